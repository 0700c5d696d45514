"""``ragloop doctor --store``: what a database's collections hold and what is wrong with them, read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import asdict, frozen

from ragloop._redact import hide_credentials, hide_password
from ragloop.errors import StoreUnavailable
from ragloop.retrievers.postgres._common import _APP, psycopg_module
from ragloop.retrievers.postgres._schema import SCHEMA_VERSION, missing_indexes, table_dim
from ragloop.retrievers.scope import Scope

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["CollectionReport", "ScopeCount", "StoreReport", "collection_exists", "diagnose_store"]


@frozen
class ScopeCount:
    """Documents of one scope.

    Attributes:
        scope: The scope, as messages name it (``tenant=acme``, or ``(no scope)``).
        documents: Its stored documents.
    """

    scope: str
    documents: int


@frozen
class CollectionReport:
    """One collection's state.

    Attributes:
        name: The collection.
        schema_version: The version ``ragloop_schema`` records (``None``: no row).
        embedder: The embedder it records.
        dim: Its vector dimension (of the table when there is no schema row).
        chunks: Stored chunks.
        documents: Stored documents.
        scopes: Documents per scope.
        missing_indexes: Secondary indexes that do not exist (searches then scan).
        keys: The metadata keys its chunks have (what filters may name).
        problems: What needs doing, one line each (empty: healthy).
        heading_vectors: Heading vectors kept in its ``_headings`` table (see
            what each sync keeps; ``None``: no such table, so every replica embeds its
            headings at its first turns until the next sync creates it). A cache, never a problem.
    """

    name: str
    schema_version: int | None
    embedder: str
    dim: int
    chunks: int
    documents: int
    scopes: tuple[ScopeCount, ...]
    missing_indexes: tuple[str, ...]
    keys: tuple[str, ...]
    problems: tuple[str, ...]
    heading_vectors: int | None = None


@frozen
class StoreReport:
    """What :func:`diagnose_store` found.

    Attributes:
        url: The database, its password hidden.
        server: The server's version.
        vector: The ``vector`` extension's version (``None``: not installed).
        collections: One report per collection looked at.
        problems: Database-wide problems (no ``vector`` extension, no collection).
    """

    url: str
    server: str
    vector: str | None
    collections: tuple[CollectionReport, ...]
    problems: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        """No problem anywhere."""
        return not self.problems and not any(c.problems for c in self.collections)

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        out = [f"store {self.url}: PostgreSQL {self.server}, pgvector {self.vector or 'not installed'}"]
        out += [f"  problem: {p}" for p in self.problems]
        for c in self.collections:
            version = "none" if c.schema_version is None else str(c.schema_version)
            out.append(
                f"collection {c.name}: schema version {version} (this ragloop: {SCHEMA_VERSION}), embedder "
                f"{c.embedder or '?'} ({c.dim}-dim), {c.documents} documents, {c.chunks} chunks"
            )
            out += [f"  {s.scope}: {s.documents} documents" for s in c.scopes]
            if c.keys:
                out.append(f"  metadata keys: {', '.join(c.keys)}")
            if c.heading_vectors is not None:
                out.append(f"  heading vectors kept: {c.heading_vectors}")
            elif c.schema_version is not None:
                out.append(f"  heading vectors: no {c.name}_headings table (the next sync creates it and keeps them)")
            out += [f"  missing index {name}" for name in c.missing_indexes]
            out += [f"  problem: {p}" for p in c.problems]
        out.append("healthy" if self.healthy else "needs attention (see the problems above)")
        return out

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        data: dict[str, Any] = asdict(self)
        data["healthy"] = self.healthy
        return data


async def _connect(url: str) -> Any:
    psycopg = psycopg_module()
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=True, fallback_application_name=_APP, connect_timeout=5
        )
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to {hide_password(url)}: {hide_credentials(str(exc), url)}") from exc


async def collection_exists(url: str, collection: str) -> bool:
    """Whether ``collection`` has a row in ``ragloop_schema`` or tables (read-only).

    Raises:
        StoreUnavailable: the server cannot be reached.
    """
    async with await _connect(url) as conn:
        row = await (
            await conn.execute(
                "select to_regclass(%s) is not null or (to_regclass('ragloop_schema') is not null and exists "
                "(select 1 from ragloop_schema where collection = %s))",
                (f"{collection}_chunks", collection),
            )
        ).fetchone()
    return bool(row and row[0])


async def diagnose_store(url: str, collection: str | None = None) -> StoreReport:
    """Read (never write) what the database at ``url`` holds: every collection, or just ``collection``.

    Raises:
        StoreUnavailable: the server cannot be reached.
    """
    async with await _connect(url) as conn:
        server = str((await (await conn.execute("show server_version")).fetchone() or ("?",))[0])
        row = await (await conn.execute("select extversion from pg_extension where extname = 'vector'")).fetchone()
        vector = str(row[0]) if row else None
        problems = [] if vector else ["the `vector` extension is not installed: run `CREATE EXTENSION vector;`"]
        rows: list[Any] = []
        if await (await conn.execute("select to_regclass('ragloop_schema')")).fetchone() != (None,):
            rows = await (
                await conn.execute("select collection, version, embedder, dim from ragloop_schema order by 1")
            ).fetchall()
        known = {r[0]: r for r in rows}
        names = [collection] if collection else sorted(known)
        if not names:
            problems.append("no ragloop collection here: index one with `ragloop index DIR --store URL`")
        reports = [await _collection(conn, name, known.get(name)) for name in names]
    return StoreReport(hide_password(url), server, vector, tuple(reports), tuple(problems))


async def _collection(conn: AsyncConnection[Any], name: str, row: Any) -> CollectionReport:
    t = {part: f"{name}_{part}" for part in ("chunks", "postings", "docs", "terms", "stats", "keys")}
    dim = await table_dim(conn, t["chunks"])
    fix = f"`ragloop index DIR --store URL --collection {name}`"
    if row is None:
        problem = (
            f"no collection {name!r}: index one with {fix}"
            if dim is None
            else f"tables of {name!r} (vector({dim})) but no row in ragloop_schema: run {fix} with the embedder it "
            f"was built with (a {dim}-dim one) to record it again"
        )
        return CollectionReport(name, None, "", dim or 0, 0, 0, (), (), (), (problem,))
    _, version, embedder, schema_dim = row
    if dim is None:
        problem = f"ragloop_schema lists {name!r} but its tables are missing: index it again with {fix}"
        return CollectionReport(name, version, embedder, schema_dim, 0, 0, (), (), (), (problem,))
    problems = []
    if version != SCHEMA_VERSION:
        problems.append(
            f"schema version {version}, this ragloop uses {SCHEMA_VERSION}: "
            + (f"run {fix} once to upgrade it in place" if version == 2 else "re-index into a new collection")
        )
    if dim != schema_dim:
        problems.append(f"ragloop_schema says {schema_dim}-dim vectors but the table holds vector({dim})")
    missing = tuple(await missing_indexes(conn, t))
    if missing:
        problems.append(f"{len(missing)} missing index(es), searches scan instead: run {fix} to recreate them")
    chunks = int((await (await conn.execute(f"select n from {t['stats']}")).fetchone() or (0,))[0])
    scoped = version == SCHEMA_VERSION
    counts = await (
        await conn.execute(
            f"select scope, count(*) from {t['docs']} group by 1 order by 1"
            if scoped
            else f"select '', count(*) from {t['docs']}"
        )
    ).fetchall()
    keys: tuple[str, ...] = ()
    if scoped:
        keys = tuple(r[0] for r in await (await conn.execute(f"select key from {t['keys']} order by 1")).fetchall())
    scopes = tuple(ScopeCount(Scope.from_label(label).describe(), int(n)) for label, n in counts if n)
    documents = sum(s.documents for s in scopes)
    headings = None
    if await (await conn.execute("select to_regclass(%s)", (f"{name}_headings",))).fetchone() != (None,):
        headings = int((await (await conn.execute(f"select count(*) from {name}_headings")).fetchone() or (0,))[0])
    return CollectionReport(
        name, version, embedder, schema_dim, chunks, documents, scopes, missing, keys, tuple(problems), headings
    )
