"""The values of a content-gap report: topics, their causes and evidence, stale pages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs
from attrs import frozen

from ragloop.turnlog import Conflict

__all__ = ["CAUSES", "Cause", "GapReport", "NearPage", "StalePage", "Topic"]

#: Why a topic's questions went unanswered, most specific first (ties between causes go to the earlier one).
Cause = Literal["contradicting", "no_passage", "irrelevant", "partial", "stale", "rated_down"]
#: Every cause, most specific first.
CAUSES: tuple[Cause, ...] = ("contradicting", "no_passage", "irrelevant", "partial", "stale", "rated_down")


@frozen
class NearPage:
    """An existing page close to a topic: where its answer probably belongs.

    Attributes:
        source: The page.
        title: Its title.
        hits: How many of the topic's turns retrieved it.
        confidence: Its mean retrieval confidence in those turns.
    """

    source: str
    title: str
    hits: int
    confidence: float


@frozen
class Topic:
    """A group of like questions that went unanswered, partly answered or rated down.

    Attributes:
        rank: 1 for the topic most users hit.
        label: Its most distinctive terms, joined by `` · ``.
        terms: Those terms and the next ones, most distinctive first.
        turns: Turns in the topic.
        users: Distinct users among them.
        trend: ``rising``, ``falling`` or ``steady`` (the period's second half against its first).
        daily: Turns per day of the period.
        examples: Typical questions (the ones nearest the topic's centre; their terms for a log that keeps no
            questions).
        questions_kept: Whether ``examples`` are questions (``False``: terms only, ``capture_questions=False``).
        cause: The most common cause among its turns.
        causes: Turns per cause.
        detail: The cause in a sentence a docs writer can act on.
        missing_terms: Terms no passage covered (for ``no_passage`` and ``partial``).
        conflicts: What cited pages disagree on (for ``contradicting``).
        pages: Existing pages nearest the topic.
        outcomes: Turns per outcome.
        down: Thumbs-down ratings.
        comments: A few of the comments that came with them.
        up: Thumbs-up ratings.
        turn_ids: Its turns, oldest first (what keeps its gap id from run to run; not in :meth:`GapReport.as_dict`).
        gap_id: Its stable id (``g-`` and 10 hex digits): the same topic keeps it across runs (see
            :mod:`ragloop.gaps._lifecycle`); empty until the lifecycle is applied.
        status: ``open``, ``fixed`` (its questions replay as answered) or ``reopened``.
        status_since: When it took that status (ISO 8601, UTC), if known.
        first_seen: Its earliest turn ever seen, in this period or an earlier run (ISO 8601, UTC).
        last_seen: Its latest turn (ISO 8601, UTC).
        weekly: ``(week's Monday, turns)`` for each week of the period.
    """

    rank: int
    label: str
    terms: tuple[str, ...]
    turns: int
    users: int
    trend: str
    daily: tuple[int, ...]
    examples: tuple[str, ...]
    questions_kept: bool
    cause: Cause
    causes: Mapping[str, int]
    detail: str
    missing_terms: tuple[str, ...]
    conflicts: tuple[Conflict, ...]
    pages: tuple[NearPage, ...]
    outcomes: Mapping[str, int]
    down: int
    comments: tuple[str, ...]
    up: int = 0
    turn_ids: tuple[str, ...] = ()
    gap_id: str = ""
    status: str = "open"
    status_since: str | None = None
    first_seen: str | None = None
    last_seen: str | None = None
    weekly: tuple[tuple[str, int], ...] = ()


@frozen
class StalePage:
    """A stale page that answers cited in the period.

    Attributes:
        source: The page.
        title: Its title.
        owner: Who refreshes it (its ``owner`` metadata), if known.
        reason: ``expired`` (past ``valid_until``) or ``old`` (``updated`` too long ago).
        valid_until: Its ``valid_until`` metadata.
        updated: Its ``updated`` metadata.
        citations: Turns whose answer cited it.
        users: Distinct users who got those answers.
    """

    source: str
    title: str
    owner: str | None
    reason: str
    valid_until: str | None
    updated: str | None
    citations: int
    users: int


@frozen
class GapReport:
    """What ``ragloop gaps`` found in a period of the turn log.

    Attributes:
        since: Start of the period (ISO 8601, UTC).
        until: Its end (exclusive).
        days: The period's days (``YYYY-MM-DD``), for the daily counts.
        turns: Turns logged in the period.
        users: Distinct users among them.
        gap_turns: Turns that ended ``none`` or ``partial``, or were rated down.
        topics: The topics, most users first.
        unclustered: Gap turns in topics too small to list.
        stale: Stale pages cited in the period, most cited first.
        daily_gaps: Gap turns per day.
        method: How questions were grouped (vectors, embedder, linkage, threshold).
    """

    since: str
    until: str
    days: tuple[str, ...]
    turns: int
    users: int
    gap_turns: int
    topics: tuple[Topic, ...]
    unclustered: int
    stale: tuple[StalePage, ...]
    daily_gaps: tuple[int, ...]
    method: str

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``ragloop gaps --json`` prints; topics without their turn ids)."""
        return attrs.asdict(self, filter=lambda a, _: a.name != "turn_ids")
