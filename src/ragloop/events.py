"""Typed events streamed to callers by :meth:`ragloop.runner.Graph.stream`, and the run result the last one carries.

The runner emits :class:`NodeStarted`, :class:`NodeFinished` and, last, :class:`RunFinished`; nodes add their
own through :func:`ragloop.emit` (the chat-turn graph emits :class:`Progress`, :class:`Token` and, when it takes
back words it already streamed, :class:`Correction`). Every event
is a frozen attrs value, so a consumer can match on its class::

    async for event in graph.stream(state):
        match event:
            case Token(text=text): print(text, end="")
            case RunFinished(result=result): print(result.stopped_by)

:class:`EventStream` is what :meth:`ragloop.runner.Graph.stream` returns: it turns a run that sends its events to a
callback into an async iterator with a bounded buffer, on asyncio or trio, and stops the run however the
consumer leaves. It lives here, below the runner, so the runner module keeps to the graph walk.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

import anyio
from attrs import asdict, field, frozen, has

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

__all__ = [
    "Correction",
    "Event",
    "EventStream",
    "NodeFinished",
    "NodeStarted",
    "Progress",
    "RunFinished",
    "RunResult",
    "Sink",
    "Step",
    "StoppedBy",
    "Token",
]

#: Why a run stopped: it reached ``END``, hit the step cap or the deadline, or a node raised.
StoppedBy = Literal["end", "step_cap", "deadline", "error"]


@frozen
class Step:
    """One entry of a run's trace.

    Attributes:
        step: 1-based step number.
        node: The node that ran.
        next: What it returned; ``None`` when it failed or was cancelled.
        started: Seconds since the run started.
        duration: Seconds it ran (including its salvage, if it had one).
        error: ``"ExcType: message"`` when it raised, or why the deadline or grace cut it short.
        forced: True for the ``finish`` node run because of a cap, deadline or error.
    """

    step: int
    node: str
    next: str | None
    started: float
    duration: float
    error: str | None = None
    forced: bool = False


def _steps(rows: Iterable[Step | tuple[Any, ...]]) -> tuple[Step, ...]:
    """Steps from the runner's rows (``Step``'s fields in order) or from steps."""
    return tuple(row if isinstance(row, Step) else Step(*row) for row in rows)


@frozen
class RunResult:
    """What a run produced.

    The trace is kept as the runner's rows and made into :class:`Step` values the first time it is read (the
    chat turn's record reads it; a bare run whose trace nobody reads never pays for it). ``RunResult(run_id,
    state, trace, …)`` takes steps or rows alike, and two results compare by their steps.

    Attributes:
        run_id: Unique id of the run (also bound in the logs).
        state: The state object, as the nodes left it.
        rows: The trace as the runner recorded it (``trace=`` when building one): a :class:`Step` or a tuple of
            ``Step``'s fields per node run.
        stopped_by: ``end``, ``step_cap``, ``deadline`` or ``error``.
        duration: Seconds the whole run took.
        error: The node error that stopped the run, if any.
        record: What the graph's ``summarize`` hook built from this result (the chat turn's decision
            record), if the graph has one; it is also what the ``turn.finished`` event logged.
    """

    run_id: str
    state: Any
    rows: tuple[Step | tuple[Any, ...], ...] = field(alias="trace", eq=_steps, repr=False)
    stopped_by: StoppedBy
    duration: float
    error: BaseException | None = field(default=None, eq=False)
    record: Any = field(default=None, eq=False)

    @functools.cached_property
    def trace(self) -> tuple[Step, ...]:
        """One :class:`Step` per node run, in order."""
        return _steps(self.rows)

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

    def log_fields(self) -> dict[str, Any]:
        """The fields of the run's ``turn.finished`` log event: run id, duration, path, timings, why it stopped,
        and the record's fields (an attrs record as ``attrs.asdict``, a mapping as it is)."""
        extra = asdict(self.record) if has(type(self.record)) else dict(self.record or {})
        timings = {k: round(v, 6) for k, v in self.timings.items()}
        run = {"run_id": self.run_id, "duration": round(self.duration, 6), "path": list(self.path)}
        return {**run, "timings": timings, "stopped_by": self.stopped_by, **extra}


@frozen
class Event:
    """Base of every event; ``run_id`` says which run it belongs to (set by the runner)."""

    run_id: str = field(default="", kw_only=True)


@frozen
class NodeStarted(Event):
    """A node is about to run.

    Attributes:
        step: 1-based step number in this run.
        node: The node's name.
    """

    step: int
    node: str


@frozen
class NodeFinished(Event):
    """A node returned (or failed).

    Attributes:
        step: 1-based step number.
        node: The node's name.
        next: The name it returned (``END`` for the end), or ``None`` when it failed.
        duration: Seconds it ran.
        error: ``"ExcType: message"`` when it raised or was cancelled by the deadline, else ``None``.
    """

    step: int
    node: str
    next: str | None
    duration: float
    error: str | None = None


