"""What both SQL sources share: filters added to a written statement, and rows turned into cited hits."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ragloop.errors import QueryRefused
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.retrievers.sql._schema import Param, SQLQuery, SQLSchema
from ragloop.state import Chunk, Hit


def _apply_filters(written: SQLQuery, filters: Filters, schema: SQLSchema) -> tuple[str, tuple[Param, ...]]:
    """The written statement with each filter as ``column IN (?, …)`` on its main table (values bound)."""
    if not filters:
        return written.sql, written.params
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(written.sql, read=schema.dialect)
    except sqlglot.errors.SqlglotError as exc:
        raise QueryRefused(f"refused: the statement does not parse ({exc})") from exc
    froms = list(tree.find_all(exp.Table)) if isinstance(tree, exp.Select) else []
    if not isinstance(tree, exp.Select) or not froms:
        raise QueryRefused("refused: filters need a SELECT over one allowlisted table")
    main = froms[0]
    table = schema.table(main.name)
    params = list(written.params)
    for column, values in filters.items():
        if table is None or column.lower() not in (c.lower() for c in table.columns):
            raise QueryRefused(f"refused: filter column {column!r} is not an allowlisted column of {main.name!r}")
        if not values:
            raise QueryRefused(f"refused: filter {column!r} has no values")
        marks = [exp.Placeholder() for _ in values]
        tree = tree.where(exp.column(column, table=main.alias_or_name).isin(*marks))
        params += [_typed(v, table.types.get(column, "")) for v in values]
    return tree.sql(dialect=schema.dialect), tuple(params)


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
    for p in params:  # for the record only: the statement ran with bound parameters
        shown = shown.replace("?", repr(p), 1)
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


def _typed(value: str, declared: str) -> Param:
    if declared.startswith("INT") and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return value
