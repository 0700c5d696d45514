"""The Postgres store's tables: checked against ``ragloop_schema`` when a collection opens, created when missing,
upgraded in place from the version-2 layout, and repaired (a missing index is recreated) by every writer."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.embed import embedder_named
from ragloop.retrievers.postgres._common import Store, install_hint

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: Version of the table layout (3: documents keyed by scope and path, a table of metadata keys). A writer
#: upgrades a version-2 collection in place; any other version asks for a re-index or a newer ragloop.
SCHEMA_VERSION = 3
_UPGRADABLE = 2


def index_ddl(t: dict[str, str], dim: int) -> dict[str, str]:
    """Each secondary index of a collection by name, with the statement that (re)creates it."""
    return {
        f"{t['chunks']}_tsv": f"create index if not exists {t['chunks']}_tsv on {t['chunks']} using gin (tsv)",
        f"{t['chunks']}_meta": (
            f"create index if not exists {t['chunks']}_meta on {t['chunks']} using gin (metadata jsonb_path_ops)"
        ),
        f"{t['chunks']}_hash": f"create index if not exists {t['chunks']}_hash on {t['chunks']} (content_hash)",
        f"{t['chunks']}_emb": (
            f"create index if not exists {t['chunks']}_emb on {t['chunks']} "
            "using hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction = 64)"
        ),
        f"{t['postings']}_doc": f"create index if not exists {t['postings']}_doc on {t['postings']} (doc_id)",
    }


def _tables_ddl(t: dict[str, str], dim: int) -> str:
    return f"""
    create table if not exists {t["chunks"]} (
        scope text not null default '',
        doc_id text not null,
        chunk_id text not null,
        seq int not null,
        content_hash text not null,
        title text not null default '',
        title_path text[] not null default '{{}}',
        source text not null default '',
        url text not null default '',
        metadata jsonb not null default '{{}}',
        text text not null,
        tsv tsvector not null,
        n_terms int not null,
        embedding vector({int(dim)}) not null,
        primary key (doc_id, chunk_id)
    );
    create table if not exists {t["docs"]} (
        scope text not null default '', doc_id text not null, hash text not null,
        updated timestamptz not null default now(), primary key (scope, doc_id)
    );
    create table if not exists {t["postings"]} (
        term text not null, doc_id text not null, chunk_id text not null,
        tf int not null, dl int not null, primary key (term, doc_id, chunk_id) include (tf, dl)
    );
    create table if not exists {t["terms"]} (term text primary key, df int not null, max_w double precision not null);
    create table if not exists {t["stats"]} (
        id int primary key check (id = 1), n bigint not null, total_len bigint not null
    );
    insert into {t["stats"]} values (1, 0, 0) on conflict do nothing;
    create table if not exists {t["keys"]} (key text primary key);
    create table if not exists {t["headings"]} (heading text primary key, embedding vector({int(dim)}) not null);
    """


def _upgrade_ddl(t: dict[str, str]) -> str:
    """Version 2 → 3: documents get a scope ('' for every existing one) and the metadata keys a table."""
    return f"""
    alter table {t["chunks"]} add column if not exists scope text not null default '';
    alter table {t["docs"]} add column if not exists scope text not null default '';
    alter table {t["docs"]} drop constraint if exists {t["docs"]}_pkey;
    alter table {t["docs"]} add primary key (scope, doc_id);
    create table if not exists {t["keys"]} (key text primary key);
    insert into {t["keys"]} select distinct jsonb_object_keys(metadata) from {t["chunks"]} on conflict do nothing;
    """


async def _ensure_extension(store: Store, conn: AsyncConnection[Any]) -> None:
    import psycopg

    dbname = conn.info.dbname
    row = await (await conn.execute("select 1 from pg_extension where extname = 'vector'")).fetchone()
    if row is not None:
        return
    if not store.create:
        raise ConfigError(f"database {dbname!r} has no `vector` extension; {install_hint(dbname)}")
    available = await (await conn.execute("select 1 from pg_available_extensions where name = 'vector'")).fetchone()
    if available is None:
        raise ConfigError(f"the server has no pgvector extension; {install_hint(dbname)}")
    try:
        await conn.execute("create extension if not exists vector")
    except psycopg.errors.UniqueViolation:
        pass  # another process created it at the same moment
    except psycopg.Error as exc:
        raise ConfigError(
            f"cannot create the `vector` extension in database {dbname!r} ({exc}); "
            f"run `CREATE EXTENSION vector;` there as a superuser"
        ) from exc


async def table_dim(conn: AsyncConnection[Any], table: str) -> int | None:
    """The dimension of ``table``'s ``embedding`` column; ``None`` when the table does not exist."""
    row = await (
        await conn.execute(
            "select format_type(atttypid, atttypmod) from pg_attribute "
            "where attrelid = to_regclass(%s) and attname = 'embedding' and not attisdropped",
            (table,),
        )
    ).fetchone()
    if row is None:
        return None
    found = re.search(r"\((\d+)\)", str(row[0]))
    return int(found.group(1)) if found else 0


