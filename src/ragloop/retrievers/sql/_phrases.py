"""The phrases the offline SQL writer reads: date ranges, numeric comparisons, rankings, totals — pure parsing.

Dates are turned into half-open ranges of ISO strings (``start <= column < end``), so a TEXT column holding
``2024-03-05`` or ``2024-03-05T12:27`` compares as written, with no date function in the statement.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Literal

from attrs import frozen

__all__ = [
    "Comparison",
    "DateRange",
    "Ranking",
    "aggregate_of",
    "comparisons",
    "date_range",
    "ranking",
]

_MONTHS = {
    m: i
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for m in names
}
_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")"
_ISO = r"\d{4}-\d{2}-\d{2}"
_RELATIVE = re.compile(r"\b(this|last|previous|past|next)\s+(day|week|month|quarter|year)\b", re.I)
_LAST_N = re.compile(r"\b(?:last|past)\s+(\d{1,3})\s+(day|week|month)s?\b", re.I)
_TODAY = re.compile(r"\b(today|yesterday)\b", re.I)
_QUARTER = re.compile(r"\bq([1-4])\s+(\d{4})\b", re.I)
_MONTH_YEAR = re.compile(r"\b(?:in\s+)?(" + _MONTH + r")\.?\s+(\d{4})\b", re.I)
_IN_YEAR = re.compile(r"\b(?:in|during)\s+(\d{4})\b", re.I)
_BETWEEN_DATES = re.compile(r"\bbetween\s+(" + _ISO + r")\s+and\s+(" + _ISO + r")\b", re.I)
_SINCE = re.compile(r"\b(since|after|from|before|until)\s+(" + _ISO + r"|\d{4})\b", re.I)


@frozen
class DateRange:
    """``start <= column < end`` as ISO strings (either side open when ``None``).

    Attributes:
        start: First day included (``YYYY-MM-DD``), or ``None``.
        end: First day no longer included, or ``None``.
        phrase: The words of the request it was read from ("this month").
        verb_at: Where the phrase starts in the request (its date column is named by a verb near it).
    """

    start: str | None
    end: str | None
    phrase: str
    verb_at: int


def _month_start(d: date) -> date:
    return d.replace(day=1)


def _add_months(d: date, n: int) -> date:
    m = d.month - 1 + n
    return date(d.year + m // 12, m % 12 + 1, 1)


def _relative(which: str, unit: str, today: date) -> tuple[date, date]:
    shift = {"this": 0, "last": -1, "previous": -1, "past": -1, "next": 1}[which.lower()]
    unit = unit.lower()
    if unit == "day":
        start = today + timedelta(days=shift)
        return start, start + timedelta(days=1)
    if unit == "week":
        start = today - timedelta(days=today.weekday()) + timedelta(weeks=shift)
        return start, start + timedelta(weeks=1)
    if unit == "month":
        start = _add_months(_month_start(today), shift)
        return start, _add_months(start, 1)
    if unit == "quarter":
        start = _add_months(date(today.year, 3 * ((today.month - 1) // 3) + 1, 1), 3 * shift)
        return start, _add_months(start, 3)
    start = date(today.year + shift, 1, 1)
    return start, date(start.year + 1, 1, 1)


def _between(request: str, today: date) -> DateRange | None:
    m = _BETWEEN_DATES.search(request)
    return DateRange(m.group(1), m.group(2), m.group(0), m.start()) if m else None


def _last_n(request: str, today: date) -> DateRange | None:
    m = _LAST_N.search(request)
    if m is None:
        return None
    n, unit = int(m.group(1)), m.group(2).lower()
    if unit == "month":
        first = _add_months(today, -n)
        start = date(first.year, first.month, min(today.day, 28))
    else:
        start = today - timedelta(days=n if unit == "day" else 7 * n)
    return DateRange(start.isoformat(), (today + timedelta(days=1)).isoformat(), m.group(0), m.start())


def _relative_phrase(request: str, today: date) -> DateRange | None:
    m = _RELATIVE.search(request)
    if m is None:
        return None
    start, end = _relative(m.group(1), m.group(2), today)
    return DateRange(start.isoformat(), end.isoformat(), m.group(0), m.start())


def _today(request: str, today: date) -> DateRange | None:
    m = _TODAY.search(request)
    if m is None:
        return None
    day = today if m.group(1).lower() == "today" else today - timedelta(days=1)
    return DateRange(day.isoformat(), (day + timedelta(days=1)).isoformat(), m.group(0), m.start())


def _quarter(request: str, today: date) -> DateRange | None:
    m = _QUARTER.search(request)
    if m is None:
        return None
    start = date(int(m.group(2)), 3 * (int(m.group(1)) - 1) + 1, 1)
    return DateRange(start.isoformat(), _add_months(start, 3).isoformat(), m.group(0), m.start())


def _month_year(request: str, today: date) -> DateRange | None:
    m = _MONTH_YEAR.search(request)
    if m is None:
        return None
    start = date(int(m.group(2)), _MONTHS[m.group(1).lower()], 1)
    return DateRange(start.isoformat(), _add_months(start, 1).isoformat(), m.group(0), m.start())


def _since(request: str, today: date) -> DateRange | None:
    m = _SINCE.search(request)
    if m is None:
        return None
    word, value = m.group(1).lower(), m.group(2)
    first = value if len(value) == 10 else f"{value}-01-01"
    if word in ("before", "until"):
        return DateRange(None, first, m.group(0), m.start())
    if word == "after" and len(value) == 4:
        first = f"{int(value) + 1}-01-01"
    return DateRange(first, None, m.group(0), m.start())


def _year(request: str, today: date) -> DateRange | None:
    m = _IN_YEAR.search(request)
    if m is None:
        return None
    year = int(m.group(1))
    return DateRange(f"{year}-01-01", f"{year + 1}-01-01", m.group(0), m.start())


_DATE_PARSERS = (_between, _last_n, _relative_phrase, _today, _quarter, _month_year, _since, _year)


def date_range(request: str, today: date) -> DateRange | None:
    """The date range a request names ("this month", "last quarter", "in March 2024", "last 30 days",
    "since 2024-03-01", "between 2024-01-01 and 2024-02-01", "in 2024"), or ``None``."""
    for parse in _DATE_PARSERS:
        found = parse(request, today)
        if found is not None:
            return found
    return None


Op = Literal[">", ">=", "<", "<=", "=", "between"]
_OPS: tuple[tuple[str, Op], ...] = (
    (r"more than|over|greater than|above|exceeding|bigger than|larger than", ">"),
    (r"at least|no fewer than|no less than|or more", ">="),
    (r"less than|fewer than|under|below|smaller than", "<"),
    (r"at most|no more than|up to|or fewer|or less", "<="),
    (r"exactly", "="),
)
_NUM = r"\$?\s?(\d[\d,]*(?:\.\d+)?)\s?(k)?"
_COMPARE = re.compile(
    r"\b(?P<op>" + "|".join(p for p, _ in _OPS) + r")\s+" + _NUM + r"\s*(?P<unit>[a-z_$]+(?:\s+[a-z_]+)?)?",
    re.I,
)
_BETWEEN_NUMS = re.compile(r"\bbetween\s+" + _NUM + r"\s+and\s+" + _NUM + r"\s*(?P<unit>[a-z_]+)?", re.I)


@frozen
class Comparison:
    """A numeric comparison the request makes ("more than 5 open tickets", "over $1,000").

    Attributes:
        op: ``>``, ``>=``, ``<``, ``<=``, ``=`` or ``between``.
        value: The number (the low end for ``between``).
        high: The high end for ``between``.
        unit: The words after the number ("open tickets", "seats"), lower-cased.
        money: True when the number was written with ``$`` (an amount).
        phrase: The words it was read from.
        at: Where it starts in the request.
    """

    op: Op
    value: float
    high: float | None
    unit: str
    money: bool
    phrase: str
    at: int


def _number(text: str, k: str | None) -> float:
    value = float(text.replace(",", ""))
    return value * 1000 if k else value


def comparisons(request: str) -> list[Comparison]:
    """Every numeric comparison of ``request``, in order."""
    out = []
    for m in _BETWEEN_NUMS.finditer(request):
        low, high = _number(m.group(1), m.group(2)), _number(m.group(3), m.group(4))
        unit = (m.group("unit") or "").lower()
        out.append(Comparison("between", low, high, unit, "$" in m.group(0), m.group(0), m.start()))
    for m in _COMPARE.finditer(request):
        if any(c.at <= m.start() < c.at + len(c.phrase) for c in out):
            continue
        op = next(o for p, o in _OPS if re.fullmatch(p, m.group("op"), re.I))
        unit = (m.group("unit") or "").lower()
        value = _number(m.group(2), m.group(3))
        out.append(Comparison(op, value, None, unit, "$" in m.group(0), m.group(0), m.start()))
    return sorted(out, key=lambda c: c.at)


_TOP = re.compile(
    r"\b(?:top|first)\s+(\d{1,3})\b|\b(\d{1,3})\s+(?:biggest|largest|highest|most|newest|latest|oldest|smallest)\b",
    re.I,
)
_MOST = re.compile(
    r"(?<!at )(?<!at )\b(?:the\s+)?(?P<how>most(?!\s+recent)|fewest|least|biggest|largest|highest|smallest|lowest)"
    r"\b(?:\s+(?P<what>[a-z_]+))?",
    re.I,
)
_BY = re.compile(r"\bby\s+(?:number of\s+|count of\s+)?(?P<what>[a-z_]+(?:\s+[a-z_]+)?)", re.I)


@frozen
class Ranking:
    """A ranking the request asks for ("top 5 customers by seats", "the customer with the most tickets").

    Attributes:
        n: How many rows.
        descending: Largest first.
        by: The words naming what is ranked on ("seats", "tickets"), lower-cased, or ``""``.
        phrase: The words it was read from.
    """

    n: int
    descending: bool
    by: str
    phrase: str


def ranking(request: str) -> Ranking | None:
    """The ranking ``request`` asks for, or ``None``."""
    top = _TOP.search(request)
    most = _MOST.search(request)
    if top is None and most is None:
        return None
    n = int(top.group(1) or top.group(2)) if top else 1
    descending = not (most and most.group("how").lower() in ("fewest", "least", "smallest", "lowest"))
    by = _BY.search(request)
    what = by.group("what") if by else (most.group("what") if most and most.group("what") else "")
    phrase = " ".join(p.group(0) for p in (top, most, by) if p)
    return Ranking(max(1, min(n, 50)), descending, what.lower(), phrase)


_AGGREGATE = re.compile(
    r"\b(?P<fn>total|sum of|average|avg|mean|combined|maximum|minimum)\b(?:\s+(?:number of\s+)?(?P<what>[a-z_]+))?",
    re.I,
)
Aggregate = Literal["SUM", "AVG", "MAX", "MIN"]
_FUNCTIONS: dict[str, Aggregate] = {"average": "AVG", "avg": "AVG", "mean": "AVG", "maximum": "MAX", "minimum": "MIN"}


def aggregate_of(request: str) -> tuple[Aggregate, str, str] | None:
    """``(function, the word after it, phrase)`` for "total amount", "average seats" …, or ``None``."""
    m = _AGGREGATE.search(request)
    if m is None:
        return None
    fn = m.group("fn").lower()
    name: Aggregate = _FUNCTIONS.get(fn, "SUM")
    return name, (m.group("what") or "").lower(), m.group(0)
