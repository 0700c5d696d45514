"""Tests for ragloop.retrievers.dense."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.dense import DenseIndex, DenseRetriever, chunk_int_id, cosine_confidence
from ragloop.retrievers.embed import HashEmbedder, normalize_rows
from tests.retrievers._corpus import CHUNKS


def _vectors(n: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    return normalize_rows(np.random.default_rng(seed).standard_normal((n, dim)))


IDS = [f"c{i}" for i in range(40)]


@pytest.fixture(params=["flat", "hnsw"])
def index(request: pytest.FixtureRequest) -> DenseIndex:
    threshold = 10_000 if request.param == "flat" else 10
    idx = DenseIndex(16, hnsw_threshold=threshold)
    vecs = _vectors(40)
    idx.add(IDS[:5], vecs[:5])
    idx.add(IDS[5:], vecs[5:])
    assert idx.kind == request.param
    return idx


class TestDenseIndex:
    def test_finds_itself_first(self, index: DenseIndex) -> None:
        """Each stored vector is its own nearest neighbour, with cosine 1."""
        vecs = _vectors(40)
        for row in (0, 17, 39):
            ((top, *_),) = index.search_sync(vecs[row], 3)
            assert top[0] == IDS[row] and top[1] == pytest.approx(1.0, abs=1e-5)

    def test_delete_removes_from_results(self, index: DenseIndex) -> None:
        """A deleted id is never returned and no longer counts."""
        assert index.delete(["c3", "unknown"]) == 1
        assert "c3" not in index and len(index) == 39
        got = [cid for cid, _ in index.search_sync(_vectors(40)[3], 40)[0]]
        assert "c3" not in got and len(got) == 39

    def test_readd_replaces_vector(self, index: DenseIndex) -> None:
        """Adding an existing id again replaces its vector instead of duplicating it."""
        new = _vectors(1, seed=99)
        index.delete(["c7"])
        index.add(["c7"], new)
        index.add(["c7"], new)
        got = index.search_sync(new[0], 40)[0]
        assert got[0][0] == "c7" and [c for c, _ in got].count("c7") == 1 and len(index) == 40

    def test_save_load_round_trip(self, index: DenseIndex, tmp_path: Path) -> None:
        """A saved and loaded index returns identical results and keeps its kind."""
        index.delete(["c1"])
        index.save(tmp_path)
        again = DenseIndex.load(tmp_path)
        q = _vectors(3, seed=5)
        assert again.kind == index.kind and len(again) == len(index)
        assert again.search_sync(q, 5) == index.search_sync(q, 5)

    def test_equal_cosines_rank_by_chunk_id(self) -> None:
        """Vectors with the same cosine rank by chunk id, whatever order they were added in (the Postgres store's
        order; faiss alone returns ties in its own order), also when the tie straddles the k-th place."""
        for threshold in (10_000, 2):
            idx = DenseIndex(16, hnsw_threshold=threshold)
            twin = _vectors(1, seed=3)
            far = _vectors(1, seed=4)
            idx.add(["t9", "t5", "t1", "far"], np.vstack([twin, twin, twin, far]))
            q = twin[0]
            assert [cid for cid, _ in idx.search_sync(q, 3)[0]] == ["t1", "t5", "t9"]
            assert [cid for cid, _ in idx.search_sync(q, 2)[0]] == ["t1", "t5"]
            assert [cid for cid, _ in idx.search_sync(q, 1)[0]] == ["t1"]

    def test_vectors_reconstructs(self, index: DenseIndex) -> None:
        """``vectors`` returns the stored rows, zeros for unknown ids."""
        got = index.vectors(["c2", "nope"])
        assert np.allclose(got[0], _vectors(40)[2], atol=1e-6) and not got[1].any()


def test_upgrade_to_hnsw_keeps_results() -> None:
    """Crossing the threshold switches to HNSW without losing any vector."""
    idx = DenseIndex(16, hnsw_threshold=30)
    vecs = _vectors(40)
    idx.add(IDS[:20], vecs[:20])
    assert idx.kind == "flat"
    idx.add(IDS[20:], vecs[20:])
    assert idx.kind == "hnsw" and len(idx) == 40
    assert idx.search_sync(vecs[4], 1)[0][0][0] == "c4"


def test_wrong_shape_is_config_error() -> None:
    """Vectors of the wrong dimension are refused with a ConfigError."""
    with pytest.raises(ConfigError, match="dim"):
        DenseIndex(8).add(["a"], np.ones((1, 4), dtype=np.float32))


def test_load_missing_is_index_error(tmp_path: Path) -> None:
    """Loading from a folder without the files is an IndexError_ that says to rebuild."""
    with pytest.raises(IndexError_, match="ragloop index"):
        DenseIndex.load(tmp_path)


def test_int_ids_are_stable_and_non_negative() -> None:
    """Chunk ids map to fixed non-negative int64 values."""
    assert chunk_int_id("abc") == chunk_int_id("abc") != chunk_int_id("abd")
    assert 0 <= chunk_int_id("abc") < 2**63


def test_cosine_confidence_is_clipped_linear() -> None:
    """Confidence is 0 at/below low, 1 at/above high, linear between."""
    assert cosine_confidence(0.1, 0.2, 0.6) == 0.0
    assert cosine_confidence(0.4, 0.2, 0.6) == pytest.approx(0.5)
    assert cosine_confidence(0.9, 0.2, 0.6) == 1.0


@pytest.mark.anyio
async def test_retriever_returns_hits_with_provenance() -> None:
    """DenseRetriever embeds the query and returns ranked hits carrying rank and cosine."""
    emb = HashEmbedder(256)
    idx = DenseIndex(256)
    idx.add([c.id for c in CHUNKS], emb.embed_sync([c.text for c in CHUNKS]))
    r = DenseRetriever(idx, emb, {c.id: c for c in CHUNKS})
    hits = await r.search("reset password security settings", 3)
    assert hits[0].id == "c0" and hits[0].ranks == {"dense": 1}
    assert hits[0].scores["dense"] == pytest.approx(hits[0].score)
    assert [h.ranks["dense"] for h in hits] == [1, 2, 3]
