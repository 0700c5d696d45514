"""Typed events streamed to callers by :meth:`ragloop.Graph.stream`.

The runner emits :class:`NodeStarted`, :class:`NodeFinished` and, last, :class:`RunFinished`; nodes add their
own through :func:`ragloop.emit` (the chat-turn graph emits :class:`Progress` and :class:`Token`). Every event
is a frozen attrs value, so a consumer can match on its class::

    async for event in graph.stream(state):
        match event:
            case Token(text=text): print(text, end="")
            case RunFinished(result=result): print(result.stopped_by)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import field, frozen

if TYPE_CHECKING:
    from ragloop.runner import RunResult

__all__ = ["Event", "NodeFinished", "NodeStarted", "Progress", "RunFinished", "Token"]


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
class RunFinished(Event):
    """The run is over; always the last event of a stream.

    Attributes:
        result: The run's :class:`~ragloop.runner.RunResult`.
    """

    result: RunResult
