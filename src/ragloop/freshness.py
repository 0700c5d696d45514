"""Freshness: which cited pages may be out of date, and the note a reply then carries.

A document may carry three metadata keys (YAML front matter, or ``ragloop index --meta``):

- ``updated``: when it was last reviewed (ISO date, ``2024-05-01``, or a datetime that starts with one);
- ``valid_until``: the last day it holds (a price list that ends, a policy with a renewal date);
- ``owner``: who refreshes it (a team or a person), named in the note and in ``ragloop gaps``.

A cited page is *stale* when today is past its ``valid_until``, or when :attr:`Freshness.max_age_days` is set
and its ``updated`` date is older than that. A date that does not parse is ignored (never a reason to call a page
stale). Pure: values in, values out; "today" is the UTC date unless :attr:`Freshness.today` fixes it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence

from attrs import field, frozen

from ragloop.state import Chunk, Citation, StaleSource

__all__ = ["Freshness", "parse_date", "stale_note", "stale_sources"]

_DATE = re.compile(r"\s*(\d{4})-(\d{1,2})-(\d{1,2})(?:$|[T ])")


def parse_date(value: str | None) -> dt.date | None:
    """The calendar date at the start of ``value`` (``2024-05-01``, ``2024-05-01T10:00:00Z``), else ``None``."""
    if not value:
        return None
    found = _DATE.match(value)
    if found is None:
        return None
    try:
        return dt.date(int(found.group(1)), int(found.group(2)), int(found.group(3)))
    except ValueError:
        return None


def _max_age(instance: object, attribute: object, value: float | None) -> None:
    if value is not None and (not isinstance(value, int | float) or not math.isfinite(value) or value < 0):
        raise ValueError(f"Freshness: max_age_days must be a number of days >= 0 (or None), got {value!r}")


@frozen
class Freshness:
    """When a cited page counts as stale.

    Attributes:
        max_age_days: A page whose ``updated`` date is older than this many days is stale (``None``: only
            ``valid_until`` counts).
        today: The date to check against (``None``: the UTC date at the check); fix it for reproducible runs.
    """

    max_age_days: float | None = field(default=None, validator=_max_age)
    today: dt.date | None = None

    def date(self) -> dt.date:
        """The date checks run against."""
        return self.today or dt.datetime.now(dt.UTC).date()


def _reason(meta: Mapping[str, str], freshness: Freshness, today: dt.date) -> str | None:
    until = parse_date(meta.get("valid_until"))
    if until is not None and today > until:
        return "expired"
    updated = parse_date(meta.get("updated"))
    if freshness.max_age_days is not None and updated is not None and (today - updated).days > freshness.max_age_days:
        return "old"
    return None


def stale_sources(
    citations: Sequence[Citation], chunks: Mapping[str, Chunk], freshness: Freshness
) -> tuple[StaleSource, ...]:
    """The cited pages that are stale, once per source, in citation order.

    Args:
        citations: The reply's citations.
        chunks: The turn's chunks by id (a citation whose chunk is not there is skipped).
        freshness: When a page counts as stale.
    """
    today = freshness.date()
    out: list[StaleSource] = []
    seen: set[str] = set()
    for c in citations:
        chunk = chunks.get(c.chunk_id)
        if chunk is None or c.source in seen:
            continue
        meta = chunk.meta()
        reason = _reason(meta, freshness, today)
        if reason is None:
            continue
        seen.add(c.source)
        out.append(
            StaleSource(
                n=c.n,
                source=c.source,
                title=c.title or c.source,
                reason="expired" if reason == "expired" else "old",
                owner=meta.get("owner") or None,
                updated=meta.get("updated") or None,
                valid_until=meta.get("valid_until") or None,
            )
        )
    return tuple(out)


def _describe(s: StaleSource) -> str:
    why = f"valid until {s.valid_until}" if s.reason == "expired" else f"last updated {s.updated}"
    owner = f"; owner: {s.owner}" if s.owner else ""
    return f"[{s.n}] {s.title} ({why}{owner})"


def stale_note(stale: Sequence[StaleSource]) -> str:
    """The note a reply ends with when it rests on stale pages (empty when none is stale)."""
    if not stale:
        return ""
    if len(stale) == 1:
        return f"\n\n(Note: this answer cites a page that may be out of date: {_describe(stale[0])}.)"
    return "\n\n(Note: this answer cites pages that may be out of date: " + "; ".join(map(_describe, stale)) + ".)"
