"""grade: grade each query's hits against that query, concurrently, failing open."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.events import Progress
from ragloop.llm.protocols import Grader
from ragloop.retrievers.live import LiveSource
from ragloop.runner import emit
from ragloop.state import Graded, Hit, TurnState, Verdict

__all__ = ["Grade", "grade_all", "route_after_grading"]

log = get_logger("ragloop.nodes.grade")


async def grade_all(
    grader: Grader,
    pairs: Sequence[tuple[str, Hit]],
    *,
    timeout_s: float,
    max_concurrency: int,
) -> list[Graded]:
    """Grade every ``(query, hit)`` pair concurrently; a failed or timed-out grade keeps the hit (fail-open).

    The result is in the order of ``pairs``; fail-open verdicts have ``fail_open=True`` and the reason.
    """
    out: list[Graded | None] = [None] * len(pairs)
    limiter = anyio.CapacityLimiter(max(1, max_concurrency))

    async def one(i: int, query: str, hit: Hit) -> None:
        async with limiter:
            try:
                with anyio.fail_after(timeout_s):
                    verdict = await grader.grade(query, hit)
            except TimeoutError:
                verdict = Verdict("relevant", reason=f"grader timed out after {timeout_s}s", fail_open=True)
            except Exception as exc:  # noqa: BLE001 — fail-open: a grader failure keeps the chunk (better extra than lost)
                verdict = Verdict("relevant", reason=f"grader failed: {type(exc).__name__}: {exc}", fail_open=True)
        out[i] = Graded(query, hit, verdict)

    async with anyio.create_task_group() as tg:
        for i, (query, hit) in enumerate(pairs):
            tg.start_soon(one, i, query, hit)
    return [g for g in out if g is not None]


def route_after_grading(
    state: TurnState,
    live_sources: Sequence[LiveSource],
    max_attempts: int,
    *,
    live_done: bool = False,
    max_hops: int = 0,
) -> str:
    """Where a turn goes once its queries are graded: live, rewrite, hop or answer."""
    short = [q for q in state.queries.values() if q.status in ("short", "failed") and not q.hop]
    if not short:
        return "hop" if len(state.hops) < max_hops else "answer"
    if not live_done and any(not q.live_tried and any(s.signals(q.text) for s in live_sources) for q in short):
        return "live"
    if any(q.attempt < max_attempts for q in short):
        return "rewrite"
    return "answer"


@define
class Grade:
    """Grades the latest retrieve's hits per query and marks each query ``enough`` or ``short``.

    Attributes:
        grader: The judge.
        live_sources: Live sources, to know whether a short query should go to ``live``.
        max_attempts: Rewrites allowed per decide query (must match the rewrite node's).
        min_relevant: Relevant hits a query needs to count as answered; partial hits are kept as context
            but never make a query ``enough`` on their own.
        timeout_s: Time limit per grade; past it the chunk is kept (fail-open).
        max_concurrency: Grades run at once.
        max_hops: Follow-up hops per turn when every query is answered (0: no ``hop`` node).
    """

    grader: Grader
    live_sources: Sequence[LiveSource] = ()
    max_attempts: int = 2
    min_relevant: int = 1
    timeout_s: float = 10.0
    max_concurrency: int = 16
    max_hops: int = 0
    routes: tuple[str, ...] = field(default=("live", "rewrite", "hop", "answer"), init=False)

    async def __call__(self, state: TurnState) -> str:
        current = [q for q in state.queries.values() if q.status == "pending"]
        pairs = [(q.text, h) for q in current for h in q.hits]
        graded = await grade_all(self.grader, pairs, timeout_s=self.timeout_s, max_concurrency=self.max_concurrency)
        state.graded.extend(graded)
        for g in graded:
            if g.verdict.fail_open:
                state.fail_open.append((g.query, g.hit.id, g.verdict.reason))
        if any(g.verdict.fail_open for g in graded):
            log.warning("grade.fail_open", count=sum(g.verdict.fail_open for g in graded))
        for q in current:
            relevant = sum(1 for g in graded if g.query == q.text and g.verdict.label == "relevant")
            q.status = "enough" if relevant >= self.min_relevant else "short"
        await emit(
            Progress(
                node="grade",
                kind="graded",
                message=f"{sum(g.verdict.keep for g in graded)} of {len(graded)} passages relevant",
                data={q.text: q.status for q in current},
            )
        )
        return route_after_grading(state, self.live_sources, self.max_attempts, max_hops=self.max_hops)
