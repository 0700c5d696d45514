"""Writing a collection: sync by document hash, one transaction per document, term statistics kept exact."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ragloop._redact import hide_credentials, hide_password
from ragloop.errors import PruneRefused, StoreUnavailable
from ragloop.retrievers.embed import embed_batched
from ragloop.retrievers.index import index_text
from ragloop.retrievers.postgres._common import _APP, Store, as_array, psycopg_module, tsvector
from ragloop.retrievers.scope import Scope
from ragloop.retrievers.update import (
    SyncSummary,
    check_removals,
    content_hash,
    diff_documents,
    document_hash,
    group_documents,
)
from ragloop.state import Chunk

if TYPE_CHECKING:
    from psycopg import AsyncConnection


@asynccontextmanager
async def scope_lock(store: Store, scope: Scope) -> AsyncIterator[None]:
    """Hold the advisory lock of ``scope`` in this collection (on a connection of its own) while the block runs:
    two syncs of one scope take turns, syncs of different scopes do not wait for each other."""
    psycopg = psycopg_module()
    try:
        conn = await psycopg.AsyncConnection.connect(store.url, autocommit=True, fallback_application_name=_APP)
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"cannot connect to {hide_password(store.url)}: {hide_credentials(str(exc), store.url)}"
        ) from exc
    async with conn:
        key = (f"ragloop:{store.collection}", scope.label)
        await conn.execute("select pg_advisory_lock(hashtext(%s), hashtext(%s))", key)
        yield


async def sync(  # noqa: PLR0913 — the options of PostgresStore.sync, which documents them
    store: Store,
    chunks: Iterable[Chunk],
    *,
    scope: Scope,
    delete_missing: bool,
    prune: bool,
    max_removed: float,
    dry_run: bool,
    progress: Callable[[int, int], None] | None,
    bulk_threshold: int,
) -> SyncSummary:
    """:meth:`~ragloop.retrievers.postgres.PostgresStore.sync`."""
    started = time.perf_counter()
    docs = group_documents(scope.apply(chunks))
    async with AsyncExitStack() as stack:
        if not dry_run:
            await stack.enter_async_context(scope_lock(store, scope))
        stored = await store.document_hashes(scope)
        diff = diff_documents(docs, stored, delete_missing=delete_missing)
        where = f"collection {store.collection}"
        refusal = ""
        try:
            check_removals(len(diff.removed), len(stored), scope=scope, where=where, prune=prune, max_share=max_removed)
        except PruneRefused as exc:
            if not dry_run:
                raise
            refusal = str(exc)  # a dry run reports it
        adopted = await legacy_documents(store, scope, diff.added)
        todo = [c for d in (*diff.added, *diff.changed) for c in docs[d]]
        hashes = sorted({content_hash(c) for c in todo})
        known = await stored_vectors(store, hashes)
        missing = [h for h in hashes if h not in known]
        n_before = (await store.info()).chunks
        if dry_run:
            return SyncSummary.of(
                diff,
                embedded=len(missing),
                reused=len(todo) - len(missing),
                chunks=n_before,
                seconds=time.perf_counter() - started,
                scope=scope,
                dry_run=True,
                refusal=refusal,
                adopted=len(adopted),
            )
        by_hash = {content_hash(c): c for c in todo}
        vectors = await embed_batched(store.embedder, [index_text(by_hash[h]) for h in missing], progress)
        for h, v in zip(missing, vectors, strict=True):
            known[h] = v
        # Loading an empty collection: many documents per transaction, and the HNSW index built once at the
        # end (much faster than growing it row by row). Otherwise one transaction per document. A load killed
        # in between leaves the index dropped: the next writer to open the collection recreates it.
        bulk = n_before == 0 and len(todo) >= bulk_threshold
        if bulk:
            await drop_vector_index(store)
        per_tx = 200 if bulk else 1
        work = [(d, docs[d]) for d in (*diff.added, *diff.changed)] + [(d, []) for d in diff.removed]
        for start in range(0, len(work), per_tx):
            await replace_documents(store, work[start : start + per_tx], known, scope=scope)
        for d in adopted:  # after the scope's copy is in: a crash in between leaves a duplicate, never a gap
            await replace_documents(store, [(d, [])], {}, scope=Scope())
        if bulk:
            await create_vector_index(store)
        if work:
            await analyze(store, vacuum=bulk)
        changed_chunks = len(todo) + sum(1 for _ in diff.removed)
        if changed_chunks and (n_before == 0 or changed_chunks * 10 >= n_before):
            await refresh_stats(store)
        return SyncSummary.of(
            diff,
            embedded=len(missing),
            reused=len(todo) - len(missing),
            chunks=(await store.info()).chunks,
            seconds=time.perf_counter() - started,
            scope=scope,
            adopted=len(adopted),
        )
    raise AssertionError("unreachable")  # pragma: no cover


async def legacy_documents(store: Store, scope: Scope, doc_ids: Sequence[str]) -> list[str]:
    """Of ``doc_ids`` (new to ``scope``), those stored in the empty scope with every pair of ``scope`` in their
    metadata: the same documents, indexed with the same ``--meta`` before scopes existed (a version-2
    collection upgraded in place). The sync moves them into ``scope`` instead of adding a second copy."""
    if not scope.pairs or not doc_ids:
        return []
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> list[str]:
        rows = await (
            await conn.execute(
                f"select d.doc_id from {t['docs']} d where d.scope = '' and d.doc_id = any(%s) and exists "
                f"(select 1 from {t['chunks']} c where c.scope = '' and c.doc_id = d.doc_id "
                "and c.metadata @> %s::jsonb) order by 1",
                (list(doc_ids), json.dumps(dict(scope.pairs))),
            )
        ).fetchall()
        return [r[0] for r in rows]

    result: list[str] = await store._run(go)
    return result


async def stored_vectors(store: Store, hashes: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
    if not hashes:
        return {}
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> dict[str, npt.NDArray[np.float32]]:
        out: dict[str, npt.NDArray[np.float32]] = {}
        for start in range(0, len(hashes), 5000):
            rows = await (
                await conn.execute(
                    f"select distinct on (content_hash) content_hash, embedding from {t['chunks']} "
                    "where content_hash = any(%s)",
                    (list(hashes[start : start + 5000]),),
                )
            ).fetchall()
            out.update({r[0]: np.asarray(as_array(r[1]), dtype=np.float32) for r in rows})
        return out

    result: dict[str, npt.NDArray[np.float32]] = await store._run(go)
    return result


async def replace_documents(
    store: Store,
    docs: Sequence[tuple[str, Sequence[Chunk]]],
    vectors: Mapping[str, npt.NDArray[np.float32]],
    *,
    scope: Scope,
) -> None:
    """Replace (or, with no chunks, delete) documents of ``scope``: their rows and term statistics, all in one
    transaction. Rows of other scopes are never touched, whatever their document ids.

    Each document is replaced whole or not at all; :meth:`sync` passes one document per transaction
    except when loading an empty collection, where it batches documents to save round trips.
    """
    t = store._t
    label = scope.label
    rows, tfs, deltas, keys, new_len = _rows(store, label, docs, vectors)
    doc_ids = [d for d, _ in docs]
    kept = [(d, document_hash(cs)) for d, cs in docs if cs]
    gone_docs = [d for d, cs in docs if not cs]

    async def go(conn: AsyncConnection[Any]) -> str:
        async with conn.transaction():
            await conn.execute("set local statement_timeout = 0")  # the search timeout is not for writes
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"ragloop:{store.collection}",))
            gone = await (
                await conn.execute(
                    f"delete from {t['chunks']} where scope = %s and doc_id = any(%s) "
                    "returning doc_id, chunk_id, n_terms",
                    (label, doc_ids),
                )
            ).fetchall()
            # This scope's postings only: the exact (document, chunk) pairs whose rows went.
            old_terms = await (
                await conn.execute(
                    f"with gone as (delete from {t['postings']} where doc_id = any(%s) and (doc_id, chunk_id) in "
                    "(select * from unnest(%s::text[], %s::text[])) returning term) "
                    "select term, count(*) from gone group by term",
                    (doc_ids, [g[0] for g in gone], [g[1] for g in gone]),
                )
            ).fetchall()
            delta = Counter(deltas)
            delta.subtract({term: int(n) for term, n in old_terms})
            removed_chunks, removed_tokens = len(gone), sum(int(g[2]) for g in gone)
            st = await (  # the statistics row is rewritten by every write: its transaction id is the version
                await conn.execute(
                    f"update {t['stats']} set n = n + %s, total_len = total_len + %s "
                    "returning n, total_len, xmin::text",
                    (len(rows) - removed_chunks, new_len - removed_tokens),
                )
            ).fetchone()
            assert st is not None
            avgdl = max(float(st[1]) / st[0], 1e-9) if st[0] else 1.0
            if rows:
                async with conn.cursor() as cur:
                    await cur.executemany(
                        f"insert into {t['chunks']} (scope, doc_id, chunk_id, seq, content_hash, title, title_path, "
                        "source, url, metadata, text, tsv, n_terms, embedding) values "
                        "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s::tsvector, %s, %s) "
                        "on conflict (doc_id, chunk_id) do nothing",
                        rows,
                    )
                    copy_sql = f"copy {t['postings']} (term, doc_id, chunk_id, tf, dl) from stdin"
                    async with cur.copy(copy_sql) as copy:
                        for r, tf in zip(rows, tfs, strict=True):
                            for term, n in tf.items():
                                await copy.write_row((term, r[1], r[2], n, r[12]))
            # Highest term-frequency weight of each term among the new rows (raises the stored ceiling).
            weights: dict[str, float] = {}
            for r, tf in zip(rows, tfs, strict=True):
                norm = store.k1 * (1 - store.b + store.b * r[12] / avgdl)
                for term, n in tf.items():
                    w = n / (n + norm)
                    if w > weights.get(term, 0.0):
                        weights[term] = w
            changed = sorted(term for term, d in delta.items() if d != 0 or term in weights)
            if changed:
                await conn.execute(
                    f"""
                    insert into {t["terms"]} (term, df, max_w)
                    select * from unnest(%s::text[], %s::int[], %s::float8[])
                    on conflict (term) do update set df = {t["terms"]}.df + excluded.df,
                        max_w = greatest({t["terms"]}.max_w, excluded.max_w)
                    """,
                    (changed, [delta[x] for x in changed], [weights.get(x, 0.0) for x in changed]),
                )
            await _write_docs(conn, t, label, kept, gone_docs, keys)
            return str(st[2])

    store._saw_version(await store._run(go))  # cached search results of the old content miss from now on
    if rows:  # the collection now holds chunks: the keys known here grow by theirs
        store._keys = (store._keys or frozenset()) | keys


async def _write_docs(
    conn: AsyncConnection[Any],
    t: dict[str, str],
    label: str,
    kept: Sequence[tuple[str, str]],
    gone: Sequence[str],
    keys: set[str],
) -> None:
    """The documents' hashes (kept ones upserted, gone ones deleted) and the new metadata keys."""
    if kept:
        await conn.execute(
            f"insert into {t['docs']} (scope, doc_id, hash) select %s, * from unnest(%s::text[], %s::text[]) "
            "on conflict (scope, doc_id) do update set hash = excluded.hash, updated = now()",
            (label, [d for d, _ in kept], [h for _, h in kept]),
        )
    if gone:
        await conn.execute(f"delete from {t['docs']} where scope = %s and doc_id = any(%s)", (label, list(gone)))
    if keys:
        await conn.execute(
            f"insert into {t['keys']} (key) select * from unnest(%s::text[]) on conflict do nothing", (sorted(keys),)
        )


