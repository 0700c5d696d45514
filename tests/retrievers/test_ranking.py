"""Tests for ragloop.retrievers.ranking: the Ranker seam, Candidates and the default FusionRanker."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.retrievers.fusion import FusionSettings, fuse_searches
from ragloop.retrievers.ranking import Candidates, FusionRanker, Ranker, candidates_of, keep_lead
from ragloop.retrievers.rerank import RerankSettings, rerank
from ragloop.state import Chunk, Decision, Graded, Hit, Verdict
from tests.strategies import with_queries

ids = st.sampled_from([f"c{i}" for i in range(30)])
lists = st.lists(ids, unique=True, max_size=15)


def _hit(cid: str, title: str = "") -> Hit:
    return Hit(chunk=Chunk(id=cid, text=f"text of {cid}", title=title or cid), score=1.0)


class TestCandidates:
    def test_hits_lists_every_chunk_once_anchor_first(self) -> None:
        """hits(): the anchor's list first, then the others in turn order, each chunk once."""
        c = Candidates("q", {"part": [_hit("b"), _hit("c")], "q": [_hit("a"), _hit("b")]}, anchor="q")
        assert [h.id for h in c.hits()] == ["a", "b", "c"]

    def test_values_are_frozen_copies(self) -> None:
        """The lists are copied into tuples: a ranker cannot change the turn's recorded searches through them."""
        searched = [_hit("a")]
        c = Candidates("q", {"q": searched}, {"a": ["relevant"]})
        searched.append(_hit("b"))
        assert c.searches["q"] == (_hit("a"),) and c.grades["a"] == ("relevant",)

    def test_of_a_state(self) -> None:
        """candidates_of: the recorded searches, every grade per chunk, the question's own list as anchor."""
        state = with_queries("Annie Morton", question="Who is Annie Morton?")
        state.decision = Decision(queries=("Annie Morton",))
        state.searches = {"Who is Annie Morton?": [_hit("a")], "Annie Morton": [_hit("a"), _hit("b")]}
        state.graded = [Graded("Annie Morton", _hit("a"), Verdict("relevant"))]
        c = candidates_of(state)
        assert c.anchor == "Who is Annie Morton?" and c.grades == {"a": ("relevant",)}
        assert set(c.searches) == set(state.searches)


class TestFusionRanker:
    def test_is_a_ranker(self) -> None:
        """The default satisfies the seam it sits behind."""
        assert isinstance(FusionRanker(), Ranker)

    @settings(max_examples=60, deadline=None)
    @given(anchor=lists, a=lists, b=lists, bad=st.sets(ids))
    def test_order_is_fusion_then_feature_rerank(
        self, anchor: list[str], a: list[str], b: list[str], bad: set[str]
    ) -> None:
        """The default ranking is exactly fuse_searches followed by rerank with the anchor's top protected (what
        the answer node computed before the seam), then the anchor's first hit kept first (lead=1), and a
        permutation of every chunk found."""
        hit = {c: _hit(c) for c in {*anchor, *a, *b}}
        searches = {"q": [hit[c] for c in anchor], "p1": [hit[c] for c in a], "p2": [hit[c] for c in b]}
        grades = {c: ["irrelevant"] for c in bad & set(hit)}
        candidates = Candidates("q", searches, grades, anchor="q")  # type: ignore[arg-type]
        fused = fuse_searches(searches, anchor="q", grades=grades)  # type: ignore[arg-type]
        expected = keep_lead(rerank("q", fused, protected=anchor[:5]), anchor, 1)
        out = FusionRanker().order(candidates)
        assert [h.id for h in out] == [h.id for h in expected]
        assert sorted(h.id for h in out) == sorted(hit)
        assert [h.id for h in anyio.run(FusionRanker().rank, candidates)] == [h.id for h in out]

    def test_settings_reach_the_ranking(self) -> None:
        """The fusion weights and the feature weights are the ranker's: zero feature weights keep the fused order,
        a heavy title weight moves the page named in the question to the top."""
        searches = {"When was Annie Morton born?": [_hit("x", "Other"), _hit("y", "Annie Morton")]}
        c = Candidates("When was Annie Morton born?", searches, anchor=None)
        off = RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0)
        assert [h.id for h in FusionRanker(features=off).order(c)] == ["x", "y"]
        assert [h.id for h in FusionRanker(FusionSettings(), RerankSettings(title_weight=5)).order(c)] == ["y", "x"]

    def test_no_searches_no_hits(self) -> None:
        """Nothing searched: an empty ranking."""
        assert FusionRanker().order(Candidates("q")) == []


@pytest.mark.anyio
class TestRankerProtocol:
    async def test_a_plain_class_with_rank_is_a_ranker(self) -> None:
        """Nothing to inherit: an object with an async rank is a Ranker; one without is not."""

        class Reversed:
            async def rank(self, candidates: Candidates) -> list[Hit]:
                return list(reversed(await FusionRanker().rank(candidates)))

        assert isinstance(Reversed(), Ranker) and not isinstance(object(), Ranker)
        c = Candidates("q", {"q": [_hit("a"), _hit("b")]}, anchor="q")
        assert [h.id for h in await Reversed().rank(c)] == ["b", "a"]


class TestKeepLead:
    @settings(max_examples=100, deadline=None)
    @given(ranked=st.lists(ids, unique=True, min_size=1, max_size=20), anchor=lists, n=st.integers(0, 4))
    def test_the_anchors_first_stay_first_and_nothing_else_moves(
        self, ranked: list[str], anchor: list[str], n: int
    ) -> None:
        """The anchor's first n ids (those ranked) end inside the first n places; the output is a permutation, and
        every other id keeps its order relative to the others."""
        anchor = [c for c in anchor if c in ranked]
        out = [h.id for h in keep_lead([_hit(c) for c in ranked], anchor, n)]
        assert sorted(out) == sorted(ranked)
        assert set(anchor[:n]) <= set(out[:n])
        rest = [c for c in out if c not in anchor[:n]]
        assert rest == [c for c in ranked if c not in anchor[:n]]

    def test_in_the_default_ranker(self) -> None:
        """The default (lead=1): the question's own first hit leads even when the parts all agree on another;
        lead=0 lets the fusion put the parts' favourite first."""
        searches = {"q": [_hit("a"), _hit("b")], "p1": [_hit("b")], "p2": [_hit("b")]}
        c = Candidates("q", searches, anchor="q")
        assert [h.id for h in FusionRanker(FusionSettings(lead=0)).order(c)] == ["b", "a"]
        assert [h.id for h in FusionRanker().order(c)] == ["a", "b"]
