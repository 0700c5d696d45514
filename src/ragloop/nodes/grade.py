"""grade: grade each query's hits against that query, concurrently, failing open."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.events import Progress
from ragloop.llm.protocols import Grader
from ragloop.policy import RoutingPolicy, next_step
from ragloop.runner import emit
from ragloop.state import Graded, Hit, TurnState, Verdict

__all__ = ["Grade", "grade_all"]

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


@define
class Grade:
    """Grades the latest retrieve's hits per query and marks each query ``enough`` or ``short``.

    Attributes:
        grader: The judge.
        policy: Where the turn goes next (:func:`ragloop.policy.next_step`).
        min_relevant: Relevant hits a query needs to count as answered; partial hits are kept as context
            but never make a query ``enough`` on their own.
        timeout_s: Time limit per grade; past it the chunk is kept (fail-open).
        max_concurrency: Grades run at once.
    """

    grader: Grader
    policy: RoutingPolicy = field(kw_only=True)
    min_relevant: int = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    max_concurrency: int = field(kw_only=True)
    routes: tuple[str, ...] = field(default=("live", "rewrite", "hop", "answer"), init=False)

    async def __call__(self, state: TurnState) -> str:
        current = [q for q in state.queries.values() if q.status == "pending"]
        pairs = [(q.text, h) for q in current for h in q.hits]
        graded = await grade_all(self.grader, pairs, timeout_s=self.timeout_s, max_concurrency=self.max_concurrency)
        state.graded.extend(graded)
        failed_open = sum(g.verdict.fail_open for g in graded)
        if failed_open:
            log.warning("grade.fail_open", count=failed_open)
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
        return next_step(state, self.policy, after="grade")
