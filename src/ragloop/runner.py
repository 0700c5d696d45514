"""The graph runner: nodes, routes, a step cap, a deadline, a trace and one event stream (``Graph.stream``).

It knows nothing about RAG. A node is any object with ``async def __call__(self, state) -> str`` returning a
route (or :data:`END`) and a ``routes`` tuple of the routes it may return; a route leads to the node of its name
unless the graph's ``edges`` send it elsewhere. The runner runs one node at a time over one shared state and
always ends a run gracefully: on the step cap, the deadline or a node's error it runs the graph's ``finish``
node, and says why in :attr:`RunResult.stopped_by`. A built :class:`Graph` cannot be changed.

Time rules, with ``deadline_s`` given:

- a node other than ``finish`` still running at the deadline is cancelled, and ``finish`` runs;
- ``finish`` runs at most once per run, whatever happens (if it raises, its error propagates);
- ``finish`` may run until ``deadline + finish_grace_s`` (or its own start + grace, when it starts after the
  deadline): a deadline that passes while it runs does not restart it. Past that it is cancelled and its
  optional ``salvage`` hook (see :class:`Node`) ends it cheaply in the time reserved for it at the end of
  the grace, so a run takes at most ``deadline_s + finish_grace_s`` plus the runner's own small overshoot.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import anyio
from attrs import evolve

from ragloop._log import get_logger
from ragloop.errors import GraphError, RagloopError, RouteError, error_text
from ragloop.events import Event, EventStream, NodeFinished, NodeStarted, RunFinished, RunResult, Sink, Step, StoppedBy
from ragloop.mermaid import flowchart

__all__ = ["END", "SALVAGE_S", "EventStream", "Graph", "Node", "RunResult", "Step", "StoppedBy", "emit"]

#: Returned by a node to end the run.
END = "END"
#: Most seconds the finish node's ``salvage`` hook gets (and never more than a quarter of the grace).
SALVAGE_S = 0.5

_log = get_logger("ragloop.runner")
_sink: contextvars.ContextVar[tuple[str, Sink] | None] = contextvars.ContextVar("ragloop_sink", default=None)
# structlog's merge_contextvars picks up every context variable named "structlog_<key>"; setting these
# directly costs a tenth of bind_contextvars(), once per run and on every step.
_log_run: contextvars.ContextVar[Any] = contextvars.ContextVar("structlog_run_id", default=...)
_log_step: contextvars.ContextVar[Any] = contextvars.ContextVar("structlog_step", default=...)
_log_node: contextvars.ContextVar[Any] = contextvars.ContextVar("structlog_node", default=...)


@runtime_checkable
class Node(Protocol):
    """One step of a graph.

    The graph's ``finish`` node may also define ``async def salvage(self, state) -> None``. When the finish
    node is still running at the end of its grace, the runner cancels it and awaits ``salvage(state)``,
    shielded, for at most ``min(SALVAGE_S, finish_grace_s / 4)`` seconds (reserved at the end of the grace).
    It must leave a usable result in the state from what is already there, without slow calls, and must not
    emit again what the cancelled call already streamed: e.g. a chat answer node writes an extractive answer
    from the context it chose, or an honest "could not finish" note after the tokens already sent.
    """

    #: The routes this node may return: node names (each leads to that node, unless the graph's edges rewire
    #: it) or :data:`END` (only :data:`END` for the finish node).
    routes: tuple[str, ...]

    async def __call__(self, state: Any) -> str:
        """Do the work, mutate ``state``, return one of ``routes``."""
        ...


async def emit(event: Event) -> None:
    """Send ``event`` to the running graph's consumer (a no-op outside a streamed run).

    Waits while the consumer's buffer is full, so a slow consumer slows the producer instead of
    filling memory.
    """
    if (current := _sink.get()) is not None:
        await current[1](evolve(event, run_id=current[0]))


class _Run:
    """One run's bookkeeping, shared by its steps."""

    __slots__ = ("deadline", "raise_errors", "run_id", "sink", "state", "t0", "trace")

    def __init__(self, state: Any, sink: Sink | None, deadline_s: float | None, raise_errors: bool) -> None:
        self.state, self.sink, self.raise_errors = state, sink, raise_errors
        self.trace: list[tuple[Any, ...]] = []  # Step's fields per node run (RunResult makes the Steps when read)
        # 64 random bits from the kernel: a fifth of uuid4's cost, the same in a forked worker as anywhere
        self.run_id, self.t0 = os.urandom(8).hex(), time.perf_counter()
        self.deadline = math.inf if deadline_s is None else self.t0 + deadline_s


