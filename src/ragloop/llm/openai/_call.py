"""The one call path every OpenAI-compatible judge (and the planner) shares: budget, output cap, metering.

:class:`_Chat` sends one ``chat.completions.create`` within the judge's time budget (its timeout cut to a share
of what is left of the turn), with the output cap as ``max_completion_tokens`` (``max_tokens`` once the server
rejects that), guards against a 200 whose body is not JSON and against empty ``choices``, and records every
call, failed ones too, with its tokens and finish reasons on the turn's usage meter (:class:`_Meter`). SDK errors
become judge errors whose message says what to do and never carries the server's own words unredacted
(:func:`_wrap`). :func:`_stream_chunks` is the same for a streamed completion.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import openai
from attrs import define, field

from ragloop._redact import upstream
from ragloop.errors import ConfigError, JudgeError, JudgeOutputError, JudgeTimeout
from ragloop.llm.budget import CallBudget, time_left
from ragloop.usage import LLMCall, record_call

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = ["ServerCompat"]

_T = TypeVar("_T")


# -- one metered call -----------------------------------------------------------------------------------


class _Meter:
    """Times one call and records it (tokens, error) on the turn's usage meter when the block exits."""

    def __init__(self, judge: str, model: str) -> None:
        self.judge = judge
        self.model = model
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_prompt_tokens = 0
        self.finish_reasons: tuple[str, ...] = ()
        self._t0 = 0.0

    def usage(self, usage: Any) -> None:
        if usage is not None:
            self.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
            self.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
            self.cached_prompt_tokens = _cached_tokens(usage, self.prompt_tokens)

    def __enter__(self) -> _Meter:
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        record_call(
            LLMCall(
                judge=self.judge,
                model=self.model,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                seconds=time.perf_counter() - self._t0,
                error=None if exc is None else f"{type(exc).__name__}: {exc}",
                finish_reasons=self.finish_reasons,
                cached_prompt_tokens=self.cached_prompt_tokens,
            )
        )