def _rows(
    store: Store, label: str, docs: Sequence[tuple[str, Sequence[Chunk]]], vectors: Mapping[str, Any]
) -> tuple[list[tuple[Any, ...]], list[Counter[str]], Counter[str], set[str], int]:
    """The chunk rows to insert, each one's term frequencies, the document-frequency change per term, the
    metadata keys, and the new rows' total token count."""
    rows: list[tuple[Any, ...]] = []
    tfs: list[Counter[str]] = []
    deltas: Counter[str] = Counter()
    keys: set[str] = set()
    new_len = 0
    for doc_id, chunks in docs:
        for seq, c in enumerate(chunks):
            tokens = store.tokenizer(index_text(c))
            new_len += len(tokens)
            # A "word" of over 1,000 bytes (a base64 blob) cannot be a btree key or a lexeme; it still
            # counts towards the length, as in the local index, but is not searchable here.
            kept_tokens = [w for w in tokens if len(w) <= 250 or len(w.encode("utf-8", "replace")) <= 1000]
            tf = Counter(kept_tokens)
            tfs.append(tf)
            deltas.update(tf.keys())
            keys.update(key for key, _ in c.metadata)
            rows.append(
                (
                    label,
                    doc_id,
                    c.id,
                    seq,
                    content_hash(c),
                    c.title,
                    list(c.title_path),
                    c.source,
                    c.url,
                    json.dumps(dict(c.metadata)),
                    c.text,
                    tsvector(kept_tokens),
                    len(tokens),
                    vectors[content_hash(c)],
                )
            )
    return rows, tfs, deltas, keys, new_len


