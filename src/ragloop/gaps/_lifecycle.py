"""A gap's life from run to run of ``ragloop gaps``: a stable id, a status, when it was first and last seen (pure).

What the log remembers (:class:`~ragloop.turnlog.GapBook`) is which gap each gap turn belonged to, each gap's
record, and the latest ``ragloop replay --mark-gaps`` of each turn. A run groups the period's gap turns afresh;
:func:`apply_lifecycle` then gives each topic

- **its id**: the remembered gap that shares the most of its turns keeps its id (ties: the lower id; each id goes
  to one topic only); a topic that shares none gets a new one, ``g-`` and 10 hex digits of the SHA-256 of its
  earliest turn id, so the same log gives the same ids even before any state is saved;
- **its status**: ``fixed`` when every one of its turns that has been replayed was answered in its latest replay,
  and that replay came after the topic's latest turn; ``reopened`` when a fixed gap later gets an unanswered replay
  or a new gap turn; else what it was (``open`` for a new gap).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence

import attrs

from ragloop.gaps._report import GapReport, Topic
from ragloop.turnlog import GapBook, GapRecord

__all__ = ["STATUSES", "apply_lifecycle", "assign_ids", "next_status", "weekly"]

#: A gap's statuses.
STATUSES = ("open", "fixed", "reopened")


def _new_id(turn_ids: Sequence[str], taken: set[str]) -> str:
    seed, n = min(turn_ids) if turn_ids else "", 0
    while True:
        gid = "g-" + hashlib.sha256(f"{seed}#{n}".encode() if n else seed.encode()).hexdigest()[:10]
        if gid not in taken:
            return gid
        n += 1


def assign_ids(topics: Sequence[Sequence[str]], members: Mapping[str, str]) -> list[str]:
    """A gap id per topic (given as its turn ids): the remembered gap sharing most turns, else a new id.

    Each remembered id goes to at most one topic: pairs are taken by most shared turns first, then by id, then by
    the topic's turn ids, so the result depends neither on dictionary order nor on the order of the topics.
    """
    pairs: list[tuple[int, str, tuple[str, ...], int]] = []
    for n, turn_ids in enumerate(topics):
        shared = Counter(members[t] for t in turn_ids if t in members)
        pairs.extend((-count, gid, tuple(sorted(turn_ids)), n) for gid, count in shared.items())
    out: list[str | None] = [None] * len(topics)
    used: set[str] = set()
    for _, gid, _, n in sorted(pairs):
        if out[n] is None and gid not in used:
            out[n] = gid
            used.add(gid)
    taken = used | set(members.values())
    for n, turn_ids in enumerate(topics):
        if out[n] is None:
            gid = _new_id(turn_ids, taken)
            out[n] = gid
            taken.add(gid)
    return [gid for gid in out if gid is not None]


def next_status(
    prev: GapRecord | None, turns: Sequence[tuple[str, float]], replays: Mapping[str, tuple[float, bool]]
) -> tuple[str, float]:
    """The gap's status and since when, from its last record, its turns ``(turn id, at)`` and their replays."""
    last_turn = max((at for _, at in turns), default=0.0)
    first_turn = min((at for _, at in turns), default=0.0)
    replayed = [replays[t] for t, _ in turns if t in replays]
    if replayed:
        latest = max(at for at, _ in replayed)
        if all(answered for _, answered in replayed) and latest >= last_turn:
            return ("fixed", prev.status_at) if prev is not None and prev.status == "fixed" else ("fixed", latest)
    if prev is None:
        return "open", first_turn
    if prev.status == "fixed":
        regressions = [at for at, answered in replayed if at > prev.status_at and not answered]
        regressions += [at for _, at in turns if at > prev.status_at]
        if regressions:
            return "reopened", min(regressions)
    return prev.status, prev.status_at


def weekly(days: Sequence[str], daily: Sequence[int]) -> tuple[tuple[str, int], ...]:
    """Turns per week (keyed by the week's Monday, ``YYYY-MM-DD``) from per-day counts."""
    weeks: dict[str, int] = {}
    for day, count in zip(days, daily, strict=True):
        d = dt.date.fromisoformat(day)
        monday = (d - dt.timedelta(days=d.weekday())).isoformat()
        weeks[monday] = weeks.get(monday, 0) + count
    return tuple(weeks.items())


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def apply_lifecycle(
    report: GapReport, book: GapBook, times: Mapping[str, float]
) -> tuple[GapReport, list[GapRecord], dict[str, str]]:
    """The report with each topic's id, status, first/last seen and weekly counts; and what to save.

    Args:
        report: A fresh report (:func:`~ragloop.gaps.build_report`).
        book: What the log remembers (``SQLBackend.gap_book()`` of the turn log).
        times: Turn id → when, for the report's turns.

    Returns:
        The report, the gap records to store, and the memberships (turn id → gap id) to store.
    """
    ids = assign_ids([t.turn_ids for t in report.topics], book.members)
    topics: list[Topic] = []
    records: list[GapRecord] = []
    members: dict[str, str] = {}
    for topic, gid in zip(report.topics, ids, strict=True):
        prev = book.gaps.get(gid)
        turns = [(t, times[t]) for t in topic.turn_ids if t in times]
        status, since = next_status(prev, turns, book.replays)
        ats = [at for _, at in turns]
        first = min([*ats, *([prev.first_seen] if prev is not None else [])], default=0.0)
        last = max([*ats, *([prev.last_seen] if prev is not None else [])], default=0.0)
        records.append(GapRecord(gid, topic.label, status, since, first, last))
        members.update({t: gid for t in topic.turn_ids})
        topics.append(
            attrs.evolve(
                topic,
                gap_id=gid,
                status=status,
                status_since=_iso(since),
                first_seen=_iso(first),
                last_seen=_iso(last),
                weekly=weekly(report.days, topic.daily),
            )
        )
    return attrs.evolve(report, topics=tuple(topics)), records, members
