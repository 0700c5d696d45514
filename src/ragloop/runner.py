"""The graph runner: nodes, routes, a step cap, a deadline, a trace and one event stream.

It knows nothing about RAG. A node is any object with ``async def __call__(self, state) -> str`` returning the
next node's name (or :data:`END`) and a ``routes`` tuple of the names it may return. The runner runs one node
at a time over one shared state and always ends a run gracefully: on the step cap, the deadline or a node's
error it runs the graph's ``finish`` node once and says why in :attr:`RunResult.stopped_by`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import anyio
import attrs
from attrs import frozen

from ragloop.errors import GraphError, RagloopError, RouteError
from ragloop.events import Event, NodeFinished, NodeStarted, RunFinished

if TYPE_CHECKING:
    import asyncio

    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectSendStream

__all__ = ["END", "EventStream", "Graph", "Node", "RunResult", "Step", "StoppedBy", "emit"]

#: Returned by a node to end the run.
END = "END"

StoppedBy = Literal["end", "step_cap", "deadline", "error"]
Sink = Callable[[Event], Awaitable[None]]

_sink: contextvars.ContextVar[tuple[str, Sink] | None] = contextvars.ContextVar("ragloop_sink", default=None)
# structlog's merge_contextvars picks up every context variable named "structlog_<key>"; setting these two
# directly costs a tenth of bind_contextvars() on every step.
_log_step: contextvars.ContextVar[Any] = contextvars.ContextVar("structlog_step", default=...)
_log_node: contextvars.ContextVar[Any] = contextvars.ContextVar("structlog_node", default=...)


@runtime_checkable
class Node(Protocol):
    """One step of a graph."""

    #: The names this node may return (node names or :data:`END`).
    routes: tuple[str, ...]

    async def __call__(self, state: Any) -> str:
        """Do the work, mutate ``state``, return the next node's name or :data:`END`."""
        ...


@frozen
class Step:
    """One entry of a run's trace.

    Attributes:
        step: 1-based step number.
        node: The node that ran.
        next: What it returned; ``None`` when it failed or was cancelled.
        started: Seconds since the run started.
        duration: Seconds it ran.
        error: ``"ExcType: message"`` when it raised or hit the deadline.
        forced: True for the ``finish`` node run because of a cap, deadline or error.
    """

    step: int
    node: str
    next: str | None
    started: float
    duration: float
    error: str | None = None
    forced: bool = False


@frozen
class RunResult:
    """What a run produced.

    Attributes:
        run_id: Unique id of the run (also bound in the logs).
        state: The state object, as the nodes left it.
        trace: One :class:`Step` per node run, in order.
        stopped_by: ``end``, ``step_cap``, ``deadline`` or ``error``.
        duration: Seconds the whole run took.
        error: The node error that stopped the run, if any.
    """

    run_id: str
    state: Any
    trace: tuple[Step, ...]
    stopped_by: StoppedBy
    duration: float
    error: BaseException | None = attrs.field(default=None, eq=False)

    @property
    def path(self) -> tuple[str, ...]:
        """The node names in the order they ran."""
        return tuple(s.node for s in self.trace)

    @property
    def timings(self) -> dict[str, float]:
        """Total seconds per node."""
        out: dict[str, float] = {}
        for s in self.trace:
            out[s.node] = out.get(s.node, 0.0) + s.duration
        return out