def _edges(nodes: Mapping[str, Node], edges: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, Any], list[str]]:
    """Every node's routes resolved to the node each leads to, and what is wrong with them."""
    table: dict[str, Any] = {}
    problems = [f"edges name node {n!r}, which is not in the graph" for n in edges if n not in nodes]
    for name, node in nodes.items():
        declared, rewired = getattr(node, "routes", None), edges.get(name, {})
        if not callable(node) or declared is None or isinstance(declared, str):
            problems.append(f"node {name!r} needs a __call__ and a `routes` tuple of names it may return")
            continue
        table[name] = MappingProxyType({r: rewired.get(r, r) for r in declared})
        problems += [
            f"edge from {name!r} on {r!r}: " + ("END ends a run" if r == END else f"{name!r} does not declare {r!r}")
            for r, t in rewired.items()
            if r not in declared or r == END != t
        ]
        problems += [
            f"unknown route {r!r} from node {name!r}" + ("" if r == t else f" (its edge leads to {t!r})")
            for r, t in table[name].items()
            if t != END and t not in nodes
        ]
    return table, problems


class Graph:
    """A validated, immutable set of named nodes with a start, a finish, a step cap and its edges.

    A node returns a *route*: one of the names in its ``routes``. A route leads to the node of that name,
    unless ``edges`` sends it elsewhere (a builder that inserts a node after another rewires that way; see
    :class:`ragloop.turn.Turn`). Every route is resolved and checked here, once, and a built graph cannot be
    changed: build another one.

    Args:
        nodes: Node name → node.
        start: The first node.
        finish: The node that ends every run that does not end on its own; it may only return ``END``.
        edges: Node name → {route it returns → the node that route leads to}, for routes that do not lead to
            the node of their own name.
        max_steps: Most nodes run before the finish node is forced (a finish reached on its own is not cut).
        finish_grace_s: Time the finish node gets past the deadline before it is cancelled and salvaged.
        summarize: Optional ``RunResult → record`` built once per run: kept as ``RunResult.record`` and
            merged into the ``turn.finished`` log event (an attrs instance as ``attrs.asdict``, else a mapping).
        context: Optional ``state → context manager`` entered around every run, in the task that runs
            the nodes (e.g. to install per-turn context variables).

    Raises:
        GraphError: An unknown start, finish, route or edge, a node without ``routes``, or a finish node
            that may return something other than ``END``.
    """

    __slots__ = ("context", "edges", "finish", "finish_grace_s", "max_steps", "nodes", "routes", "start", "summarize")

    def __init__(
        self,
        nodes: Mapping[str, Node],
        *,
        start: str,
        finish: str,
        edges: Mapping[str, Mapping[str, str]] | None = None,
        max_steps: int = 12,
        finish_grace_s: float = 5.0,
        summarize: Callable[[RunResult], Any] | None = None,
        context: Callable[[Any], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        ends = [f"{what} node {n!r} is not in the graph" for what, n in (("start", start), ("finish", finish))]
        table, problems = _edges(nodes, edges or {})
        problems[:0] = [line for line, n in zip(ends, (start, finish), strict=True) if n not in nodes]
        if END in nodes:
            problems.append(f"{END!r} is reserved for the end of a run; rename that node")
        if set(table.get(finish, {}).values()) - {END}:
            problems.append(f"finish node {finish!r} runs once, last: its routes must be ({END!r},)")
        if max_steps < 1:
            problems.append(f"max_steps must be at least 1, got {max_steps}")
        if problems:
            known = ", ".join(sorted(nodes)) or "(none)"
            raise GraphError("; ".join(problems) + f" (known nodes: {known}; end a run with END)")
        self.nodes: Mapping[str, Node] = MappingProxyType(dict(nodes))
        self.edges: Mapping[str, Mapping[str, str]] = MappingProxyType(table)  # node → {route → where it leads}
        self.start, self.finish, self.max_steps, self.finish_grace_s = start, finish, max_steps, finish_grace_s
        self.summarize, self.context = summarize, context
        #: Node → the nodes (or END) it may lead to. Set last: from here on the graph cannot be changed.
        self.routes: Mapping[str, frozenset[str]] = MappingProxyType(
            {n: frozenset(e.values()) for n, e in table.items()}
        )

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, "routes"):
            raise GraphError(f"a built Graph cannot be changed (setting {name!r}); build a new Graph instead")
        object.__setattr__(self, name, value)

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart, from the declared routes."""
        return flowchart(self.start, self.routes, end=END)

    async def run(
        self, state: Any, *, deadline_s: float | None = None, raise_errors: bool = False, on_event: Sink | None = None
    ) -> RunResult:
        """Run the graph over ``state`` until END, the step cap, the deadline or an error.

        Args:
            state: The shared state; nodes mutate it.
            deadline_s: Seconds the run may take before the running node is cancelled and finish runs.
            raise_errors: Re-raise a node's error instead of recording it and running finish.
            on_event: Optional async callback receiving every event, as :meth:`stream` would yield them.

        Raises:
            RouteError: A node returned a name it did not declare.
            Exception: Whatever the finish node raised (it is not run again), or any node with ``raise_errors``.
        """
        run = _Run(state, on_event, deadline_s, raise_errors)
        tokens = [_sink.set((run.run_id, on_event) if on_event else None), _log_run.set(run.run_id)]
        tokens += [_log_step.set(0), _log_node.set(self.start)]
        try:
            if self.context is None:
                stopped_by, failure = await self._walk(run)
            else:
                with self.context(state):
                    stopped_by, failure = await self._walk(run)
        finally:
            for var, token in zip((_sink, _log_run, _log_step, _log_node), tokens, strict=True):
                var.reset(token)
        result = RunResult(run.run_id, state, tuple(run.trace), stopped_by, time.perf_counter() - run.t0, failure)
        if self.summarize is not None:
            result = evolve(result, record=self.summarize(result))
        if _log.enabled("info"):  # the record becomes log fields only for a log that keeps them
            _log.info("turn.finished", **result.log_fields())
        if on_event is not None:
            await on_event(RunFinished(result, run_id=run.run_id))
        return result

    async def _walk(self, run: _Run) -> tuple[StoppedBy, BaseException | None]:
        """Step from ``start`` until END; returns why the run stopped and the node error that stopped it."""
        current, failure, forced = self.start, None, False
        stopped_by: StoppedBy = "end"
        while current != END:
            capped = len(run.trace) >= self.max_steps
            if not forced and current != self.finish and (capped or time.perf_counter() >= run.deadline):
                current, stopped_by, forced = self.finish, "step_cap" if capped else "deadline", True
            nxt, exc, cut = await self._step(run, current, forced)
            if current == self.finish and exc is not None:
                raise exc  # finish never runs twice, and no node is left to end the run gracefully
            if current == self.finish and cut:
                return ("deadline" if stopped_by == "end" else stopped_by), failure
            if exc is not None or cut:
                stopped_by, failure, current, forced = "error" if exc else "deadline", exc, self.finish, True
            elif (target := self.edges[current].get(nxt)) is None:  # type: ignore[arg-type]
                allowed = ", ".join(sorted(self.edges[current])) or "(none)"
                hint = f"its routes are: {allowed} (add it to {current}.routes or return one of those)"
                raise RouteError(f"node {current!r} returned {nxt!r}, which it does not declare; {hint}")
            else:
                current = target
        return stopped_by, failure

    async def _step(self, run: _Run, name: str, forced: bool) -> tuple[str | None, Exception | None, bool]:
        """Run one node, normal or forced, under its time budget; record it, log it, stream it.

        Returns what it returned, what it raised, and whether its deadline or grace cut it short.
        """
        clock, node, n, last = time.perf_counter, self.nodes[name], len(run.trace) + 1, name == self.finish
        _log_step.set(n), _log_node.set(name)
        if run.sink is not None:
            await run.sink(NodeStarted(n, name, run_id=run.run_id))
        started, salvage = clock(), getattr(node, "salvage", None) if last else None
        reserve = min(SALVAGE_S, self.finish_grace_s / 4) if salvage is not None else 0.0
        until = max(run.deadline, started) + self.finish_grace_s - reserve if last else run.deadline
        nxt, exc, error, cut = None, None, None, False
        try:
            if until == math.inf:  # no deadline: no cancel scope (a scope costs more than the rest of a step)
                nxt = await node(run.state)
            else:
                with anyio.move_on_after(until - started) as scope:
                    nxt = await node(run.state)
                cut = scope.cancelled_caught
        except Exception as e:
            _log.error("node.failed", run_id=run.run_id, step=n, node=name, exc_info=e)
            if run.raise_errors:
                raise
            exc, error = e, f"{type(e).__name__}: {e}"
        if cut:
            error = f"{'grace: finish' if last else 'deadline:'} cancelled after {clock() - started:.3f}s"
            error += await _salvage(salvage, run.state, reserve) if salvage is not None else ""
        duration = clock() - started
        run.trace.append((n, name, nxt, started - run.t0, duration, error, forced))
        if run.sink is not None:
            await run.sink(NodeFinished(n, name, nxt, duration, error, run_id=run.run_id))
        return nxt, exc, cut

    def stream(
        self,
        state: Any,
        *,
        deadline_s: float | None = None,
        raise_errors: bool = False,
        buffer: int = 64,
        then: Callable[[RunResult], Iterable[Event]] | None = None,
    ) -> EventStream:
        """Run the graph and yield its events as they happen, ending with :class:`RunFinished`.

        Use it either way, on any anyio backend::

            async for event in graph.stream(state): ...            # the run starts with the first event

            async with graph.stream(state) as events:              # the run lives in a task group here
                async for event in events: ...

        The buffer is bounded: a slow consumer slows the run. When the consumer stops — ``break`` (even
        while it still holds the stream), ``aclose()``, leaving the ``async with``, an exception or the
        cancellation of the consuming task — every in-flight node and its child tasks are cancelled.
        ``then`` maps the finished run to events sent after :class:`RunFinished` (the chat layer's reply).
        """
        run = partial(self.run, state, deadline_s=deadline_s, raise_errors=raise_errors)
        return EventStream(run, buffer, then)

    def run_sync(self, state: Any, *, deadline_s: float | None = None, raise_errors: bool = False) -> RunResult:
        """Blocking :meth:`run` for code without an event loop (scripts, worker processes)."""
        import asyncio  # imported here: asyncio is not needed to import ragloop

        trio = sys.modules.get("trio")  # never imported here: only a program running trio has it loaded
        if asyncio._get_running_loop() is not None or (trio is not None and trio.lowlevel.in_trio_run()):
            raise RagloopError("run_sync() was called inside a running event loop; use `await graph.run(state)`")
        return anyio.run(lambda: self.run(state, deadline_s=deadline_s, raise_errors=raise_errors))


async def _salvage(salvage: Callable[[Any], Awaitable[None]], state: Any, budget: float) -> str:
    """Await the finish node's salvage hook, shielded, for at most ``budget`` seconds; say how it went."""
    try:
        with anyio.move_on_after(budget, shield=True) as scope:
            await salvage(state)
    except Exception as exc:  # noqa: BLE001 — a failing salvage must not lose the run's result: it is recorded
        return f"; salvage failed: {error_text(exc)}"
    return "; salvage timed out" if scope.cancelled_caught else "; salvaged"
