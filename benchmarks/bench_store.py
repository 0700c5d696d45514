"""The Postgres store against the local index and against the raw SQL the engine needs.

Runs a real PostgreSQL 16 + pgvector (the ``pgserver`` wheel) and measures:

1. **Quality** on a BEIR folder (SciFact train by default) with MiniLM: the corpus is loaded into a fresh
   collection (``PostgresStore.sync``: every chunk embedded; this is the *full rebuild*), the local
   ``KnowledgeIndex`` is built from the very same vectors (recorded while the store embedded them), and
   both answer every judged query with hybrid search under ``ragloop eval``'s protocol (150 chunks, documents
   ranked by their best chunk): nDCG@10, recall@10/100, MRR@10 side by side, and how many queries get the
   same top-10 documents from both. ``--skip-quality`` leaves it out.
2. **Updates**: 1 % of the documents (seeded) get a sentence appended; ``sync`` then replaces only those
   documents, embedding only their changed chunks. Seconds and chunks embedded, against the full rebuild;
   the same for the local index (``update_index``).
3. **Latency at scale, beside the engine**: collections of ``--sizes`` chunks (the corpus's chunks repeated
   under new document ids, each copy made distinct by one extra word, every document given a ``tenant`` (one
   of 100, ~1 % of the chunks each) and a ``group`` (one of 4); 384-dim hash-embedder vectors, so 100k chunks
   do not take an hour of MiniLM). In one run, interleaved query by query (the order rotating):

   - ``store``: ``PostgresStore.search`` (hybrid, k=10, query embedding included);
   - ``raw-or``: the reference, hand-written SQL on a pool of its own, one prepared statement and one round
     trip per search: pgvector k-NN on the HNSW index and Postgres full-text ranking (``ts_rank_cd`` over the
     store's ``tsv`` column, GIN index) of chunks holding *any* query word (the store's and the local index's
     semantics), the two top-``depth`` lists fused by RRF in SQL, the top-k rows with text and metadata;
   - ``raw-and``: the same with chunks holding *every* query word (``plainto_tsquery``'s semantics, as in
     pgvector's hybrid-search example; a different, narrower search, for reference);
   - ``local``: the local index's hybrid search on the same chunks (``--no-local`` skips it).

   Then ``--concurrency`` searches at a time through a pool of ``--pool-size`` connections, store and raw-or
   in turn for ``--rounds`` rounds; and filtered searches (one tenant, one group): latency and the share that
   filled k, with the store scoring by the filtered chunks' own BM25 statistics (the default, issue 30) beside
   the same store scoring by the collection's (``store, collection statistics``).
4. **Where the time goes**, per search: the statements (round trips) the server ran and their server time
   (from the server's statement log, switched on for a short pass), this process's CPU, the server's CPU (all
   backends), and, in the concurrent runs, the pool's wait per connection request.

The 1-minute load average is recorded beside every figure (the machine may be shared). The server's data
folder (``--pgdata``) is kept between runs, and a collection that already holds the wanted chunks is reused
(``--fresh`` starts over): building 100k chunks takes minutes.

Usage::

    python benchmarks/bench_store.py --beir ../shared/data/scifact-train --split train
    nice python benchmarks/bench_store.py --skip-quality --sizes 10000 100000 --out benchmarks/results/X.json

Writes ``benchmarks/results/bench_store.json`` (and ``.txt``, the table; ``--json`` prints the report
instead). Prints medians and ratios and never asserts anything.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import numpy as np
import numpy.typing as npt

from ragloop.errors import RetrievalError
from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
from ragloop.retrievers.evaluate import evaluate_run, load_qrels, load_queries, percentile, rank_docs
from ragloop.retrievers.index import KnowledgeIndex, index_text
from ragloop.retrievers.ingest import chunk_id, ingest_path
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
    store: PostgresStore,
    local: KnowledgeIndex,
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    budgets: Sequence[tuple[str, int, float]] = (),
) -> dict[str, Any]:
    """nDCG@10 etc. of the local index and the store, and of the store under each lexical budget
    (``(label, lexical_budget, lexical_share)``, searched on the same collection)."""
    retriever = local.retriever("hybrid")
    stores: dict[str, PostgresStore] = {"postgres": store}
    for label, budget, share in budgets:
        stores[f"postgres {label}"] = PostgresStore(
            store.url, store.embedder, collection=store.collection, lexical_budget=budget, lexical_share=share
        )
    runs: dict[str, dict[str, dict[str, float]]] = {"local": {}, **{name: {} for name in stores}}
    same_top10 = 0
    try:
        for qid in sorted(qrels):
            local_docs = _docs_of(await retriever.search(queries[qid], 150))
            runs["local"][qid] = local_docs
            for name, s in stores.items():
                runs[name][qid] = _docs_of(await s.search(queries[qid], 150))
            same_top10 += rank_docs(local_docs)[:10] == rank_docs(runs["postgres"][qid])[:10]
    finally:
        for name, s in stores.items():
            if name != "postgres":
                await s.aclose()
    out: dict[str, Any] = {name: evaluate_run(run, qrels) for name, run in runs.items()}
    out["queries"] = len(qrels)
    out["same_top10_docs"] = same_top10
    out["ndcg@10_difference"] = abs(out["local"]["ndcg@10"] - out["postgres"]["ndcg@10"])
    out["budgets"] = {label: {"lexical_budget": b, "lexical_share": sh} for label, b, sh in budgets}
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


#: Bump when _scaled changes what it makes: a cached collection of another recipe is rebuilt.
RECIPE = "copies+tenant100+group4 v1"


def _scaled(chunks: Sequence[Chunk], size: int) -> list[Chunk]:
    """``size`` chunks: copies of the corpus under new document ids, each copy distinct by one word; every
    document has a ``tenant`` (one of 100) and a ``group`` (one of 4) by a stable hash of its id."""
    out: list[Chunk] = []
    copy = 0
    while len(out) < size:
        for c in chunks:
            if len(out) >= size:
                break
            if copy == 0:
                text, doc = c.text, c.doc_id
            else:
                text, doc = f"{c.text} copy{copy}", f"{c.doc_id}~{copy}"
            h = zlib.crc32(doc.encode())
            meta = {**c.meta(), "tenant": f"t{h % 100}", "group": f"g{(h // 100) % 4}"}
            out.append(attrs.evolve(c, text=text, id=chunk_id(text), doc_id=doc, metadata=meta))
        copy += 1
    return out


async def _drop_collection(url: str, name: str) -> None:
    """Remove a collection's tables and its ragloop_schema row (the quality phase times a fresh build)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for suffix in ("chunks", "postings", "docs", "terms", "stats", "keys"):
            await conn.execute(f"drop table if exists {name}_{suffix}")
        if await (await conn.execute("select to_regclass('ragloop_schema')")).fetchone() != (None,):
            await conn.execute("delete from ragloop_schema where collection = %s", (name,))