async def missing_indexes(conn: AsyncConnection[Any], t: dict[str, str]) -> list[str]:
    """The secondary indexes of the collection that do not exist (a killed bulk load drops the HNSW one)."""
    names = list(index_ddl(t, 0))
    rows = await (
        await conn.execute("select n from unnest(%s::text[]) n where to_regclass(n) is null", (names,))
    ).fetchall()
    return sorted(r[0] for r in rows)


def _fix(store: Store) -> str:
    return f"`ragloop index DIR --store URL --collection {store.collection}`"


async def _orphan_tables(store: Store, conn: AsyncConnection[Any], dbname: str) -> int | None:
    """Tables without a ``ragloop_schema`` row (it was deleted): their vector dimension, once checked against
    the embedder given; ``None`` when the collection has no tables either."""
    dim = await table_dim(conn, store._t["chunks"])
    if dim is None:
        return None
    given = store._embedder
    fix = (
        f"collection {store.collection!r} in database {dbname!r} has tables ({store._t['chunks']}, vector({dim})) "
        "but no row in ragloop_schema (it was deleted)"
    )
    if given is None or not store.create:
        raise IndexError_(
            f"{fix}; run {_fix(store)} --embedder … once with the embedder it was built with (a {dim}-dim one) to "
            "record it again"
        )
    if given.dim != dim:
        raise IndexError_(
            f"{fix}, and embedder {given.name!r} ({given.dim}-dim) was given; pass the embedder it was built with "
            f"(a {dim}-dim one) to record the row again, or index into a new --collection"
        )
    return dim


