"""Tests for ragloop.retrievers.hybrid."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.retrievers.bm25 import BM25Index, BM25Retriever
from ragloop.retrievers.dense import DenseIndex, DenseRetriever
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.hybrid import HybridRetriever, rrf_fuse
from ragloop.state import Chunk, Hit
from tests.retrievers._corpus import CHUNKS, hit_lists


def _hit(cid: str, score: float = 1.0, conf: float = 0.0) -> Hit:
    return Hit(chunk=Chunk(id=cid, text=cid), score=score, confidence=conf)


class TestRRFFuse:
    def test_example(self) -> None:
        """Fused scores are Σ w/(k+rank); a chunk found by both lists wins."""
        out = rrf_fuse({"bm25": [_hit("a"), _hit("b")], "dense": [_hit("b"), _hit("c")]}, k=0)
        assert [h.id for h in out] == ["b", "a", "c"]
        assert out[0].score == pytest.approx(1 / 2 + 1 / 1)
        assert out[0].ranks == {"bm25": 2, "dense": 1}

    def test_weights(self) -> None:
        """A heavier weight lets its retriever's top hit win."""
        out = rrf_fuse({"bm25": [_hit("a")], "dense": [_hit("b")]}, {"bm25": 1.0, "dense": 2.0})
        assert out[0].id == "b"

    def test_confidence_is_weighted_mean_with_missing_as_zero(self) -> None:
        """Confidence averages per-retriever confidences by weight; a miss counts as 0."""
        out = rrf_fuse(
            {"bm25": [_hit("a", conf=0.8)], "dense": [_hit("a", conf=0.4), _hit("b", conf=1.0)]},
            {"bm25": 1.0, "dense": 3.0},
        )
        by_id = {h.id: h for h in out}
        assert by_id["a"].confidence == pytest.approx((0.8 + 3 * 0.4) / 4)
        assert by_id["b"].confidence == pytest.approx(3 * 1.0 / 4)

    def test_negative_weight_rejected(self) -> None:
        """Negative weights are a ConfigError."""
        with pytest.raises(ConfigError):
            rrf_fuse({"bm25": [_hit("a")]}, {"bm25": -1.0})

    @given(hit_lists(), st.randoms(use_true_random=False))
    def test_order_independent(self, results: dict[str, list[Hit]], rnd: random.Random) -> None:
        """Fusion gives the same list whatever the order of the mapping."""
        names = list(results)
        rnd.shuffle(names)
        shuffled = {n: results[n] for n in names}
        a, b = rrf_fuse(results), rrf_fuse(shuffled)
        assert [(h.id, h.score, h.confidence, dict(h.ranks), dict(h.scores)) for h in a] == [
            (h.id, h.score, h.confidence, dict(h.ranks), dict(h.scores)) for h in b
        ]

    @given(hit_lists())
    def test_keeps_provenance(self, results: dict[str, list[Hit]]) -> None:
        """Every input chunk appears once, with each list's first position and score recorded."""
        out = rrf_fuse(results)
        ids = [h.id for h in out]
        assert len(ids) == len(set(ids))
        assert set(ids) == {h.id for hits in results.values() for h in hits}
        by_id = {h.id: h for h in out}
        for name, hits in results.items():
            first: dict[str, tuple[int, float]] = {}
            for pos, h in enumerate(hits, start=1):
                first.setdefault(h.id, (pos, h.score))
            for cid, (pos, score) in first.items():
                assert by_id[cid].ranks[name] == pos and by_id[cid].scores[name] == score
        for h in out:
            assert set(h.ranks) == {n for n, hits in results.items() if any(x.id == h.id for x in hits)}
            assert 0.0 <= h.confidence <= 1.0
        assert [h.score for h in out] == sorted((h.score for h in out), reverse=True)


def _hybrid() -> HybridRetriever:
    emb = HashEmbedder(256)
    chunks = {c.id: c for c in CHUNKS}
    bm25 = BM25Index()
    bm25.build(list(chunks), [c.text for c in CHUNKS])
    dense = DenseIndex(256)
    dense.add(list(chunks), emb.embed_sync([c.text for c in CHUNKS]))
    return HybridRetriever(BM25Retriever(bm25, chunks), DenseRetriever(dense, emb, chunks, low=0.1, high=0.5))


class TestHybridRetriever:
    @pytest.mark.anyio
    async def test_on_topic_confident_off_topic_not(self) -> None:
        """The on-topic top hit is confident; hits for an unrelated query are not."""
        r = _hybrid()
        on = await r.search("vitamin D deficiency bone density", 3)
        off = await r.search("quantum chromodynamics lattice", 3)
        assert on[0].id == "c5" and on[0].confidence > 0.6
        assert set(on[0].ranks) == {"bm25", "dense"}
        assert all(h.confidence < 0.2 for h in off)
        assert all(h.confidence < on[0].confidence for h in on[1:])

    @pytest.mark.anyio
    async def test_k_limits_results(self) -> None:
        """At most k hits come back, best first."""
        hits = await _hybrid().search("password login code", 2)
        assert len(hits) == 2 and hits[0].score >= hits[1].score