async def _cached(url: str, name: str, size: int) -> bool:
    """Whether collection ``name`` already holds the ``size`` chunks of this :data:`RECIPE`."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("create table if not exists bench_recipe (collection text primary key, recipe text)")
        row = await (await conn.execute("select recipe from bench_recipe where collection = %s", (name,))).fetchone()
        if row is None or row[0] != f"{RECIPE} size={size}":
            return False
        n = await (await conn.execute(f"select count(*) from {name}_chunks")).fetchone()
        return n is not None and n[0] == size


async def _mark_cached(url: str, name: str, size: int) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "insert into bench_recipe values (%s, %s) on conflict (collection) do update set recipe = excluded.recipe",
            (name, f"{RECIPE} size={size}"),
        )


RAW_SQL = """
with knn as materialized (
    select doc_id, chunk_id, row_number() over (order by dist) as r from (
        select doc_id, chunk_id, embedding <=> %(vec)s as dist from {chunks} where {where}
        order by embedding <=> %(vec)s limit %(depth)s
    ) s
),
lex as materialized (
    select doc_id, chunk_id, row_number() over (order by rank desc, chunk_id) as r from (
        select doc_id, chunk_id, ts_rank_cd(tsv, q) as rank from {chunks}, cast(%(tsq)s as tsquery) q
        where tsv @@ q and {where} order by rank desc, chunk_id limit %(depth)s
    ) s
),
fused as (
    select doc_id, chunk_id, coalesce(1.0 / (%(rrf)s + knn.r), 0) + coalesce(1.0 / (%(rrf)s + lex.r), 0) as score
    from knn full join lex using (doc_id, chunk_id) order by score desc, chunk_id limit %(k)s
)
select c.doc_id, c.chunk_id, c.text, c.source, c.title, c.title_path, c.url, c.metadata, f.score
from fused f join {chunks} c using (doc_id, chunk_id) order by f.score desc, c.chunk_id
"""


def _load() -> float:
    """The 1-minute load average, printed beside every figure."""
    return round(os.getloadavg()[0], 2)


def _tsquery(tokens: Sequence[str], op: str) -> str:
    """A ``tsquery`` literal of the store's own tokens joined by ``|`` (any word) or ``&`` (every word)."""
    quoted = ["'" + t.replace("\\", "\\\\").replace("'", "''") + "'" for t in dict.fromkeys(tokens)]
    return f" {op} ".join(quoted) or "''"


