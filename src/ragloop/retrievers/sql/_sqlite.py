"""A SQLite database as a plan source: read-only URI, ``query_only``, an authorizer and a time limit."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from attrs import define, field

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._check import _FORBIDDEN_FUNCTIONS, check_sql
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._rows import _apply_filters, _rows_result
from ragloop.retrievers.sql._schema import Param, SQLSchema, SQLWriter, Table, _allowed

# sqlite3 authorizer action codes (stable across SQLite versions).
_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_RECURSIVE = getattr(sqlite3, "SQLITE_RECURSIVE", 33)


@define
class SQLiteSource:
    """A SQLite database as a plan source: allowlisted, read-only, one checked SELECT per sub-query.

    Attributes:
        path: The database file (must exist; it is only ever opened read-only).
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        name: The source name plans use.
        description: What a planner reads (the schema is appended).
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: Statement time limit; a statement past it is interrupted.
        max_concurrency: Statements running at once.
        value_limit: A text column with at most this many distinct values has them loaded (offline lookups).
        statements: Every statement that ran, in order (for tests and the record).
    """

    path: Path = field(converter=Path)
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    max_concurrency: int = field(default=4, kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)
    _limiter: anyio.CapacityLimiter = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0 or self.max_concurrency < 1:
            raise ConfigError("max_rows and max_concurrency must be at least 1 and timeout_s positive")
        self._limiter = anyio.CapacityLimiter(self.max_concurrency)

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use. Raises ConfigError for an allowlist entry the
        database lacks, SourceError when the database cannot be opened."""
        if self._schema is None:
            self._schema = await anyio.to_thread.run_sync(self._introspect, limiter=self._limiter)
        return self._schema

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Write, check and run one statement for ``query``; filters become ``column IN (?, …)`` conditions.

        Raises:
            QueryRefused: the writer could not write it, or the check refused it (message says why).
            SourceError: the database failed or the statement timed out.
        """
        schema = await self.schema()
        written = await self.writer.write(query, schema)
        sql, params = _apply_filters(written, filters, schema)
        sql, params = check_sql(sql, params, schema, max_rows=self.max_rows)
        self.statements.append(sql)
        started = time.perf_counter()
        columns, rows = await anyio.to_thread.run_sync(self._execute, sql, params, limiter=self._limiter)
        seconds = time.perf_counter() - started
        return _rows_result(self.name, self.path.name, sql, params, columns, rows, schema, written.note, seconds)

    # -- internals ----------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # mode=ro: never writable, and a missing file fails instead of creating an empty database.
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=self.timeout_s)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: cannot open {self.path} read-only ({exc}); check the path") from exc
        return conn

    def _introspect(self) -> SQLSchema:
        conn = self._connect()
        try:
            tables: list[Table] = []
            for name, wanted in self.allow.items():
                info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (name,)).fetchall()
                if not info:
                    raise ConfigError(f"{self.name}: allowlisted table {name!r} is not in {self.path}")
                types = {row[0]: str(row[1]).upper() for row in info}
                missing = [c for c in wanted if c not in types]
                if missing:
                    raise ConfigError(f"{self.name}: table {name!r} has no column(s) {missing}; fix the allowlist")
                columns = tuple(c for c in types if c in wanted)
                key = next((row[0] for row in info if row[2] == 1 and row[0] in wanted), "")
                foreign = tuple(
                    (row[3], row[2], row[4])
                    for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)).fetchall()
                    if row[2] in self.allow and row[3] in wanted and row[4] in self.allow[row[2]]
                )
                values: dict[str, tuple[str, ...]] = {}
                for column in columns:
                    if "CHAR" not in types[column] and "TEXT" not in types[column]:
                        continue
                    found = conn.execute(
                        f'SELECT DISTINCT "{column}" FROM "{name}" WHERE "{column}" IS NOT NULL LIMIT ?',
                        (self.value_limit + 1,),
                    ).fetchall()
                    if len(found) <= self.value_limit:
                        values[column] = tuple(sorted(str(r[0]) for r in found))
                tables.append(Table(name, key, columns, types, foreign, values))
            return SQLSchema(tuple(tables))
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema of {self.path} ({exc})") from exc
        finally:
            conn.close()

    def _authorizer(self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if action == sqlite3.SQLITE_READ:
            allowed = self.allow.get(arg1 or "")
            # A read of no particular column (COUNT(*)) comes with no database name.
            return _OK if allowed is not None and (not arg2 or arg2 in allowed) and db in ("main", None) else _DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return _DENY if (arg2 or "").lower() in _FORBIDDEN_FUNCTIONS else _OK
        return _OK if action in _ALLOWED_ACTIONS or action == _RECURSIVE else _DENY

    def _execute(self, sql: str, params: tuple[Param, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
        conn = self._connect()
        deadline = time.monotonic() + self.timeout_s
        conn.set_authorizer(self._authorizer)
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            cursor = conn.execute(sql, params)
            rows = cursor.fetchmany(self.max_rows)
            columns = [d[0] for d in cursor.description or ()]
            return columns, rows
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise SourceError(
                    f"{self.name}: the statement ran past {self.timeout_s}s and was interrupted; narrow the query"
                ) from exc
            if "not authorized" in str(exc):
                raise QueryRefused(f"refused by the database: {exc} (outside the allowlist)") from exc
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        except sqlite3.Error as exc:
            if "prohibited" in str(exc):
                raise QueryRefused(f"refused by the database: {exc} (outside the allowlist)") from exc
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        finally:
            conn.close()
