"""retrieve: concurrent search, merging, the fast path, the thrash guard."""

from __future__ import annotations

import math

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop import END
from ragloop.events import Progress
from ragloop.nodes.retrieve import merge_budget, merge_hits
from ragloop.state import TurnState
from ragloop.testing import FakeRetriever, make_hit
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio


class TestMerge:
    def test_dedup_keeps_best_copy_and_all_finders(self) -> None:
        """Copies of one text are merged; the best-scoring copy wins; every finder is listed."""
        a = make_hit("SSO uses SAML.", score=0.5, chunk_id="c1")
        b = make_hit("sso  uses saml", score=0.9, chunk_id="c2")
        merged = merge_hits({"q1": [a], "q2": [b]}, budget=10)
        assert len(merged) == 1
        assert merged[0].id == "c2" and merged[0].best_query == "q2" and merged[0].queries == ("q1", "q2")

    def test_budget_interleaves_queries(self) -> None:
        """The cap keeps each query's best hit before anyone's second."""
        q1 = [make_hit(f"one {i}", score=10 - i) for i in range(5)]
        q2 = [make_hit(f"two {i}", score=1 - i / 10) for i in range(5)]
        merged = merge_hits({"q1": q1, "q2": q2}, budget=2)
        assert {h.text for h in merged} == {"one 0", "two 0"}

    def test_budget_grows_sublinearly(self) -> None:
        """The total budget grows slower than the number of queries and is capped."""
        assert merge_budget(1, per_query=6, total=12) == 6
        assert merge_budget(4, per_query=6, total=100) == 12
        assert merge_budget(50, per_query=6, total=12) == 12

    @given(
        st.dictionaries(
            st.sampled_from(["q1", "q2", "q3"]),
            st.lists(
                st.tuples(st.sampled_from(["alpha", "beta", "Alpha!", "gamma", "delta"]), st.floats(0, 1)),
                max_size=5,
            ),
            max_size=3,
        ),
        st.integers(0, 8),
    )
    def test_merge_properties(self, raw: dict[str, list[tuple[str, float]]], budget: int) -> None:
        """Merge is order-independent, keeps the best copy, caps, and loses no provenance."""
        results = {q: [make_hit(t, score=s, chunk_id=f"{q}-{i}") for i, (t, s) in enumerate(v)] for q, v in raw.items()}
        merged = merge_hits(results, budget=budget)
        reversed_input = {q: list(reversed(results[q])) for q in reversed(list(results))}
        assert merge_hits(reversed_input, budget=budget) == merged
        assert len(merged) <= budget
        assert len({h.text.lower().strip("!") for h in merged}) == len(merged)
        assert [h.score for h in merged] == sorted((h.score for h in merged), reverse=True)
        for h in merged:
            key = h.text.lower().strip("!")
            finders = {q for q, hits in results.items() for x in hits if x.text.lower().strip("!") == key}
            assert set(h.queries) == finders
            assert h.score == max(x.score for q in finders for x in results[q] if x.text.lower().strip("!") == key)