class RawSearch:
    """The reference: the same hybrid search as one hand-written prepared statement, one round trip."""

    def __init__(self, pool: Any, store: PostgresStore, op: str) -> None:
        self.pool, self.store, self.op = pool, store, op
        self.chunks = f"{store.collection}_chunks"

    async def search(self, query: str, k: int = 10, filters: dict[str, tuple[str, ...]] | None = None) -> list[Any]:
        vec = np.asarray((await self.store.embedder.embed([query]))[0], dtype=np.float32)
        params: dict[str, Any] = {
            "vec": vec,
            "tsq": _tsquery(self.store.tokenizer(query), self.op),
            "depth": self.store.depth,
            "rrf": self.store.rrf_k,
            "k": k,
        }
        where = "true"
        if filters:
            ((key, (value,)),) = filters.items()
            where = "metadata @> %(f)s::jsonb"
            params["f"] = json.dumps({key: value})
        sql = RAW_SQL.format(chunks=self.chunks, where=where)
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql, params, prepare=True)
            return await cur.fetchall()


async def _raw_pool(url: str, size: int, ef_search: int) -> Any:
    """A pool of ``size`` connections for the reference query: the store's session settings, no checks."""
    from pgvector.psycopg import register_vector_async
    from psycopg_pool import AsyncConnectionPool

    async def configure(conn: Any) -> None:
        await register_vector_async(conn)
        await conn.execute(f"set hnsw.ef_search = {int(ef_search)}")
        await conn.execute("set max_parallel_workers_per_gather = 0")

    pool: Any = AsyncConnectionPool(
        url,
        min_size=size,
        max_size=size,
        kwargs={"autocommit": True, "application_name": "ragloop-raw"},
        configure=configure,
        open=False,
    )
    await pool.open(wait=True, timeout=30)
    return pool


def _server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of every process of the server (postmaster's children)."""
    import psutil

    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 3), "p95": round(percentile(values, 95), 3)}


Search = Callable[[str], Awaitable[Any]]


