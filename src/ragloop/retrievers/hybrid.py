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
from ragloop.state import Chunk, Hit

__all__ = ["HybridRetriever", "rrf_fuse"]


def _check_weights(weights: Mapping[str, float]) -> None:
    bad = {n: w for n, w in weights.items() if not w >= 0}
    if bad:
        raise ConfigError(f"fusion weights must be >= 0, got {bad}")


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
        weight-averaged confidence over all retrievers, 0 for those that missed the chunk.

    Raises:
        ConfigError: a negative weight or ``k < 0``.
    """
    if k < 0:
        raise ConfigError(f"the RRF constant k must be >= 0, got {k}")
    weights = dict(weights or {})
    _check_weights(weights)
    names = sorted(results)
    w = {n: float(weights.get(n, 1.0)) for n in names}
    total_w = sum(w.values())
    chunks: dict[str, Chunk] = {}
    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    conf: dict[str, float] = {}
    fused: dict[str, float] = {}
    queries: dict[str, set[str]] = {}
    for name in names:
        seen: set[str] = set()
        for pos, hit in enumerate(results[name], start=1):
            cid = hit.id
            if cid in seen:
                continue
            seen.add(cid)
            chunks.setdefault(cid, hit.chunk)
            ranks.setdefault(cid, {})[name] = pos
            scores.setdefault(cid, {})[name] = hit.score
            fused[cid] = fused.get(cid, 0.0) + w[name] / (k + pos)
            conf[cid] = conf.get(cid, 0.0) + w[name] * hit.confidence
            queries.setdefault(cid, set()).update(hit.queries)
    out = [
        Hit(
            chunk=chunks[cid],
            score=fused[cid],
            confidence=min(1.0, max(0.0, conf[cid] / total_w)) if total_w > 0 else 0.0,
            ranks=ranks[cid],
            scores=scores[cid],
            queries=tuple(sorted(queries[cid])),
        )
        for cid in fused
    ]
    out.sort(key=lambda h: (-h.score, h.id))
    return out


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
        depth: int = 100,
    ) -> None:
        self.bm25 = bm25
        self.dense = dense
        self.weights = dict(weights) if weights is not None else {bm25.name: 1.0, dense.name: 1.0}
        _check_weights(self.weights)
        self.rrf_k = rrf_k
        self.depth = depth
        pos = {cid: i for i, cid in enumerate(bm25.index.chunk_ids)}
        self._bm25_pos = pos

    def _bm25_side(self, query: str, depth: int) -> tuple[list[Hit], npt.NDArray[np.float32], float]:
        all_scores, best = self.bm25.index.scores(query)
        hits = self.bm25.to_hits(self.bm25.index.top(all_scores, best, depth))
        return hits, all_scores, best

    async def search(self, query: str, k: int = 10) -> list[Hit]:
        """Return at most ``k`` fused hits, best first, each with both retrievers' provenance."""
        depth = max(k, self.depth)
        got: dict[str, object] = {}

        async def lexical() -> None:
            got["bm25"] = await anyio.to_thread.run_sync(self._bm25_side, query, depth)

        async def semantic() -> None:
            vec = await self.dense.embed_query(query)
            got["vec"] = vec
            got["dense"] = await self.dense.search_vector(vec, depth)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lexical)
            tg.start_soon(semantic)
        bm25_hits, all_scores, best = got["bm25"]  # type: ignore[misc]
        dense_hits: list[Hit] = got["dense"]  # type: ignore[assignment]
        vec: npt.NDArray[np.float32] = got["vec"]  # type: ignore[assignment]
        fused = rrf_fuse({self.bm25.name: bm25_hits, self.dense.name: dense_hits}, self.weights, self.rrf_k)[:k]
        return self._with_confidence(fused, vec, all_scores, best)

    def _with_confidence(
        self,
        hits: list[Hit],
        vec: npt.NDArray[np.float32],
        all_scores: npt.NDArray[np.float32],
        best: float,
    ) -> list[Hit]:
        if not hits:
            return hits
        cosines = self.dense.index.vectors([h.id for h in hits]) @ vec
        wb = self.weights.get(self.bm25.name, 1.0)
        wd = self.weights.get(self.dense.name, 1.0)
        out = []
        for hit, cos in zip(hits, cosines.tolist(), strict=True):
            i = self._bm25_pos.get(hit.id)
            cb = min(1.0, float(all_scores[i]) / best) if best > 0 and i is not None else 0.0
            cd = cosine_confidence(cos, self.dense.low, self.dense.high)
            conf = (wb * cb + wd * cd) / (wb + wd) if wb + wd > 0 else 0.0
            out.append(
                Hit(
                    chunk=hit.chunk,
                    score=hit.score,
                    confidence=conf,
                    ranks=hit.ranks,
                    scores=hit.scores,
                    queries=hit.queries,
                )
            )
        return out