@frozen
class Progress(Event):
    """Something a node wants a user to see ("searching…", "found 3 passages").

    Attributes:
        node: The node that emitted it.
        kind: A short machine-readable kind (``"search"``, ``"retrieved"``, ``"graded"``, …).
        message: Human-readable text.
        data: Structured details.
    """

    node: str
    kind: str
    message: str
    data: dict[str, Any] = field(factory=dict, eq=False, hash=False)


@frozen
class Token(Event):
    """A piece of the streamed answer.

    Attributes:
        text: The token text.
    """

    text: str


@frozen
class Correction(Event):
    """Words already streamed are taken back: the final reply no longer holds them, and says so.

    A client that shows tokens as they arrive should strike or remove ``removed`` from what it shows (or
    replace its text with the final reply); ``note`` is the sentence the reply adds about it, which also
    streams as a :class:`Token`.

    Attributes:
        removed: The streamed sentences the final reply leaves out, in reply order.
        reason: Why, in a few words (``"not supported by the cited passages"``).
        note: What the reply says about it.
    """

    removed: tuple[str, ...]
    reason: str
    note: str


@frozen
class RunFinished(Event):
    """The run is over; always the last event of a stream.

    Attributes:
        result: The run's :class:`RunResult`.
    """

    result: RunResult


#: An async callback receiving a run's events (what :func:`ragloop.emit` and the runner send to).
Sink = Callable[[Event], Awaitable[None]]


class EventStream:
    """What :meth:`ragloop.runner.Graph.stream` returns: an async iterator and an async context manager.

    Inside ``async with`` the run is a task of a task group entered in the consumer's task. A bare
    ``async for`` has no block a task group could span (an ``async for`` may be left by ``break`` without any
    call back into the iterator), so its first step starts the run as a task of the event loop (a system task
    on trio) and every way out stops it: the run is cancelled when ``__anext__`` raises (consumer cancelled),
    on ``aclose()``, and on ``break``: ``async for`` iterates a private object made for that loop alone, which
    the loop drops on leaving, and dropping it cancels the run at once (CPython frees it there and then).
    """

    def __init__(
        self,
        run: Callable[..., Awaitable[RunResult]],
        buffer: int,
        then: Callable[[RunResult], Iterable[Event]] | None = None,
    ) -> None:
        self._then = then
        self._send, self._receive = anyio.create_memory_object_stream[Event](buffer)
        self._run, self._scope, self._done, self._started = run, anyio.CancelScope(), anyio.Event(), False
        self._failure: list[Exception] = []
        self._tg: TaskGroup | None = None

    async def _produce(self) -> None:
        try:
            with self._scope:
                async with self._send:
                    try:
                        result = await self._run(on_event=self._send.send)
                        for event in self._then(result) if self._then is not None else ():
                            await self._send.send(event)
                    except Exception as exc:  # noqa: BLE001 — RouteError, raise_errors, a failing finish: re-raised
                        self._failure.append(exc)  # to the consumer by __anext__, which sees it before the end
        finally:
            self._done.set()

    def _start(self) -> None:
        self._started = True
        if self._tg is not None:
            self._tg.start_soon(self._produce)
        elif (trio := sys.modules.get("trio")) is not None and trio.lowlevel.in_trio_run():
            trio.lowlevel.spawn_system_task(self._produce, context=contextvars.copy_context())
        else:
            import asyncio

            _RUNNING.add(task := asyncio.get_running_loop().create_task(self._produce()))
            task.add_done_callback(_RUNNING.discard)

    def _stop(self) -> None:
        self._scope.cancel()  # before closing: a run blocked on a full buffer then sees the cancellation
        self._receive.close()

    async def __aenter__(self) -> EventStream:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._start()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        self._stop()
        return await self._tg.__aexit__(*exc_info) if self._tg else None

    def __aiter__(self) -> _Loop:
        return _Loop(self)

    async def __anext__(self) -> Event:
        if not self._started:
            self._start()
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):  # the run ended, or this stream was stopped
            self._receive.close()
            if self._failure:
                raise self._failure[0] from None
            raise StopAsyncIteration from None
        except BaseException:  # the consumer was cancelled: the run has stopped when the cancellation goes on
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Stop the run: cancel every in-flight node and wait until it has stopped."""
        self._stop()
        if self._started:
            with anyio.CancelScope(shield=True):
                await self._done.wait()


class _Loop:
    """The iterator one ``async for`` gets from :class:`EventStream`; when the loop drops it, the run stops."""

    __slots__ = ("__weakref__", "_stream")

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        weakref.finalize(self, stream._stop).atexit = False

    def __aiter__(self) -> _Loop:
        return self

    def __anext__(self) -> Awaitable[Event]:
        return self._stream.__anext__()


_RUNNING: set[Any] = set()  # asyncio keeps only weak references to tasks
