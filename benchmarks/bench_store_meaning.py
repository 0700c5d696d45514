"""What a Postgres collection's dense threshold per scope costs (``retrievers/postgres/_meaning.py``): memory kept,
time and memory per measurement, on a real PostgreSQL 16 + pgvector (the ``pgserver`` wheel).

The collection holds two tenants, MiniLM-embedded: FastAPI's docs (``tenant=fastapi``) and Redis's
(``tenant=redis``), from ``../shared/data`` (``--limit`` chunks of each for a smoke run). It is loaded once and
kept in ``--pgdata``. Then, in this process:

- ``prepare_corpus``: its time, the memory the corpus keeps (tracemalloc, after a collection), and of that what
  the meaning keeps (each chunk's key and headings, measured alone), beside what holding every vector would cost
  (chunks × dim × 4 bytes);
- ``keep_headings`` per tenant, timed: what a sync does last, keeping the vectors of the headings the whole
  collection's scale and the tenant's ask in the collection's ``_headings`` table (nothing to embed when the
  kept collection already holds them);
- for each scope (the whole collection, each tenant, in that order), the scale measured twice: the first time looks
  up its headings among the kept ones (and embeds any not kept), the second reads its vectors and calibrates only;
  then the vector read alone. Beside the first time, the same scale's first time without kept headings
  (``first_s_without_kept_headings``: a meaning built without the lookup, which embeds every heading it asks, as
  before the table existed), measured just before it, and whether the two scales are equal. Times are taken with
  tracemalloc off (it slows every allocation); a third measurement and a second read, under tracemalloc, give the
  most memory each held at once (the scope's vectors, dropped after).

It asserts nothing; it prints one JSON object and writes ``benchmarks/results/bench_store_meaning.json``.

Usage: ``python benchmarks/bench_store_meaning.py [--limit N] [--pgdata DIR] [--fresh] [--out PATH]``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import anyio

from ragloop.retrievers.embed import MiniLMEmbedder
from ragloop.retrievers.ingest import ingest_path
from ragloop.retrievers.postgres import PostgresStore
from ragloop.retrievers.postgres._meaning import COLUMNS, StoreMeaning, keep_headings
from ragloop.retrievers.scope import Scope

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).parents[1] / ".." / "shared" / "data"
TENANTS = {"fastapi": "fastapi-docs", "redis": "redis-docs"}


def _mb(n: float) -> float:
    return round(n / 2**20, 2)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def _fill(url: str, collection: str, embedder: MiniLMEmbedder, limit: int | None) -> dict[str, Any]:
    async with PostgresStore(url, embedder, collection=collection) as store:
        if (await store.info()).chunks:
            return {"cached": True}
        loaded: dict[str, Any] = {}
        for tenant, folder in TENANTS.items():
            chunks = ingest_path(DATA / folder).chunks[:limit]
            print(f"loading {len(chunks)} chunks of {folder} …", file=sys.stderr)
            t0 = time.perf_counter()
            await store.sync(chunks, scope={"tenant": tenant})
            loaded[tenant] = {"chunks": len(chunks), "s": round(time.perf_counter() - t0, 1)}
        return loaded


async def _keep(url: str, collection: str) -> dict[str, Any]:
    """What each tenant's sync does last (``keep_headings``), timed: it embeds and keeps the headings the whole
    collection's scale and the tenant's ask (nothing on a second run: they are kept)."""
    out: dict[str, Any] = {}
    async with PostgresStore(url, collection=collection) as store:
        for tenant in TENANTS:
            t0 = time.perf_counter()
            embedded = await keep_headings(store, Scope.of({"tenant": tenant}))
            out[tenant] = {"embedded": embedded, "s": round(time.perf_counter() - t0, 3)}
    return out


async def _prepare(url: str, collection: str) -> tuple[Any, dict[str, Any]]:
    store = PostgresStore(url, collection=collection, create=False)
    await store.prepare(texts=False)  # the schema check and the embedder, out of the timings
    t0 = time.perf_counter()
    await store.prepare_corpus()
    took = time.perf_counter() - t0
    tracemalloc.start()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    corpus = await store.prepare_corpus()
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    # what the meaning keeps, alone: the rows it is built from, then only what it holds once they are gone
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    rows = await store._prepare(COLUMNS)
    meaning = StoreMeaning.of(store.url, store._t["chunks"], rows, store.embedder, str)
    del rows
    gc.collect()
    meaning_kept = tracemalloc.get_traced_memory()[0] - base
    del meaning
    tracemalloc.stop()
    await store.aclose()
    dim = store.embedder.dim
    return corpus, {
        "chunks": len(corpus),
        "s": round(took, 3),
        "corpus_kept_mb": _mb(kept),
        "meaning_kept_mb": _mb(meaning_kept),
        "meaning_kept_bytes_per_chunk": round(meaning_kept / max(1, len(corpus))),
        "vectors_if_kept_mb": _mb(len(corpus) * dim * 4),
    }


def _timed(fn: Any) -> tuple[Any, float]:
    """``fn()`` and its seconds (tracemalloc off: it slows every allocation)."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def _peak(fn: Any) -> float:
    """The most memory (MB) ``fn()`` held at once beyond what was held before (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return _mb(peak)


def _scopes(corpus: Any, dim: int, bare: Any) -> dict[str, Any]:
    vectors = corpus.meaning._scales._vectors  # the store's StoredVectors: the read alone
    corpus.meaning._scales._embed(["warm up"])  # MiniLM's query session compiled before any timing
    out: dict[str, Any] = {}
    for name, filters in (("all", None), *((t, {"tenant": (t,)}) for t in TENANTS)):
        positions = corpus.visible(filters) if filters else None
        embedding, first_embedding = _timed(lambda p=positions: bare(p))
        scale, first = _timed(lambda p=positions: corpus.meaning(p))
        _, again = _timed(lambda p=positions: corpus.meaning(p))
        ids = [str(i) for i in (positions if positions is not None else range(len(corpus)))]
        _, read = _timed(lambda ids=ids: vectors(ids))
        out[name] = {
            "chunks": len(ids),
            "threshold": scale.threshold if scale else None,
            "questions": scale.questions if scale else 0,
            "first_s": first,
            "first_s_without_kept_headings": first_embedding,
            "same_scale_without_kept_headings": embedding == scale,
            "again_s": again,
            "read_vectors_s": read,
            "again_peak_mb": _peak(lambda p=positions: corpus.meaning(p)),
            "read_vectors_peak_mb": _peak(lambda ids=ids: vectors(ids)),
            "vectors_mb": _mb(len(ids) * dim * 4),
            "load": _load(),
        }
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from bench_store import start_server

    server = start_server(Path(args.pgdata), fresh=args.fresh)
    url = server.get_uri()
    collection = "meaning" if args.limit is None else f"meaning{args.limit}"
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/bench_store_meaning.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_at_start": _load(),
    }
    try:
        report["load"] = await _fill(url, collection, MiniLMEmbedder(), args.limit)
        report["keep_headings"] = await _keep(url, collection)
        corpus, report["prepare_corpus"] = await _prepare(url, collection)
        store = PostgresStore(url, collection=collection, create=False)
        try:
            rows = await store._prepare(COLUMNS)
        finally:
            await store.aclose()
        bare = StoreMeaning.of(url, store._t["chunks"], rows, store.embedder, str)  # no kept headings
        report["scopes"] = await anyio.to_thread.run_sync(lambda: _scopes(corpus, 384, bare))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=None, help="chunks of each tenant's docs (a smoke run)")
    p.add_argument(
        "--pgdata",
        default=str(Path(tempfile.gettempdir()) / "ragloop-bench-meaning-pg"),
        help="the server's data folder, kept between runs (the loaded collection is reused)",
    )
    p.add_argument("--fresh", action="store_true", help="delete --pgdata first and load everything again")
    p.add_argument("--out", default=str(RESULTS / "bench_store_meaning.json"))
    args = p.parse_args()
    report = anyio.run(main_async, args)
    print(json.dumps(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
