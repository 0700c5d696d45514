"""Quality: single-shot retrieval against the offline agentic turn, on a BEIR-layout folder.

Both arms search the same :class:`~ragloop.retrievers.index.KnowledgeIndex` of the folder's corpus (hybrid
mode: bm25s + dense, RRF-fused), built once with ``--embedder`` (MiniLM by default) and cached under
``--cache`` (``/tmp/ragloop-bench-quality``).

- **single_shot**: the question as one query, ``search(question, k=30)``; documents ranked by their best
  chunk's score (the ``ragloop eval`` convention), top 10 scored.
- **agentic**: ``ChatRAG.from_index(index)`` — the default turn with the offline judges (decide's topic
  splitting, grading, rewriting; no model, no network) — asked the question. Every ``search`` the turn makes
  is recorded. Its documents are ranked as: first the documents of the answer's context blocks, in block
  order (what the turn finally keeps and hands to the answerer); then every other document any of the turn's
  queries retrieved (original and rewritten, including hits the grader rejected), by its best fused score
  over those queries. Documents never retrieved are absent. The turn searches ``TurnSettings.k`` = 8 chunks
  per query, so with a single query its pool is 8 documents: recall@10 can then be below single-shot's by
  construction.

Metrics are :func:`ragloop.retrievers.evaluate.evaluate_run`'s (BEIR / trec_eval definitions): recall@2,
recall@5, recall@10 of the judged documents and nDCG@10, plus retrieval calls and wall seconds per question
(the agentic figure includes the offline judges). The full report — also ``kept_only`` recall (blocks only,
no backfill) and a diagnosis of where the judged documents were lost (not retrieved, graded irrelevant, cut
from the blocks), and how often decide split the question and a rewrite found a judged document — goes to
``benchmarks/results/quality-<folder>.json``.

Usage::

    python benchmarks/bench_quality.py --beir ../shared/data/hotpotqa-dev200 --split dev
    python benchmarks/bench_quality.py --beir ../shared/data/scifact-train --split train --json

With ``--json`` it prints one object ``{"single_shot": {...}, "agentic": {...}}``, each keyed ``recall@2``,
``recall@5``, ``recall@10``, ``ndcg@10``, ``retrieval_calls_per_question``, ``seconds_per_question``.
It never asserts anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from ragloop.retrievers.evaluate import evaluate_run, load_qrels, load_queries, rank_docs

RESULTS = Path(__file__).parent / "results"
KEYS = ("recall@2", "recall@5", "recall@10", "ndcg@10", "retrieval_calls_per_question", "seconds_per_question")


class Recording:
    """A retriever wrapper that keeps every search's query and hits (for the agentic arm's ranking)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[Any]]] = []

    async def search(self, query: str, k: int = 10) -> Sequence[Any]:
        hits = list(await self.inner.search(query, k))
        self.calls.append((query, hits))
        return hits


def open_index(folder: Path, embedder_name: str, cache: Path) -> Any:
    """The folder's index, built once and cached under ``cache``."""
    from ragloop.errors import IndexError_
    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path

    embedder = MiniLMEmbedder() if embedder_name == "minilm" else HashEmbedder()
    target = cache / f"{folder.resolve().name}-{embedder.name}"
    if (target / "manifest.json").is_file():
        try:
            return KnowledgeIndex.load(target, embedder)
        except IndexError_:
            pass
    t = time.perf_counter()
    index = KnowledgeIndex.build(ingest_path(folder).chunks, embedder)
    index.save(target)
    print(f"built index of {len(index.chunks)} chunks in {time.perf_counter() - t:.0f}s → {target}", file=sys.stderr)
    return index


def doc_of(index: Any, chunk_id: str) -> str:
    chunk = index.chunk(chunk_id)
    return (chunk.doc_id or chunk.id) if chunk is not None else chunk_id


