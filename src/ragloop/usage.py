"""Per-turn accounting of judge calls: how many, which, tokens used, failures, cache hits, and their cost.

A turn installs one :class:`UsageMeter` with :func:`metering`; every judge (LLM or offline) records its
calls with :func:`record_call`, and every cache its hits with :func:`record_cache`. The meter travels in a
context variable, so it reaches judges running in child tasks of the turn without being threaded through every
signature; outside a turn the calls are simply not counted. :func:`cost_of` prices a turn's calls with the
application's price table (model → :class:`Price`).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping

import attrs
from attrs import define, field, frozen

__all__ = [
    "LLMCall",
    "Price",
    "UsageMeter",
    "cost_of",
    "current_meter",
    "metering",
    "record_cache",
    "record_call",
]


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
        finish_reasons: The model's ``finish_reason`` per choice, when it gave one.
        ended: ``time.time()`` when the call ended (set by :func:`record_call` when left at 0), so a tracer
            can place the call in time.
        cached_prompt_tokens: Of ``prompt_tokens``, those the server reports it took from its prompt cache
            (``usage.prompt_tokens_details.cached_tokens``: OpenAI, vLLM, llama.cpp), else 0.
    """

    judge: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None
    finish_reasons: tuple[str, ...] = ()
    ended: float = 0.0
    cached_prompt_tokens: int = 0


@frozen
class Price:
    """What a model costs, in the application's currency per million tokens.

    Attributes:
        input_per_m: Per million prompt tokens.
        output_per_m: Per million completion tokens.
        cached_input_per_m: Per million prompt tokens the server took from its prompt cache (providers bill
            them at a discount); ``None``: billed as ``input_per_m``.
    """

    input_per_m: float
    output_per_m: float
    cached_input_per_m: float | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> float:
        """The cost of that many prompt and completion tokens, ``cached_prompt_tokens`` of the prompt tokens at
        the cached rate (at most ``prompt_tokens`` of them)."""
        cached = min(max(cached_prompt_tokens, 0), prompt_tokens) if self.cached_input_per_m is not None else 0
        fresh = prompt_tokens - cached
        cached_rate = self.cached_input_per_m or 0.0
        return (fresh * self.input_per_m + cached * cached_rate + completion_tokens * self.output_per_m) / 1e6


def cost_of(calls: list[LLMCall] | tuple[LLMCall, ...], prices: Mapping[str, Price]) -> float | None:
    """The cost of ``calls`` under ``prices`` (model → :class:`Price`); ``None`` when no price table is given
    or a model call's model is missing from it (an unknown cost is not a zero cost). Offline calls cost 0."""
    if not prices:
        return None
    total = 0.0
    for call in calls:
        if call.model == "offline":
            continue
        price = prices.get(call.model)
        if price is None:
            return None
        total += price.cost(call.prompt_tokens, call.completion_tokens, call.cached_prompt_tokens)
    return total


@define
class UsageMeter:
    """Collects the :class:`LLMCall` s of one turn."""

    calls: list[LLMCall] = field(factory=list)
    cache_hits: dict[str, int] = field(factory=dict)

    def record(self, call: LLMCall) -> None:
        """Add one call."""
        self.calls.append(call)

    def cache_hit(self, cache: str, n: int = 1) -> None:
        """Count ``n`` hits of the cache named ``cache`` (``embedding``, ``retrieval``, ``grade``, ``reply``)."""
        self.cache_hits[cache] = self.cache_hits.get(cache, 0) + n

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all calls."""
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        """Completion tokens over all calls."""
        return sum(c.completion_tokens for c in self.calls)

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens over all calls that the servers took from their prompt caches."""
        return sum(c.cached_prompt_tokens for c in self.calls)

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
        meter.record(call if call.ended else attrs.evolve(call, ended=time.time()))


def record_cache(cache: str, n: int = 1) -> None:
    """Count ``n`` hits of ``cache`` on the running turn's meter; a no-op outside a turn."""
    meter = _meter.get()
    if meter is not None and n:
        meter.cache_hit(cache, n)