async def analyze(store: Store, *, vacuum: bool) -> None:
    """Fresh planner statistics after a write (and, after a bulk load, a visibility map for index-only scans)."""
    t = store._t
    what = "vacuum (analyze)" if vacuum else "analyze"

    async def go(conn: AsyncConnection[Any]) -> None:
        await conn.execute("set statement_timeout = 0")
        try:
            for table in (t["chunks"], t["postings"], t["terms"]):
                await conn.execute(f"{what} {table}")
        finally:
            await conn.execute(f"set statement_timeout = {max(1, round(store.statement_timeout_s * 1000))}")

    await store._run(go)


async def drop_vector_index(store: Store) -> None:
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> None:
        await conn.execute(f"drop index if exists {t['chunks']}_emb")

    await store._run(go)


async def create_vector_index(store: Store) -> None:
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> None:
        # No statement timeout for the build; more memory keeps the graph build in RAM.
        async with conn.transaction():
            await conn.execute("set local statement_timeout = 0")
            await conn.execute("set local maintenance_work_mem = '512MB'")
            await conn.execute(
                f"create index if not exists {t['chunks']}_emb on {t['chunks']} "
                "using hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction = 64)"
            )

    await store._run(go)


async def refresh_stats(store: Store) -> None:
    """Recompute the term statistics exactly from the stored rows (one statement per table)."""
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> str:
        async with conn.transaction():
            await conn.execute("set local statement_timeout = 0")  # the search timeout is not for writes
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"ragloop:{store.collection}",))
            row = await (
                await conn.execute(
                    f"update {t['stats']} set n = s.n, total_len = s.len from "
                    f"(select count(*) as n, coalesce(sum(n_terms), 0) as len from {t['chunks']}) s "
                    f"returning {t['stats']}.xmin::text"
                )
            ).fetchone()
            await conn.execute(f"delete from {t['terms']}")
            await conn.execute(
                f"""
                insert into {t["terms"]} (term, df, max_w)
                select p.term, count(*), max(p.tf::float8 / (p.tf + %s * (1 - %s + %s * p.dl / st.avgdl)))
                from {t["postings"]} p,
                    (select greatest(total_len::float8 / nullif(n, 0), 1e-9) as avgdl from {t["stats"]}) st
                group by p.term
                """,
                (store.k1, store.b, store.b),
            )
            await conn.execute(f"delete from {t['keys']}")
            await conn.execute(
                f"insert into {t['keys']} select distinct jsonb_object_keys(metadata) from {t['chunks']}"
            )
            return str(row[0])  # type: ignore[index]  # the statistics row always exists

    store._saw_version(await store._run(go))


