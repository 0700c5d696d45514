"""A PostgreSQL database as a plan source: each statement in a ``READ ONLY`` transaction, rolled back."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from attrs import define, field

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.postgres import hide_credentials
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._check import check_sql
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._rows import _apply_filters, _rows_result
from ragloop.retrievers.sql._schema import Param, SQLSchema, SQLWriter, Table, _allowed

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
    on its own connection inside a ``READ ONLY`` transaction with ``statement_timeout`` set, then rolls back.
    Postgres has no per-statement authorizer: give the source a role that can only ``SELECT`` the allowlisted
    tables as the second lock. Needs the ``[postgres]`` extra (psycopg 3).

    Attributes:
        url: ``postgresql://`` connection URL.
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        name: The source name plans use.
        description: What a planner reads.
        schema_name: The Postgres schema the tables live in.
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: ``statement_timeout`` of every statement.
        value_limit: A text column with at most this many distinct values has them loaded.
        statements: Every statement that ran, in order.
    """

    url: str
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    schema_name: str = field(default="public", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0:
            raise ConfigError("max_rows must be at least 1 and timeout_s positive")

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use (ConfigError for an allowlist entry it lacks)."""
        if self._schema is None:
            self._schema = await self._introspect()
        return self._schema

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Write, check and run one statement for ``query`` (see :meth:`SQLiteSource.run`)."""
        schema = await self.schema()
        written = await self.writer.write(query, schema)
        sql, params = _apply_filters(written, filters, schema)
        sql, params = check_sql(sql, params, schema, max_rows=self.max_rows)
        self.statements.append(sql)
        started = time.perf_counter()
        columns, rows = await self._execute(_pg_text(sql), params)
        label = self.url.rsplit("/", 1)[-1].split("?", 1)[0] or "postgres"
        return _rows_result(
            self.name, label, sql, params, columns, rows, schema, written.note, time.perf_counter() - started
        )

    async def _connect(self) -> Any:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=False)
            await conn.set_read_only(True)
        except psycopg.Error as exc:
            reason = hide_credentials(str(exc), self.url)
            raise SourceError(f"{self.name}: cannot connect to the database ({reason}); check the url") from exc
        return conn

    async def _execute(self, sql: str, params: tuple[Param, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
        import psycopg

        conn = await self._connect()
        try:
            async with conn.cursor() as cur:
                await cur.execute(f"SET LOCAL statement_timeout = {int(self.timeout_s * 1000)}")
                await cur.execute(
                    psycopg.sql.SQL("SET LOCAL search_path = {}").format(psycopg.sql.Identifier(self.schema_name))
                )
                await cur.execute(sql, params)
                rows = await cur.fetchmany(self.max_rows)
                columns = [d.name for d in cur.description or ()]
            return columns, list(rows)
        except psycopg.errors.QueryCanceled as exc:
            raise SourceError(
                f"{self.name}: the statement ran past {self.timeout_s}s and was cancelled; narrow the query"
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise QueryRefused(f"refused by the database: {exc}") from exc
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        finally:
            await conn.rollback()
            await conn.close()

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
            return SQLSchema(tuple(tables), dialect="postgres")
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema ({exc})") from exc
        finally:
            await conn.rollback()
            await conn.close()