async def _side_by_side(methods: dict[str, Search], queries: Sequence[str]) -> dict[str, Any]:
    """Every query through every method, the order rotating query by query; per method p50/p95 ms."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    load = [_load()]
    for i, q in enumerate(queries):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            started = time.perf_counter()
            await methods[name](q)
            times[name].append((time.perf_counter() - started) * 1000)
    load.append(_load())
    return {"ms": {n: _ms(t) for n, t in times.items()}, "load": load, "searches": len(queries)}


async def _cpu_pass(search: Search, queries: Sequence[str], pid: int) -> dict[str, Any]:
    """One method alone, sequentially: wall, this process's CPU and the server's CPU per search."""
    n = len(queries)
    load0, cpu0, srv0, t0 = _load(), time.process_time(), _server_cpu_s(pid), time.perf_counter()
    for q in queries:
        await search(q)
    wall, cpu, srv = time.perf_counter() - t0, time.process_time() - cpu0, _server_cpu_s(pid) - srv0
    return {
        "wall_ms_per_search": round(wall * 1000 / n, 3),
        "client_cpu_ms_per_search": round(cpu * 1000 / n, 3),
        "server_cpu_ms_per_search": round(srv * 1000 / n, 3),
        "load": [load0, _load()],
    }


_LOG_LINE = re.compile(
    r"^(?P<app>[^|\n]*)\|LOG:\s+duration: (?P<ms>[\d.]+) ms\s+(?P<kind>statement|parse|bind|execute)",
    re.M,
)


async def _statement_pass(url: str, log: Path, searches: dict[str, tuple[str, Search]], queries: Sequence[str]) -> Any:
    """Per method (application name, search): statements and round trips per search and their server time,
    read from the server's log with ``log_min_duration_statement = 0`` on for this pass only."""
    import psycopg

    out: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        for name, (app, search) in searches.items():
            await admin.execute("alter system set log_line_prefix = '%a|'")
            await admin.execute("alter system set log_min_duration_statement = 0")
            await admin.execute("select pg_reload_conf()")
            await anyio.sleep(0.3)
            offset = log.stat().st_size
            for q in queries:
                await search(q)
            await admin.execute("alter system reset log_min_duration_statement")
            await admin.execute("alter system reset log_line_prefix")
            await admin.execute("select pg_reload_conf()")
            await anyio.sleep(0.3)
            with log.open("rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
            kinds: dict[str, int] = {}
            server_ms = 0.0
            for m in _LOG_LINE.finditer(text.replace("\r", "")):
                if m["app"] != app:
                    continue
                kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
                server_ms += float(m["ms"])
            n = len(queries)
            out[name] = {
                # Each statement or extended-protocol execute is one round trip (psycopg syncs after each).
                "round_trips_per_search": round((kinds.get("statement", 0) + kinds.get("execute", 0)) / n, 2),
                "log_lines_per_search": {kind: round(c / n, 2) for kind, c in sorted(kinds.items())},
                "server_ms_per_search": round(server_ms / n, 3),
                "searches": n,
            }
    return out


async def _concurrent(search: Search, queries: Sequence[str], concurrency: int, pool: Any, pid: int) -> dict[str, Any]:
    """``concurrency`` workers sharing ``queries``: per-search p50/p95, throughput, CPU and the pool's waits."""
    lat: list[float] = []
    errors: list[str] = []
    todo = list(queries)
    pool.pop_stats()

    async def worker() -> None:
        while todo:
            q = todo.pop()
            started = time.perf_counter()
            try:
                await search(q)
            except RetrievalError as exc:  # counted, not fatal: the report says how many failed and why
                errors.append(str(exc)[:200])
                continue
            lat.append((time.perf_counter() - started) * 1000)

    load0, cpu0, srv0, t0 = _load(), time.process_time(), _server_cpu_s(pid), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    wall, cpu, srv = time.perf_counter() - t0, time.process_time() - cpu0, _server_cpu_s(pid) - srv0
    stats = pool.pop_stats()
    n = max(1, len(lat) + len(errors))
    return {
        "latencies": lat,
        "wall_s": wall,
        "errors": errors,
        "client_cpu_ms_per_search": cpu * 1000 / n,
        "server_cpu_ms_per_search": srv * 1000 / n,
        "pool_wait_ms_per_request": stats.get("requests_wait_ms", 0) / max(1, stats.get("requests_num", 1)),
        "pool_requests_queued": stats.get("requests_queued", 0),
        "load": [load0, _load()],
    }


def _merge_rounds(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for r in runs for x in r["latencies"]]
    n = len(lat) + sum(len(r["errors"]) for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    mean = lambda key: round(sum(r[key] for r in runs) / len(runs), 3)  # noqa: E731
    return {
        "ms": _ms(lat),
        "searches_per_s": round(n / wall, 1) if wall else None,
        "errors": sum(len(r["errors"]) for r in runs),
        "error_samples": [e for r in runs for e in r["errors"]][:3],
        "client_cpu_ms_per_search": mean("client_cpu_ms_per_search"),
        "server_cpu_ms_per_search": mean("server_cpu_ms_per_search"),
        "pool_wait_ms_per_request": mean("pool_wait_ms_per_request"),
        "load": [x for r in runs for x in r["load"]],
    }


async def _filtered(
    methods: dict[str, Callable[[str, dict[str, tuple[str, ...]]], Awaitable[Any]]],
    queries: Sequence[str],
    filters: dict[str, tuple[str, ...]],
    k: int,
) -> dict[str, Any]:
    """Filtered searches side by side: p50/p95 ms and the share of searches that returned ``k`` rows."""
    names = list(methods)
    times: dict[str, list[float]] = {n: [] for n in names}
    full: dict[str, int] = dict.fromkeys(names, 0)
    load = [_load()]
    for i, q in enumerate(queries):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            started = time.perf_counter()
            rows = await methods[name](q, filters)
            times[name].append((time.perf_counter() - started) * 1000)
            full[name] += len(rows) >= k
    load.append(_load())
    return {
        "filters": {key: list(v) for key, v in filters.items()},
        "ms": {n: _ms(t) for n, t in times.items()},
        "filled_k_share": {n: round(full[n] / len(queries), 3) for n in names},
        "load": load,
    }


async def _scale_run(
    url: str,
    pid: int,
    log: Path,
    store: PostgresStore,
    local: KnowledgeIndex | None,
    queries: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Everything measured on one collection (see the module docstring, items 3 and 4)."""
    pool = await _raw_pool(url, args.pool_size, max(store.ef_search, store.depth))
    try:
        raw_or, raw_and = RawSearch(pool, store, "|"), RawSearch(pool, store, "&")
        methods: dict[str, Search] = {
            "store": lambda q: store.search(q, 10),
            "raw-or": lambda q: raw_or.search(q, 10),
            "raw-and": lambda q: raw_and.search(q, 10),
        }
        if local is not None:
            methods["local"] = lambda q: local.search(q, 10)
        for q in queries[:10]:  # warm-up: connections, prepared statements, caches
            for search in methods.values():
                await search(q)
        out: dict[str, Any] = {"single": await _side_by_side(methods, queries)}
        few = queries[: args.profile_queries]
        compared = ("store", "raw-or", "raw-and")
        out["cpu"] = {name: await _cpu_pass(methods[name], few, pid) for name in compared}
        apps = {"store": "ragloop", "raw-or": "ragloop-raw", "raw-and": "ragloop-raw"}
        out["statements"] = await _statement_pass(url, log, {n: (apps[n], methods[n]) for n in compared}, few)
        pools = {"store": store._pool, "raw-or": pool, "raw-and": pool}  # a benchmark may read the store's pool
        for name in compared:  # warm-up: the store's pool grows to its size (the reference's starts full)
            await _concurrent(methods[name], queries[: 2 * args.concurrency], args.concurrency, pools[name], pid)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in compared}
        for r in range(args.rounds):
            for name in compared[r % 3 :] + compared[: r % 3]:
                runs[name].append(await _concurrent(methods[name], queries, args.concurrency, pools[name], pid))
        out["concurrent"] = {name: _merge_rounds(rs) for name, rs in runs.items()}
        exact = PostgresStore(
            url, store.embedder, collection=store.collection, pool_size=2, exact_knn_max=10**9, create=False
        )
        # issue 30's "before": a filtered search scored with the whole collection's BM25 statistics
        shared = PostgresStore(url, store.embedder, collection=store.collection, scope_statistics=False, create=False)
        fil = {
            "store": lambda q, f: store.search(q, 10, f),
            "store, collection statistics": lambda q, f: shared.search(q, 10, f),
            "store, exact k-NN forced": lambda q, f: exact.search(q, 10, f),
            "raw-or": lambda q, f: raw_or.search(q, 10, f),
        }
        few = queries[: args.filtered_queries]
        try:
            out["filtered"] = {
                "tenant": await _filtered(fil, few, {"tenant": ("t7",)}, 10),
                "group": await _filtered(fil, few, {"group": ("g1",)}, 10),
            }
        finally:
            await exact.aclose()
            await shared.aclose()
        single = out["single"]["ms"]
        out["ratios"] = {
            "store_minus_raw_or_p50_ms": round(single["store"]["p50"] - single["raw-or"]["p50"], 3),
            "store_over_raw_or_p95": round(single["store"]["p95"] / single["raw-or"]["p95"], 3),
            "store_concurrent_p50_over_single_p50": round(
                out["concurrent"]["store"]["ms"]["p50"] / single["store"]["p50"], 2
            ),
            "raw_or_concurrent_p50_over_single_p50": round(
                out["concurrent"]["raw-or"]["ms"]["p50"] / single["raw-or"]["p50"], 2
            ),
            "store_minus_raw_and_p50_ms": round(single["store"]["p50"] - single["raw-and"]["p50"], 3),
            "store_over_raw_and_p95": round(single["store"]["p95"] / single["raw-and"]["p95"], 3),
            "raw_and_concurrent_p50_over_single_p50": round(
                out["concurrent"]["raw-and"]["ms"]["p50"] / single["raw-and"]["p50"], 2
            ),
        }
        return out
    finally:
        await pool.close()


def _save(report: dict[str, Any], out: Path) -> None:
    """Write the report so far (a long run keeps what it measured if a later phase is stopped)."""
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


async def _vectors_of(url: str, name: str, chunks: Sequence[Chunk], embedder: RecordingEmbedder) -> None:
    """Give ``embedder`` the stored vector of every chunk (a cached collection: the local index needs them)."""
    import psycopg
    from pgvector.psycopg import register_vector_async

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await register_vector_async(conn)
        rows = await (await conn.execute(f"select chunk_id, embedding from {name}_chunks")).fetchall()
    by_id = {r[0]: np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], dtype=np.float32) for r in rows}
    for c in chunks:
        embedder.seen[index_text(c)] = by_id[c.id]


def _budgets(specs: Sequence[str]) -> list[tuple[str, int, float]]:
    """``BUDGET:SHARE`` strings as ``(label, lexical_budget, lexical_share)``."""
    out = []
    for spec in specs:
        budget, _, share = spec.partition(":")
        out.append((f"budget {spec}", int(budget), float(share or 0)))
    return out


async def _quality_phase(
    url: str,
    chunks: Sequence[Chunk],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    args: argparse.Namespace,
    report: dict[str, Any],
) -> None:
    """Items 1 and 2 of the module docstring (with ``--reuse-quality``, a cached collection: no build, no
    update)."""
    name, size = "quality", len(chunks)
    embedder = RecordingEmbedder(MiniLMEmbedder())
    cached = args.reuse_quality and await _cached(url, name, size)
    if not cached:
        await _drop_collection(url, name)
    async with PostgresStore(
        url, embedder, collection=name, pool_size=args.pool_size, statement_timeout_s=args.timeout
    ) as store:
        if cached:
            print(f"quality: {size} chunks cached; reading their vectors …", file=sys.stderr)
            await _vectors_of(url, name, chunks, embedder)
        else:
            print(f"full build: {size} chunks, embedding with {embedder.name} …", file=sys.stderr)
            full = await store.sync(chunks)
            await _mark_cached(url, name, size)
        started = time.perf_counter()
        local = await anyio.to_thread.run_sync(lambda: KnowledgeIndex.build(chunks, embedder))
        local_assemble_s = time.perf_counter() - started
        print(f"quality (load {_load()}) …", file=sys.stderr)
        report["quality"] = await _quality(store, local, queries, qrels, _budgets(args.budgets))
        report["quality"]["load"] = _load()
        if cached:
            report["update"] = {"cached": True}
            return
        edited, n_docs = _edit(chunks, args.edit_share, args.seed)
        before = embedder.computed
        upd = await store.sync(edited)
        store_embedded = embedder.computed - before
        await store.sync(chunks)  # back to the corpus as built (the vectors are known), for --reuse-quality
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


def start_server(pgdata: Path, *, fresh: bool = False) -> Any:
    """A real PostgreSQL with pgvector (the ``pgserver`` wheel) on ``pgdata``, emptied first when ``fresh``;
    stopped when the process exits."""
    import pgserver

    if fresh:
        shutil.rmtree(pgdata, ignore_errors=True)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    beir = Path(args.beir)
    queries = load_queries(beir)
    qrels = {q: r for q, r in load_qrels(beir, args.split).items() if q in queries}
    chunks = list(ingest_path(beir).chunks)
    pgdata = Path(args.pgdata)
    server = start_server(pgdata, fresh=args.fresh)
    url, pid = server.get_uri(), server.get_pid()
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
            await _quality_phase(url, chunks, queries, qrels, args, report)
        hash_embedder = HashEmbedder(384)
        query_texts = [queries[q] for q in sorted(qrels)][: args.queries]
        report["scale"] = {}
        for size in args.sizes:
            data = _scaled(chunks, size)
            name = f"scale{size}"
            cached = await _cached(url, name, size)
            async with PostgresStore(
                url, hash_embedder, collection=name, pool_size=args.pool_size, statement_timeout_s=args.timeout
            ) as store:
                if cached:
                    print(f"{size} chunks: cached in {pgdata}", file=sys.stderr)
                    load: dict[str, Any] = {"cached": True}
                else:
                    print(f"loading {size} chunks …", file=sys.stderr)
                    load = {**(await store.sync(data, prune=True)).as_dict(), "load": [_load()]}
                    await _mark_cached(url, name, size)
                local = None
                if not args.no_local:
                    local = await anyio.to_thread.run_sync(functools.partial(KnowledgeIndex.build, data, hash_embedder))
                print(f"searching at {size} (load {_load()}) …", file=sys.stderr)
                run = await _scale_run(url, pid, pgdata / "log", store, local, query_texts, args)
                report["scale"][str(size)] = {
                    "load": load,
                    "local_dense": local.dense.kind if local else None,
                    **run,
                }
                _save(report, Path(args.out))
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
    return report


def _table(r: dict[str, Any]) -> str:
    lines = [f"bench_store on {r['corpus']} ({r['documents']} documents, {r['chunks']} chunks)", ""]
    q = r.get("quality")
    if q:
        names = ["local", "postgres", *(f"postgres {b}" for b in q.get("budgets", {}))]
        lines.append(f"quality, hybrid, {q['queries']} queries (load {q.get('load', '?')}): " + " | ".join(names))
        for key in ("ndcg@10", "recall@10", "recall@100", "mrr@10"):
            lines.append(f"  {key:<12} " + "  ".join(f"{q[n][key]:.4f}" for n in names))
        lines.append(
            f"  nDCG@10 difference {q['ndcg@10_difference']:.4f}; same top-10 documents on "
            f"{q['same_top10_docs']}/{q['queries']} queries"
        )
        u = r["update"]
    if q and not u.get("cached"):
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
        lines += _scale_table(size, s)
    return "\n".join(lines)


def _scale_table(size: str, s: dict[str, Any]) -> list[str]:
    load = s["load"]
    built = "cached" if load.get("cached") else f"loaded in {load['seconds']:.0f} s"
    one, conc, rat = s["single"], s["concurrent"], s["ratios"]
    lines = [
        "",
        f"{size} chunks (hash-384 vectors, {built}), k=10; load average beside each figure",
        f"  one at a time, interleaved ({one['searches']} searches each; load {one['load'][0]}–{one['load'][1]}):",
    ]
    for name, ms in one["ms"].items():
        lines.append(f"    {name:<8} p50 {ms['p50']:8.2f} ms   p95 {ms['p95']:8.2f} ms")
    lines.append(
        f"    store − raw-or p50 {rat['store_minus_raw_or_p50_ms']:+.2f} ms; store / raw-or p95 "
        f"{rat['store_over_raw_or_p95']:.2f}×"
    )
    if "store_minus_raw_and_p50_ms" in rat:
        lines.append(
            f"    store − raw-and p50 {rat['store_minus_raw_and_p50_ms']:+.2f} ms; store / raw-and p95 "
            f"{rat['store_over_raw_and_p95']:.2f}×"
        )
    lines.append("  where the time goes, per search (one method at a time):")
    for name, c in s["cpu"].items():
        st = s["statements"].get(name, {"round_trips_per_search": "?", "server_ms_per_search": float("nan")})
        lines.append(
            f"    {name:<8} wall {c['wall_ms_per_search']:.2f} ms, client CPU {c['client_cpu_ms_per_search']:.2f} ms, "
            f"server CPU {c['server_cpu_ms_per_search']:.2f} ms, {st['round_trips_per_search']} round trips, "
            f"server time {st['server_ms_per_search']:.2f} ms (load {c['load'][0]}–{c['load'][1]})"
        )
    lines.append("  concurrent through the pool:")
    for name, c in conc.items():
        lines.append(
            f"    {name:<8} p50 {c['ms']['p50']:8.2f} ms   p95 {c['ms']['p95']:8.2f} ms   {c['searches_per_s']}/s, "
            f"pool wait {c['pool_wait_ms_per_request']:.1f} ms, client CPU {c['client_cpu_ms_per_search']:.2f} ms, "
            f"server CPU {c['server_cpu_ms_per_search']:.2f} ms per search, {c['errors']} failed "
            f"(load {min(c['load'])}–{max(c['load'])})"
        )
    lines.append(
        f"    concurrent p50 / single p50: store {rat['store_concurrent_p50_over_single_p50']}×, raw-or "
        f"{rat['raw_or_concurrent_p50_over_single_p50']}×"
        + (
            f", raw-and {rat['raw_and_concurrent_p50_over_single_p50']}×"
            if "raw_and_concurrent_p50_over_single_p50" in rat
            else ""
        )
    )
    for label, f in s["filtered"].items():
        lines.append(f"  filtered by {label} {f['filters']} (load {f['load'][0]}–{f['load'][1]}):")
        for name, ms in f["ms"].items():
            lines.append(
                f"    {name:<8} p50 {ms['p50']:8.2f} ms   p95 {ms['p95']:8.2f} ms   filled k on "
                f"{f['filled_k_share'][name]:.0%}"
            )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--beir", default="../shared/data/scifact-train")
    p.add_argument("--split", default="train")
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000])
    p.add_argument("--queries", type=int, default=300, help="queries for the latency runs")
    p.add_argument("--profile-queries", type=int, default=50, help="queries for the CPU and statement passes")
    p.add_argument("--filtered-queries", type=int, default=100, help="queries for each filtered run")
    p.add_argument("--rounds", type=int, default=2, help="concurrent rounds per method (alternating order)")
    p.add_argument("--no-local", action="store_true", help="leave out the local index's reference latency")
    p.add_argument(
        "--pgdata",
        default=str(Path(tempfile.gettempdir()) / "ragloop-bench-store-pg"),
        help="the server's data folder, kept between runs (the built collections are reused)",
    )
    p.add_argument("--fresh", action="store_true", help="delete --pgdata first and build everything again")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--pool-size", type=int, default=10)
    p.add_argument("--timeout", type=float, default=30.0, help="statement timeout of every search, seconds")
    p.add_argument("--edit-share", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=14)
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument(
        "--reuse-quality", action="store_true", help="reuse a cached quality collection (no build or update timing)"
    )
    p.add_argument(
        "--budgets",
        nargs="*",
        default=[],
        help="also search the quality collection under these lexical budgets, BUDGET:SHARE (e.g. 0:0.02)",
    )
    p.add_argument("--out", default=str(RESULTS / "bench_store.json"))
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead of the table")
    args = p.parse_args()
    report = anyio.run(main_async, args)
    text = _table(report)
    print(json.dumps(report) if args.json else text)
    out = Path(args.out)
    _save(report, out)
    out.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
