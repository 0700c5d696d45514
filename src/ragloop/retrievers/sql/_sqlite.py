"""A SQLite database as a plan source: read-only URI, ``query_only``, an authorizer, and a bounded statement."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
from attrs import define, field

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers._threads import run_in_daemon_thread
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._allow import FUNCTIONS
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._rows import ForCaller, run_checked
from ragloop.retrievers.sql._schema import Param, SQLSchema, SQLWriter, Table, TenantKey, _allowed
from ragloop.retrievers.sql._tenant import check_tenants
from ragloop.state import Caller

_T = TypeVar("_T")
# sqlite3 authorizer action codes (stable across SQLite versions).
_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_RECURSIVE = getattr(sqlite3, "SQLITE_RECURSIVE", 33)
#: Functions the authorizer lets a statement call: the allowlist, plus those SQLite calls for operators.
_SQLITE_FUNCTIONS = frozenset(f.name for f in FUNCTIONS if "sqlite" in f.dialects) | {
    "like", "glob", "coalesce", "substring", "current_time", "ceiling", "pow", "min", "max", "count",
}  # fmt: skip
_CTE = re.compile(r"ragloop_cte_\d+")
#: The progress handler runs every this many virtual-machine instructions.
_EVERY = 1_000


def _limits(max_value_bytes: int) -> dict[int, int]:
    """``sqlite3`` limits per connection: how long a value or statement, how wide, deep and compound."""
    return {
        sqlite3.SQLITE_LIMIT_LENGTH: max_value_bytes,  # longest string or blob (the doubling CTE stops here)
        sqlite3.SQLITE_LIMIT_SQL_LENGTH: 100_000,
        sqlite3.SQLITE_LIMIT_COLUMN: 500,
        sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 100,
        sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 20,
        sqlite3.SQLITE_LIMIT_VDBE_OP: 100_000,
        sqlite3.SQLITE_LIMIT_FUNCTION_ARG: 16,
        sqlite3.SQLITE_LIMIT_ATTACHED: 0,
        sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1_000,
        sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 1_000,
        sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH: 1,
    }


@define
class SQLiteSource:
    """A SQLite database as a plan source: allowlisted, read-only, one checked SELECT per sub-query.

    Each statement runs on its own connection, opened read-only, with an authorizer (reads outside the
    allowlist and functions outside it are denied), ``sqlite3`` limits (value length, statement length,
    columns, expression depth, compound terms, program size), a page cache of ``cache_kib`` and a progress
    handler that interrupts it past ``timeout_s`` or ``max_steps`` instructions, whichever comes first.

    Attributes:
        path: The database file (must exist; it is only ever opened read-only).
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        tenants: The tenant-scoped tables and how their rows name the tenant; every reference to one sees only
            the caller's rows, and a request without a caller tenant is refused.
        name: The source name plans use.
        description: What a planner reads (the schema is appended).
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: Statement time limit; a statement past it is interrupted.
        max_steps: Virtual-machine instructions a statement may run before it is interrupted.
        max_value_bytes: Longest string or blob a statement may build (``SQLITE_LIMIT_LENGTH``).
        cache_kib: Page cache per connection, in KiB (``PRAGMA cache_size``).
        max_concurrency: Statements running at once.
        value_limit: A text column with at most this many distinct values has them loaded (offline lookups).
        statements: Every statement that ran, in order (for tests and the record).
    """

    path: Path = field(converter=Path)
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    tenants: Mapping[str, TenantKey] = field(factory=dict, kw_only=True)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    max_steps: int = field(default=50_000_000, kw_only=True)
    max_value_bytes: int = field(default=1_000_000, kw_only=True)
    cache_kib: int = field(default=8_192, kw_only=True)
    max_concurrency: int = field(default=4, kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)
    _limiter: anyio.CapacityLimiter = field(init=False, repr=False)
    _readable: dict[str, frozenset[str]] = field(factory=dict, init=False, repr=False)
    _stuck: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0 or self.max_concurrency < 1:
            raise ConfigError("max_rows and max_concurrency must be at least 1 and timeout_s positive")
        if self.max_steps < _EVERY or self.max_value_bytes < 1_000 or self.cache_kib < 64:
            raise ConfigError("max_steps must be at least 1000, max_value_bytes at least 1000, cache_kib at least 64")
        check_tenants(self.tenants, self.allow, self.name)
        self._limiter = anyio.CapacityLimiter(self.max_concurrency)
        readable: dict[str, set[str]] = {t: set(c) for t, c in self.allow.items()}
        for table, key in self.tenants.items():
            for t, columns in key.columns(table).items():
                readable.setdefault(t, set()).update(columns)
        self._readable = {t: frozenset(c) for t, c in readable.items()}

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use. Raises ConfigError for an allowlist entry the
        database lacks, SourceError when the database cannot be opened."""
        if self._schema is None:
            self._schema = await self._in_thread(self._introspect)
        return self._schema

    def for_caller(self, caller: Caller | None) -> ForCaller:
        """This source on behalf of ``caller`` (what the plan node runs)."""
        return ForCaller(self, caller)

    async def run(self, query: str, filters: Filters, *, caller: Caller | None = None) -> SourceResult:
        """Write, check and run one statement for ``query``; filters become ``column IN (?, …)`` conditions.

        Args:
            query: The sub-query.
            filters: Column → values for the main table.
            caller: Who asks; with ``tenants`` set, every scoped table shows only ``caller.tenant``'s rows.

        Raises:
            QueryRefused: the writer could not write it, or the check refused it (message names the rule).
            SourceError: the database failed, or the statement ran past its time, steps or value size.
        """
        return await run_checked(self, query, filters, caller, self._run_statement, self.path.name)

    # -- internals ----------------------------------------------------------------------------------------

    async def _run_statement(
        self, sql: str, params: tuple[Param, ...], tenant: str | None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One checked statement in a thread (the tenant is in the statement already: SQLite has no setting)."""
        return await self._in_thread(lambda: self._execute(sql, params))

    async def _in_thread(self, fn: Callable[[], _T]) -> _T:
        """``fn`` in a daemon thread, at most ``max_concurrency`` at once; a call its caller gave up on (a plan's
        sub-query timeout) is left to end by itself, and while ``2 * max_concurrency`` are, none starts."""
        with self._lock:
            if self._stuck >= 2 * self.max_concurrency:
                raise SourceError(
                    f"{self.name}: {self._stuck} earlier statements are still stuck opening or reading {self.path}; "
                    "no new one starts until one returns (check the disk or mount it is on)"
                )
        state = {"done": False, "abandoned": False}

        def work() -> _T:
            try:
                return fn()
            finally:
                with self._lock:
                    state["done"] = True
                    if state["abandoned"]:
                        self._stuck -= 1

        async with self._limiter:
            try:
                return await run_in_daemon_thread(work, name=f"ragloop {self.name}")
            except BaseException:
                with self._lock:
                    if not state["done"]:
                        state["abandoned"] = True
                        self._stuck += 1
                raise

    def _connect(self) -> sqlite3.Connection:
        # mode=ro: never writable, and a missing file fails instead of creating an empty database.
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=self.timeout_s)
            conn.execute("PRAGMA query_only = ON")
            # Set here, by the source; the checker refuses every PRAGMA a writer proposes.
            conn.execute(f"PRAGMA cache_size = -{int(self.cache_kib)}")
            conn.execute("PRAGMA temp_store = FILE")
            for limit, value in _limits(self.max_value_bytes).items():
                conn.setlimit(limit, value)
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
            self._check_tenant_columns(conn)
            return SQLSchema(tuple(tables))
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema of {self.path} ({exc})") from exc
        finally:
            conn.close()

    def _check_tenant_columns(self, conn: sqlite3.Connection) -> None:
        for table, key in self.tenants.items():
            for t, columns in key.columns(table).items():
                have = {row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (t,))}
                missing = [c for c in columns if c not in have]
                if missing:
                    raise ConfigError(f"{self.name}: tenants: table {t!r} has no column(s) {missing}; fix tenants")

    def _authorizer(self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if action == sqlite3.SQLITE_READ:
            if db is None and _CTE.fullmatch(arg1 or ""):
                return _OK  # a WITH query of the statement (the rewrite names them all ragloop_cte_<n>)
            allowed = self._readable.get(arg1 or "")
            # A read of no particular column (COUNT(*)) comes with no column name.
            return _OK if allowed is not None and (not arg2 or arg2 in allowed) and db in ("main", None) else _DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return _OK if (arg2 or "").lower() in _SQLITE_FUNCTIONS else _DENY
        return _OK if action in _ALLOWED_ACTIONS or action == _RECURSIVE else _DENY

    def _execute(self, sql: str, params: tuple[Param, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
        conn = self._connect()
        deadline = time.monotonic() + self.timeout_s
        budget = [self.max_steps // _EVERY]

        def progress() -> int:
            budget[0] -= 1
            return int(budget[0] <= 0 or time.monotonic() > deadline)

        conn.set_authorizer(self._authorizer)
        conn.set_progress_handler(progress, _EVERY)
        try:
            cursor = conn.execute(sql, params)
            rows = cursor.fetchmany(self.max_rows)
            columns = [d[0] for d in cursor.description or ()]
            return columns, rows
        except sqlite3.Error as exc:
            raise self._failure(exc, steps_left=budget[0]) from exc
        finally:
            conn.close()

    def _failure(self, exc: sqlite3.Error, *, steps_left: int) -> Exception:
        text = str(exc)
        if "interrupted" in text:
            spent = "steps" if steps_left <= 0 else "time"
            return SourceError(
                f"{self.name}: the statement ran past its {spent} budget ({self.timeout_s}s, {self.max_steps:,} "
                "steps) and was interrupted; narrow the query"
            )
        if "too big" in text:
            return SourceError(
                f"{self.name}: the statement built a value over {self.max_value_bytes:,} bytes (max_value_bytes) "
                "and was stopped; narrow the query"
            )
        if "not authorized" in text or "prohibited" in text:
            return QueryRefused(f"refused by the database: {exc} (outside the allowlist)")
        return SourceError(f"{self.name}: the statement failed: {exc}")
