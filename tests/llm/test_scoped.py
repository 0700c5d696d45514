"""Corpus-derived judges per caller scope (:mod:`ragloop.llm.scoped`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import anyio
import pytest
from attrs import frozen
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.llm.offline import OfflineAnswerer, OfflineDecider
from ragloop.llm.scoped import (
    MAX_CONCURRENT_BUILDS,
    ScopedAnswerer,
    ScopedDecider,
    ScopedKnowledge,
    current_scope,
    turn_scope,
)
from ragloop.retrievers.scope import Corpus
from ragloop.state import ContextBlock, PageContext
from ragloop.text.terms import CorpusStats

pytestmark = pytest.mark.anyio

_CORPUS = Corpus(
    ("acme one", "acme two", "globex one", "shared one"),
    ({"tenant": "acme"}, {"tenant": "acme"}, {"tenant": "globex"}, {}),
)


@frozen
class Seen:
    """What a build was given, and the thread it ran in."""

    texts: tuple[str, ...]
    thread: int


def knowledge(corpus: Corpus = _CORPUS, **kwargs: int) -> tuple[ScopedKnowledge[Seen], list[Seen]]:
    built: list[Seen] = []

    def build(texts: Sequence[str]) -> Seen:
        seen = Seen(tuple(texts), threading.get_ident())
        built.append(seen)
        return seen

    return ScopedKnowledge(corpus, build, **kwargs), built


class TestScopedKnowledge:
    def test_each_scope_is_built_from_the_texts_it_can_find(self) -> None:
        """A tenant's knowledge is built from its own chunks only, in index order; no filter is the whole corpus."""
        known, built = knowledge()
        assert known.base.texts == _CORPUS.texts and len(built) == 1
        assert known.for_filters({"tenant": ("acme",)}).texts == ("acme one", "acme two")
        assert known.for_filters({"tenant": ("globex",)}).texts == ("globex one",)
        assert known.for_filters(None) is known.base and known.for_filters({}) is known.base
        assert known.builds == 2

    def test_a_scope_is_built_once_and_scopes_that_see_the_same_chunks_share_it(self) -> None:
        """The second turn of a scope builds nothing; a filter of two keys that finds the same chunks reuses it."""
        corpus = Corpus(("a", "b"), ({"tenant": "acme", "product": "sso"}, {"tenant": "globex", "product": "sso"}))
        known, _ = knowledge(corpus)
        first = known.for_filters({"tenant": ("acme",)})
        assert known.for_filters({"tenant": ("acme",)}) is first
        assert known.for_filters({"tenant": ("acme",), "product": ("sso",)}) is first
        assert known.builds == 1

    def test_a_filter_every_chunk_passes_is_the_base(self) -> None:
        """Filters that hide nothing build nothing: the start-up knowledge serves them."""
        corpus = Corpus(("a", "b"), ({"tenant": "acme"}, {"tenant": "acme"}))
        known, _ = knowledge(corpus)
        assert known.for_filters({"tenant": ("acme",)}) is known.base and known.builds == 0

    def test_least_recently_used_scopes_are_dropped(self) -> None:
        """``max_scopes`` bounds the builds kept: a third scope drops the least recently used one."""
        corpus = Corpus(("a", "b", "c"), ({"t": "1"}, {"t": "2"}, {"t": "3"}))
        known, _ = knowledge(corpus, max_scopes=2)
        one = known.for_filters({"t": ("1",)})
        known.for_filters({"t": ("2",)})
        assert known.for_filters({"t": ("1",)}) is one  # 1 is now the most recent
        known.for_filters({"t": ("3",)})  # drops 2
        assert known.for_filters({"t": ("1",)}) is one and known.builds == 3
        known.for_filters({"t": ("2",)})
        assert known.builds == 4

    def test_max_scopes_below_one_is_refused(self) -> None:
        """A cache that can keep nothing is a configuration error that names the setting."""
        with pytest.raises(ConfigError, match="max_scopes"):
            knowledge(max_scopes=0)

    async def test_a_turn_resolves_its_scope_once_off_the_event_loop(self) -> None:
        """Inside a turn the scope's knowledge is built in a worker thread and kept for the rest of the turn,
        even if the cache drops it meanwhile."""
        corpus = Corpus(("a", "b", "c"), ({"t": "1"}, {"t": "2"}, {"t": "3"}))
        known, built = knowledge(corpus, max_scopes=1)
        loop_thread = threading.get_ident()
        with turn_scope({"t": ("1",)}):
            first = await known.acurrent()
            assert first.texts == ("a",) and first.thread != loop_thread
            known.for_filters({"t": ("2",)})  # evicts scope 1 from the cache
            assert await known.acurrent() is first and known.current() is first
        assert len(built) == 3
        assert await known.acurrent() is known.base  # outside a turn: the whole corpus

    async def test_at_most_two_scopes_build_at_once(self) -> None:
        """Many new scopes at once (a caller sending distinct narrowing filters) build at most
        MAX_CONCURRENT_BUILDS at a time, so the worker threads other callers' searches need stay free."""
        corpus = Corpus(tuple(str(i) for i in range(8)), tuple({"t": str(i)} for i in range(8)))
        running, peak = [0], [0]
        lock = threading.Lock()

        def build(texts: Sequence[str]) -> Seen:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return Seen(tuple(texts), threading.get_ident())

        known = ScopedKnowledge(corpus, build)

        async def turn(i: int) -> None:
            with turn_scope({"t": (str(i),)}):
                assert (await known.acurrent()).texts == (str(i),)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(turn, i)
        assert known.builds == 8 and 1 <= peak[0] <= MAX_CONCURRENT_BUILDS

    async def test_a_cancelled_turn_stops_waiting_and_its_build_is_kept(self) -> None:
        """A turn cancelled while its scope builds (its deadline, a client gone) returns at once; the build
        finishes in its thread, is kept for the scope's next turn and gives its slot back."""
        corpus = Corpus(("a", "b", "c"), ({"t": "1"}, {"t": "2"}, {"t": "3"}))
        gate = threading.Event()

        def build(texts: Sequence[str]) -> Seen:
            gate.wait(5)
            return Seen(tuple(texts), threading.get_ident())

        known = ScopedKnowledge(corpus, build, base=Seen(corpus.texts, 0))
        with anyio.move_on_after(0.05) as scope, turn_scope({"t": ("1",)}):
            await known.acurrent()
        assert scope.cancelled_caught and known.builds == 0
        gate.set()
        with anyio.fail_after(5):
            while known.builds < 1:
                await anyio.sleep(0.01)
        with turn_scope({"t": ("1",)}):
            assert (await known.acurrent()).texts == ("a",) and known.builds == 1
        with anyio.fail_after(5), turn_scope({"t": ("2",)}):  # the slot came back: more builds run
            assert (await known.acurrent()).texts == ("b",)

    async def test_child_tasks_of_a_turn_see_its_scope(self) -> None:
        """The scope reaches the turn's child tasks (the grade node grades in a task group)."""
        seen: list[object] = []

        async def child() -> None:
            seen.append(current_scope())

        with turn_scope({"tenant": ("globex",)}):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
        assert seen == [(("tenant", ("globex",)),)] and current_scope() == ()

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", None])), max_size=12),
        st.sampled_from(["a", "b", "c"]),
    )
    def test_a_scope_knows_exactly_what_its_filter_finds(self, rows: list[tuple[str, str | None]], want: str) -> None:
        """For any corpus, a scope's knowledge is built from exactly the chunks its filter matches, in order."""
        texts = tuple(f"{t}-{i}" for i, (t, _) in enumerate(rows))
        metas = tuple({"tenant": t, **({"product": p} if p else {})} for t, p in rows)
        known, _ = knowledge(Corpus(texts, metas))
        got = known.for_filters({"tenant": (want,)}).texts
        assert got == tuple(text for text, (t, _) in zip(texts, rows, strict=True) if t == want)