def best_by_doc(index: Any, hits: Sequence[Any]) -> dict[str, float]:
    docs: dict[str, float] = {}
    for hit in hits:
        doc = hit.chunk.doc_id or hit.id
        if hit.score > docs.get(doc, -math.inf):
            docs[doc] = hit.score
    return docs


def as_run(order: Sequence[str]) -> dict[str, float]:
    """A ranked list as a run whose scores reproduce the order."""
    return {doc: float(len(order) - i) for i, doc in enumerate(order)}


async def single_shot(index: Any, queries: dict[str, str], qids: list[str]) -> tuple[dict[str, Any], float]:
    retriever = index.retriever("hybrid")
    await retriever.search(queries[qids[0]], 30)  # warm-up
    run: dict[str, dict[str, float]] = {}
    t = time.perf_counter()
    for qid in qids:
        docs = best_by_doc(index, await retriever.search(queries[qid], 30))
        run[qid] = as_run(rank_docs(docs)[:10])
    return run, (time.perf_counter() - t) / len(qids)


async def agentic(
    index: Any, queries: dict[str, str], qids: list[str], qrels: dict[str, dict[str, int]]
) -> tuple[dict[str, Any], dict[str, Any], float, float, list[dict[str, Any]]]:
    from ragloop.chat import ChatRAG

    rag = ChatRAG.from_index(index)
    node: Any = rag.nodes["retrieve"]
    recording = Recording(node.retriever)
    node.retriever = recording
    await rag.ask(queries[qids[0]])  # warm-up
    run: dict[str, dict[str, float]] = {}
    kept: dict[str, dict[str, float]] = {}
    calls: list[int] = []
    seconds: list[float] = []
    rows: list[dict[str, Any]] = []
    for qid in qids:
        recording.calls.clear()
        t = time.perf_counter()
        reply = await rag.ask(queries[qid])
        seconds.append(time.perf_counter() - t)
        calls.append(len(recording.calls))
        block_docs = list(dict.fromkeys(doc_of(index, b.chunk_id) for b in reply.blocks))
        pool: dict[str, float] = {}
        for _, hits in recording.calls:
            for doc, score in best_by_doc(index, hits).items():
                pool[doc] = max(score, pool.get(doc, -math.inf))
        rest = [d for d in rank_docs(pool) if d not in block_docs]
        run[qid] = as_run([*block_docs, *rest][:10])
        kept[qid] = as_run(block_docs[:10])
        rows.append(diagnose(index, qid, qrels[qid], reply, recording.calls, block_docs))
    await rag.aclose()
    return run, kept, sum(calls) / len(calls), statistics.mean(seconds), rows


def diagnose(
    index: Any, qid: str, rels: dict[str, int], reply: Any, calls: list[tuple[str, list[Any]]], block_docs: list[str]
) -> dict[str, Any]:
    """Where each judged document went in one turn."""
    record = reply.record
    gold = {d for d, r in rels.items() if r > 0}
    first = record.decision.queries
    found_by: dict[str, set[str]] = {}
    for query, hits in calls:
        for hit in hits:
            found_by.setdefault(hit.chunk.doc_id or hit.id, set()).add(query)
    labels: dict[str, str] = {}
    order = {"relevant": 0, "partial": 1, "irrelevant": 2}
    for g in record.grades:
        doc = doc_of(index, g.chunk_id)
        if doc not in labels or order[g.label] < order[labels[doc]]:
            labels[doc] = g.label
    fates = {}
    for doc in gold:
        if doc in block_docs:
            fates[doc] = "in_blocks"
        elif doc not in found_by:
            fates[doc] = "not_retrieved"
        elif doc in labels:
            fates[doc] = f"graded_{labels[doc]}_not_kept" if labels[doc] != "irrelevant" else "graded_irrelevant"
        else:
            fates[doc] = "retrieved_not_graded"
    return {
        "qid": qid,
        "decide_queries": len(first),
        "queries": [q for q, _ in calls],
        "rewrites": len([r for r in record.rewrites if r.accepted]),
        "fast_path": record.fast_path,
        "outcome": reply.outcome,
        "gold_fates": fates,
        "gold_found_only_by_rewrite": sum(1 for d in gold if d in found_by and not (found_by[d] & set(first))),
    }


