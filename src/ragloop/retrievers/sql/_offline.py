"""The offline SQL writer: the common shapes of an ordinary question, written as one plain SELECT; anything else
refused with the precise reason.

It reads the request against the schema it is given (:mod:`._phrases` does the parsing):

- **values** the database holds, named in the request ("Harbor Lane Bank", "Enterprise", "urgent"), and keys
  ("order ORD-1042", "customer 17"): equality;
- **date ranges** on the table's date column ("this month", "last quarter", "in March 2024", "last 30 days",
  "since 2024-03-01"): ``column >= ? AND column < ?`` over ISO strings, the column named by a verb where it can
  be ("opened" → ``opened``, "churned" → ``churned_on``), computed from :attr:`OfflineSQLWriter.today`;
- **numeric comparisons** ("more than 100 seats", "orders over $1,000", "between 10 and 20 seats") on the
  numeric column they name, and on **counts** of related rows ("customers with more than 5 open tickets");
- **counts** ("how many …"), **totals and averages** of a numeric column ("total amount", "average seats"),
  **rankings** ("top 5 customers by seats", "the customer with the most tickets") and **latest / oldest**;
- **joins along declared foreign keys**, one hop: a condition on another table becomes ``key IN (SELECT …)``.

Only ``SELECT``, ``WHERE``, ``IN`` sub-selects, ``GROUP BY … HAVING COUNT(*)`` inside them, ``ORDER BY`` and
``LIMIT``, with ``COUNT``, ``SUM``, ``AVG``, ``MIN``, ``MAX`` — every value a ``?`` parameter — so the statement
check passes it as it passes a model's. It refuses, saying which words it could not write: breakdowns ("per
plan", "by region", "for each"), percentages and ratios, negation and "or" between values, a value the database
does not hold ("P1" when priorities are normal, low, high, urgent), a comparison or ranking on a column it
cannot name, a date phrase on a table with no date column, and conditions more than one foreign key away.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date

from attrs import define, field, frozen

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._phrases import (
    Comparison,
    DateRange,
    Ranking,
    aggregate_of,
    comparisons,
    date_range,
    ranking,
)
from ragloop.retrievers.sql._schema import Param, SQLQuery, SQLSchema, Table

__all__ = ["OfflineSQLWriter"]

_BEYOND = re.compile(
    r"\b(?:per|for each|each|broken down by|grouped by|group by|breakdown)\b(?!\s+(?:seat|key|month|minute)s?\b)"
    r"|\bby\s+(?:plan|region|status|priority|month|year|quarter|week|day|customer)\b"
    r"|\bpercent(?:age)?s?\b|%|\bratio\b|\bshare of\b|\bproportion\b|\brate of\b"
    r"|\bnot\b|\bwithout\b|\bexcept\b|\bexcluding\b|\bnever\b|\bno longer\b|\bother than\b",
    re.IGNORECASE,
)
_COUNT = re.compile(r"\bhow many\b|\bnumber of\b|\bcount\b", re.IGNORECASE)
_LATEST = re.compile(
    r"\b(?:latest|newest|most recent|last)\b(?!\s+(?:\d+\s+)?(?:day|week|month|quarter|year)s?\b)", re.I
)
_OLDEST = re.compile(r"\b(?:oldest|earliest|first)\b(?!\s+\d)", re.IGNORECASE)
_DATE_NAMES = ("created", "opened", "date", "signup", "signed", "ordered", "updated", "churned", "_on", "_at")
_MONEY = ("amount", "usd", "price", "total", "revenue", "cost", "spent", "value")
#: Words of a request that may look like values but never are (question words, time words, units).
_PLAIN = frozenset({"sql", "q1", "q2", "q3", "q4"})
_VALUE_LIKE = re.compile(r"(?<![\w-])(?:[A-Z][A-Za-z]*\d[\w-]*|[A-Z]{1,4}\d+|#\d+)(?![\w-])")


def _singular(name: str) -> str:
    return name[:-1] if name.endswith("s") else name


def _word_at(text: str, phrase: str) -> int:
    m = re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE)
    return m.start() if m else -1


def _names(table: Table) -> tuple[str, str]:
    return table.name.lower(), _singular(table.name).lower()


@frozen(eq=False)  # compared by identity: a Table holds mappings, which do not hash
class _Cond:
    table: Table
    sql: str
    params: tuple[Param, ...]
    at: int
    length: int = 0


def _date_columns(table: Table) -> list[str]:
    return [c for c in table.columns if any(d in c.lower() for d in _DATE_NAMES) and c != table.key]


def _numeric_columns(table: Table) -> list[str]:
    keys = {table.key, *(c for c, _, _ in table.foreign)}
    return [c for c in table.columns if table.types.get(c, "").startswith(("INT", "REAL", "NUM", "FLOAT", "DOUB"))
            and c not in keys]  # fmt: skip


@define
class OfflineSQLWriter:
    """Writes SQL without a model for the common shapes of a question (see the module docstring).

    Attributes:
        today: The clock "this month" and "last quarter" are read against (``datetime.date.today`` by default).
    """

    today: Callable[[], date] = field(default=date.today)

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        """The statement for ``request``; QueryRefused with the reason when it cannot be written offline."""
        return self.write_sync(request, schema)

    def write_sync(self, request: str, schema: SQLSchema) -> SQLQuery:
        """Synchronous :meth:`write`."""
        beyond = _BEYOND.search(request)
        if beyond:
            raise QueryRefused(
                f"cannot answer offline: {beyond.group(0).strip()!r} asks for a breakdown, a percentage or a "
                "negation, which the offline SQL writer does not write; configure a model to answer this part"
            )
        values = self._values(request, schema)
        when = date_range(request, self.today())
        numbers = comparisons(request)
        target = self._target(request, schema, values)
        if target is None:
            raise QueryRefused(
                "cannot answer offline: the request names no table "
                f"({', '.join(t.name for t in schema.tables)}) and no known value to look up"
            )
        spans = [(c.at, c.at + c.length) for c in values] + [(c.at, c.at + len(c.phrase)) for c in numbers]
        if when is not None:
            spans.append((when.verb_at, when.verb_at + len(when.phrase)))
        self._unknown_values(request, schema, spans, target)
        conds = list(values)
        if when is not None:
            conds.append(self._date_cond(request, schema, target, when))
        conds += [self._number_cond(request, schema, target, c) for c in numbers]
        rank = ranking(request)
        agg = aggregate_of(request)
        count = bool(_COUNT.search(request)) and not (agg and agg[0] == "SUM")
        order = None if rank else self._order(request, target)
        if not conds and not count and not order and not rank and not agg:
            raise QueryRefused(
                f"cannot answer offline: the request names no id or known value of {target.name} to look up"
            )
        where, params = self._where(target, conds)
        select, order_by, limit, pattern = self._select(request, schema, target, count, agg, rank, order, params)
        sql = f"SELECT {select} FROM {target.name}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        if order_by:
            sql += f" ORDER BY {order_by}"
        if limit:
            sql += f" LIMIT {limit}"
        return SQLQuery(sql, tuple(params), note=f"offline pattern: {pattern}")

    # --- what the request names ------------------------------------------------------------------------

    def _values(self, request: str, schema: SQLSchema) -> list[_Cond]:
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
            elif t.key:
                for m in re.finditer(r"\b[A-Z]{2,5}-\d{2,}\b", request):
                    candidates.append((m.start(), len(m.group(0)), t, t.key, m.group(0)))
        conds: list[_Cond] = []
        taken: list[tuple[int, int]] = []
        # Longest match first, so "Harbor Lane Bank" wins over a shorter value inside it.
        for at, length, t, column, value in sorted(candidates, key=lambda c: (-c[1], c[0])):
            if any(at < end and start < at + length for start, end in taken):
                continue
            if column == t.key and isinstance(value, str) and not self._key_fits(value, t):
                continue
            taken.append((at, at + length))
            conds.append(_Cond(t, f"{t.name}.{column} = ?", (value,), at, length))
        return sorted(conds, key=lambda c: c.at)

    def _key_fits(self, value: str, table: Table) -> bool:
        """A code-shaped key ("ORD-1042") belongs to the table whose name it starts like (orders)."""
        return table.name.lower().startswith(value.split("-")[0].lower()[:3])

    def _unknown_values(self, request: str, schema: SQLSchema, known: list[tuple[int, int]], target: Table) -> None:
        """Refuse a value-like word ("P1") the database does not hold: ignoring it would answer another question."""
        for m in _VALUE_LIKE.finditer(request):
            if any(s <= m.start() < e for s, e in known) or m.group(0).lower() in _PLAIN:
                continue
            near = [t for t in schema.tables if t is target or _link(target, t) is not None]
            small = [
                f"{t.name}.{c} is one of {', '.join(v[:8])}"
                for t in near
                for c, v in t.values.items()
                if c != t.key and c not in _date_columns(t) and 0 < len(v) <= 8
            ]
            raise QueryRefused(
                f"cannot answer offline: {m.group(0)!r} is not a value the database holds"
                + (f" ({'; '.join(small)})" if small else "")
            )

    def _target(self, request: str, schema: SQLSchema, conds: list[_Cond]) -> Table | None:
        named = [
            (pos, t)
            for t in schema.tables
            for pos in (_word_at(request, t.name), _word_at(request, _singular(t.name)))
            if pos >= 0 and not any(c.at <= pos < c.at + c.length for c in conds)
        ]
        asked = re.search(
            r"\b(?:which|what|list|show|how many|number of|top \d+|\d+ biggest|\d+ largest)\s+(?:\w+\s+){0,2}?(\w+)",
            request,
            re.I,
        )
        if asked:
            word = asked.group(1).lower()
            for t in schema.tables:
                if word in _names(t):
                    return t
        if named:
            return min(named, key=lambda p: p[0])[1]
        keyed = [c for c in conds if " = ?" in c.sql and c.sql.endswith(f".{c.table.key} = ?")]
        if keyed:
            return keyed[0].table
        return conds[0].table if conds else None

    def _date_cond(self, request: str, schema: SQLSchema, target: Table, when: DateRange) -> _Cond:
        """The date range on the date column a verb names ("opened" → tickets.opened), else on the target's."""
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", request)}
        stems = {w[:5] for w in words if len(w) >= 4}
        for t in sorted(schema.tables, key=lambda t: t is not target):
            for column in _date_columns(t):
                head = re.split(r"[_\s]", column.lower())[0]
                if head[:5] in stems and (t is target or _link(target, t) is not None):
                    return self._range(t, column, when)
        columns = _date_columns(target)
        if not columns:
            raise QueryRefused(
                f"cannot answer offline: {when.phrase!r} needs a date column, and {target.name} has none"
            )
        return self._range(target, columns[0], when)

    def _range(self, table: Table, column: str, when: DateRange) -> _Cond:
        parts, params = [], []
        if when.start is not None:
            parts.append(f"{table.name}.{column} >= ?")
            params.append(when.start)
        if when.end is not None:
            parts.append(f"{table.name}.{column} < ?")
            params.append(when.end)
        return _Cond(table, " AND ".join(parts), tuple(params), when.verb_at, len(when.phrase))

    def _number_cond(self, request: str, schema: SQLSchema, target: Table, c: Comparison) -> _Cond:
        """A comparison on the numeric column its unit names, or on a count of related rows ("5 open tickets")."""
        unit_words = c.unit.split()
        for t in schema.tables:
            if t is not target and unit_words and unit_words[-1] in _names(t) and _link(target, t) is not None:
                return self._count_cond(request, target, t, c)
        for t in sorted(schema.tables, key=lambda t: t is not target):
            if t is not target and _link(target, t) is None:
                continue
            for column in _numeric_columns(t):
                col = column.lower()
                named = any(w and (col.startswith(w[:4]) or w.startswith(col[:4])) for w in unit_words)
                money = c.money and any(m in col for m in _MONEY)
                if named or money:
                    return _Cond(t, *_compare(f"{t.name}.{column}", c), at=c.at, length=len(c.phrase))
        raise QueryRefused(
            f"cannot answer offline: {c.phrase.strip()!r} compares a number, and no numeric column of "
            f"{target.name} or a linked table is named by {c.unit or 'the words after it'!r}"
        )

    def _count_cond(self, request: str, target: Table, other: Table, c: Comparison) -> _Cond:
        link = _link(target, other)
        assert link is not None
        mine, _, theirs = link
        inner = [v for v in self._values(request, SQLSchema((other,))) if v.at > c.at]
        where = " AND ".join(v.sql for v in inner)
        having, params = _compare("COUNT(*)", c)
        sub = f"SELECT {other.name}.{theirs} FROM {other.name}" + (f" WHERE {where}" if where else "")
        sub += f" GROUP BY {other.name}.{theirs} HAVING {having}"
        values = tuple(p for v in inner for p in v.params) + params
        # the values inside the sub-select were consumed: they must not also filter the target
        return _Cond(target, f"{target.name}.{mine} IN ({sub})", values, c.at, len(c.phrase) + len(other.name) + 8)

    # --- the statement ---------------------------------------------------------------------------------

    def _where(self, target: Table, conds: list[_Cond]) -> tuple[list[str], list[Param]]:
        consumed = self._consumed(conds)
        where: list[str] = []
        params: list[Param] = []
        by_table: dict[str, list[_Cond]] = {}
        for c in sorted((c for c in conds if c not in consumed), key=lambda c: c.at):
            by_table.setdefault(c.table.name, []).append(c)
        for name, cs in by_table.items():
            if name == target.name:
                where += [c.sql for c in cs]
                params += [p for c in cs for p in c.params]
                continue
            link = _link(target, cs[0].table)
            if link is None:
                raise QueryRefused(
                    f"cannot answer offline: {cs[0].params[0]!r} is a value of {name}, which no foreign key links "
                    f"to {target.name} (the offline writer follows one foreign key)"
                )
            mine, other, theirs = link
            inner = " AND ".join(c.sql for c in cs)
            where.append(f"{target.name}.{mine} IN (SELECT {other}.{theirs} FROM {other} WHERE {inner})")
            params += [p for c in cs for p in c.params]
        return where, params

    def _consumed(self, conds: list[_Cond]) -> set[_Cond]:
        """Value conditions on another table that a count condition already holds in its sub-select."""
        counts = [c for c in conds if "HAVING COUNT" in c.sql]
        return {
            v
            for v in conds
            for c in counts
            if v is not c and " = ?" in v.sql and v.at > c.at and f"FROM {v.table.name} WHERE" in c.sql
        }

    def _select(
        self,
        request: str,
        schema: SQLSchema,
        target: Table,
        count: bool,
        agg: tuple[str, str, str] | None,
        rank: Ranking | None,
        order: tuple[str, str] | None,
        params: list[Param],
    ) -> tuple[str, str, int | None, str]:
        """``(select list, order by, limit, pattern name)``."""
        columns = ", ".join(f"{target.name}.{c}" for c in target.columns)
        if agg is not None:
            fn, word, phrase = agg
            column = self._numeric(target, word, request, money=fn == "SUM")
            if column is None:
                raise QueryRefused(
                    f"cannot answer offline: {phrase!r} needs a numeric column of {target.name} it can name "
                    f"({', '.join(_numeric_columns(target)) or 'it has none'})"
                )
            return f"{fn}({target.name}.{column}) AS {fn.lower()}_{column}", "", None, fn.lower()
        if count:
            return "COUNT(*) AS count", "", None, "count"
        if rank is not None:
            direction = "DESC" if rank.descending else "ASC"
            for other in schema.tables:
                link = _link(target, other)
                if other is not target and link is not None and rank.by and rank.by.split()[-1] in _names(other):
                    mine, _, theirs = link
                    sub = f"(SELECT COUNT(*) FROM {other.name} WHERE {other.name}.{theirs} = {target.name}.{mine})"
                    alias = f"{_singular(other.name)}_count"
                    return f"{columns}, {sub} AS {alias}", f"{alias} {direction}", rank.n, "ranking by count"
            column = self._numeric(target, rank.by, request, money=False)
            if column is None:
                raise QueryRefused(
                    f"cannot answer offline: {rank.phrase!r} ranks on something no numeric column of "
                    f"{target.name} names ({', '.join(_numeric_columns(target)) or 'it has none'})"
                )
            return columns, f"{target.name}.{column} {direction}", rank.n, "ranking"
        if order is not None:
            column, direction = order
            return columns, f"{target.name}.{column} {direction}", 1, "latest" if direction == "DESC" else "oldest"
        return columns, "", None, "lookup"

    def _numeric(self, table: Table, word: str, request: str, *, money: bool) -> str | None:
        numeric = _numeric_columns(table)
        words = [w for w in (word, *re.findall(r"[a-z_]+", request.lower())) if w]
        for w in words:
            for c in numeric:
                if c.lower().startswith(w[:4]) or w.startswith(c.lower()[:4]):
                    return c
        if money:
            return next((c for c in numeric if any(m in c.lower() for m in _MONEY)), None)
        return None

    def _order(self, request: str, table: Table) -> tuple[str, str] | None:
        direction = "DESC" if _LATEST.search(request) else "ASC" if _OLDEST.search(request) else None
        if direction is None:
            return None
        columns = _date_columns(table)
        return (columns[0], direction) if columns else None


def _compare(column: str, c: Comparison) -> tuple[str, tuple[Param, ...]]:
    value: Param = int(c.value) if c.value == int(c.value) else c.value
    if c.op == "between" and c.high is not None:
        high: Param = int(c.high) if c.high == int(c.high) else c.high
        return f"{column} >= ? AND {column} <= ?", (value, high)
    return f"{column} {c.op} ?", (value,)


def _link(target: Table, other: Table) -> tuple[str, str, str] | None:
    """``(target column, other table, other column)`` of a declared foreign key between the two, either way."""
    for column, ref_table, ref_column in target.foreign:
        if ref_table == other.name:
            return column, other.name, ref_column
    for column, ref_table, ref_column in other.foreign:
        if ref_table == target.name:
            return ref_column, other.name, column
    return None
