"""plan: make a retrieval plan across sources and run it in dependency waves.

:func:`execute_plan` runs a validated :class:`~ragloop.plan.Plan`: wave after wave, each wave's sub-queries
concurrently (bounded, each with its own timeout), the slots of later sub-queries filled from the rows of
earlier ones; a sub-query that fails, is refused or finds nothing skips exactly its transitive dependents,
with the reason. The :class:`Plan` node asks a planner (model first, offline fallback), runs the plan, and
hands the results to the rest of the turn: rows and live records count as graded context, document passages
go to the grade node like any query's hits. A question the planner does not plan (no structured source
needed) goes to ``decide`` unchanged; a plan of document searches in one wave *is* a decide, and goes straight
to ``retrieve``.

**Plan only when it pays.** With a model planner and the offline planner behind it, the offline planner reads
the question first (no model call): only a question that names a plan source's entities or tables (a
customer, an order id, "which customers") goes on to the model planner; any other question goes to ``decide``
at once, so a documentation question makes no planning call (decide, one grade per query, the answer).
``gate=False`` asks the model planner about every question, as before.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import anyio
import attrs
from attrs import define, field, frozen

from ragloop._log import get_logger
from ragloop._redact import bounded
from ragloop.errors import JudgeTimeout, PlanError, QueryRefused, error_text
from ragloop.events import Progress
from ragloop.llm.budget import CallBudget, time_left
from ragloop.plan import Fate, FateStatus, Plan, PlanRun, SubQuery, WaveRun, build_waves, dependents, fill
from ragloop.plan import validate_plan as _validate
from ragloop.policy import ANSWER, DECIDE, EDGES, GRADE, PLAN, RETRIEVE
from ragloop.retrievers.sources import CallerScoped, DocumentSource, Filters, Source, SourceResult
from ragloop.runner import emit
from ragloop.state import Caller, Decision, Graded, QueryState, TurnState, Verdict

if TYPE_CHECKING:
    from ragloop.llm.planner import Planner

__all__ = ["MAX_SLOT_VALUES", "PlanExecution", "PlanNode", "Strategy", "execute_plan", "slot_values"]

log = get_logger("ragloop.nodes.plan")

#: The model planner's share of the turn: the offline planner, retrieval and the answer come after it.
_PLANNER_BUDGET = CallBudget(share=0.3, reserve_s=3.0)
_PLANNER_TIMEOUT_S = 30.0

#: How to schedule a plan: dependency waves (correct), one at a time (correct, slow), or everything at once
#: ignoring dependencies (fast, wrong whenever a slot was needed: for benchmarks).
Strategy = Literal["waves", "sequential", "parallel"]
#: Most distinct values one slot carries into a later sub-query.
MAX_SLOT_VALUES = 20


@frozen
class PlanExecution:
    """A finished plan run.

    Attributes:
        run: The plan, waves and fates (goes to the state and the decision record).
        results: The source results of the sub-queries that ran, by id.
        queries: The query text each sub-query ran with (slots filled), by id.
    """

    run: PlanRun
    results: Mapping[str, SourceResult]
    queries: Mapping[str, str]


def slot_values(sub: SubQuery, results: Mapping[str, SourceResult]) -> tuple[dict[str, tuple[str, ...]], str]:
    """The values of ``sub``'s slots from its dependencies' rows, and why not (empty string when all filled).

    Values keep row order, are unique and non-empty, at most :data:`MAX_SLOT_VALUES` per slot.
    """
    values: dict[str, tuple[str, ...]] = {}
    for slot in sub.slots:
        result = results.get(slot.source)
        if result is None:
            return values, f"slot {{{slot.name}}}: {slot.source!r} has no results"
        found = [row[slot.column] for row in result.rows if row.get(slot.column, "").strip()]
        if not found:
            present = sorted({c for row in result.rows for c in row})
            return values, (
                f"slot {{{slot.name}}}: no value in column {slot.column!r} of {slot.source!r}'s "
                f"{len(result.rows)} row(s) (columns: {', '.join(present) or 'none'})"
            )
        values[slot.name] = tuple(dict.fromkeys(v.strip() for v in found))[:MAX_SLOT_VALUES]
    return values, ""


def _filters(sub: SubQuery, values: Mapping[str, tuple[str, ...]]) -> Filters:
    out: dict[str, tuple[str, ...]] = {}
    for key, template in sub.filters:
        name = template[1:-1] if template.startswith("{") and template.endswith("}") else None
        out[key] = values.get(name, ()) if name is not None else (fill(template, values),)
    return out


async def execute_plan(
    plan: Plan,
    sources: Mapping[str, Source],
    *,
    timeout_s: float = 5.0,
    max_concurrency: int = 4,
    strategy: Strategy = "waves",
    planner: str = "",
    on_wave: Callable[[WaveRun, Sequence[Fate]], Awaitable[None]] | None = None,
) -> PlanExecution:
    """Run ``plan`` against ``sources`` (validated first; raises PlanError if it is invalid).

    Args:
        plan: The plan.
        sources: The sources by name.
        timeout_s: Time limit per sub-query; past it the sub-query fails and its dependents are skipped.
        max_concurrency: Sub-queries running at once within a wave.
        strategy: ``waves`` (default), ``sequential`` or ``parallel`` (ignores dependencies; benchmarks only).
        planner: Which planner made the plan, for the record.
        on_wave: Awaited after each wave with its timing and fates (the node emits progress events).
    """
    _validate(plan, sources.keys())
    waves = build_waves(plan.subqueries)
    if strategy == "sequential":
        schedule: tuple[tuple[str, ...], ...] = tuple((qid,) for wave in waves for qid in wave)
    elif strategy == "parallel":
        schedule = (tuple(q.id for q in plan.subqueries),)
    else:
        schedule = waves
    run = _Executor(plan, sources, timeout_s, strategy, anyio.CapacityLimiter(max(1, max_concurrency)), waves)
    wave_runs: list[WaveRun] = []
    for n, ids in enumerate(schedule, start=1):
        started = time.perf_counter()
        runnable = [qid for qid in ids if qid not in run.fates]
        async with anyio.create_task_group() as tg:
            for qid in runnable:
                tg.start_soon(run.one, run.subs[qid])
        wave = WaveRun(n, tuple(runnable), round(time.perf_counter() - started, 6))
        wave_runs.append(wave)
        if strategy != "parallel":
            run.skip_dependents([qid for qid in runnable if run.fates[qid].status != "ok"])
        if on_wave is not None:
            await on_wave(wave, [run.fates[qid] for qid in runnable if qid in run.fates])
    ordered = tuple(run.fates[q.id] for q in plan.subqueries if q.id in run.fates)
    return PlanExecution(PlanRun(plan, planner, tuple(wave_runs), ordered), run.results, run.ran_with)


@define
class _Executor:
    """The mutable side of one plan run: results and fates so far."""

    plan: Plan
    sources: Mapping[str, Source]
    timeout_s: float
    strategy: Strategy
    limiter: anyio.CapacityLimiter
    waves: tuple[tuple[str, ...], ...]
    results: dict[str, SourceResult] = field(factory=dict)
    fates: dict[str, Fate] = field(factory=dict)
    ran_with: dict[str, str] = field(factory=dict)

    @property
    def subs(self) -> dict[str, SubQuery]:
        return self.plan.by_id()

    def wave_of(self, qid: str) -> int:
        return next(n for n, wave in enumerate(self.waves, start=1) if qid in wave)

    async def one(self, sub: SubQuery) -> None:
        values, problem = slot_values(sub, self.results)
        if self.strategy == "parallel":  # no dependency has run: the slots are simply empty
            values, problem = {s.name: values.get(s.name, ()) for s in sub.slots}, ""
        query = " ".join(fill(sub.query, values).split())
        self.ran_with[sub.id] = query
        wave = self.wave_of(sub.id)
        if problem:
            self.fates[sub.id] = Fate(sub.id, sub.source, "skipped", wave, query, reason=problem)
            return
        status: FateStatus = "ok"
        reason, detail, count = "", "", 0
        started = time.perf_counter()
        async with self.limiter:
            try:
                with anyio.fail_after(self.timeout_s):
                    result = await self.sources[sub.source].run(query, _filters(sub, values))
            except TimeoutError:
                status, reason = "failed", f"timed out after {self.timeout_s}s"
            except QueryRefused as exc:
                status, reason = "refused", str(exc)
            except Exception as exc:  # noqa: BLE001 - one failing sub-query never cancels its siblings
                status, reason = "failed", f"{error_text(exc)}"
            else:
                self.results[sub.id] = result
                count, detail = len(result.hits), result.detail
                if not result.hits:
                    status, reason = "empty", "found nothing"
        seconds = round(time.perf_counter() - started, 6)
        self.fates[sub.id] = Fate(sub.id, sub.source, status, wave, query, reason, count, seconds, detail)
        if status != "ok":
            log.info("subquery.not_ok", id=sub.id, status=status, reason=reason)

    def skip_dependents(self, failed: Sequence[str]) -> None:
        """Mark every transitive dependent of ``failed`` skipped, naming the failed sub-query it waited for."""
        subs = self.subs
        order = list(subs)
        for qid in sorted(dependents(self.plan.subqueries, failed), key=order.index):
            if qid in self.fates:
                continue
            cause = _path_to(subs, qid, failed)[0]
            reason = f"depends on {cause!r}, which {_verb(self.fates[cause].status)}"
            self.fates[qid] = Fate(qid, subs[qid].source, "skipped", self.wave_of(qid), subs[qid].query, reason)


def _path_to(subs: Mapping[str, SubQuery], qid: str, failed: Sequence[str]) -> list[str]:
    """The failed sub-queries ``qid`` depends on (nearest first), for the skip reason."""
    seen: list[str] = []
    frontier = list(subs[qid].depends_on)
    while frontier:
        dep = frontier.pop(0)
        if dep in failed and dep not in seen:
            seen.append(dep)
        frontier.extend(subs[dep].depends_on)
    return seen or list(subs[qid].depends_on)


def _verb(status: FateStatus) -> str:
    return {
        "empty": "found nothing",
        "failed": "failed",
        "refused": "was refused",
        "skipped": "was skipped",
        "ok": "ran",
    }[status]


def _for_turn(
    sources: Mapping[str, Source], caller: Caller | None, filters: Mapping[str, tuple[str, ...]]
) -> Mapping[str, Source]:
    """The sources scoped to the turn, as on the decide route: the caller handed to every source that answers for
    a caller (live lookups, SQL sources: ``for_caller``, with ``None`` too, so a source showing rows by tenant
    shows none to nobody), the metadata filters to every document search (the plan path checks access too)."""

    def scoped(source: Source) -> Source:
        if isinstance(source, CallerScoped):  # live lookups and SQL sources: the caller's rows only
            return source.for_caller(caller)
        if filters and isinstance(source, DocumentSource):
            return attrs.evolve(source, scope=dict(filters))
        return source

    return {k: scoped(s) for k, s in sources.items()}


@define
class PlanNode:
    """Plans retrieval across sources and runs the plan in waves; simple questions keep the decide route.

    Attributes:
        planner: The planner (a model planner, usually).
        sources: The plan sources by name (the document source included).
        fallback: Planner used when ``planner`` fails or returns an invalid plan (the offline planner).
        documents: Name of the document source: its sub-queries go on to the grade node.
        max_subqueries: Most sub-queries a plan may hold.
        timeout_s: Time limit per sub-query.
        max_concurrency: Sub-queries running at once within a wave.
        gate: Ask the model planner only about questions the ``fallback`` plans (they name a plan source's
            entities); the others go to ``decide`` without a planning call.
    """

    planner: Planner
    sources: Mapping[str, Source]
    fallback: Planner | None = None
    documents: str = "documents"
    max_subqueries: int = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    max_concurrency: int = field(kw_only=True)
    gate: bool = True
    routes: tuple[str, ...] = field(default=EDGES[PLAN], init=False)

    async def __call__(self, state: TurnState) -> str:
        made = await self._plan(state)
        if made is None:
            return DECIDE
        plan, planner = made
        waves = build_waves(plan.subqueries)
        if len(waves) == 1 and all(q.source == self.documents and not q.filters for q in plan.subqueries):
            # A single wave of document searches is what decide makes: take today's route.
            queries = tuple(dict.fromkeys(" ".join(q.query.split()) for q in plan.subqueries))
            state.decision = Decision(queries=queries, reason=f"plan ({planner}): {plan.intent}".strip())
            for q in queries:
                state.queries[q] = QueryState(text=q, root=q)
            state.pending = list(queries)
            await emit(Progress(node="plan", kind="queries", message=f"{len(queries)} search(es)"))
            return RETRIEVE
        await emit(
            Progress(
                node="plan",
                kind="plan",
                message=f"plan: {len(plan.subqueries)} sub-queries in {len(waves)} wave(s)",
                data={"planner": planner, "waves": [list(w) for w in waves], "intent": plan.intent},
            )
        )

        async def on_wave(run: WaveRun, fates: Sequence[Fate]) -> None:
            await emit(
                Progress(
                    node="plan",
                    kind="wave",
                    message=f"wave {run.n}: "
                    + ", ".join(f"{f.id} ({f.source}) {f.status}" for f in fates)
                    + f" in {run.seconds:.2f}s",
                    data={"wave": run.n, "seconds": run.seconds, "fates": [attrs.asdict(f) for f in fates]},
                )
            )

        done = await execute_plan(
            plan,
            _for_turn(self.sources, state.caller, state.filters),
            timeout_s=self.timeout_s,
            max_concurrency=self.max_concurrency,
            planner=planner,
            on_wave=on_wave,
        )
        state.plan = done.run
        return self._hand_over(state, plan, done)

    async def _plan(self, state: TurnState) -> tuple[Plan, str] | None:
        names = list(self.sources)
        offline: Plan | None = None
        asked = False
        if self.gate and self.fallback is not None and self.fallback is not self.planner:
            try:
                offline, asked = await self.fallback.plan(state.question, state.history), True
            except Exception as exc:  # noqa: BLE001 - a failing gate asks the model, as without one
                log.warning("plan.gate_failed", planner=self.fallback.name, error=str(exc))
            if asked and offline is None:
                return None  # no plan source's entity in the question: decide routes it, no planning call
        for judge in (self.planner, self.fallback):
            if judge is None:
                continue
            try:
                plan = offline if asked and judge is self.fallback else await self._ask(judge, state)
                if plan is None:
                    return None
                _validate(plan, names, max_subqueries=self.max_subqueries)
                return plan, judge.name if judge is self.planner else f"fallback: {judge.name}"
            except PlanError as exc:  # quotes the model's ids, which a server ignoring the output cap can inflate
                state.errors.append(f"plan: {error_text(exc, 1_000)}")
                log.warning("plan.invalid", planner=judge.name, error=str(exc))
            except Exception as exc:  # noqa: BLE001 - a failing planner falls back; the turn must still answer
                state.errors.append(f"plan: {type(exc).__name__}: {bounded(str(exc), 1_000)}")
                log.warning("plan.failed", planner=judge.name, error=str(exc))
        return None

    async def _ask(self, judge: Planner, state: TurnState) -> Plan | None:
        """``judge``'s plan; the model planner within a share of the turn's time, so a hung server leaves the
        offline planner and the rest of the turn their time (its SDK retries would otherwise use it all)."""
        if judge is not self.planner:
            return await judge.plan(state.question, state.history)
        seconds = _PLANNER_BUDGET.seconds(_PLANNER_TIMEOUT_S, time_left())
        if seconds <= 0:
            raise JudgeTimeout("the model planner was not asked: too little of the turn was left")
        with anyio.move_on_after(seconds) as scope:
            return await judge.plan(state.question, state.history)
        assert scope.cancelled_caught
        raise JudgeTimeout(f"the model planner did not answer within its budget of {seconds:.2f}s")

    def _hand_over(self, state: TurnState, plan: Plan, done: PlanExecution) -> str:
        """Turn each sub-query into a query of the turn: rows are context, passages go to grading."""
        state.decision = Decision(
            queries=tuple(done.queries[q.id] for q in plan.subqueries if q.id in done.queries),
            reason=f"plan: {plan.intent}".strip(),
        )
        to_grade = False
        for sub in plan.subqueries:
            fate = done.run.fate(sub.id)
            result = done.results.get(sub.id)
            gap = fate is None or fate.status != "ok" or result is None
            reason = f"{sub.source}: {fate.reason if fate else 'did not run'}"
            text = done.queries.get(sub.id) or fill(sub.query, {s.name: (f"[{s.name}]",) for s in sub.slots})
            if gap:  # the answer names what found nothing, and why ("… (sql: cannot answer offline: …)")
                text = f"{text} ({reason.split(';')[0]})"
            if text in state.queries:
                text = f"{text} ({sub.id})"
            q = QueryState(text=text, root=text, live_tried=True)
            state.queries[text] = q
            if gap or result is None:
                q.status, q.error = "no_context", reason
                continue
            hits = [attrs.evolve(h, queries=(text,), best_query=text) for h in result.hits if h.id not in state.shown]
            state.shown.update(h.id for h in hits)
            q.hits = hits
            if sub.source == self.documents:
                q.status = "pending"
                to_grade = True
                continue
            q.status = "enough"
            for h in hits:
                state.graded.append(Graded(text, h, Verdict("relevant", reason=f"{sub.source}: {h.chunk.title}")))
        return GRADE if to_grade else ANSWER
