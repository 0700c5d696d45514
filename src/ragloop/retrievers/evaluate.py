"""Retrieval evaluation on BEIR-layout folders: nDCG@10, Recall@{2,5,10,100}, MRR@10, latency.

The metric definitions are BEIR's (which delegates to ``pytrec_eval``/trec_eval), with graded relevance
taken from the qrels and a document counting as relevant when its grade is at least 1:

- ``ndcg@10``: Σ_{i≤10} rel_i / log2(i + 1), over the same sum for the ideal ordering of the qrels;
- ``recall@k``: relevant documents in the top ``k`` / all relevant documents of the query;
- ``mrr@10``: 1 / rank of the first relevant document in the top 10 (0 when none).

Documents are ranked by score, ties broken by document id in *descending* order, as trec_eval does.
Each metric is averaged over the queries that have at least one relevant document; a query with no
results scores 0. Chunked corpora are scored per document: a document's score is the score of its best
chunk.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from ragloop.errors import ConfigError, IndexError_, InputError
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.index import KnowledgeIndex, Mode, check_index_target

__all__ = [
    "METRIC_KEYS",
    "evaluate_beir",
    "evaluate_run",
    "load_qrels",
    "load_queries",
    "mrr_at_k",
    "ndcg_at_k",
    "percentile",
    "rank_docs",
    "recall_at_k",
]

#: Keys of the dict :func:`evaluate_beir` returns, in display order.
METRIC_KEYS = (
    "ndcg@10",
    "recall@2",
    "recall@5",
    "recall@10",
    "recall@100",
    "mrr@10",
    "latency_ms_p50",
    "latency_ms_p95",
    "queries",
)

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def rank_docs(scores: Mapping[str, float]) -> list[str]:
    """Document ids by score, best first; ties by id, descending (trec_eval's order)."""
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def ndcg_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k with linear gains (trec_eval ``ndcg_cut``); 0 when the query has no relevant document."""
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    if idcg == 0:
        return 0.0
    dcg = sum(max(rels.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    return dcg / idcg


def recall_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    """Share of the query's relevant documents found in the top ``k``."""
    relevant = {d for d, r in rels.items() if r > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int = 10) -> float:
    """1 / rank of the first relevant document in the top ``k``, else 0."""
    for i, d in enumerate(ranked[:k], start=1):
        if rels.get(d, 0) > 0:
            return 1.0 / i
    return 0.0


def evaluate_run(run: Run, qrels: Qrels) -> dict[str, float]:
    """Mean nDCG@10, Recall@{2,5,10,100} and MRR@10 of ``run`` (query → doc → score) against ``qrels``.

    Averages over the queries of ``qrels`` with at least one relevant document; a query missing from
    ``run`` scores 0.
    """
    totals = dict.fromkeys(("ndcg@10", "recall@2", "recall@5", "recall@10", "recall@100", "mrr@10"), 0.0)
    judged = [q for q, rels in qrels.items() if any(r > 0 for r in rels.values())]
    for q in judged:
        rels = qrels[q]
        ranked = rank_docs(run.get(q, {}))
        totals["ndcg@10"] += ndcg_at_k(ranked, rels, 10)
        for k in (2, 5, 10, 100):
            totals[f"recall@{k}"] += recall_at_k(ranked, rels, k)
        totals["mrr@10"] += mrr_at_k(ranked, rels, 10)
    n = len(judged)
    return {key: (value / n if n else 0.0) for key, value in totals.items()}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation, as ``numpy.percentile``; 0 if empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def load_queries(folder: Path) -> dict[str, str]:
    """``queries.jsonl`` of a BEIR folder as query id → text."""
    path = folder / "queries.jsonl"
    if not path.is_file():
        raise InputError(f"no queries.jsonl in {folder}; pass a BEIR folder (corpus, queries.jsonl, qrels/)")
    out: dict[str, str] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                d = json.loads(line)
                out[str(d["_id"])] = str(d["text"])
    return out


def _pick_split(folder: Path, split: str | None) -> Path:
    qdir = folder / "qrels"
    found = sorted(p.stem for p in qdir.glob("*.tsv")) if qdir.is_dir() else []
    if not found:
        raise InputError(f"no qrels/*.tsv in {folder}; pass a BEIR folder with relevance judgments")
    if split is None:
        if len(found) == 1:
            split = found[0]
        elif "test" in found:
            split = "test"
        else:
            raise InputError(f"{folder} has several qrels splits ({', '.join(found)}); choose one with --split")
    if split not in found:
        raise InputError(f"no qrels split {split!r} in {folder}; available: {', '.join(found)}")
    return qdir / f"{split}.tsv"


def load_qrels(folder: Path, split: str | None = None) -> dict[str, dict[str, int]]:
    """``qrels/<split>.tsv`` of a BEIR folder as query id → doc id → grade (header line skipped)."""
    path = _pick_split(folder, split)
    out: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            parts = line.rstrip("\n").split("\t")
            if n == 0 and parts[0] == "query-id":
                continue
            if len(parts) < 3:
                continue
            out.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    return out


def _open_index(
    folder: Path,
    embedder: Embedder,
    index_dir: Path | None,
    progress: Callable[[int, int], None] | None,
) -> KnowledgeIndex:
    # The corpus file is what gets ingested: a cache may sit beside it in the BEIR folder, never over it.
    source = next((folder / n for n in ("corpus.jsonl", "corpus.jsonl.gz") if (folder / n).exists()), folder)
    if index_dir is not None:
        check_index_target(index_dir, source=source)  # refuse a bad cache folder before building anything
    if index_dir is not None and (index_dir / "manifest.json").is_file():
        try:
            return KnowledgeIndex.load(index_dir, embedder)
        except IndexError_:
            pass  # stale cache (other embedder, corrupt): rebuild below
    from ragloop.retrievers.ingest import ingest_path

    result = ingest_path(folder)
    index = KnowledgeIndex.build(result.chunks, embedder, progress=progress)
    if index_dir is not None:
        index.save(index_dir, source=source)
    return index


def evaluate_beir(
    folder: str | Path,
    split: str | None = None,
    mode: Mode = "hybrid",
    embedder: Embedder | None = None,
    *,
    index_dir: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    index: KnowledgeIndex | None = None,
) -> dict[str, Any]:
    """Index a BEIR folder's corpus (through :func:`~ragloop.retrievers.ingest.ingest_path`), run its
    queries and score them.

    Args:
        folder: BEIR folder: ``corpus.jsonl[.gz]``, ``queries.jsonl``, ``qrels/<split>.tsv``.
        split: Qrels split; by default the only one, else ``test``.
        mode: ``bm25``, ``dense`` or ``hybrid``.
        embedder: Embedder for the dense side; default :func:`~ragloop.retrievers.embed.default_embedder`
            (the cheap hash embedder for ``mode="bm25"``, whose results do not use vectors).
        index_dir: Cache the built index here and reuse it when it matches the embedder.
        progress: ``progress(done, total)`` while embedding the corpus.
        index: An already built index of this corpus (skips ingestion and ``index_dir``).

    Returns:
        A dict keyed by :data:`METRIC_KEYS`: the metrics, search latency p50/p95 in milliseconds (one
        query at a time, including query embedding), and the number of evaluated queries.
    """
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"no BEIR folder at {root}")
    qrels = load_qrels(root, split)
    queries = load_queries(root)
    missing = [q for q in qrels if q not in queries]
    if len(missing) == len(qrels):
        raise InputError(f"none of the qrels' query ids are in {root / 'queries.jsonl'}")
    qrels = {q: r for q, r in qrels.items() if q in queries}
    if index is None:
        if embedder is None:
            from ragloop.retrievers.embed import HashEmbedder, default_embedder

            embedder = HashEmbedder() if mode == "bm25" else default_embedder()
        index = _open_index(root, embedder, Path(index_dir) if index_dir is not None else None, progress)
    if mode not in ("bm25", "dense", "hybrid"):
        raise ConfigError(f"unknown mode {mode!r}; use bm25, dense or hybrid")
    retriever = index.retriever(mode)
    # Fetch extra chunks so that ~100 distinct documents remain after grouping chunks by document.
    depth = 150

    async def run_all() -> tuple[dict[str, dict[str, float]], list[float]]:
        run: dict[str, dict[str, float]] = {}
        latencies: list[float] = []
        qids = sorted(qrels)
        if qids:
            await retriever.search(queries[qids[0]], depth)  # warm-up, not timed
        for qid in qids:
            started = time.perf_counter()
            hits = await retriever.search(queries[qid], depth)
            latencies.append((time.perf_counter() - started) * 1000)
            docs: dict[str, float] = {}
            for hit in hits:
                doc = hit.chunk.doc_id or hit.id
                if hit.score > docs.get(doc, -math.inf):
                    docs[doc] = hit.score
            top = rank_docs(docs)[:100]
            run[qid] = {d: docs[d] for d in top}
        return run, latencies

    run, latencies = anyio.run(run_all)
    metrics: dict[str, Any] = evaluate_run(run, qrels)
    metrics["latency_ms_p50"] = percentile(latencies, 50)
    metrics["latency_ms_p95"] = percentile(latencies, 95)
    metrics["queries"] = sum(1 for rels in qrels.values() if any(r > 0 for r in rels.values()))
    return {key: metrics[key] for key in METRIC_KEYS}
