"""What a replayed question says about a knowledge-base change: the logged turn against the new reply (pure).

A question's *before* is its latest logged turn; its *after* is the reply the given knowledge base gives now.
:func:`verdict` compares them:

- ``fixed``: it was not answered (``none`` or ``partial``) and now is, with a citation;
- ``broken``: it was answered (``context`` or ``direct``) and now is not (``none``, ``partial``, or the turn
  failed), or a page it cited is gone from the knowledge base;
- ``changed``: answered before and after, citing other pages; or a gap that is still a gap, with another outcome;
- ``same``: everything else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from attrs import frozen

__all__ = ["VERDICTS", "Outcome", "ReplayItem", "ReplayReport", "Verdict", "order", "verdict"]

#: What :func:`verdict` says of one replayed question (``VERDICTS`` lists them worst first).
Verdict = Literal["broken", "fixed", "changed", "same"]
#: What a replayed question can say, worst first (the order reports list them in).
VERDICTS: tuple[Verdict, ...] = ("broken", "fixed", "changed", "same")

_ANSWERED = ("context", "direct")
_GAP = ("none", "partial")


@frozen
class Outcome:
    """One side of the comparison: a turn's outcome and the pages its reply cited.

    Attributes:
        outcome: ``context``, ``partial``, ``none``, ``direct``, or ``error`` (the replayed turn failed).
        pages: The cited pages, sorted, each once.
    """

    outcome: str
    pages: tuple[str, ...] = ()

    @classmethod
    def of(cls, outcome: str, pages: Collection[str]) -> Outcome:
        """An outcome with its pages sorted and deduplicated."""
        return cls(outcome, tuple(sorted(set(pages))))


def verdict(before: Outcome, after: Outcome, pages: Collection[str] | None = None) -> tuple[Verdict, str]:
    """The verdict on one question and why, in a few words.

    Args:
        before: The logged turn.
        after: The replayed reply.
        pages: Every page of the knowledge base replayed against (``None``: not known; a gone page is then seen
            only in what the reply cites).
    """
    if before.outcome in _ANSWERED:
        return _was_answered(before, after, pages)
    if after.outcome == "context" and after.pages:
        return "fixed", f"was {before.outcome}, now answered"
    if after.outcome != before.outcome:
        return "changed", f"was {before.outcome}, now {after.outcome}"
    return "same", f"still {after.outcome}"


def _was_answered(before: Outcome, after: Outcome, pages: Collection[str] | None) -> tuple[Verdict, str]:
    if after.outcome not in _ANSWERED:
        return "broken", f"was {before.outcome}, now {after.outcome}"
    gone = [p for p in before.pages if pages is not None and p not in pages]
    if gone:
        return "broken", f"cited page gone: {', '.join(gone)}"
    if before.pages != after.pages:
        return "changed", "cites other pages"
    return "same", f"still {after.outcome}"


@frozen
class ReplayItem:
    """One distinct question replayed (every logged turn of the same question and filters counts once).

    Attributes:
        question: The question.
        filters: The logged filters it was asked with, ``(key, values)``.
        turn_ids: The logged turns it stands for, oldest first.
        last_at: When it was last asked (seconds since the epoch).
        before: Its latest logged turn.
        after: The reply now.
        verdict: ``fixed``, ``broken``, ``changed`` or ``same`` (see :func:`ragloop.replay.verdict`).
        reason: Why, in a few words.
    """

    question: str
    filters: tuple[tuple[str, tuple[str, ...]], ...]
    turn_ids: tuple[str, ...]
    last_at: float
    before: Outcome
    after: Outcome
    verdict: Verdict
    reason: str


@frozen
class ReplayReport:
    """A whole replay.

    Attributes:
        items: One per distinct question, worst verdict first, then most turns, then by question.
        turns: Logged turns read.
        skipped: ``(reason, turns)`` for turns that could not be replayed (no question kept, truncated).
        seconds: Wall time of the replay.
    """

    items: tuple[ReplayItem, ...]
    turns: int
    skipped: tuple[tuple[str, int], ...] = ()
    seconds: float = 0.0

    def count(self, which: Verdict) -> int:
        """Questions with this verdict."""
        return sum(1 for i in self.items if i.verdict == which)

    @property
    def broken(self) -> bool:
        """Whether anything broke (the command's exit status 1)."""
        return any(i.verdict == "broken" for i in self.items)


def order(items: Sequence[ReplayItem]) -> tuple[ReplayItem, ...]:
    """Worst verdict first, then the most asked, then by question and filters (a total order: deterministic)."""
    rank = {v: n for n, v in enumerate(VERDICTS)}
    return tuple(sorted(items, key=lambda i: (rank[i.verdict], -len(i.turn_ids), i.question, i.filters)))
