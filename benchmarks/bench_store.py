"""The Postgres store against the local index: quality, latency at scale, and in-place updates.

Runs a real PostgreSQL 16 + pgvector (the ``pgserver`` wheel) in a temporary folder and measures:

1. **Quality** on a BEIR folder (SciFact train by default) with MiniLM: the corpus is loaded into a fresh
   collection (``PostgresStore.sync``: every chunk embedded; this is the *full rebuild*), the local
   ``KnowledgeIndex`` is built from the very same vectors (recorded while the store embedded them), and
   both answer every judged query with hybrid search under ``ragloop eval``'s protocol (150 chunks, documents
   ranked by their best chunk): nDCG@10, recall@10/100, MRR@10 side by side, and how many queries get the
   same top-10 documents from both.
2. **Updates**: 1 % of the documents (seeded) get a sentence appended; ``sync`` then replaces only those
   documents, embedding only their changed chunks. Seconds and chunks embedded, against the full rebuild;
   the same for the local index (``update_index``).
3. **Latency at scale**: collections of ``--sizes`` chunks (the corpus's chunks repeated under new document
   ids, each copy made distinct by one extra word; 384-dim vectors from the hash embedder, so building
   100k chunks does not take an hour of MiniLM), ``--queries`` sequential hybrid searches (k=10, p50/p95
   ms, query embedding included), then ``--concurrency`` searches at a time through a pool of
   ``--pool-size`` connections (per-search p50/p95 and searches/s), and the local index's hybrid search on
   the same chunks for reference.

Usage::

    python benchmarks/bench_store.py --beir ../shared/data/scifact-train --split train

Writes ``benchmarks/results/bench_store.json`` (and ``.txt``, the printed table). Prints medians and ratios
and never asserts anything.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np
import numpy.typing as npt

from ragloop.errors import RetrievalError
from ragloop.retrievers.chunking import chunk_id
from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
from ragloop.retrievers.evaluate import evaluate_run, load_qrels, load_queries, percentile, rank_docs
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from ragloop.retrievers.postgres import PostgresStore
from ragloop.retrievers.update import update_index
from ragloop.state import Chunk

RESULTS = Path(__file__).parent / "results"


class RecordingEmbedder:
    """Wraps an embedder: remembers every vector by text and counts the texts it really embedded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.dim: int = inner.dim
        self.seen: dict[str, npt.NDArray[np.float32]] = {}
        self.computed = 0

    def embed_sync(self, texts: Sequence[str], progress: Any = None) -> npt.NDArray[np.float32]:
        missing = list(dict.fromkeys(t for t in texts if t not in self.seen))
        if missing:
            vecs = np.asarray(self.inner.embed_sync(missing), dtype=np.float32)
            self.computed += len(missing)
            self.seen.update(zip(missing, vecs, strict=True))
        return np.stack([self.seen[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return await anyio.to_thread.run_sync(self.embed_sync, texts)


def _docs_of(hits: Sequence[Any]) -> dict[str, float]:
    docs: dict[str, float] = {}
    for hit in hits:
        doc = hit.chunk.doc_id or hit.id
        if hit.score > docs.get(doc, -math.inf):
            docs[doc] = hit.score
    return {d: docs[d] for d in rank_docs(docs)[:100]}


async def _quality(
    store: PostgresStore, local: KnowledgeIndex, queries: dict[str, str], qrels: dict[str, dict[str, int]]
) -> dict[str, Any]:
    retriever = local.retriever("hybrid")
    runs: dict[str, dict[str, dict[str, float]]] = {"local": {}, "postgres": {}}
    same_top10 = 0
    for qid in sorted(qrels):
        local_docs = _docs_of(await retriever.search(queries[qid], 150))
        store_docs = _docs_of(await store.search(queries[qid], 150))
        runs["local"][qid] = local_docs
        runs["postgres"][qid] = store_docs
        same_top10 += rank_docs(local_docs)[:10] == rank_docs(store_docs)[:10]
    out: dict[str, Any] = {name: evaluate_run(run, qrels) for name, run in runs.items()}
    out["queries"] = len(qrels)
    out["same_top10_docs"] = same_top10
    out["ndcg@10_difference"] = abs(out["local"]["ndcg@10"] - out["postgres"]["ndcg@10"])
    return out


def _edit(chunks: Sequence[Chunk], share: float, seed: int) -> tuple[list[Chunk], int]:
    """Append a sentence to the last chunk of ``share`` of the documents (seeded); returns chunks, docs edited."""
    docs = sorted({c.doc_id for c in chunks})
    chosen = set(random.Random(seed).sample(docs, max(1, round(len(docs) * share))))
    last = {c.doc_id: c.id for c in chunks}
    out = []
    for c in chunks:
        if c.doc_id in chosen and last[c.doc_id] == c.id:
            text = c.text + " This finding was revised after a later replication study."
            c = attrs.evolve(c, text=text, id=chunk_id(text))
        out.append(c)
    return out, len(chosen)


def _scaled(chunks: Sequence[Chunk], size: int) -> list[Chunk]:
    """``size`` chunks: copies of the corpus under new document ids, each copy distinct by one word."""
    out: list[Chunk] = []
    copy = 0
    while len(out) < size:
        for c in chunks:
            if len(out) >= size:
                break
            if copy == 0:
                out.append(c)
            else:
                text = f"{c.text} copy{copy}"
                out.append(attrs.evolve(c, text=text, id=chunk_id(text), doc_id=f"{c.doc_id}~{copy}"))
        copy += 1
    return out


async def _latency(store: PostgresStore, local: KnowledgeIndex, queries: list[str], concurrency: int) -> dict[str, Any]:
    for q in queries[:5]:  # warm-up: pool connections, caches
        await store.search(q, 10)
        await local.search(q, 10)
    seq: list[float] = []
    for q in queries:
        started = time.perf_counter()
        await store.search(q, 10)
        seq.append((time.perf_counter() - started) * 1000)
    loc: list[float] = []
    for q in queries:
        started = time.perf_counter()
        await local.search(q, 10)
        loc.append((time.perf_counter() - started) * 1000)
    conc: list[float] = []
    errors: list[str] = []
    todo = list(queries)

    async def worker() -> None:
        while todo:
            q = todo.pop()
            started = time.perf_counter()
            try:
                await store.search(q, 10)
            except RetrievalError as exc:  # counted, not fatal: the report says how many failed and why
                errors.append(str(exc)[:200])
                continue
            conc.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    wall = time.perf_counter() - started
    return {
        "postgres_sequential_ms": {"p50": percentile(seq, 50), "p95": percentile(seq, 95)},
        "local_sequential_ms": {"p50": percentile(loc, 50), "p95": percentile(loc, 95)},
        f"postgres_{concurrency}_concurrent_ms": {"p50": percentile(conc, 50), "p95": percentile(conc, 95)},
        f"postgres_{concurrency}_concurrent_searches_per_s": len(conc) / wall,
        "searches": len(queries),
        f"postgres_{concurrency}_concurrent_errors": len(errors),
        "errors": errors[:5],
    }


def _save(report: dict[str, Any], out: Path) -> None:
    """Write the report so far (a long run keeps what it measured if a later phase is stopped)."""
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import pgserver

    beir = Path(args.beir)
    queries = load_queries(beir)
    qrels = {q: r for q, r in load_qrels(beir, args.split).items() if q in queries}
    chunks = list(ingest_path(beir).chunks)
    root = Path(tempfile.mkdtemp(prefix="ragloop-bench-store-"))
    root.chmod(0o755)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(root / "data", cleanup_mode="stop")  # type: ignore[attr-defined]
    url = server.get_uri()
    report: dict[str, Any] = {
        "corpus": str(beir),
        "split": args.split,
        "documents": len({c.doc_id for c in chunks}),
        "chunks": len(chunks),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/bench_store.py", *sys.argv[1:]]),
        "load_average_at_start": os.getloadavg(),
    }
    try:
        if not args.skip_quality:
            embedder = RecordingEmbedder(MiniLMEmbedder())
            async with PostgresStore(
                url, embedder, collection="quality", pool_size=args.pool_size, statement_timeout_s=args.timeout
            ) as store:
                print(f"full build: {len(chunks)} chunks, embedding with {embedder.name} …", file=sys.stderr)
                full = await store.sync(chunks)
                started = time.perf_counter()
                local = await anyio.to_thread.run_sync(lambda: KnowledgeIndex.build(chunks, embedder))
                local_assemble_s = time.perf_counter() - started
                print("quality …", file=sys.stderr)
                report["quality"] = await _quality(store, local, queries, qrels)
                edited, n_docs = _edit(chunks, args.edit_share, args.seed)
                before = embedder.computed
                upd = await store.sync(edited)
                store_embedded = embedder.computed - before
                before = embedder.computed
                started = time.perf_counter()
                _, local_upd = await anyio.to_thread.run_sync(lambda: update_index(local, edited))
                local_update_s = time.perf_counter() - started
                report["update"] = {
                    "documents_edited": n_docs,
                    "edit_share": args.edit_share,
                    "postgres_full_build": full.as_dict(),
                    "postgres_update": {**upd.as_dict(), "embedder_calls_texts": store_embedded},
                    "postgres_update_speedup": full.seconds / upd.seconds if upd.seconds else None,
                    "local_update": {**local_upd.as_dict(), "seconds": local_update_s},
                    "local_assemble_seconds": local_assemble_s,
                }
                _save(report, Path(args.out))
        hash_embedder = RecordingEmbedder(HashEmbedder(384))
        query_texts = [queries[q] for q in sorted(qrels)][: args.queries]
        report["scale"] = {}
        for size in args.sizes:
            data = _scaled(chunks, size)
            name = f"scale{size}"
            async with PostgresStore(
                url, hash_embedder, collection=name, pool_size=args.pool_size, statement_timeout_s=args.timeout
            ) as store:
                print(f"loading {size} chunks …", file=sys.stderr)
                load = await store.sync(data)
                local = await anyio.to_thread.run_sync(functools.partial(KnowledgeIndex.build, data, hash_embedder))
                print(f"searching at {size} …", file=sys.stderr)
                lat = await _latency(store, local, query_texts, args.concurrency)
                report["scale"][str(size)] = {"load": load.as_dict(), "local_dense": local.dense.kind, **lat}
                _save(report, Path(args.out))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    return report


def _table(r: dict[str, Any]) -> str:
    lines = [f"bench_store on {r['corpus']} ({r['documents']} documents, {r['chunks']} chunks)", ""]
    q = r.get("quality")
    if q:
        lines.append(f"quality, hybrid, {q['queries']} queries     local    postgres")
        for key in ("ndcg@10", "recall@10", "recall@100", "mrr@10"):
            lines.append(f"  {key:<32} {q['local'][key]:.4f}   {q['postgres'][key]:.4f}")
        lines.append(
            f"  nDCG@10 difference {q['ndcg@10_difference']:.4f}; same top-10 documents on "
            f"{q['same_top10_docs']}/{q['queries']} queries"
        )
        u = r["update"]
        full, upd = u["postgres_full_build"], u["postgres_update"]
        lines += [
            "",
            f"update after editing {u['documents_edited']} documents ({u['edit_share']:.0%}):",
            f"  postgres full build   {full['seconds']:8.1f} s, {full['embedded']} chunks embedded",
            f"  postgres --update     {upd['seconds']:8.1f} s, {upd['embedded']} embedded, {upd['reused']} reused, "
            f"{upd['changed']} documents replaced (x{u['postgres_update_speedup']:.0f} faster)",
            f"  local --update        {u['local_update']['seconds']:8.1f} s, {u['local_update']['embedded']} embedded",
        ]
    for size, s in r.get("scale", {}).items():
        c = next(k for k in s if k.endswith("_concurrent_ms"))
        n = c.split("_")[1]
        lines += [
            "",
            f"{size} chunks (hash-384 vectors; load {s['load']['seconds']:.0f} s):",
            f"  postgres hybrid, one at a time   p50 {s['postgres_sequential_ms']['p50']:.2f} ms  "
            f"p95 {s['postgres_sequential_ms']['p95']:.2f} ms",
            f"  postgres hybrid, {n} concurrent   p50 {s[c]['p50']:.2f} ms  p95 {s[c]['p95']:.2f} ms  "
            f"({s[f'postgres_{n}_concurrent_searches_per_s']:.0f} searches/s, "
            f"{s.get(f'postgres_{n}_concurrent_errors', 0)} failed)",
            f"  local hybrid ({s['local_dense']}), one at a time  p50 {s['local_sequential_ms']['p50']:.2f} ms  "
            f"p95 {s['local_sequential_ms']['p95']:.2f} ms",
        ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--beir", default="../shared/data/scifact-train")
    p.add_argument("--split", default="train")
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    p.add_argument("--queries", type=int, default=300, help="queries for the latency runs")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--pool-size", type=int, default=10)
    p.add_argument("--timeout", type=float, default=30.0, help="statement timeout of every search, seconds")
    p.add_argument("--edit-share", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "bench_store.json"))
    args = p.parse_args()
    report = anyio.run(main_async, args)
    text = _table(report)
    print(text)
    out = Path(args.out)
    _save(report, out)
    out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