async def ensure_schema(store: Store, conn: AsyncConnection[Any]) -> None:
    """Check the collection against ``ragloop_schema``; create, upgrade or repair it when the store may write.

    Sets ``store.missing_indexes`` (what a reader found missing) and ``store.repaired`` (what a writer fixed:
    indexes recreated, a lost ``ragloop_schema`` row recorded again, a version-2 layout upgraded).

    Raises:
        ConfigError: no ``vector`` extension and it cannot be created.
        IndexError_: the collection is missing, was written by another embedder, other BM25 settings or another
            schema version, or its tables and ``ragloop_schema`` disagree; each message says what to do.
    """
    await _ensure_extension(store, conn)
    dbname = conn.info.dbname
    await conn.execute(
        "create table if not exists ragloop_schema (collection text primary key, version int not null, "
        "embedder text not null, dim int not null, settings jsonb not null, created timestamptz default now())"
    )
    settings = {"k1": store.k1, "b": store.b, "tokenizer": store.tokenizer.config()}
    found = await (
        await conn.execute(
            "select version, embedder, dim, settings from ragloop_schema where collection = %s", (store.collection,)
        )
    ).fetchone()
    repaired: list[str] = []
    upgrade = False
    if found is None:
        orphan = await _orphan_tables(store, conn, dbname)
        if orphan is None and (store._embedder is None or not store.create):
            raise IndexError_(
                f"no collection {store.collection!r} in database {dbname!r}; index one with {_fix(store)}"
            )
        if orphan is not None:
            repaired.append("recorded the lost ragloop_schema row again")
            upgrade = not await _has_scope(conn, store._t)
    else:
        version, emb, dim, saved = found
        if store._embedder is None:
            store._embedder = embedder_named(emb, int(dim))
            if store._embedder is None:
                raise IndexError_(
                    f"the collection was built with embedder {emb!r} ({dim}-dim), which ragloop cannot rebuild by "
                    "name; pass the same embedder to PostgresStore(url, embedder)"
                )
        if version == _UPGRADABLE and store.create:
            upgrade = True
        elif version == _UPGRADABLE:
            raise IndexError_(
                f"collection {store.collection!r} has schema version {version}; run {_fix(store)} once to upgrade "
                f"it in place to version {SCHEMA_VERSION} (its documents are kept)"
            )
        elif isinstance(version, int) and version > SCHEMA_VERSION:
            raise IndexError_(
                f"collection {store.collection!r} has schema version {version}, written by a newer ragloop (this one "
                f"reads {SCHEMA_VERSION}); upgrade ragloop"
            )
        elif version != SCHEMA_VERSION:
            raise IndexError_(
                f"collection {store.collection!r} has schema version {version}, this ragloop uses {SCHEMA_VERSION}; "
                f"re-index it with {_fix(store)} into a new collection"
            )
        reindex = f"re-index it with {_fix(store)} into a new collection"
        if emb != store.embedder.name or dim != store.embedder.dim:
            raise IndexError_(
                f"collection {store.collection!r} was built with embedder {emb!r} ({dim}-dim) but "
                f"{store.embedder.name!r} ({store.embedder.dim}-dim) was given; use the same embedder or {reindex}"
            )
        if saved != settings:
            raise IndexError_(
                f"collection {store.collection!r} was built with BM25 settings {saved}, not {settings}; "
                f"pass the same settings or {reindex}"
            )
        if not store.create and await table_dim(conn, store._t["chunks"]) is None:
            raise IndexError_(
                f"the tables of collection {store.collection!r} are missing from database {dbname!r} (dropped?); "
                f"index it again with {_fix(store)}"
            )
    if not store.create:
        store.missing_indexes = tuple(await missing_indexes(conn, store._t))
        return
    await _create_or_repair(store, conn, found is None, upgrade, settings, repaired)


async def _has_scope(conn: AsyncConnection[Any], t: dict[str, str]) -> bool:
    row = await (
        await conn.execute(
            "select 1 from pg_attribute where attrelid = to_regclass(%s) and attname = 'scope' and not attisdropped",
            (t["docs"],),
        )
    ).fetchone()
    return row is not None


async def _create_or_repair(
    store: Store,
    conn: AsyncConnection[Any],
    record: bool,
    upgrade: bool,
    settings: dict[str, Any],
    repaired: list[str],
) -> None:
    """Create what is missing (tables, indexes, the ``ragloop_schema`` row), upgrading version 2 first; one
    transaction under the collection's advisory lock, so concurrent writers do it once."""
    t = store._t
    async with conn.transaction():
        await conn.execute("set local statement_timeout = 0")  # an HNSW rebuild takes as long as it takes
        await conn.execute("set local maintenance_work_mem = '512MB'")
        await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"ragloop:{store.collection}",))
        if upgrade:
            await conn.execute(_upgrade_ddl(t))
            await conn.execute(
                "update ragloop_schema set version = %s where collection = %s", (SCHEMA_VERSION, store.collection)
            )
            repaired.append(f"upgraded the schema to version {SCHEMA_VERSION} in place")
        missing = await missing_indexes(conn, t)
        existed = await table_dim(conn, t["chunks"]) is not None
        await conn.execute(_tables_ddl(t, store.embedder.dim))
        for name, ddl in index_ddl(t, store.embedder.dim).items():
            if name in missing:
                await conn.execute(ddl)
        if existed:
            repaired.extend(f"recreated index {name}" for name in missing)
        elif not record:
            repaired.append("recreated the missing tables (empty: index the documents again)")
        if record:
            await conn.execute(
                "insert into ragloop_schema (collection, version, embedder, dim, settings) "
                "values (%s, %s, %s, %s, %s) on conflict do nothing",
                (store.collection, SCHEMA_VERSION, store.embedder.name, store.embedder.dim, json.dumps(settings)),
            )
    store.repaired = tuple(repaired)
    store.missing_indexes = ()
