"""grade: grade each query's hits against that query, concurrently, failing open."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import error_text
from ragloop.events import Progress
from ragloop.llm.budget import time_left
from ragloop.llm.protocols import BatchGrader, Grader
from ragloop.policy import EDGES, GRADE, RoutingPolicy, next_step
from ragloop.runner import emit
from ragloop.state import Graded, Hit, TurnState, Verdict

__all__ = ["Grade", "grade_all", "grade_batches"]

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
                verdict = Verdict("relevant", reason=f"grader failed: {error_text(exc)}", fail_open=True)
        out[i] = Graded(query, hit, verdict)

    async with anyio.create_task_group() as tg:
        for i, (query, hit) in enumerate(pairs):
            tg.start_soon(one, i, query, hit)
    return [g for g in out if g is not None]


async def grade_batches(
    grader: BatchGrader,
    groups: Sequence[tuple[str, Sequence[Hit]]],
    *,
    timeout_s: float,
    max_concurrency: int,
) -> list[Graded]:
    """Grade each ``(query, hits)`` group in one judge call, the groups concurrently, failing open.

    A failed or timed-out call keeps all of its group's hits; a hit the reply gave no valid verdict for is kept
    alone (``fail_open=True`` and the reason, in both cases). The result follows the order of ``groups``.
    """
    out: list[list[Graded]] = [[] for _ in groups]
    limiter = anyio.CapacityLimiter(max(1, max_concurrency))

    async def one(i: int, query: str, hits: Sequence[Hit]) -> None:
        failed: str | None = None
        verdicts: Sequence[Verdict | None] = ()
        async with limiter:
            try:
                with anyio.fail_after(timeout_s):
                    verdicts = await grader.grade_batch(query, hits)
            except TimeoutError:
                failed = f"grader timed out after {timeout_s}s"
            except Exception as exc:  # noqa: BLE001 — fail-open: a grader failure keeps the chunks
                failed = f"grader failed: {error_text(exc)}"
        for j, hit in enumerate(hits):
            verdict = verdicts[j] if failed is None and j < len(verdicts) else None
            if verdict is None:
                why = failed or "the batch reply had no valid verdict for this passage"
                verdict = Verdict("relevant", reason=why, fail_open=True)
            out[i].append(Graded(query, hit, verdict))

    async with anyio.create_task_group() as tg:
        for i, (query, hits) in enumerate(groups):
            if hits:
                tg.start_soon(one, i, query, hits)
    return [g for group in out for g in group]


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
        per_passage: Grade each hit in its own judge call even when the grader can grade a query's hits in
            one (:class:`~ragloop.llm.protocols.BatchGrader`).
    """

    grader: Grader
    policy: RoutingPolicy = field(kw_only=True)
    min_relevant: int = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    max_concurrency: int = field(kw_only=True)
    per_passage: bool = field(default=False, kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[GRADE], init=False)

    async def __call__(self, state: TurnState) -> str:
        current = [q for q in state.queries.values() if q.status == "pending"]
        # Half of what is left of the turn at most: grades that outlive the deadline would be cancelled with the
        # node and the hits lost, when failing open keeps them for the answer.
        left = time_left()
        timeout_s = self.timeout_s if left is None else max(0.05, min(self.timeout_s, left / 2))
        if not self.per_passage and isinstance(self.grader, BatchGrader):
            groups = [(q.text, tuple(q.hits)) for q in current]
            graded = await grade_batches(self.grader, groups, timeout_s=timeout_s, max_concurrency=self.max_concurrency)
        else:
            pairs = [(q.text, h) for q in current for h in q.hits]
            graded = await grade_all(self.grader, pairs, timeout_s=timeout_s, max_concurrency=self.max_concurrency)
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
                message=_graded_message(graded, len(current)),
                data={q.text: q.status for q in current},
            )
        )
        return next_step(state, self.policy, after=GRADE)


def _graded_message(graded: Sequence[Graded], queries: int) -> str:
    """ "5 of 8 passages relevant": distinct passages, a passage counted once however many queries found it."""
    kept = {g.hit.id for g in graded if g.verdict.keep}
    seen = {g.hit.id for g in graded}
    per = f" ({len(graded)} grades for {queries} queries)" if queries > 1 else ""
    return f"{len(kept)} of {len(seen)} passages relevant{per}"
