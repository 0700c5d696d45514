"""Hybrid retrieval: weighted reciprocal-rank fusion of BM25 and dense results.

:func:`rrf_fuse` is pure: it merges ranked hit lists from named retrievers into one list, giving each
chunk ``Σ weight_r / (k + rank_r)`` over the retrievers that returned it, and keeps every retriever's rank
and score in ``Hit.ranks`` / ``Hit.scores``. The result does not depend on the order of the mapping.

Confidence (``Hit.confidence``, in [0, 1]) is the weighted mean of the per-retriever confidences::

    confidence = Σ_r weight_r · c_r / Σ_r weight_r

- ``c_bm25`` = BM25 score / the query's best possible BM25 score in this corpus (the sum of each query
  term's highest score in any chunk), times the share of query words the corpus knows
  (see :mod:`ragloop.retrievers.bm25`);
- ``c_dense`` = the cosine mapped linearly from ``low`` (0) to ``high`` (1) (see
  :mod:`ragloop.retrievers.dense`).

So a hit is confident only when the retrievers *agree*: it shares the query's rare words and is close in
meaning. In :func:`rrf_fuse` a retriever that did not return the hit contributes 0; :class:`HybridRetriever`
instead computes both components exactly for every fused hit (the cosine from the stored vector, the BM25
score from the full score vector), so a hit just outside one retriever's candidate list is not penalised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ragloop.errors import ConfigError
from ragloop.retrievers.bm25 import BM25Retriever
from ragloop.retrievers.dense import DenseRetriever, cosine_confidence
from ragloop.retrievers.filters import Filters, check_filter_keys
from ragloop.state import Chunk, Hit

__all__ = ["HybridRetriever", "hybrid_confidence", "rrf_fuse", "rrf_rank"]


def _check_weights(weights: Mapping[str, float]) -> None:
    bad = {n: w for n, w in weights.items() if not w >= 0}
    if bad:
        raise ConfigError(f"fusion weights must be >= 0, got {bad}")


def hybrid_confidence(
    bm25_score: float, best: float, cosine: float, *, w_bm25: float, w_dense: float, low: float, high: float
) -> float:
    """The confidence of a fused hit (see the module docstring): the weighted mean of the BM25 score over
    the query's best possible score (capped at 1) and the cosine mapped from ``low``..``high`` to 0..1.

    Every hybrid retriever (the local index, the Postgres store) computes its confidence here.
    """
    cb = min(1.0, bm25_score / best) if best > 0 else 0.0
    cd = cosine_confidence(cosine, low, high)
    return (w_bm25 * cb + w_dense * cd) / (w_bm25 + w_dense) if w_bm25 + w_dense > 0 else 0.0


def rrf_rank(
    rankings: Mapping[str, Sequence[tuple[str, float, float]]],
    weights: Mapping[str, float] | None = None,
    k: int = 60,
) -> list[tuple[str, float, dict[str, int], dict[str, float], float]]:
    """The id-level core of :func:`rrf_fuse` (pure, no Hit objects).

    Args:
        rankings: Retriever name → ``(chunk_id, score, confidence)`` rows, best first.
        weights: Retriever name → weight (default 1.0).
        k: The RRF constant.

    Returns:
        ``(chunk_id, fused score, ranks, scores, confidence)`` for every distinct id, by fused score
        (ties by id).
    """
    if k < 0:
        raise ConfigError(f"the RRF constant k must be >= 0, got {k}")
    weights = dict(weights or {})
    _check_weights(weights)
    names = sorted(rankings)  # a fixed order makes float sums independent of the mapping's order
    w = {n: float(weights.get(n, 1.0)) for n in names}
    total_w = sum(w.values())
    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    fused: dict[str, float] = {}
    conf: dict[str, float] = {}
    for name in names:
        wn = w[name]
        for pos, (cid, score, c) in enumerate(rankings[name], start=1):
            r = ranks.get(cid)
            if r is None:
                r = ranks[cid] = {}
                scores[cid] = {}
                fused[cid] = 0.0
                conf[cid] = 0.0
            elif name in r:
                continue  # repeated within one list: its first (best) position counts
            r[name] = pos
            scores[cid][name] = score
            fused[cid] += wn / (k + pos)
            conf[cid] += wn * c
    order = sorted(fused, key=lambda cid: (-fused[cid], cid))
    return [
        (
            cid,
            fused[cid],
            ranks[cid],
            scores[cid],
            min(1.0, max(0.0, conf[cid] / total_w)) if total_w > 0 else 0.0,
        )
        for cid in order
    ]


def rrf_fuse(
    results: Mapping[str, Sequence[Hit]],
    weights: Mapping[str, float] | None = None,
    k: int = 60,
) -> list[Hit]:
    """Fuse ranked hit lists by weighted reciprocal rank.

    Args:
        results: Retriever name → its hits, best first. A chunk repeated within one list counts at its
            first (best) position.
        weights: Retriever name → weight (default 1.0 for every name).
        k: The RRF constant; larger values flatten the rank curve.

    Returns:
        Every distinct chunk once, by fused score (ties by chunk id). ``ranks``/``scores`` hold the
        1-based position and the score in each list that contained it; ``confidence`` is the
        weight-averaged confidence over all retrievers, 0 for those that missed the chunk; ``queries``
        is the sorted union of the input hits' queries.

    Raises:
        ConfigError: a negative weight or ``k < 0``.
    """
    chunks: dict[str, Chunk] = {}
    queries: dict[str, set[str]] = {}
    for name in sorted(results):
        for hit in results[name]:
            chunks.setdefault(hit.id, hit.chunk)
            queries.setdefault(hit.id, set()).update(hit.queries)
    rankings = {n: [(h.id, h.score, h.confidence) for h in hits] for n, hits in results.items()}
    return [
        Hit(
            chunk=chunks[cid],
            score=score,
            confidence=conf,
            ranks=ranks,
            scores=scores,
            queries=tuple(sorted(queries[cid])),
        )
        for cid, score, ranks, scores, conf in rrf_rank(rankings, weights, k)
    ]


class HybridRetriever:
    """BM25 and dense search run concurrently, fused with :func:`rrf_fuse`, with exact confidences.

    Args:
        bm25: The lexical retriever.
        dense: The dense retriever.
        weights: Fusion weights keyed ``"bm25"`` / ``"dense"``; also weight the confidence.
        rrf_k: The RRF constant.
        depth: Candidates taken from each retriever before fusion (at least the requested ``k``).
    """

    def __init__(
        self,
        bm25: BM25Retriever,
        dense: DenseRetriever,
        *,
        weights: Mapping[str, float] | None = None,
        rrf_k: int = 60,
        depth: int = 50,
    ) -> None:
        self.bm25 = bm25
        self.dense = dense
        self.weights = dict(weights) if weights is not None else {bm25.name: 1.0, dense.name: 1.0}
        _check_weights(self.weights)
        self.rrf_k = rrf_k
        self.depth = depth
        self._bm25_pos = {cid: i for i, cid in enumerate(bm25.index.chunk_ids)}

    def _lexical(
        self, query: str, depth: int, filters: Filters | None
    ) -> tuple[list[tuple[str, float, float]], npt.NDArray[np.float32], float]:
        all_scores, best = self.bm25.scores(query, filters)  # chunks that do not match score 0
        return self.bm25.index.top(all_scores, best, depth), all_scores, best

    def metadata_keys(self) -> frozenset[str] | None:
        """Every metadata key of the indexed chunks (a filter on another key is refused); ``None``: no chunks."""
        return self.bm25.metadata_keys()

    async def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """Return at most ``k`` fused hits, best first, each with both retrievers' provenance.

        With ``filters``, only chunks whose metadata matches are candidates (exact search on both sides).

        Raises:
            UnknownFilterKey: a filter key that no chunk has.
        """
        check_filter_keys(filters, self.metadata_keys())
        depth = max(k, self.depth)
        lexical: tuple[list[tuple[str, float, float]], npt.NDArray[np.float32], float] | None = None
        semantic: list[tuple[str, float]] = []
        vec = np.zeros(0, dtype=np.float32)

        async def run_lexical() -> None:
            nonlocal lexical
            lexical = await anyio.to_thread.run_sync(self._lexical, query, depth, filters)

        async def run_semantic() -> None:
            nonlocal semantic, vec
            vec = await self.dense.embed_query(query)
            if filters:
                semantic = await anyio.to_thread.run_sync(self.dense.search_filtered, vec, depth, filters)
            else:
                semantic = (await anyio.to_thread.run_sync(self.dense.index.search_sync, vec, depth))[0]

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_lexical)
            tg.start_soon(run_semantic)
        assert lexical is not None
        bm25_rows, all_scores, best = lexical
        # Confidence is filled in below from exact values, so the rows carry 0 here.
        rankings = {
            self.bm25.name: [(cid, score, 0.0) for cid, score, _ in bm25_rows],
            self.dense.name: [(cid, cos, 0.0) for cid, cos in semantic],
        }
        top = rrf_rank(rankings, self.weights, self.rrf_k)[:k]
        if not top:
            return []
        cosines = self.dense.index.vectors([row[0] for row in top]) @ vec
        wb = self.weights.get(self.bm25.name, 1.0)
        wd = self.weights.get(self.dense.name, 1.0)
        chunks = self.bm25.chunks
        hits = []
        for (cid, score, ranks, scores, _), cos in zip(top, cosines.tolist(), strict=True):
            i = self._bm25_pos.get(cid)
            bm25_score = float(all_scores[i]) if i is not None else 0.0
            conf = hybrid_confidence(
                bm25_score, best, cos, w_bm25=wb, w_dense=wd, low=self.dense.low, high=self.dense.high
            )
            hits.append(Hit(chunk=chunks[cid], score=score, confidence=conf, ranks=ranks, scores=scores))
        return hits
