"""Tests for ragloop.retrievers.join: several retrievers searched at once and joined into one list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers.join import JoinedRetriever, join_hits
from ragloop.state import Chunk, Hit
from ragloop.testing import FakeRetriever

pytestmark = pytest.mark.anyio


def _hit(cid: str, score: float = 1.0, confidence: float = 0.5, **ranks: int) -> Hit:
    return Hit(chunk=Chunk(id=cid, text=cid), score=score, confidence=confidence, ranks=ranks)


def _lists(ids: Sequence[str], confidence: float = 0.5) -> list[Hit]:
    return [_hit(c, score=1.0 - i / 100, confidence=confidence) for i, c in enumerate(ids)]


class Keyed:
    """A retriever whose chunks carry only ``keys`` as metadata keys; records the filters it was given."""

    def __init__(self, ids: Sequence[str], keys: frozenset[str]) -> None:
        self.ids, self.keys = list(ids), keys
        self.filters: list[Any] = []
        self.version = ""

    def metadata_keys(self) -> frozenset[str]:
        return self.keys

    async def search(self, query: str, k: int = 10, filters: Any = None) -> list[Hit]:
        self.filters.append(filters)
        return _lists(self.ids)[:k]


class TestJoinHits:
    def test_rrf_keeps_each_retrievers_rank(self) -> None:
        """A chunk both retrievers found leads; each hit keeps its rank per retriever and the inner ones."""
        docs = [_hit("a", bm25=1, dense=4), _hit("b", bm25=2)]
        manuals = [_hit("m"), _hit("b")]
        out = join_hits({"docs": docs, "manuals": manuals}, {"docs": 1.0, "manuals": 1.0})
        assert out[0].id == "b"
        assert dict(out[0].ranks) == {"docs": 2, "docs.bm25": 2, "manuals": 2}
        by_id = {h.id: h for h in out}
        assert dict(by_id["a"].ranks) == {"docs": 1, "docs.bm25": 1, "docs.dense": 4}
        assert dict(by_id["m"].ranks) == {"manuals": 1}

    def test_weights_move_a_list(self) -> None:
        """A heavier retriever's first hit beats a lighter one's."""
        out = join_hits({"a": _lists(["x"]), "b": _lists(["y"])}, {"a": 0.2, "b": 1.0})
        assert [h.id for h in out] == ["y", "x"]

    def test_confidence_is_the_best_not_diluted(self) -> None:
        """A chunk only one retriever holds keeps that retriever's confidence (the other's silence is no vote)."""
        out = join_hits({"a": _lists(["x"], 0.9), "b": _lists(["y"], 0.4)}, {})
        assert {h.id: h.confidence for h in out} == {"x": 0.9, "y": 0.4}

    def test_modes(self) -> None:
        """confidence: by weight × confidence; concatenate: each list in turn, a repeat at its first place."""
        lists = {"a": _lists(["x", "y"], 0.3), "b": _lists(["z", "x"], 0.8)}
        assert [h.id for h in join_hits(lists, {}, "confidence")] == ["x", "z", "y"]  # x ties z, found first
        assert [h.id for h in join_hits(lists, {"b": 0.3}, "confidence")] == ["x", "y", "z"]
        assert [h.id for h in join_hits(lists, {}, "concatenate")] == ["x", "y", "z"]

    @settings(max_examples=80, deadline=None)
    @given(
        a=st.lists(st.sampled_from("abcdefgh"), max_size=8),
        b=st.lists(st.sampled_from("abcdefgh"), max_size=8),
        mode=st.sampled_from(["rrf", "confidence", "concatenate"]),
    )
    def test_every_chunk_once_with_its_ranks(self, a: list[str], b: list[str], mode: Any) -> None:
        """Whatever the lists and mode: each distinct chunk exactly once, and ranks[name] is its first place in
        that retriever's list."""
        lists = {"a": _lists(a), "b": _lists(b)}
        out = join_hits(lists, {}, mode)
        assert sorted(h.id for h in out) == sorted({*a, *b})
        for hit in out:
            for name, ids in (("a", a), ("b", b)):
                assert hit.ranks.get(name) == (ids.index(hit.id) + 1 if hit.id in ids else None)


