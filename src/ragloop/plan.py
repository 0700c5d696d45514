"""A typed retrieval plan: sub-queries over named sources, their dependencies, and the waves they run in.

A :class:`Plan` is a small DAG of :class:`SubQuery` values. Each sub-query names a *source* (``"documents"``,
``"sql"``, ``"tickets"`` …), its query text and filters, the sub-queries it depends on, and the *slots* that
carry values from a dependency's results into its own text or filters (``"{customer}"`` in the query is filled
from the ``customer`` column of an earlier SQL sub-query's rows)::

    Plan(
        subqueries=(
            SubQuery("cust", "sql", "plan of customer Harbor Lane Bank", purpose="find the customer's plan"),
            SubQuery(
                "price",
                "documents",
                "{plan} plan price per seat",
                depends_on=("cust",),
                slots=(Slot("plan", "cust", "plan"),),
            ),
        ),
        intent="customer plan, then its price",
    )

Everything here is pure: :func:`validate_plan` names every problem, :func:`build_waves` orders the sub-queries
in topological waves (each as early as its dependencies allow), :func:`dependents` finds what a failure skips.
The run's outcome (:class:`PlanRun`: waves, timings and each sub-query's :class:`Fate`) is written by the plan
node and lands in the turn's decision record.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Literal

from attrs import field, frozen

from ragloop.errors import PlanError

__all__ = [
    "MAX_SUBQUERIES",
    "Fate",
    "FateStatus",
    "Plan",
    "PlanRun",
    "Slot",
    "SubQuery",
    "WaveRun",
    "build_waves",
    "dependents",
    "fill",
    "placeholders",
    "plan_problems",
    "validate_plan",
]

#: Most sub-queries a plan may hold by default (a bigger plan is a runaway planner, not a question).
MAX_SUBQUERIES = 6
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def _filter_items(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(k), str(v)) for k, v in items)


@frozen
class Slot:
    """A value carried from an earlier sub-query's results into a later one.

    Attributes:
        name: The placeholder name, used as ``{name}`` in the query text or a filter value.
        source: Id of the sub-query whose results fill it (must be a dependency).
        column: The result field to take: a row column for SQL, a record field for live sources
            (``id`` is always available).
    """

    name: str
    source: str
    column: str


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _slots(value: Iterable[Slot]) -> tuple[Slot, ...]:
    return tuple(value)


@frozen
class SubQuery:
    """One step of a plan.

    Attributes:
        id: Short identifier, unique in the plan (letters, digits, ``_``).
        source: Name of the source that answers it (``documents``, ``sql``, a live source's name).
        query: Query text; may hold ``{slot}`` placeholders filled from dependencies' results.
        filters: Source-specific filters as ``(name, value)`` pairs (a mapping is accepted:
            ``{"ids": "{ticket_ids}"}``); values may be placeholders. :meth:`filter_map` gives them as a dict.
        depends_on: Ids of the sub-queries that must finish (with results) before this one runs.
        purpose: Why the plan needs it, in a few words (for the record and the answer's gap notes).
        slots: The placeholders and where their values come from.
    """

    id: str
    source: str
    query: str
    filters: tuple[tuple[str, str], ...] = field(default=(), converter=_filter_items)
    depends_on: tuple[str, ...] = field(default=(), converter=_names)
    purpose: str = ""
    slots: tuple[Slot, ...] = field(default=(), converter=_slots)

    def filter_map(self) -> dict[str, str]:
        """The filters as a dict."""
        return dict(self.filters)


def _subqueries(value: Iterable[SubQuery]) -> tuple[SubQuery, ...]:
    return tuple(value)


@frozen
class Plan:
    """A retrieval plan for one question.

    Attributes:
        subqueries: The steps, in the planner's order.
        intent: What the question wants, in a few words.
        notes: Synthesis notes for the answer (how the parts relate).
    """

    subqueries: tuple[SubQuery, ...] = field(converter=_subqueries)
    intent: str = ""
    notes: str = ""

    def by_id(self) -> dict[str, SubQuery]:
        """Sub-queries by id."""
        return {q.id: q for q in self.subqueries}

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources the plan uses, in order of first use."""
        return tuple(dict.fromkeys(q.source for q in self.subqueries))


def placeholders(text: str) -> tuple[str, ...]:
    """The ``{name}`` placeholders of ``text``, in order, unique (``{{`` is a literal brace)."""
    names: list[str] = []
    try:
        for _, name, _, _ in string.Formatter().parse(text):
            if name is not None and name not in names:
                names.append(name)
    except ValueError:  # an unmatched brace: no placeholders, the text is taken literally
        return ()
    return tuple(names)


def fill(text: str, values: Mapping[str, Sequence[str]]) -> str:
    """``text`` with each ``{name}`` replaced by its values joined with ``", "`` (unknown names stay as is)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return ", ".join(values[name]) if name in values else m.group(0)

    return re.sub(r"\{([^{}]+)\}", one, text)


def plan_problems(plan: Plan, sources: Collection[str], *, max_subqueries: int = MAX_SUBQUERIES) -> list[str]:
    """Every problem of ``plan`` as one sentence each (empty: the plan is valid).

    Checks: at least one and at most ``max_subqueries`` sub-queries; ids well formed and unique; every
    source known; every dependency exists and is not the sub-query itself; no cycle; every slot's source is
    a dependency; every placeholder in the query and filters is a declared slot, and every slot is used.
    """
    problems: list[str] = []
    subs = plan.subqueries
    if not subs:
        problems.append("the plan has no sub-queries; plan at least one search")
    if len(subs) > max_subqueries:
        problems.append(f"the plan has {len(subs)} sub-queries; the limit is {max_subqueries}")
    ids = [q.id for q in subs]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"sub-query id {dup!r} is used {ids.count(dup)} times; ids must be unique")
    for q in subs:
        problems.extend(_subquery_problems(q, set(ids), sources))
    cycle = _cycle(subs)
    if cycle:
        problems.append(f"the plan has a dependency cycle: {' -> '.join(cycle)}")
    return problems


def _subquery_problems(q: SubQuery, known: set[str], sources: Collection[str]) -> list[str]:
    problems: list[str] = []
    if not _ID.fullmatch(q.id):
        problems.append(f"sub-query id {q.id!r} must be 1-32 letters, digits or '_' starting with a letter")
    if q.source not in sources:
        problems.append(
            f"sub-query {q.id!r} uses unknown source {q.source!r}; known: {', '.join(sorted(sources)) or 'none'}"
        )
    if not q.query.strip():
        problems.append(f"sub-query {q.id!r} has an empty query")
    for dep in q.depends_on:
        if dep == q.id:
            problems.append(f"sub-query {q.id!r} depends on itself")
        elif dep not in known:
            problems.append(f"sub-query {q.id!r} depends on {dep!r}, which is not in the plan")
    names = [s.name for s in q.slots]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"sub-query {q.id!r} declares slot {dup!r} twice")
    for s in q.slots:
        if s.source not in q.depends_on:
            problems.append(
                f"slot {s.name!r} of sub-query {q.id!r} reads from {s.source!r}, which is not one of its "
                f"dependencies ({', '.join(q.depends_on) or 'none'}); add it to depends_on"
            )
    used = set(placeholders(q.query)).union(*(placeholders(v) for _, v in q.filters))
    for name in sorted(used - set(names)):
        problems.append(f"sub-query {q.id!r} uses placeholder {{{name}}} but declares no slot {name!r}")
    for name in sorted(set(names) - used):
        problems.append(f"slot {name!r} of sub-query {q.id!r} is never used in its query or filters")
    return problems


def validate_plan(plan: Plan, sources: Collection[str], *, max_subqueries: int = MAX_SUBQUERIES) -> Plan:
    """``plan`` if it is valid; otherwise :class:`PlanError` listing every problem (see :func:`plan_problems`)."""
    problems = plan_problems(plan, sources, max_subqueries=max_subqueries)
    if problems:
        raise PlanError("invalid retrieval plan: " + "; ".join(problems))
    return plan


def _cycle(subs: Sequence[SubQuery]) -> list[str]:
    """One dependency cycle as ``[a, b, …, a]`` (empty: none). Unknown dependencies are ignored."""
    deps = {q.id: list(q.depends_on) for q in subs}
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        colour[node] = 1
        stack.append(node)
        for dep in deps.get(node, ()):
            if dep not in deps:
                continue
            if colour.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in colour:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        colour[node] = 2
        return []

    for q in subs:
        if q.id not in colour:
            found = visit(q.id)
            if found:
                return found
    return []


def build_waves(subqueries: Sequence[SubQuery]) -> tuple[tuple[str, ...], ...]:
    """Topological waves of sub-query ids: each sub-query runs in the first wave after all its dependencies.

    Within a wave, ids keep the plan's order. Raises :class:`PlanError` on a cycle or an unknown dependency.
    """
    pending = {q.id: set(q.depends_on) for q in _unique(subqueries)}
    order = [q.id for q in subqueries]
    for qid, deps in pending.items():
        unknown = deps - pending.keys()
        if unknown:
            raise PlanError(f"sub-query {qid!r} depends on {sorted(unknown)}, which are not in the plan")
    done: set[str] = set()
    waves: list[tuple[str, ...]] = []
    while len(done) < len(order):
        wave = tuple(i for i in order if i not in done and pending[i] <= done)
        if not wave:
            raise PlanError(f"the plan has a dependency cycle: {' -> '.join(_cycle(subqueries))}")
        waves.append(wave)
        done.update(wave)
    return tuple(waves)


def _unique(subqueries: Iterable[SubQuery]) -> list[SubQuery]:
    """The sub-queries as a list (first copy of a duplicated id wins)."""
    seen: dict[str, SubQuery] = {}
    for q in subqueries:
        seen.setdefault(q.id, q)
    return list(seen.values())


def dependents(subqueries: Sequence[SubQuery], failed: Collection[str]) -> frozenset[str]:
    """Every sub-query that depends, directly or transitively, on one in ``failed`` (``failed`` excluded)."""
    children: dict[str, list[str]] = {}
    for q in subqueries:
        for dep in q.depends_on:
            children.setdefault(dep, []).append(q.id)
    out: set[str] = set()
    frontier = list(failed)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in out:
                out.add(child)
                frontier.append(child)
    return frozenset(out - set(failed))


#: What happened to a sub-query: answered, ran with no results, failed, refused (unsafe SQL, cannot answer
#: offline), or skipped because a dependency did not deliver.
FateStatus = Literal["ok", "empty", "failed", "refused", "skipped"]


@frozen
class Fate:
    """What happened to one sub-query.

    Attributes:
        id: The sub-query id.
        source: Its source.
        status: ``ok``, ``empty``, ``failed``, ``refused`` or ``skipped``.
        wave: 1-based wave it belonged to.
        query: The query as run, slots filled (the template, when skipped).
        reason: Why it failed, was refused or skipped (empty when ``ok``).
        results: How many results (rows, passages, records) it returned.
        seconds: How long it ran (0 when skipped).
        detail: Source-specific detail, e.g. the SQL statement that ran.
    """

    id: str
    source: str
    status: FateStatus
    wave: int
    query: str
    reason: str = ""
    results: int = 0
    seconds: float = 0.0
    detail: str = ""


@frozen
class WaveRun:
    """One wave of a plan run.

    Attributes:
        n: 1-based wave number.
        ids: The sub-queries it held.
        seconds: Its wall time (its sub-queries ran concurrently).
    """

    n: int
    ids: tuple[str, ...]
    seconds: float


@frozen
class PlanRun:
    """A plan and how it ran: written by the plan node, read by the answer and the decision record.

    Attributes:
        plan: The validated plan.
        planner: Which planner made it (``offline``, a model name, or ``fallback: …``).
        waves: The waves as they ran.
        fates: Each sub-query's fate, in plan order.
    """

    plan: Plan
    planner: str
    waves: tuple[WaveRun, ...] = ()
    fates: tuple[Fate, ...] = ()

    def fate(self, subquery_id: str) -> Fate | None:
        """The fate of one sub-query, if it has one yet."""
        return next((f for f in self.fates if f.id == subquery_id), None)

    @property
    def gaps(self) -> tuple[Fate, ...]:
        """The sub-queries that found nothing (empty, failed, refused or skipped)."""
        return tuple(f for f in self.fates if f.status != "ok")
