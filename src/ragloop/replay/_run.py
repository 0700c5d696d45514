"""Re-asking logged questions against a chat: grouped, bounded, in a fixed order, with progress."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import anyio

from ragloop.errors import RagloopError
from ragloop.replay._compare import Outcome, ReplayItem, ReplayReport, order, verdict

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG
    from ragloop.turnlog import LoggedTurn

__all__ = ["DEFAULT_LIMIT", "replay_turns"]

#: Logged turns replayed unless told otherwise (the latest ones).
DEFAULT_LIMIT = 10_000

_Key = tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]


def _groups(turns: Sequence[LoggedTurn]) -> tuple[dict[_Key, list[LoggedTurn]], dict[str, int]]:
    """The replayable turns by (question, filters), oldest first within each; the others counted by reason."""
    groups: dict[_Key, list[LoggedTurn]] = {}
    skipped: dict[str, int] = {}
    for t in sorted(turns, key=lambda t: (t.row.at, t.row.turn_id)):
        row = t.row
        if row.question is None:
            why = "no question kept (the log was written with capture_questions=False)"
        elif row.truncated:
            why = "question truncated in the log (longer than it keeps)"
        elif row.filters is None:  # asked without them, it could read pages of a tenant it was walled from
            why = "logged before turns kept their filters: its walls are unknown"
        else:
            groups.setdefault((row.question, row.filters), []).append(t)
            continue
        skipped[why] = skipped.get(why, 0) + 1
    return groups, skipped


async def replay_turns(
    rag: ChatRAG,
    turns: Sequence[LoggedTurn],
    *,
    pages: Collection[str] | None = None,
    limit: int = DEFAULT_LIMIT,
    concurrency: int = 4,
    deadline_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Ask each distinct logged question again and compare the reply with its latest logged turn.

    Each question is asked with the filters its turn was logged with (the tenant wall among them) and nothing
    else: no other tenant's pages can answer it. A question asked many times is asked once. The report is the
    same whatever order the replies finish in.

    Args:
        rag: The chat over the knowledge base to measure (offline judges give the same replies every run).
        turns: Logged turns (:meth:`ragloop.turnlog.TurnLog.turns`).
        pages: Every page of that knowledge base, to tell a cited page that is gone (``None``: not known).
        limit: Replay only the latest ``limit`` logged turns.
        concurrency: Questions in flight at once.
        deadline_s: Time limit per question.
        progress: Called with ``(done, total)`` questions after each one.

    Raises:
        ValueError: ``limit`` or ``concurrency`` below 1.
    """
    if limit < 1 or concurrency < 1:
        raise ValueError(f"limit and concurrency must be at least 1, got {limit} and {concurrency}")
    started = time.perf_counter()
    latest = sorted(turns, key=lambda t: (t.row.at, t.row.turn_id))[-limit:]
    groups, skipped = _groups(latest)
    keys = list(groups)
    afters: list[Outcome | None] = [None] * len(keys)
    pending = iter(enumerate(keys))
    done = 0

    async def worker() -> None:  # a fixed number of workers, not a task per question: memory stays bounded
        nonlocal done
        for n, (question, filters) in pending:
            try:
                reply = await rag.ask(question, filters=dict(filters), deadline_s=deadline_s)
                afters[n] = Outcome.of(reply.outcome, [c.source for c in reply.citations])
            except RagloopError:  # a filter key the new knowledge base lacks, a question it refuses
                afters[n] = Outcome("error")
            done += 1
            if progress is not None:
                progress(done, len(keys))

    async with anyio.create_task_group() as tg:
        for _ in range(min(concurrency, len(keys))):
            tg.start_soon(worker)
    items = []
    for key, after in zip(keys, afters, strict=True):
        assert after is not None  # every task set its slot before the group closed
        logged = groups[key]
        last = logged[-1].row
        before = Outcome.of(last.outcome, [c.source for c in last.citations])
        which, reason = verdict(before, after, pages)
        items.append(
            ReplayItem(key[0], key[1], tuple(t.row.turn_id for t in logged), last.at, before, after, which, reason)
        )
    return ReplayReport(
        items=order(items),
        turns=len(latest),
        skipped=tuple(sorted(skipped.items())),
        seconds=time.perf_counter() - started,
    )