async def delete_documents(store: Store, doc_ids: Iterable[str], scope: Scope) -> int:
    """Delete documents of ``scope`` by id (one transaction each); returns how many existed."""
    stored = await store.document_hashes(scope)
    gone = [d for d in doc_ids if d in stored]
    for d in gone:
        await replace_documents(store, [(d, [])], {}, scope=scope)
    return len(gone)


async def scope_counts(store: Store) -> dict[Scope, tuple[int, int]]:
    """Documents and chunks stored per scope."""
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> dict[Scope, tuple[int, int]]:
        docs = await (await conn.execute(f"select scope, count(*) from {t['docs']} group by 1")).fetchall()
        chunks = dict(await (await conn.execute(f"select scope, count(*) from {t['chunks']} group by 1")).fetchall())
        return {Scope.from_label(label): (int(n), int(chunks.get(label, 0))) for label, n in docs}

    result: dict[Scope, tuple[int, int]] = await store._run(go)
    return result


async def document_hashes(store: Store, scope: Scope) -> dict[str, str]:
    """Document id → document hash, for the documents stored under ``scope``."""
    t = store._t

    async def go(conn: AsyncConnection[Any]) -> dict[str, str]:
        sql = f"select doc_id, hash from {t['docs']} where scope = %s"
        return {r[0]: r[1] for r in await (await conn.execute(sql, (scope.label,))).fetchall()}

    result: dict[str, str] = await store._run(go)
    return result
