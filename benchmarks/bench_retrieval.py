"""Retrieval benchmark: build time, memory and search latency of bm25, dense and hybrid search.

What it measures, per corpus size (10k and 100k synthetic chunks by default; 1M with ``--sizes``):

- build: wall time to embed (HashEmbedder, 384-dim, so the numbers are about the *indexes*, not a model)
  and index the chunks with :meth:`KnowledgeIndex.build`, the RSS growth of the process while doing it,
  and the bytes the saved index takes on disk;
- search: p50 / p95 latency of one query at a time through ``KnowledgeIndex.search`` for each mode
  (``k=10``; the serving path: one OpenMP thread, faiss and bm25 in a worker thread, query embedding
  included — for HashEmbedder that is ~50 µs; MiniLM adds its own per-query cost, printed separately
  when installed).

Synthetic chunks are 40–80 words drawn from a Zipf-distributed 30k-word vocabulary; queries are 3–6
words from the same distribution. Dense search is exact (``IndexFlatIP``) below ``--hnsw-threshold``
(default 50k, as in the library) and HNSW above, so 10k runs exact and 100k runs HNSW; ``--flat`` forces
exact search at every size to show what HNSW buys.

Targets at 100k chunks (p50): bm25 ≤ 1 ms, dense ≤ 1 ms, hybrid ≤ 3 ms. This script prints a table and
writes ``benchmarks/results/retrieval-<timestamp>.json``; it never asserts on time.

Usage::

    .venv/bin/python benchmarks/bench_retrieval.py                 # 10k and 100k
    .venv/bin/python benchmarks/bench_retrieval.py --sizes 10000   # quick
    .venv/bin/python benchmarks/bench_retrieval.py --sizes 1000000 # if memory and time allow
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.state import Chunk

RESULTS = Path(__file__).parent / "results"


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def synthetic(n: int, n_queries: int, seed: int = 0) -> tuple[list[Chunk], list[str]]:
    """``n`` chunks and ``n_queries`` queries of Zipf-distributed pseudo-words."""
    rng = np.random.default_rng(seed)
    vocab_size = 30_000
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "be", "da", "fi", "go", "hu", "je", "pa", "ze"]
    vocab = ["".join(syll[(i >> s) & 15] for s in range(0, 12, 4)) + str(i % 7 or "") for i in range(vocab_size)]
    p = 1.0 / np.arange(1, vocab_size + 1) ** 1.07
    p /= p.sum()
    lengths = rng.integers(40, 81, size=n)
    words = rng.choice(vocab_size, size=int(lengths.sum()), p=p)
    chunks, at = [], 0
    for i, length in enumerate(lengths.tolist()):
        text = " ".join(vocab[w] for w in words[at : at + length])
        at += length
        chunks.append(Chunk(id=f"s{i}", text=text, doc_id=f"d{i}"))
    qwords = rng.choice(vocab_size, size=n_queries * 6, p=p)
    qlens = rng.integers(3, 7, size=n_queries)
    queries = [" ".join(vocab[w] for w in qwords[i * 6 : i * 6 + q]) for i, q in enumerate(qlens.tolist())]
    return chunks, queries


def latency(index: KnowledgeIndex, queries: list[str], mode: str, k: int = 10) -> dict[str, float]:
    """p50/p95/mean milliseconds of single-query searches (after a short warm-up)."""

    async def run() -> list[float]:
        for q in queries[:20]:
            await index.search(q, k, mode)  # type: ignore[arg-type]
        times = []
        for q in queries:
            t = time.perf_counter()
            await index.search(q, k, mode)  # type: ignore[arg-type]
            times.append((time.perf_counter() - t) * 1000)
        return times

    times = anyio.run(run)
    qs = np.percentile(times, [50, 95])
    return {"p50_ms": float(qs[0]), "p95_ms": float(qs[1]), "mean_ms": statistics.fmean(times)}


def bench_size(n: int, n_queries: int, hnsw_threshold: int) -> dict[str, Any]:
    """Build, save and query an index of ``n`` synthetic chunks."""
    chunks, queries = synthetic(n, n_queries)
    embedder = HashEmbedder(384)
    before = rss_bytes()
    t = time.perf_counter()
    index = KnowledgeIndex.build(chunks, embedder, hnsw_threshold=hnsw_threshold)
    build_s = time.perf_counter() - t
    rss_delta = rss_bytes() - before
    tmp = Path(tempfile.mkdtemp(prefix="ragloop-bench-"))
    try:
        t = time.perf_counter()
        saved = index.save(tmp / "kb")
        save_s = time.perf_counter() - t
        disk = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
        t = time.perf_counter()
        KnowledgeIndex.load(saved, embedder)
        load_s = time.perf_counter() - t
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row: dict[str, Any] = {
        "chunks": n,
        "dense_kind": index.dense.kind,
        "build_s": build_s,
        "save_s": save_s,
        "load_s": load_s,
        "rss_delta_mb": rss_delta / 2**20,
        "index_disk_mb": disk / 2**20,
        "search": {m: latency(index, queries, m) for m in ("bm25", "dense", "hybrid")},
    }
    return row


def minilm_query_ms(n: int = 100) -> float | None:
    """p50 milliseconds to embed one short query with MiniLM (None when not installed)."""
    try:
        from ragloop.retrievers.embed import MiniLMEmbedder

        emb = MiniLMEmbedder(threads=1)
    except Exception:  # noqa: BLE001 — optional figure: MiniLM missing or unloadable here means "no figure"
        return None
    qs = [f"how do I configure feature number {i} of the product" for i in range(n)]
    emb.embed_sync(qs[:5])
    times = []
    for q in qs:
        t = time.perf_counter()
        emb.embed_sync([q])
        times.append((time.perf_counter() - t) * 1000)
    return float(np.percentile(times, 50))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--hnsw-threshold", type=int, default=50_000)
    parser.add_argument("--flat", action="store_true", help="exact dense search at every size")
    args = parser.parse_args()
    threshold = 2**62 if args.flat else args.hnsw_threshold
    rows = []
    for n in args.sizes:
        print(f"building {n:,} chunks …", flush=True)
        rows.append(bench_size(n, args.queries, threshold))
    mini = minilm_query_ms()
    header = (
        f"{'chunks':>9} {'dense':>5} {'build s':>8} {'RSS +MB':>8} {'disk MB':>8} "
        f"{'bm25 p50/p95 ms':>16} {'dense p50/p95 ms':>17} {'hybrid p50/p95 ms':>18}"
    )
    print(header)
    for r in rows:
        s = r["search"]
        cells = [f"{s[m]['p50_ms']:.2f}/{s[m]['p95_ms']:.2f}" for m in ("bm25", "dense", "hybrid")]
        print(
            f"{r['chunks']:>9,} {r['dense_kind']:>5} {r['build_s']:>8.1f} {r['rss_delta_mb']:>8.0f} "
            f"{r['index_disk_mb']:>8.0f} {cells[0]:>16} {cells[1]:>17} {cells[2]:>18}"
        )
    if mini is not None:
        print(f"MiniLM query embedding (1 thread), p50: {mini:.1f} ms — add it to dense/hybrid with MiniLM")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"retrieval-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "minilm_query_p50_ms": mini, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
