"""Per-turn accounting of judge calls: how many, which, tokens used, failures.

A turn installs one :class:`UsageMeter` with :func:`metering`; every judge (LLM or offline) records its
calls with :func:`record_call`. The meter travels in a context variable, so it reaches judges running in
child tasks of the turn without being threaded through every signature; outside a turn the calls are
simply not counted.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from attrs import define, field, frozen

__all__ = ["LLMCall", "UsageMeter", "current_meter", "metering", "record_call"]


@frozen
class LLMCall:
    """One judge call.

    Attributes:
        judge: ``decide``, ``grade``, ``rewrite``, ``answer`` or ``embed``.
        model: Model name, or ``"offline"``.
        prompt_tokens: Prompt tokens reported by the server (0 offline).
        completion_tokens: Completion tokens reported by the server (0 offline).
        seconds: Wall time of the call.
        error: The error's class and message when the call failed, else ``None``.
    """

    judge: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None


@define
class UsageMeter:
    """Collects the :class:`LLMCall` s of one turn."""

    calls: list[LLMCall] = field(factory=list)

    def record(self, call: LLMCall) -> None:
        """Add one call."""
        self.calls.append(call)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all calls."""
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens over all calls."""
        return sum(c.completion_tokens for c in self.calls)

    @property
    def llm_calls(self) -> int:
        """Calls that went to a model (offline judge calls are not counted)."""
        return sum(1 for c in self.calls if c.model != "offline")


_meter: contextvars.ContextVar[UsageMeter | None] = contextvars.ContextVar("ragloop_meter", default=None)


def current_meter() -> UsageMeter | None:
    """The meter of the running turn, or ``None`` outside a turn."""
    return _meter.get()


@contextlib.contextmanager
def metering(meter: UsageMeter) -> Iterator[UsageMeter]:
    """Install ``meter`` for the code (and child tasks) run inside the block."""
    token = _meter.set(meter)
    try:
        yield meter
    finally:
        _meter.reset(token)


def record_call(call: LLMCall) -> None:
    """Record ``call`` on the running turn's meter; a no-op outside a turn."""
    meter = _meter.get()
    if meter is not None:
        meter.record(call)