class TestJoinedRetriever:
    async def test_searches_all_at_once_and_cuts_at_k(self) -> None:
        """Every retriever is searched for the query (at least k deep); the joined list is cut at k."""
        one, two = FakeRetriever(lambda q: _lists(["a", "b", "c"])), FakeRetriever(lambda q: _lists(["d", "a"]))
        joined = JoinedRetriever({"one": one, "two": two})
        out = await joined.search("q", k=2)
        assert [h.id for h in out] == ["a", "d"] and one.calls == ["q"] and two.calls == ["q"]

    async def test_a_failure_fails_the_search_unless_optional(self) -> None:
        """A failing retriever fails the search (named in the error); named optional, its share is left out."""

        def boom(query: str) -> list[Hit]:
            raise OSError("index gone")

        table = {"docs": FakeRetriever(lambda q: _lists(["a"])), "manuals": FakeRetriever(boom)}
        with pytest.raises(RetrievalError, match="manuals: OSError: index gone"):
            await JoinedRetriever(table).search("q")
        assert [h.id for h in await JoinedRetriever(table, optional=["manuals"]).search("q")] == ["a"]

    async def test_filters_go_to_retrievers_that_know_their_keys(self) -> None:
        """A retriever whose chunks lack a filter's key cannot match it: it contributes nothing and is not
        asked (its UnknownFilterKey would fail the whole search)."""
        tagged, plain = Keyed(["a"], frozenset({"product"})), Keyed(["b"], frozenset())
        joined = JoinedRetriever({"tagged": tagged, "plain": plain})
        out = await joined.search("q", filters={"product": ("pro",)})
        assert [h.id for h in out] == ["a"] and plain.filters == [] and tagged.filters == [{"product": ("pro",)}]
        assert joined.metadata_keys() == frozenset({"product"})

    async def test_version_follows_every_retriever(self) -> None:
        """The joined version changes when any retriever's does (cached searches are keyed on it)."""
        one = Keyed([], frozenset())
        joined = JoinedRetriever({"one": one, "two": FakeRetriever(lambda q: [])})
        one.version = "v1"
        before = joined.version
        one.version = "v2"
        assert joined.version != before

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"retrievers": {}}, "at least one retriever"),
            ({"retrievers": {"x": object()}}, "not a retriever.*x"),
            ({"mode": "sum"}, "unknown join mode 'sum'; use one of rrf, confidence, concatenate"),
            ({"weights": {"nope": 1.0}}, "nope: no retriever of that name; known: one"),
            ({"weights": {"one": -1.0}}, "must be >= 0"),
        ],
    )
    def test_bad_configuration_is_refused(self, kwargs: dict[str, Any], message: str) -> None:
        """Each mistake is one ConfigError naming it."""
        args: dict[str, Any] = {"retrievers": {"one": FakeRetriever(lambda q: [])}} | kwargs
        with pytest.raises(ConfigError, match=message):
            JoinedRetriever(args.pop("retrievers"), **args)

    async def test_cancellation_reaches_every_search(self) -> None:
        """A search cancelled from outside (the retrieve node's time limit) cancels every inner search."""
        cancelled: list[str] = []

        class Stuck:
            def __init__(self, name: str) -> None:
                self.name = name

            async def search(self, query: str, k: int = 10, filters: Any = None) -> list[Hit]:
                try:
                    await anyio.sleep(30)
                finally:
                    cancelled.append(self.name)
                return []

        with anyio.move_on_after(0.05):
            await JoinedRetriever({"a": Stuck("a"), "b": Stuck("b")}).search("q")
        assert sorted(cancelled) == ["a", "b"]