class TestRetrieve:
    async def test_one_failing_query_does_not_cancel_others(self) -> None:
        """A raising and a hanging query are recorded as failed; the third's hits are used."""
        retriever = FakeRetriever(
            {"good": [make_hit("good text")]},
            errors={"bad": OSError("index down")},
            delays={"slow": 30},
        )
        state = with_queries("good", "bad", "slow")
        with anyio.fail_after(5):
            assert await turn_node("retrieve", retriever=retriever, timeout_s=0.05)(state) == "grade"
        assert state.queries["bad"].status == "failed" and "index down" in (state.queries["bad"].error or "")
        assert state.queries["slow"].status == "failed" and "timed out" in (state.queries["slow"].error or "")
        assert [h.text for h in state.queries["good"].hits] == ["good text"]

    async def test_queries_run_concurrently(self) -> None:
        """Several queries are searched at once (bounded by max_concurrency)."""
        retriever = FakeRetriever(delays={"a": 0.05, "b": 0.05, "c": 0.05})
        await turn_node("retrieve", retriever=retriever, max_concurrency=2)(with_queries("a", "b", "c"))
        assert retriever.concurrency.peak == 2

    async def test_fast_path(self) -> None:
        """One query whose hits are all confident skips grading."""
        retriever = FakeRetriever({"q": [make_hit("x", confidence=0.9), make_hit("y", confidence=0.8)]})
        state = with_queries("q")
        assert await turn_node("retrieve", retriever=retriever, fast_path_confidence=0.75)(state) == "answer"
        assert state.fast_path and state.queries["q"].status == "enough" and len(state.graded) == 2

    async def test_fast_path_keeps_only_confident_hits(self) -> None:
        """Enough confident hits skip grading; the weak tail is dropped rather than passed on ungraded."""
        hits = [make_hit("x", confidence=0.9), make_hit("y", confidence=0.8), make_hit("z", confidence=0.3)]
        state = with_queries("q")
        assert (
            await turn_node("retrieve", retriever=FakeRetriever({"q": hits}), fast_path_min_hits=2)(state) == "answer"
        )
        assert [g.hit.text for g in state.graded] == ["x", "y"] and len(state.queries["q"].hits) == 2

    async def test_no_fast_path_for_an_id_the_hits_do_not_name(self) -> None:
        """Confident hits that do not name the query's ticket id go to grading (and maybe live)."""
        hits = [make_hit("How tickets work", confidence=0.95), make_hit("Ticket statuses", confidence=0.9)]
        state = with_queries("status of ticket #1234")
        assert await turn_node("retrieve", retriever=FakeRetriever({"status of ticket #1234": hits}))(state) == "grade"

    async def test_no_fast_path_with_a_weak_hit_or_two_queries(self) -> None:
        """A single weak hit, or two queries, go to grading."""
        weak = FakeRetriever({"q": [make_hit("x", confidence=0.9), make_hit("y", confidence=0.2)]})
        assert await turn_node("retrieve", retriever=weak)(with_queries("q")) == "grade"
        two = FakeRetriever(lambda q: [make_hit(q, confidence=1.0)])
        assert await turn_node("retrieve", retriever=two)(with_queries("a", "b")) == "grade"

    async def test_thrash_guard_filters_shown_chunks(self) -> None:
        """Chunks shown by an earlier attempt are not retrieved again."""
        hit = make_hit("seen before", chunk_id="c1")
        state = with_queries("q")
        state.shown.add("c1")
        await turn_node("retrieve", retriever=FakeRetriever({"q": [hit, make_hit("new")]}))(state)
        assert [h.text for h in state.queries["q"].hits] == ["new"]

    async def test_emits_progress(self) -> None:
        """retrieve reports 'searching…' and 'found N passages' progress events."""
        from ragloop import Graph

        g = Graph(
            {"retrieve": _Only(turn_node("retrieve", retriever=FakeRetriever({"q": [make_hit("x")]})))},
            start="retrieve",
            finish="retrieve",
        )
        kinds = [e.kind async for e in g.stream(with_queries("q")) if isinstance(e, Progress)]
        assert kinds == ["search", "retrieved"]

    async def test_the_retrieved_event_tells_searches_that_waited_out_from_a_store_that_is_down(self) -> None:
        """'busy' lists the failed queries that ran out of time (a busy store, the query timeout), not those
        that found the store down or failed otherwise: the serve tells the client busy from unavailable."""
        from ragloop import Graph
        from ragloop.errors import StoreBusy, StoreUnavailable

        retriever = FakeRetriever(
            {"good": [make_hit("good text")]},
            errors={
                "busy": StoreBusy("no free connection"),
                "grouped": ExceptionGroup("hybrid", [StoreBusy("a"), TimeoutError()]),
                "down": StoreUnavailable("unreachable"),
                "mixed": ExceptionGroup("hybrid", [StoreBusy("a"), StoreUnavailable("b")]),
                "broken": OSError("index down"),
            },
            delays={"slow": 30},
        )
        node = turn_node("retrieve", retriever=retriever, timeout_s=0.05)
        g = Graph({"retrieve": _Only(node)}, start="retrieve", finish="retrieve")
        state = with_queries("good", "busy", "grouped", "down", "mixed", "broken", "slow")
        with anyio.fail_after(10):
            done = [e async for e in g.stream(state) if isinstance(e, Progress) and e.kind == "retrieved"]
        data = done[0].data or {}
        assert sorted(data["failed"]) == ["broken", "busy", "down", "grouped", "mixed", "slow"]
        assert sorted(data["busy"]) == ["busy", "grouped", "slow"]