def _cached_tokens(usage: Any, prompt_tokens: int) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (0 when the server sends none), at most ``prompt_tokens``:
    a server's count is data, and a bad one must not make a turn's cost negative."""
    details = getattr(usage, "prompt_tokens_details", None)
    raw = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    try:
        cached = int(raw or 0)
    except (TypeError, ValueError, OverflowError):  # text, a list, an infinite float
        return 0
    return min(max(cached, 0), prompt_tokens)


def _wrap(exc: openai.APIError, *, judge: str, model: str, timeout_s: float, client: openai.AsyncOpenAI) -> JudgeError:
    """Translate an SDK error into the judge error the nodes understand, with a message that says what to do."""
    retries = f"after the client's {client.max_retries} retries"
    where = f"{judge} call to model {model!r} at {client.base_url}"
    if isinstance(exc, openai.APITimeoutError):
        return JudgeTimeout(
            f"{where} timed out (timeout_s={timeout_s}, {retries}); raise timeout_s or check the server's load"
        )
    if isinstance(exc, openai.APIStatusError):
        hint = {
            401: "check the API key",
            403: "check the API key's permissions",
            404: "check the model name and base_url (it usually ends in /v1)",
            429: "the server is rate limiting; lower concurrency or raise max_retries",
        }.get(exc.status_code, "see the server's message")
        return JudgeError(f"{where} failed with HTTP {exc.status_code} {retries}: {upstream(_message(exc))}; {hint}")
    if isinstance(exc, openai.APIConnectionError):
        return JudgeError(f"{where} could not connect or the connection dropped ({retries}): {exc}; is the server up?")
    return JudgeError(f"{where} failed: {exc}")


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return str(exc.message)


def _create(client: openai.AsyncOpenAI) -> Any:
    # Typed as Any: the SDK's overloads want TypedDict messages; ours are plain dicts built here.
    return client.chat.completions.create


def _cap_rejected(exc: openai.APIStatusError, param: str) -> bool:
    """A 400/422 that names the output-cap parameter: the server does not know it."""
    return exc.status_code in (400, 422) and param in _message(exc)


@define
class ServerCompat:
    """What one server accepts, learned from its answers and shared by the judges of one client.

    Attributes:
        cap_param: The output-cap parameter the server takes: ``max_completion_tokens`` (OpenAI's current
            name) until the server rejects it, then ``max_tokens``.
        tools_dropped: Set once the server answered a search-worthy question in plain text although tools
            were offered (a chat template without tool support drops them silently); the decider in ``auto``
            mode then decides with ``json_schema``.
    """

    cap_param: str = "max_completion_tokens"
    tools_dropped: bool = False


@define
class _Chat:
    """What every judge shares: client, model, timeout, budget, output cap, and one metered completion call."""

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float
    temperature: float | None
    max_tokens: int | None = None
    budget: CallBudget = field(factory=CallBudget)
    compat: ServerCompat = field(factory=ServerCompat)

    def seconds(self, judge: str) -> tuple[float, float | None]:
        """This call's total time budget and the turn's time left; JudgeTimeout when none is left."""
        left = time_left()
        seconds = self.budget.seconds(self.timeout_s, left)
        if seconds <= 0:
            raise JudgeTimeout(
                f"{judge}: not sent to model {self.model!r}: {left:.2f}s left in the turn, less than the "
                f"{self.budget.reserve_s}s kept for the fallbacks; raise the turn's deadline_s"
            )
        return seconds, left

    def timed_out(self, judge: str, elapsed: float, seconds: float, left: float | None) -> JudgeTimeout:
        """The error for a call that used up its budget."""
        turn = "no turn deadline" if left is None else f"{left:.2f}s were left in the turn"
        return JudgeTimeout(
            f"{judge} call to model {self.model!r} at {self.client.base_url} timed out after {elapsed:.2f}s "
            f"(its budget: {seconds:.2f}s including the client's {self.client.max_retries} retries; "
            f"timeout_s={self.timeout_s}, {turn}); the offline fallback takes over"
        )

    async def send(self, judge: str, messages: list[dict[str, Any]], seconds: float, **params: Any) -> Any:
        """One ``create`` call with the output cap, retried once with ``max_tokens`` if the server rejects
        ``max_completion_tokens``; SDK errors become JudgeErrors."""
        if self.temperature is not None:
            params.setdefault("temperature", self.temperature)
        timeout = min(self.timeout_s, seconds)
        for _ in range(2):
            cap = {self.compat.cap_param: self.max_tokens} if self.max_tokens is not None else {}
            try:
                return await _create(self.client)(model=self.model, messages=messages, timeout=timeout, **cap, **params)
            except openai.APIStatusError as exc:
                if (
                    cap
                    and self.compat.cap_param == "max_completion_tokens"
                    and _cap_rejected(exc, "max_completion_tokens")
                ):
                    self.compat.cap_param = "max_tokens"
                    continue
                raise _wrap(exc, judge=judge, model=self.model, timeout_s=timeout, client=self.client) from exc
            except openai.APIError as exc:
                raise _wrap(exc, judge=judge, model=self.model, timeout_s=timeout, client=self.client) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def complete(
        self, judge: str, messages: list[dict[str, Any]], parse: Callable[[ChatCompletion], _T], **params: Any
    ) -> _T:
        """One metered call within the judge's budget; ``parse`` runs inside the meter, so output errors count
        as failed calls."""
        with _Meter(judge, self.model) as meter:
            seconds, left = self.seconds(judge)
            started = time.perf_counter()
            try:
                with anyio.fail_after(seconds):
                    completion: ChatCompletion = await self.send(judge, messages, seconds, **params)
            except TimeoutError as exc:
                raise self.timed_out(judge, time.perf_counter() - started, seconds, left) from exc
            except ValueError as exc:  # json.JSONDecodeError: a 200 whose body is not JSON (proxy, broken server)
                raise JudgeOutputError(
                    f"{judge}: model {self.model!r} answered with a body that is not JSON ({exc}); "
                    "the server or a proxy broke the response"
                ) from exc
            meter.usage(completion.usage)
            meter.finish_reasons = tuple(c.finish_reason for c in completion.choices if c.finish_reason)
            if not completion.choices:
                raise JudgeOutputError(
                    f"{judge}: model {self.model!r} returned no choices (empty 'choices'); "
                    "the server may have filtered the output"
                )
            return parse(completion)


def _positive(instance: object, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name} must be a positive number of seconds/characters, got {value!r}"
        )


def _cap(instance: object, attribute: Any, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name} must be a positive number of tokens (or None), got {value!r}"
        )


def _finish_reason(completion: ChatCompletion) -> str | None:
    return completion.choices[0].finish_reason


def _normal(query: str) -> str:
    return " ".join(query.casefold().split())


async def _stream_chunks(
    chat: _Chat, judge: str, messages: list[dict[str, Any]], params: dict[str, Any], meter: _Meter
) -> AsyncGenerator[Any, None]:
    """Yield a streamed completion's chunks, usage to ``meter``; raise a JudgeError if it breaks, never ends,
    or runs past the judge's budget (``timeout_s`` also bounds each wait for the next chunk)."""
    seconds, left = chat.seconds(judge)
    started = anyio.current_time()
    end = started + seconds
    finished = False
    try:
        with anyio.fail_after(seconds):
            response = await chat.send(
                judge, messages, seconds, stream=True, stream_options={"include_usage": True}, **params
            )
        async with response:
            chunks = response.__aiter__()
            while True:
                wait = min(chat.timeout_s, end - anyio.current_time())
                if wait <= 0:
                    raise TimeoutError
                with anyio.fail_after(wait):
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                if chunk.usage is not None:
                    meter.usage(chunk.usage)
                if any(choice.finish_reason for choice in chunk.choices):
                    finished = True
                    meter.finish_reasons = tuple(c.finish_reason for c in chunk.choices if c.finish_reason)
                yield chunk
    except TimeoutError as exc:
        raise chat.timed_out(judge, anyio.current_time() - started, seconds, left) from exc
    except openai.APIError as exc:
        raise _wrap(exc, judge=judge, model=chat.model, timeout_s=chat.timeout_s, client=chat.client) from exc
    except ValueError as exc:  # json.JSONDecodeError from a malformed SSE chunk
        raise JudgeOutputError(
            f"{judge}: model {chat.model!r} sent a malformed stream chunk ({exc}); the server or a proxy "
            "broke the SSE stream"
        ) from exc
    if not finished:
        raise JudgeError(
            f"{judge}: the stream from model {chat.model!r} ended before the model finished (no "
            "finish_reason); the connection was cut"
        )
