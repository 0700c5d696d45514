"""The offline SQL writer: a few honest patterns, everything else refused."""

from __future__ import annotations

import re

from attrs import define, frozen

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._schema import Param, SQLQuery, SQLSchema, Table

_BEYOND = re.compile(
    r"\b(?:last|this|next|past|previous)\s+(?:day|week|month|quarter|year)s?\b|\byesterday\b|\btoday\b|"
    r"\bsince\b|\bbetween\b|\bbefore\b|\bafter\b|\bmore than\b|\bless than\b|\bat least\b|\bat most\b|"
    r"\btop\s+\d+|\baverage\b|\btotal\b|\bsum of\b|\bmost\b|\bfewest\b|\bper\b",
    re.IGNORECASE,
)
_COUNT = re.compile(r"\bhow many\b|\bnumber of\b|\bcount\b", re.IGNORECASE)
_LATEST = re.compile(r"\b(?:latest|newest|most recent|last)\b", re.IGNORECASE)
_OLDEST = re.compile(r"\b(?:oldest|earliest|first)\b", re.IGNORECASE)
_DATE_NAMES = ("created", "opened", "date", "signup", "ordered", "updated")


def _singular(name: str) -> str:
    return name[:-1] if name.endswith("s") else name


def _word_at(text: str, phrase: str) -> int:
    m = re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE)
    return m.start() if m else -1


@frozen
class _Cond:
    table: Table
    column: str
    value: Param
    at: int


@define
class OfflineSQLWriter:
    """Writes SQL without a model, for a few honest patterns; refuses everything else.

    Patterns: a row by its key (``order ORD-1042``, ``customer 17``); rows by known column values named in
    the request (``Harbor Lane Bank``, ``Enterprise``, ``urgent``), across a foreign key when the value
    lives in another table; ``how many …`` counts; ``latest`` / ``oldest`` by the table's date column.
    Date ranges, comparisons, totals and rankings are refused: "cannot answer offline".
    """

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        """The statement for ``request``; QueryRefused with the reason when no pattern applies."""
        return self.write_sync(request, schema)

    def write_sync(self, request: str, schema: SQLSchema) -> SQLQuery:
        """Synchronous :meth:`write`."""
        beyond = _BEYOND.search(request)
        if beyond:
            raise QueryRefused(
                f"cannot answer offline: {beyond.group(0)!r} needs a date range, comparison or total, which the "
                "offline SQL patterns do not write; configure a model to answer this part"
            )
        conds = self._conditions(request, schema)
        target = self._target(request, schema, conds)
        if target is None:
            raise QueryRefused(
                "cannot answer offline: the request names no table "
                f"({', '.join(t.name for t in schema.tables)}) and no known value to look up"
            )
        count = bool(_COUNT.search(request))
        order = self._order(request, target)
        if not conds and not count and not order:
            raise QueryRefused(
                f"cannot answer offline: the request names no id or known value of {target.name} to look up"
            )
        where: list[str] = []
        params: list[Param] = []
        by_table: dict[str, list[_Cond]] = {}
        for c in sorted(conds, key=lambda c: c.at):
            by_table.setdefault(c.table.name, []).append(c)
        for name, cs in by_table.items():
            clause = " AND ".join(f"{c.column} = ?" for c in cs)
            values = [c.value for c in cs]
            if name == target.name:
                where.append(" AND ".join(f"{target.name}.{c.column} = ?" for c in cs))
                params += values
                continue
            link = self._link(target, cs[0].table)
            if link is None:
                raise QueryRefused(
                    f"cannot answer offline: {cs[0].value!r} is a value of {name}, which no foreign key links to "
                    f"{target.name}"
                )
            mine, other, theirs = link
            where.append(f"{target.name}.{mine} IN (SELECT {theirs} FROM {other} WHERE {clause})")
            params += values
        select = "COUNT(*) AS count" if count else ", ".join(f"{target.name}.{c}" for c in target.columns)
        sql = f"SELECT {select} FROM {target.name}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        pattern = "count" if count else "lookup"
        if order and not count:
            column, direction = order
            sql += f" ORDER BY {target.name}.{column} {direction} LIMIT 1"
            pattern = "latest" if direction == "DESC" else "oldest"
        return SQLQuery(sql, tuple(params), note=f"offline pattern: {pattern}")

    def _conditions(self, request: str, schema: SQLSchema) -> list[_Cond]:
        conds: list[_Cond] = []
        taken: list[tuple[int, int]] = []
        candidates: list[tuple[int, int, Table, str, Param]] = []
        for t in schema.tables:
            for column, values in t.values.items():
                for v in values:
                    if len(v) >= 2:
                        at = _word_at(request, v)
                        if at >= 0:
                            candidates.append((at, len(v), t, column, v))
            if t.key and t.types.get(t.key, "").startswith("INT"):
                for m in re.finditer(rf"\b{re.escape(_singular(t.name))}s?\s*(?:id\s*)?#?\s*(\d+)\b", request, re.I):
                    candidates.append((m.start(1), len(m.group(1)), t, t.key, int(m.group(1))))
        # Longest match first, so "Harbor Lane Bank" wins over a shorter value inside it.
        for at, length, t, column, value in sorted(candidates, key=lambda c: (-c[1], c[0])):
            if any(at < end and start < at + length for start, end in taken):
                continue
            taken.append((at, at + length))
            conds.append(_Cond(t, column, value, at))
        return conds

    def _target(self, request: str, schema: SQLSchema, conds: list[_Cond]) -> Table | None:
        named = [
            (pos, t)
            for t in schema.tables
            for pos in (_word_at(request, t.name), _word_at(request, _singular(t.name)))
            if pos >= 0 and not any(c.at <= pos < c.at + len(str(c.value)) for c in conds)
        ]
        asked = re.search(r"\b(?:which|what|list|show|how many|number of)\s+(?:\w+\s+){0,2}?(\w+)", request, re.I)
        if asked:
            word = asked.group(1).lower()
            for t in schema.tables:
                if word in (t.name.lower(), _singular(t.name).lower()):
                    return t
        if named:
            return min(named, key=lambda p: p[0])[1]
        keyed = [c for c in conds if c.column == c.table.key]
        if keyed:
            return keyed[0].table
        return conds[0].table if conds else None

    def _order(self, request: str, table: Table) -> tuple[str, str] | None:
        direction = "DESC" if _LATEST.search(request) else "ASC" if _OLDEST.search(request) else None
        if direction is None:
            return None
        column = next((c for c in table.columns if any(d in c.lower() for d in _DATE_NAMES)), None)
        return (column, direction) if column else None

    def _link(self, target: Table, other: Table) -> tuple[str, str, str] | None:
        for column, ref_table, ref_column in target.foreign:
            if ref_table == other.name:
                return column, other.name, ref_column
        for column, ref_table, ref_column in other.foreign:
            if ref_table == target.name:
                return ref_column, other.name, column
        return None