async def emit(event: Event) -> None:
    """Send ``event`` to the running graph's consumer (a no-op outside a streamed run).

    Waits while the consumer's buffer is full, so a slow consumer slows the producer instead of
    filling memory.
    """
    current = _sink.get()
    if current is not None:
        run_id, sink = current
        await sink(attrs.evolve(event, run_id=run_id))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Graph:
    """A validated set of named nodes with a start, a finish and a step cap.

    Args:
        nodes: Node name → node.
        start: The first node.
        finish: The node that ends every run; it also runs once on a cap, deadline or error.
        max_steps: Most nodes run before the finish node is forced.
        finish_grace_s: Time the finish node gets after the deadline has passed.
        summarize: Optional ``state → dict`` merged into the ``turn.finished`` log event.
        context: Optional ``state → context manager`` entered around every run, in the task that runs
            the nodes (e.g. to install per-turn context variables).

    Raises:
        GraphError: An unknown start, finish or route name, or a node without ``routes``.
    """

    def __init__(
        self,
        nodes: Mapping[str, Node],
        *,
        start: str,
        finish: str,
        max_steps: int = 12,
        finish_grace_s: float = 5.0,
        summarize: Callable[[Any], Mapping[str, Any]] | None = None,
        context: Callable[[Any], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        known = ", ".join(sorted(nodes)) or "(none)"
        problems = [
            f"{what} node {name!r} is not in the graph"
            for what, name in (("start", start), ("finish", finish))
            if name not in nodes
        ]
        if END in nodes:
            problems.append(f"{END!r} is reserved for the end of a run; rename that node")
        routes: dict[str, frozenset[str]] = {}
        for name, node in nodes.items():
            declared = getattr(node, "routes", None)
            if not callable(node) or declared is None or isinstance(declared, str):
                problems.append(f"node {name!r} needs a __call__ and a `routes` tuple of names it may return")
                continue
            routes[name] = frozenset(declared)
            problems += [f"unknown route {r!r} from node {name!r}" for r in declared if r != END and r not in nodes]
        if max_steps < 1:
            problems.append(f"max_steps must be at least 1, got {max_steps}")
        if problems:
            raise GraphError("; ".join(problems) + f" (known nodes: {known}; end a run with END)")
        self.nodes = dict(nodes)
        self.routes = routes
        self.start, self.finish, self.max_steps = start, finish, max_steps
        self.finish_grace_s = finish_grace_s
        self.summarize = summarize
        self.context = context

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart, from the declared routes."""
        lines = ["flowchart TD", f"    START([start]) --> {self.start}"]
        for name in self.nodes:
            for target in sorted(self.routes[name]):
                lines.append(f"    {name} --> {'END([end])' if target == END else target}")
        return "\n".join(lines)

    async def run(
        self,
        state: Any,
        *,
        deadline_s: float | None = None,
        raise_errors: bool = False,
        on_event: Sink | None = None,
    ) -> RunResult:
        """Run the graph over ``state`` until END, the step cap, the deadline or an error.

        Args:
            state: The shared state; nodes mutate it.
            deadline_s: Seconds the run may take before the running node is cancelled and finish runs.
            raise_errors: Re-raise a node's error instead of recording it and running finish.
            on_event: Optional async callback receiving every event, as :meth:`stream` would yield them.

        Raises:
            RouteError: A node returned a name it did not declare.
        """
        run_id = uuid.uuid4().hex[:16]
        import structlog  # first run only: keeps `import ragloop` light

        log = structlog.get_logger("ragloop").bind(run_id=run_id)
        token = _sink.set((run_id, on_event) if on_event is not None else None)
        around = self.context(state) if self.context is not None else contextlib.nullcontext()
        try:
            with around, structlog.contextvars.bound_contextvars(run_id=run_id):
                result = await self._execute(state, run_id, log, deadline_s, raise_errors, on_event)
        finally:
            _sink.reset(token)
        if on_event is not None:
            await on_event(RunFinished(result, run_id=run_id))
        return result

    async def _execute(  # noqa: PLR0915 — a step's whole bookkeeping (trace, events, errors) in one place
        self,
        state: Any,
        run_id: str,
        log: Any,
        deadline_s: float | None,
        raise_errors: bool,
        sink: Sink | None,
    ) -> RunResult:
        clock = time.perf_counter
        t0 = clock()
        deadline = math.inf if deadline_s is None else t0 + deadline_s
        trace: list[Step] = []
        stopped_by: StoppedBy = "end"
        failure: BaseException | None = None
        current = self.start
        step_token, node_token = _log_step.set(0), _log_node.set(current)
        try:
            while current != END:
                if len(trace) >= self.max_steps:
                    stopped_by = "step_cap"
                    break
                if clock() >= deadline:
                    stopped_by = "deadline"
                    break
                node, n = self.nodes[current], len(trace) + 1
                _log_step.set(n)
                _log_node.set(current)
                if sink is not None:
                    await sink(NodeStarted(n, current, run_id=run_id))
                started = clock()
                nxt: str | None = None
                error: str | None = None
                try:
                    if deadline == math.inf:
                        nxt = await node(state)
                    else:
                        with anyio.move_on_after(deadline - started) as scope:
                            nxt = await node(state)
                        if scope.cancelled_caught:
                            error, stopped_by = f"deadline: cancelled after {clock() - started:.3f}s", "deadline"
                except Exception as exc:
                    log.error("node.failed", step=n, node=current, exc_info=exc)
                    if raise_errors:
                        raise
                    error, stopped_by, failure = _describe(exc), "error", exc
                duration = clock() - started
                trace.append(Step(n, current, nxt, started - t0, duration, error))
                if sink is not None:
                    await sink(NodeFinished(n, current, nxt, duration, error, run_id=run_id))
                if error is not None:
                    break
                assert nxt is not None
                if nxt not in self.routes[current]:
                    allowed = ", ".join(sorted(self.routes[current])) or "(none)"
                    raise RouteError(
                        f"node {current!r} returned {nxt!r}, which it does not declare; "
                        f"its routes are: {allowed} (add it to {current}.routes or return one of those)"
                    )
                current = nxt
            if current != END:
                await self._force_finish(state, run_id, t0, deadline, trace, sink)
        finally:
            _log_step.reset(step_token)
            _log_node.reset(node_token)
        result = RunResult(run_id, state, tuple(trace), stopped_by, clock() - t0, failure)
        extra = dict(self.summarize(state)) if self.summarize is not None else {}
        log.info(
            "turn.finished",
            path=list(result.path),
            timings={k: round(v, 6) for k, v in result.timings.items()},
            stopped_by=stopped_by,
            duration=round(result.duration, 6),
            **extra,
        )
        return result

    async def _force_finish(
        self, state: Any, run_id: str, t0: float, deadline: float, trace: list[Step], sink: Sink | None
    ) -> None:
        """Run ``finish`` once after a cap, deadline or error; its own error propagates."""
        clock = time.perf_counter
        n = len(trace) + 1
        _log_step.set(n)
        _log_node.set(self.finish)
        if sink is not None:
            await sink(NodeStarted(n, self.finish, run_id=run_id))
        started = clock()
        budget = max(deadline - started, self.finish_grace_s)
        error: str | None = None
        nxt: str | None = None
        with anyio.move_on_after(budget) as scope:
            nxt = await self.nodes[self.finish](state)
        if scope.cancelled_caught:
            error = f"grace: finish cancelled after {clock() - started:.3f}s"
        duration = clock() - started
        trace.append(Step(n, self.finish, nxt, started - t0, duration, error, forced=True))
        if sink is not None:
            await sink(NodeFinished(n, self.finish, nxt, duration, error, run_id=run_id))

    def stream(
        self,
        state: Any,
        *,
        deadline_s: float | None = None,
        raise_errors: bool = False,
        buffer: int = 64,
    ) -> EventStream:
        """Run the graph and yield its events as they happen, ending with :class:`RunFinished`.

        Use it either way::

            async for event in graph.stream(state): ...            # asyncio; the run is a background task

            async with graph.stream(state) as events:              # structured; any anyio backend
                async for event in events: ...

        The buffer is bounded: a slow consumer slows the run. When the consumer stops — ``break``,
        ``aclose()``, leaving the ``async with``, cancellation of the consuming task — every in-flight node
        and its child tasks are cancelled.
        """
        return EventStream(self, state, {"deadline_s": deadline_s, "raise_errors": raise_errors}, buffer)

    def run_sync(self, state: Any, *, deadline_s: float | None = None, raise_errors: bool = False) -> RunResult:
        """Blocking :meth:`run` for code without an event loop (scripts, worker processes)."""
        import asyncio  # imported here: asyncio is not needed to import ragloop

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return anyio.run(lambda: self.run(state, deadline_s=deadline_s, raise_errors=raise_errors))
        raise RagloopError("run_sync() was called inside a running event loop; use `await graph.run(state)`")


async def _produce(
    graph: Graph,
    state: Any,
    options: dict[str, Any],
    send: MemoryObjectSendStream[Event],
    scope: anyio.CancelScope,
    failure: list[BaseException],
) -> None:
    """Run ``graph`` into ``send``, holding no reference to the EventStream (so it can be collected)."""
    with scope:
        async with send:
            try:
                await graph.run(state, on_event=send.send, **options)
            except Exception as exc:  # noqa: BLE001 — not swallowed: re-raised to the stream's consumer
                failure.append(exc)


class EventStream:
    """The async iterator returned by :meth:`Graph.stream`; also an async context manager."""

    def __init__(self, graph: Graph, state: Any, options: dict[str, Any], buffer: int) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[Event](buffer)
        self._scope = anyio.CancelScope()
        self._failure: list[BaseException] = []
        self._args = (graph, state, options, self._send, self._scope, self._failure)
        self._task: asyncio.Task[None] | None = None
        self._tg: TaskGroup | None = None
        self._finished = False

    async def __aenter__(self) -> EventStream:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(_produce, *self._args)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._scope.cancel()
        self._receive.close()
        assert self._tg is not None
        return await self._tg.__aexit__(*exc_info)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._tg is None and self._task is None:
            import asyncio

            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RagloopError(
                    "plain `async for` over graph.stream() needs asyncio; on other backends use "
                    "`async with graph.stream(state) as events:`"
                ) from None
            self._task = loop.create_task(_produce(*self._args))
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            self._finished = True
            self._receive.close()
            if self._task is not None:
                await self._task
            if self._failure:
                raise self._failure[0] from None
            raise StopAsyncIteration from None
        except BaseException:
            self._scope.cancel()
            raise

    async def aclose(self) -> None:
        """Stop the run: cancel every in-flight node and wait until it has stopped."""
        self._scope.cancel()
        self._receive.close()
        if self._task is not None:
            import asyncio

            with anyio.CancelScope(shield=True):
                await asyncio.wait([self._task])

    def __del__(self) -> None:
        # `break` out of `async for` drops the last reference: stop the background run at once.
        self._receive.close()
        if not self._finished and self._task is not None and not self._task.done():
            self._scope.cancel()