class _BusyThen:
    """A retriever whose store is busy for its first ``busy`` searches (StoreBusy after ``wait_s``), then answers."""

    def __init__(self, busy: int, *, queued: bool = True, wait_s: float = 0.05) -> None:
        self.busy, self.queued, self.wait_s, self.calls = busy, queued, wait_s, 0

    async def search(self, query: str, k: int = 10, filters: object = None) -> list[object]:
        from ragloop.errors import StoreBusy

        self.calls += 1
        if self.calls <= self.busy:
            await anyio.sleep(self.wait_s)
            raise StoreBusy("no free connection (all 1 busy)", queued=self.queued)
        return [make_hit("found after the wait")]


class TestBusyStore:
    """A search that waited out a busy store queues again within the turn's deadline (issue 35)."""

    async def test_a_busy_store_is_waited_for_within_the_turns_deadline(self) -> None:
        """Busy for three searches, a 30 s turn deadline, a 1 s retrieval timeout: the query is answered."""
        retriever = _BusyThen(3)
        state = with_queries("q")
        with anyio.move_on_after(30) as scope:  # the runner's deadline scope of the turn
            await turn_node("retrieve", retriever=retriever, timeout_s=1.0)(state)
        assert not scope.cancelled_caught
        assert retriever.calls == 4 and state.queries["q"].status != "failed"
        assert [h.text for h in state.queries["q"].hits] == ["found after the wait"]

    async def test_without_room_in_the_deadline_the_query_fails_as_busy(self) -> None:
        """The deadline leaves less than twice the retrieval timeout: no second try, the query failed busy."""
        retriever = _BusyThen(3)
        state = with_queries("q")
        with anyio.move_on_after(1.5):
            await turn_node("retrieve", retriever=retriever, timeout_s=1.0)(state)
        assert retriever.calls == 1 and state.queries["q"].status == "failed"
        assert "StoreBusy" in (state.queries["q"].error or "")

    async def test_a_store_busy_at_once_is_queued_again_after_growing_pauses(self) -> None:
        """A store that refuses at once (no pool wait) for a whole 4 s turn with a 1 s retrieval timeout: the
        search queues again only after pauses of 0.05 s doubling to 0.25 s, so it is tried a handful of times in
        the 2 s the deadline leaves for re-queueing, never thousands (before: it spun a core until the deadline)."""
        retriever = _BusyThen(10**9, wait_s=0.0)
        state = with_queries("q")
        with anyio.move_on_after(4.0):
            await turn_node("retrieve", retriever=retriever, timeout_s=1.0)(state)
        # Pauses 0.05, 0.1, 0.2, 0.25, 0.25, ... fill the 2 s of room: at most 1 + 10 tries, even on a fast machine.
        assert 2 <= retriever.calls <= 12, retriever.calls
        assert state.queries["q"].status == "failed" and "StoreBusy" in (state.queries["q"].error or "")

    @pytest.mark.parametrize("deadline", [None, 30.0])
    async def test_no_deadline_or_a_statement_timeout_is_not_tried_again(self, deadline: float | None) -> None:
        """No turn deadline (nothing bounds the waiting): one try. A statement that ran past its timeout
        (queued=False): one try, since running it again costs the store as much again."""
        retriever = _BusyThen(3, queued=deadline is None)
        state = with_queries("q")
        with anyio.move_on_after(deadline if deadline is not None else math.inf):
            await turn_node("retrieve", retriever=retriever, timeout_s=1.0)(state)
        assert retriever.calls == 1 and state.queries["q"].status == "failed"


class _Only:
    """Wraps a node so that it ends the run (for streaming one node)."""

    routes = (END,)

    def __init__(self, node: object) -> None:
        self.node = node

    async def __call__(self, state: TurnState) -> str:
        await self.node(state)  # type: ignore[operator]
        return END