def summarise_diagnosis(rows: list[dict[str, Any]]) -> dict[str, Any]:
    fates = Counter(f for r in rows for f in r["gold_fates"].values())
    total = sum(fates.values()) or 1
    return {
        "questions": len(rows),
        "split_into_2plus_queries": sum(r["decide_queries"] > 1 for r in rows) / len(rows),
        "mean_decide_queries": statistics.mean(r["decide_queries"] for r in rows),
        "with_accepted_rewrite": sum(r["rewrites"] > 0 for r in rows) / len(rows),
        "fast_path": sum(r["fast_path"] for r in rows) / len(rows),
        "outcomes": dict(Counter(r["outcome"] for r in rows)),
        "gold_fate_share": {k: v / total for k, v in fates.most_common()},
        "gold_found_only_by_rewrite": sum(r["gold_found_only_by_rewrite"] for r in rows),
        "gold_docs": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", required=True, type=Path, help="BEIR folder: corpus.jsonl[.gz], queries, qrels/")
    parser.add_argument("--split", default=None, help="qrels split (default: the only one, else test)")
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ragloop-bench-quality"))
    parser.add_argument("--limit", type=int, default=None, help="first N judged questions only (quick runs)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/quality-<name>.json)")
    parser.add_argument("--json", action="store_true", help="print {single_shot, agentic} as one JSON object")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    qrels = {q: r for q, r in load_qrels(args.beir, args.split).items() if any(v > 0 for v in r.values())}
    queries = load_queries(args.beir)
    qids = sorted(q for q in qrels if q in queries)[: args.limit]
    qrels = {q: qrels[q] for q in qids}
    index = open_index(args.beir, args.embedder, args.cache)

    async def both() -> Any:
        ss = await single_shot(index, queries, qids)
        ag = await agentic(index, queries, qids, qrels)
        return ss, ag

    (ss_run, ss_seconds), (ag_run, kept_run, ag_calls, ag_seconds, rows) = anyio.run(both)
    report: dict[str, Any] = {}
    for name, run, calls, secs in (
        ("single_shot", ss_run, 1.0, ss_seconds),
        ("agentic", ag_run, ag_calls, ag_seconds),
    ):
        m = evaluate_run(run, qrels)
        report[name] = {
            "recall@2": m["recall@2"],
            "recall@5": m["recall@5"],
            "recall@10": m["recall@10"],
            "ndcg@10": m["ndcg@10"],
            "retrieval_calls_per_question": calls,
            "seconds_per_question": secs,
        }
    kept = evaluate_run(kept_run, qrels)
    full = {
        **report,
        "agentic_kept_only": {k: kept[k] for k in ("recall@2", "recall@5", "recall@10", "ndcg@10")},
        "diagnosis": summarise_diagnosis(rows),
        "dataset": str(args.beir.name),
        "split": args.split,
        "questions": len(qids),
        "embedder": index.embedder.name,
        "chunks": len(index.chunks),
        "machine": f"{platform.machine()} {platform.system()}, shared CPUs",
        "per_question": rows,
    }
    out = args.out or RESULTS / f"quality-{args.beir.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print(f"{args.beir.name} ({len(qids)} questions, {len(index.chunks)} chunks, {index.embedder.name}, hybrid)")
    print(f"{'':<14}" + "".join(f"{k.replace('_per_question', '/q'):>18}" for k in KEYS))
    for name in ("single_shot", "agentic"):
        print(f"{name:<14}" + "".join(f"{report[name][k]:>18.3f}" for k in KEYS))
    print(f"{'kept only':<14}" + "".join(f"{full['agentic_kept_only'][k]:>18.3f}" for k in KEYS[:4]))
    print("diagnosis:", json.dumps(full["diagnosis"], indent=1))


if __name__ == "__main__":
    main()
