"""A PostgreSQL database as a plan source: each statement in a bounded ``READ ONLY`` transaction, rolled back."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from attrs import define, field

from ragloop._log import get_logger
from ragloop._redact import hide_credentials
from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._rows import ForCaller, run_checked
from ragloop.retrievers.sql._schema import Param, SQLSchema, SQLWriter, Table, TenantKey, _allowed
from ragloop.retrievers.sql._tenant import check_tenants
from ragloop.state import Caller

log = get_logger("ragloop.retrievers.sql")
_SIZE = re.compile(r"\d+\s*(?:kB|MB|GB)")
_SETTING = re.compile(r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*")

_PG_COLUMNS = """
SELECT c.table_name, c.column_name, c.data_type
FROM information_schema.columns c
WHERE c.table_schema = %s AND c.table_name = ANY(%s)
ORDER BY c.table_name, c.ordinal_position
"""
_PG_KEYS = """
SELECT tc.table_name, tc.constraint_type, kcu.column_name, ccu.table_name, ccu.column_name
FROM information_schema.table_constraints tc
JOIN information_schema.key_column_usage kcu
  ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema
JOIN information_schema.constraint_column_usage ccu
  ON ccu.constraint_name = tc.constraint_name AND ccu.table_schema = tc.table_schema
WHERE tc.table_schema = %s AND tc.table_name = ANY(%s) AND tc.constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')
"""


def _pg_type(data_type: str) -> str:
    kind = data_type.lower()
    if "int" in kind:
        return "INTEGER"
    if "char" in kind or kind == "text":
        return "TEXT"
    return kind.upper()


def _pg_text(sql: str) -> str:
    """A checked Postgres statement ready for psycopg: every literal ``%`` doubled, ``%s`` placeholders kept."""
    import sqlglot

    tokens = list(sqlglot.tokenize(sql, read="postgres"))
    out: list[str] = []
    at = 0
    for i, token in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        placeholder = (
            token.token_type.name == "MOD" and nxt is not None and nxt.text == "s" and nxt.start == token.end + 1
        )
        if token.token_type.name == "STRING" or (token.token_type.name == "MOD" and not placeholder):
            out.append(sql[at : token.start])
            out.append(sql[token.start : token.end + 1].replace("%", "%%"))
            at = token.end + 1
    out.append(sql[at:])
    return "".join(out)


@define
class PostgresSQLSource:
    """A PostgreSQL database as a plan source: allowlisted, one checked SELECT per sub-query, read-only.

    The same checks as :class:`SQLiteSource` (the Postgres dialect of :func:`check_sql`); each statement runs
    on its own connection inside a ``READ ONLY`` transaction that sets, with ``SET LOCAL``, ``statement_timeout``,
    ``work_mem``, ``temp_file_limit`` (when the role may: a superuser, or ``GRANT SET ON PARAMETER
    temp_file_limit``; otherwise the role's own setting stands, see docs/planning.md), ``search_path`` and the
    caller's tenant as ``tenant_setting``, then rolls back. Postgres has no per-statement authorizer: give the
    source a read-only role with row-level security on the tenant-scoped tables as the second lock (the recipe
    is in docs/planning.md). Needs the ``[postgres]`` extra (psycopg 3).

    Attributes:
        url: ``postgresql://`` connection URL.
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        tenants: The tenant-scoped tables and how their rows name the tenant (see :class:`SQLiteSource`).
        name: The source name plans use.
        description: What a planner reads.
        schema_name: The Postgres schema the tables live in.
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: ``statement_timeout`` of every statement.
        work_mem: ``work_mem`` of every statement (sorts and hashes spill to disk past it).
        temp_file_limit: ``temp_file_limit`` of every statement (disk a statement may spill), when settable.
        tenant_setting: The setting that carries the caller's tenant to row-level security policies
            (``current_setting('ragloop.tenant', true)``); ``None``: not set.
        value_limit: A text column with at most this many distinct values has them loaded.
        statements: Every statement that ran, in order.
    """

    url: str
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    tenants: Mapping[str, TenantKey] = field(factory=dict, kw_only=True)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    schema_name: str = field(default="public", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    work_mem: str = field(default="16MB", kw_only=True)
    temp_file_limit: str = field(default="64MB", kw_only=True)
    tenant_setting: str | None = field(default="ragloop.tenant", kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)
    _temp_limit_settable: bool = field(default=True, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0:
            raise ConfigError("max_rows must be at least 1 and timeout_s positive")
        for what, value in (("work_mem", self.work_mem), ("temp_file_limit", self.temp_file_limit)):
            if not _SIZE.fullmatch(value):
                raise ConfigError(f"{what} must be a size such as '16MB' (kB, MB or GB), got {value!r}")
        if self.tenant_setting is not None and not _SETTING.fullmatch(self.tenant_setting):
            raise ConfigError(f"tenant_setting must look like 'ragloop.tenant', got {self.tenant_setting!r}")
        check_tenants(self.tenants, self.allow, self.name)

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use (ConfigError for an allowlist entry it lacks)."""
        if self._schema is None:
            self._schema = await self._introspect()
        return self._schema

    def for_caller(self, caller: Caller | None) -> ForCaller:
        """This source on behalf of ``caller`` (what the plan node runs)."""
        return ForCaller(self, caller)

    async def run(self, query: str, filters: Filters, *, caller: Caller | None = None) -> SourceResult:
        """Write, check and run one statement for ``query`` (see :meth:`SQLiteSource.run`)."""
        label = self.url.rsplit("/", 1)[-1].split("?", 1)[0] or "postgres"
        return await run_checked(self, query, filters, caller, self._run_statement, label)

    async def _run_statement(
        self, sql: str, params: tuple[Param, ...], tenant: str | None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One checked statement, its ``%`` escaped for psycopg, in its bounded transaction (with the tenant)."""
        return await self._execute(_pg_text(sql), params, tenant=tenant)

    async def _connect(self) -> Any:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=False)
            await conn.set_read_only(True)
        except psycopg.Error as exc:
            reason = hide_credentials(str(exc), self.url)
            raise SourceError(f"{self.name}: cannot connect to the database ({reason}); check the url") from exc
        return conn

    async def _execute(
        self, sql: str, params: tuple[Param, ...], *, tenant: str | None = None
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        import psycopg

        conn = await self._connect()
        try:
            async with conn.cursor() as cur:
                await self._bound(cur, tenant)
                await cur.execute(sql, params)
                rows = await cur.fetchmany(self.max_rows)
                columns = [d.name for d in cur.description or ()]
            return columns, list(rows)
        except psycopg.errors.QueryCanceled as exc:
            raise SourceError(
                f"{self.name}: the statement ran past {self.timeout_s}s and was cancelled; narrow the query"
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise QueryRefused(f"refused by the database: {str(exc).splitlines()[0]}") from exc
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: the statement failed: {str(exc).splitlines()[0]}") from exc
        finally:
            await conn.rollback()
            await conn.close()

    async def _bound(self, cur: Any, tenant: str | None) -> None:
        """The transaction's limits and tenant, each with ``SET LOCAL`` (gone at the rollback)."""
        from psycopg import errors, sql

        await cur.execute(f"SET LOCAL statement_timeout = {int(self.timeout_s * 1000)}")
        await cur.execute(sql.SQL("SET LOCAL work_mem = {}").format(sql.Literal(self.work_mem)))
        # The checked text quotes strings the standard way ('' for a quote, a backslash is a backslash).
        await cur.execute("SET LOCAL standard_conforming_strings = on")
        if self._temp_limit_settable:
            # Only a superuser, or a role granted SET ON PARAMETER temp_file_limit (Postgres 15+), may set it.
            await cur.execute("SAVEPOINT ragloop_limits")
            try:
                await cur.execute(sql.SQL("SET LOCAL temp_file_limit = {}").format(sql.Literal(self.temp_file_limit)))
            except errors.InsufficientPrivilege:
                await cur.execute("ROLLBACK TO SAVEPOINT ragloop_limits")
                self._temp_limit_settable = False
                log.warning(
                    "sql.temp_file_limit_not_set",
                    source=self.name,
                    hint="GRANT SET ON PARAMETER temp_file_limit TO <role>, or ALTER ROLE <role> SET temp_file_limit",
                )
            await cur.execute("RELEASE SAVEPOINT ragloop_limits")
        await cur.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(self.schema_name)))
        if self.tenant_setting is not None and tenant is not None:
            name = sql.SQL(self.tenant_setting)  # checked against _SETTING at construction
            await cur.execute(sql.SQL("SET LOCAL {} = {}").format(name, sql.Literal(str(tenant))))

    async def _introspect(self) -> SQLSchema:
        import psycopg

        conn = await self._connect()
        names = list(self.allow)
        try:
            async with conn.cursor() as cur:
                await cur.execute(_PG_COLUMNS, (self.schema_name, names))
                found: dict[str, dict[str, str]] = {}
                for table, column, data_type in await cur.fetchall():
                    found.setdefault(table, {})[column] = _pg_type(data_type)
                await cur.execute(_PG_KEYS, (self.schema_name, names))
                constraints = await cur.fetchall()
                tables = []
                for name, wanted in self.allow.items():
                    types = found.get(name)
                    if not types:
                        raise ConfigError(
                            f"{self.name}: allowlisted table {name!r} is not in schema {self.schema_name!r}"
                        )
                    missing = [c for c in wanted if c not in types]
                    if missing:
                        raise ConfigError(f"{self.name}: table {name!r} has no column(s) {missing}; fix the allowlist")
                    columns = tuple(c for c in types if c in wanted)
                    key = next(
                        (c[2] for c in constraints if c[0] == name and c[1] == "PRIMARY KEY" and c[2] in wanted), ""
                    )
                    foreign = tuple(
                        (c[2], c[3], c[4])
                        for c in constraints
                        if c[0] == name
                        and c[1] == "FOREIGN KEY"
                        and c[2] in wanted
                        and c[4] in self.allow.get(c[3], ())
                    )
                    values: dict[str, tuple[str, ...]] = {}
                    for column in columns:
                        if types[column] != "TEXT":
                            continue
                        await cur.execute(
                            psycopg.sql.SQL("SELECT DISTINCT {c} FROM {s}.{t} WHERE {c} IS NOT NULL LIMIT %s").format(
                                c=psycopg.sql.Identifier(column),
                                s=psycopg.sql.Identifier(self.schema_name),
                                t=psycopg.sql.Identifier(name),
                            ),
                            (self.value_limit + 1,),
                        )
                        distinct = await cur.fetchall()
                        if len(distinct) <= self.value_limit:
                            values[column] = tuple(sorted(str(r[0]) for r in distinct))
                    tables.append(Table(name, key, columns, types, foreign, values))
                await self._check_tenant_columns(cur)
            return SQLSchema(tuple(tables), dialect="postgres", namespace=self.schema_name)
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema ({exc})") from exc
        finally:
            await conn.rollback()
            await conn.close()

    async def _check_tenant_columns(self, cur: Any) -> None:
        for table, key in self.tenants.items():
            for t, columns in key.columns(table).items():
                await cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                    (self.schema_name, t),
                )
                have = {row[0] for row in await cur.fetchall()}
                missing = [c for c in columns if c not in have]
                if missing:
                    raise ConfigError(f"{self.name}: tenants: table {t!r} has no column(s) {missing}; fix tenants")
