"""What both SQL sources share: a source bound to a caller, the body of ``run``, and rows turned into cited hits."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from attrs import frozen

from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._check import check_sql
from ragloop.retrievers.sql._schema import Param, SQLSchema, SQLWriter, TenantKey
from ragloop.state import Caller, Chunk, Hit

#: How a source runs one checked statement: ``(sql, params, tenant) -> (columns, rows)``.
Execute = Callable[[str, tuple[Param, ...], str | None], Awaitable[tuple[list[str], list[tuple[Any, ...]]]]]


class _CallerRun(Protocol):
    name: str
    description: str

    async def run(self, query: str, filters: Filters, *, caller: Caller | None = None) -> SourceResult: ...


@frozen
class ForCaller:
    """A SQL source on behalf of one caller: every statement sees only the caller's tenant's rows.

    What :meth:`SQLiteSource.for_caller` returns (the plan node asks for it once per turn); it shares the
    source's schema, connections and statement record.

    Attributes:
        source: The SQL source.
        caller: Who asks (``None``: nobody, so tenant-scoped tables are refused).
    """

    source: _CallerRun
    caller: Caller | None

    @property
    def name(self) -> str:
        """The source's name."""
        return self.source.name

    @property
    def description(self) -> str:
        """The source's description."""
        return self.source.description

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """The source's :meth:`run` with this caller."""
        return await self.source.run(query, filters, caller=self.caller)

    def for_caller(self, caller: Caller | None) -> ForCaller:
        """The same source for another caller."""
        return ForCaller(self.source, caller)


class _Checked(Protocol):
    name: str
    writer: SQLWriter
    tenants: Mapping[str, TenantKey]
    max_rows: int
    statements: list[str]

    async def schema(self) -> SQLSchema: ...


async def run_checked(
    source: _Checked, query: str, filters: Filters, caller: Caller | None, execute: Execute, label: str
) -> SourceResult:
    """The ``run`` of both SQL sources: write a statement for ``query``, check it (allowlist, ``LIMIT``, filters,
    the caller's tenant), record it, run it through the source's ``execute`` and cite its rows under ``label``.

    Raises:
        QueryRefused: The writer could not write it, or the check refused it (the message names the rule).
        SourceError: Whatever ``execute`` raises for a database failure.
    """
    schema = await source.schema()
    written = await source.writer.write(query, schema)
    tenant = caller.tenant if caller is not None else None
    sql, params = check_sql(
        written.sql,
        written.params,
        schema,
        max_rows=source.max_rows,
        filters=filters,
        tenants=source.tenants,
        tenant=tenant,
    )
    source.statements.append(sql)
    started = time.perf_counter()
    columns, rows = await execute(sql, params, tenant)
    seconds = time.perf_counter() - started
    return _rows_result(source.name, label, sql, params, columns, rows, schema, written.note, seconds)


def _rows_result(  # noqa: PLR0913 - one call site (run_checked), all keyword-free positional data
    name: str,
    label: str,
    sql: str,
    params: tuple[Param, ...],
    columns: list[str],
    rows: list[tuple[Any, ...]],
    schema: SQLSchema,
    note: str,
    seconds: float,
) -> SourceResult:
    """Rows as citeable hits (``<label>#<table>/<key>``) plus their fields, and the statement for the record."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read=schema.dialect)
    first = next(tree.find_all(exp.Table), None)
    table = schema.table(first.name) if first is not None else None
    table_name = table.name if table else "query"
    key = table.key if table and table.key in columns else ""
    shown = sql
    placeholder = "%s" if schema.dialect == "postgres" else "?"
    for p in params:  # for the record only: the statement ran with bound parameters
        shown = shown.replace(placeholder, repr(p), 1)
    digest = hashlib.sha256(f"{sql}|{params}".encode()).hexdigest()[:10]
    hits: list[Hit] = []
    out_rows: list[dict[str, str]] = []
    for i, row in enumerate(rows):
        fields = {c: "" if v is None else str(v) for c, v in zip(columns, row, strict=True)}
        out_rows.append(fields)
        ref = f"{table_name}/{fields[key]}" if key else f"{table_name}/{digest}#{i + 1}"
        body = "; ".join(f"{c.replace('_', ' ')}: {v}" for c, v in fields.items() if v and c != key)
        what = f"{table_name} {key} {fields[key]}" if key else f"{table_name} result {i + 1}"
        chunk = Chunk(
            id=f"{name}:{ref}",
            text=f"{what} — {body}.",
            source=f"{label}#{ref}",
            title=f"{name}: {what}",
            doc_id=f"{name}:{table_name}",
        )
        hits.append(Hit(chunk, score=1.0, confidence=1.0))
    return SourceResult(hits=hits, rows=out_rows, detail=f"{shown} ({note}; {len(rows)} row(s), {seconds:.3f}s)")
