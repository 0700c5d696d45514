"""What both SQL sources share: a source bound to a caller, and rows turned into cited hits."""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from attrs import frozen

from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._schema import Param, SQLSchema
from ragloop.state import Caller, Chunk, Hit


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


def _rows_result(  # noqa: PLR0913 - one call site per source, all keyword-free positional data
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
