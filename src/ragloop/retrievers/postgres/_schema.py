"""The Postgres store's tables: checked against ``ragloop_schema`` when a collection opens, created when missing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.postgres._common import Store, embedder_named, install_hint

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: Version of the table layout; a collection written by another version asks for a re-index.
SCHEMA_VERSION = 2


async def ensure_schema(store: Store, conn: AsyncConnection[Any]) -> None:
    import psycopg

    dbname = conn.info.dbname
    row = await (await conn.execute("select 1 from pg_extension where extname = 'vector'")).fetchone()
    if row is None:
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
    if found is not None and store._embedder is None:
        store._embedder = embedder_named(found[1], int(found[2]))
    elif found is None and store._embedder is None:
        raise IndexError_(
            f"no collection {store.collection!r} in database {dbname!r}; "
            f"index one with `ragloop index DIR --store URL --collection {store.collection}`"
        )
    reindex = f"re-index it with `ragloop index DIR --store URL --collection {store.collection}` into a new collection"
    if found is not None:
        version, emb, dim, saved = found
        if version != SCHEMA_VERSION:
            raise IndexError_(
                f"collection {store.collection!r} has schema version {version}, this ragloop uses "
                f"{SCHEMA_VERSION}; {reindex}"
            )
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
        return
    if not store.create:
        raise IndexError_(f"no collection {store.collection!r} in database {dbname!r}; index one with `ragloop index`")
    t = store._t
    async with conn.transaction():
        # Idempotent, and safe against a concurrent creator: the advisory lock orders them.
        await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"ragloop:{store.collection}",))
        await conn.execute(
            f"""
            create table if not exists {t["chunks"]} (
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
                embedding vector({int(store.embedder.dim)}) not null,
                primary key (doc_id, chunk_id)
            );
            create index if not exists {t["chunks"]}_tsv on {t["chunks"]} using gin (tsv);
            create index if not exists {t["chunks"]}_meta on {t["chunks"]} using gin (metadata jsonb_path_ops);
            create index if not exists {t["chunks"]}_hash on {t["chunks"]} (content_hash);
            create index if not exists {t["chunks"]}_emb on {t["chunks"]}
                using hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction = 64);
            create table if not exists {t["docs"]} (
                doc_id text primary key, hash text not null, updated timestamptz not null default now()
            );
            create table if not exists {t["postings"]} (
                term text not null, doc_id text not null, chunk_id text not null,
                tf int not null, dl int not null, primary key (term, doc_id, chunk_id) include (tf, dl)
            );
            create index if not exists {t["postings"]}_doc on {t["postings"]} (doc_id);
            create table if not exists {t["terms"]} (
                term text primary key, df int not null, max_w double precision not null
            );
            create table if not exists {t["stats"]} (
                id int primary key check (id = 1), n bigint not null, total_len bigint not null
            );
            insert into {t["stats"]} values (1, 0, 0) on conflict do nothing;
            """
        )
        await conn.execute(
            "insert into ragloop_schema (collection, version, embedder, dim, settings) "
            "values (%s, %s, %s, %s, %s) on conflict do nothing",
            (store.collection, SCHEMA_VERSION, store.embedder.name, store.embedder.dim, json.dumps(settings)),
        )