def _judges(texts: Sequence[str]) -> tuple[OfflineDecider, OfflineAnswerer]:
    stats = CorpusStats.from_texts(texts)
    return OfflineDecider(stats), OfflineAnswerer(stats)


@frozen
class Bundle:
    decider: OfflineDecider
    answerer: OfflineAnswerer


def _bundle(texts: Sequence[str]) -> Bundle:
    return Bundle(*_judges(texts))


_QLR = Corpus(
    (
        "The QLR (quantum lattice relay) forwards telemetry between racks.",
        "Globex invoices are paid by wire within thirty days.",
        "The Globex dashboard shows usage per project.",
    ),
    ({"tenant": "acme"}, {"tenant": "globex"}, {"tenant": "globex"}),
)


class TestScopedJudges:
    async def test_a_tenant_decider_never_expands_another_tenants_abbreviation(self) -> None:
        """globex's "What does QLR stand for?" is searched as asked; acme's turn expands it from acme's text
        (before: every tenant's queries carried acme's expansion)."""
        decider = ScopedDecider(ScopedKnowledge(_QLR, _bundle), "decider")
        with turn_scope({"tenant": ("globex",)}):
            globex = await decider.decide("What does QLR stand for?", (), PageContext())
        with turn_scope({"tenant": ("acme",)}):
            acme = await decider.decide("What does QLR stand for?", (), PageContext())
        assert not any("quantum" in q for q in globex.queries), globex
        assert any("quantum lattice relay" in q for q in acme.queries), acme

    async def test_the_answerer_abstains_on_a_name_only_another_tenant_mentions(self) -> None:
        """A name "never mentioned" is judged on the tenant's own chunks: QLR is unknown to globex, known to acme."""
        answerer = ScopedAnswerer(ScopedKnowledge(_QLR, _bundle), "answerer")
        block = ContextBlock(1, "Globex invoices are paid by wire within thirty days.", "globex/inv.md", "Invoices")
        with turn_scope({"tenant": ("globex",)}):
            globex = answerer.abstain("Is QLR paid by wire?", [block], [])
        with turn_scope({"tenant": ("acme",)}):
            acme = answerer.abstain("Is QLR paid by wire?", [block], [])
        assert globex is not None and "QLR" in " ".join(globex.unknown)
        assert acme is None or "QLR" not in " ".join(acme.unknown)

    async def test_the_streamed_answer_is_the_scopes_composition(self) -> None:
        """``answer`` streams exactly what ``compose`` writes in the same scope."""
        answerer = ScopedAnswerer(ScopedKnowledge(_QLR, _bundle), "answerer")
        block = ContextBlock(1, "Globex invoices are paid by wire within thirty days.", "globex/inv.md", "Invoices")
        with turn_scope({"tenant": ("globex",)}):
            streamed = "".join([t async for t in answerer.answer("How are invoices paid?", [block], "context")])
            composed = answerer.compose("How are invoices paid?", [block], "context")
        assert streamed == composed and "[1]" in streamed
