"""Judges that call any OpenAI-compatible chat server (OpenAI, vLLM, Ollama, llama.cpp ``llama-server``).

Each judge takes an ``openai.AsyncOpenAI`` client built by the caller (never here), a model name, a timeout
and an output cap. A call's total time, the client's own retries (``max_retries``, for 429 and 5xx answers)
included, is its timeout cut to a share of what is left of the turn's deadline, so the offline fallbacks
behind it still run in time (:mod:`ragloop.llm.budget`). Every request carries its output cap as
``max_completion_tokens`` (``max_tokens`` for servers that reject it), and every ``finish_reason`` is read:
complete tool calls survive a cut, a cut answer says so, an empty or filtered answer fails so the offline
answerer takes over. Every call, failed ones too, is recorded on the turn's usage meter with the
server-reported token counts.

Failures surface as :class:`~ragloop.errors.JudgeError` subclasses the nodes can fail open on:

- :class:`~ragloop.errors.JudgeTimeout`: the call (or a stalled stream) ran past its budget;
- :class:`~ragloop.errors.JudgeOutputError`: unparseable or unusable output (bad tool arguments, bad JSON,
  empty choices, a malformed stream chunk, garbage queries, a plain-text reply to a question that needs a
  search); :class:`~ragloop.errors.JudgeTruncated` when it stopped at the output cap;
- :class:`~ragloop.errors.JudgeError`: HTTP errors after the retries, connection failures, cut streams.

This module imports ``openai``; import it only where the OpenAI judges are wanted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import attrs
import openai
from attrs import define, field, frozen

from ragloop._redact import upstream
from ragloop.errors import ConfigError, JudgeError, JudgeOutputError, JudgeTimeout, JudgeTruncated
from ragloop.llm import batch_grade, prompts
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget, time_left
from ragloop.llm.guards import is_small_talk, query_problem, reply_problem
from ragloop.state import ContextBlock, Decision, Hit, Label, Message, Outcome, PageContext, Verdict
from ragloop.usage import LLMCall, record_call

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = [
    "DecideMode",
    "OpenAIAnswerer",
    "OpenAIDecider",
    "OpenAIGrader",
    "OpenAIJudges",
    "OpenAIRewriter",
    "ServerCompat",
    "ToolsDropped",
    "clean_query",
    "parse_search_calls",
    "parse_verdict",
]

_T = TypeVar("_T")
_LABELS: tuple[Label, ...] = ("relevant", "partial", "irrelevant")


# -- one metered call -----------------------------------------------------------------------------------


class _Meter:
    """Times one call and records it (tokens, error) on the turn's usage meter when the block exits."""

    def __init__(self, judge: str, model: str) -> None:
        self.judge = judge
        self.model = model
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reasons: tuple[str, ...] = ()
        self._t0 = 0.0

    def usage(self, usage: Any) -> None:
        if usage is not None:
            self.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
            self.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)

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
            )
        )


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


# -- decide ---------------------------------------------------------------------------------------------

DecideMode = Literal["auto", "tools", "json"]


def _normal(query: str) -> str:
    return " ".join(query.casefold().split())


def parse_search_calls(calls: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """Turn ``(tool name, JSON arguments)`` pairs into deduplicated search queries.

    Raises:
        JudgeOutputError: a call names another tool, its arguments are not a JSON object, or its
            ``query`` is missing, not a string, or blank.
    """
    queries: list[str] = []
    seen: set[str] = set()
    for name, arguments in calls:
        if name != "search":
            raise JudgeOutputError(f"decider called an unknown tool {name!r}; the only tool is 'search'")
        try:
            args = json.loads(arguments or "{}")
        except ValueError as exc:
            raise JudgeOutputError(
                f"decider sent malformed JSON arguments to 'search': {arguments[:200]!r} ({exc})"
            ) from exc
        query = args.get("query") if isinstance(args, dict) else None
        if not isinstance(query, str) or not query.strip():
            raise JudgeOutputError(f"decider called 'search' without a non-empty string 'query': {arguments[:200]!r}")
        query = " ".join(query.split())
        if _normal(query) not in seen:
            seen.add(_normal(query))
            queries.append(query)
    return tuple(queries)


def _usable_queries(queries: Sequence[str], who: str) -> tuple[tuple[str, ...], list[str]]:
    """The queries that pass :func:`~ragloop.llm.guards.query_problem`, and why the others did not."""
    kept: list[str] = []
    rejected: list[str] = []
    for q in queries:
        problem = query_problem(q)
        if problem is None:
            kept.append(" ".join(q.split()))
        else:
            rejected.append(f"{q[:60]!r}: {problem}")
    if not kept:
        raise JudgeOutputError(f"{who}: no usable search query ({'; '.join(rejected) or 'none given'})")
    return tuple(kept), rejected


class ToolsDropped(JudgeOutputError):
    """The model answered a question that needs a search in plain text although the ``search`` tool was
    offered: the server probably dropped the tools (a chat template without tool support)."""


@define
class OpenAIDecider:
    """Decides whether to search: with native tool calling, or with structured output (``json_schema``).

    ``mode="tools"`` offers a ``search(query)`` tool (parallel calls); ``mode="json"`` asks for
    ``{"action": "search" | "reply", "queries": [...], "reply": "..."}`` under a ``json_schema`` grammar, for
    servers without tool support; ``mode="auto"`` (the default) starts with tools and switches to ``json``
    for good once the server answers a question that needs a search in plain text (tools dropped).

    A direct reply is accepted only when it is well-formed text, complete (``finish_reason="stop"``) and the
    question is small talk; a model that replies to anything else, or writes garbage, raises
    :class:`JudgeOutputError` so the node falls back to the offline decider. Tool calls cut by the output cap
    are dropped and the complete ones kept.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call (built and closed by the caller).
        model: Model name; a fast, cheap one is enough.
        timeout_s: Longest time for one call, the SDK's retries included; the turn's deadline may cut it
            further (see :class:`~ragloop.llm.budget.CallBudget`).
        glossary: Abbreviation → expansion, rendered into the system prompt.
        max_history: How many earlier conversation messages to send.
        stream: Request a streamed completion and assemble tool calls from their deltas (for servers and
            proxies that only stream); the Decision is the same.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        mode: ``auto``, ``tools`` or ``json`` (see above).
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=20.0, validator=_positive)
    glossary: Mapping[str, str] = field(factory=dict)
    max_history: int = 6
    stream: bool = False
    temperature: float | None = 0.0
    mode: DecideMode = field(default="auto", validator=attrs.validators.in_(("auto", "tools", "json")))
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["decide"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["decide"])
    compat: ServerCompat = field(factory=ServerCompat)

    @property
    def mode_in_use(self) -> Literal["tools", "json"]:
        """The mode the next call uses: ``json`` when set so, or in ``auto`` once tools were dropped."""
        if self.mode == "json" or (self.mode == "auto" and self.compat.tools_dropped):
            return "json"
        return "tools"

    def _chat(self) -> _Chat:
        return _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )

    def _messages(
        self, question: str, history: Sequence[Message], page: PageContext, json_mode: bool
    ) -> list[dict[str, Any]]:
        system = prompts.decide_system_prompt(page, self.glossary)
        if json_mode:
            system = prompts.decide_json_system_prompt(page, self.glossary)
        return [
            {"role": "system", "content": system},
            *prompts.history_messages(history, self.max_history),
            {"role": "user", "content": question},
        ]

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Return ``Decision(queries=…)`` or, for small talk, ``Decision(reply=…)``.

        Raises:
            JudgeOutputError: malformed, empty, cut or unusable output; a reply to a question that needs a
                search (:class:`ToolsDropped` in ``tools`` mode).
            JudgeTimeout: the call ran past its budget.
            JudgeError: the server failed after the client's retries.
        """
        if self.mode_in_use == "json":
            return await self._decide_json(question, history, page)
        try:
            return await self._decide_tools(question, history, page)
        except ToolsDropped as exc:
            if self.mode != "auto":
                raise
            self.compat.tools_dropped = True
            decision = await self._decide_json(question, history, page)
            return Decision(
                queries=decision.queries,
                reply=decision.reply,
                reason=f"{decision.reason}; switched to json_schema decide: {exc}",
            )

    async def _decide_tools(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        messages = self._messages(question, history, page, json_mode=False)
        params: dict[str, Any] = {"tools": [prompts.SEARCH_TOOL], "tool_choice": "auto", "parallel_tool_calls": True}
        chat = self._chat()
        if self.stream:
            with _Meter("decide", self.model) as meter:
                content, calls, finish = await _streamed_message(chat, "decide", messages, params, meter)
                return self._decision(question, content, calls, finish)
        return await chat.complete("decide", messages, lambda c: self._parse_completion(question, c), **params)

    def _parse_completion(self, question: str, completion: ChatCompletion) -> Decision:
        message = completion.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in (message.tool_calls or ()) if c.type == "function"]
        return self._decision(question, message.content or "", calls, _finish_reason(completion))

    def _decision(self, question: str, content: str, calls: Sequence[tuple[str, str]], finish: str | None) -> Decision:
        if calls:
            return self._from_calls(calls, finish)
        if finish == "content_filter":
            raise JudgeOutputError(f"decider: model {self.model!r} output was filtered (finish_reason=content_filter)")
        if finish == "length":
            cut = (
                f"decider: model {self.model!r} wrote text without a search call and stopped at the output cap "
                f"({self.max_tokens} tokens); a cut reply is never shown"
            )
            if is_small_talk(question):
                raise JudgeTruncated(cut)
            raise ToolsDropped(f"{cut}, and the question needs a search: the server may have dropped the tools")
        if not content.strip():
            raise JudgeOutputError(f"decider: model {self.model!r} returned neither a search call nor a reply")
        problem = reply_problem(content)
        if problem is not None:
            raise ToolsDropped(
                f"decider: model {self.model!r} wrote no tool call, and its text is no reply ({problem}); "
                "the server may not parse or offer tools for this model"
            )
        if not is_small_talk(question):
            raise ToolsDropped(
                f"decider: model {self.model!r} answered a question that needs a search in plain text, without "
                "calling 'search'; the server may have dropped the tools (a chat template without tool support)"
            )
        return Decision(reply=content.strip(), reason="model replied without searching (small talk)")

    def _from_calls(self, calls: Sequence[tuple[str, str]], finish: str | None) -> Decision:
        complete: list[tuple[str, str]] = []
        dropped: list[str] = []
        for name, arguments in calls:
            try:
                parse_search_calls([(name, arguments)])
            except JudgeOutputError as exc:
                if finish != "length":
                    raise
                dropped.append(str(exc))
                continue
            complete.append((name, arguments))
        if not complete:
            raise JudgeTruncated(
                f"decider: model {self.model!r} stopped at the output cap ({self.max_tokens} tokens) before any "
                "complete search call"
            )
        queries, rejected = _usable_queries(parse_search_calls(complete), f"decider ({self.model!r})")
        reason = f"model called search {len(calls)}x"
        if dropped:
            reason += f"; output cut at the cap: kept {len(complete)} complete call(s), dropped {len(dropped)}"
        if rejected:
            reason += f"; rejected {len(rejected)} unusable quer(ies): {'; '.join(rejected)}"
        return Decision(queries=queries, reason=reason)

    async def _decide_json(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        messages = self._messages(question, history, page, json_mode=True)
        response_format = dict(prompts.DECIDE_RESPONSE_FORMAT)
        return await self._chat().complete(
            "decide", messages, lambda c: self._parse_json(question, c), response_format=response_format
        )

    def _parse_json(self, question: str, completion: ChatCompletion) -> Decision:
        finish = _finish_reason(completion)
        content = completion.choices[0].message.content or ""
        if finish == "content_filter":
            raise JudgeOutputError(f"decider: model {self.model!r} output was filtered (finish_reason=content_filter)")
        try:
            obj = json.loads(content)
        except ValueError as exc:
            cut = f" (cut at the output cap of {self.max_tokens} tokens)" if finish == "length" else ""
            err = JudgeTruncated if finish == "length" else JudgeOutputError
            raise err(f"decider: json_schema reply is not JSON{cut}: {content[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise JudgeOutputError(f"decider: json_schema reply is not an object: {content[:200]!r}")
        action, reply, raw = obj.get("action"), obj.get("reply"), obj.get("queries")
        queries = [q for q in raw if isinstance(q, str)] if isinstance(raw, list) else []
        if action == "reply" and isinstance(reply, str) and is_small_talk(question) and reply_problem(reply) is None:
            return Decision(reply=reply.strip(), reason="model replied without searching (small talk, json_schema)")
        who = f"decider ({self.model!r}, json_schema)"
        kept, rejected = _usable_queries(queries, who)
        reason = f"model asked for {len(kept)} search(es) (json_schema)"
        if action == "reply":
            reason += "; its direct reply was refused: the question is not small talk"
        if rejected:
            reason += f"; rejected {len(rejected)} unusable quer(ies): {'; '.join(rejected)}"
        return Decision(queries=kept, reason=reason)


async def _streamed_message(
    chat: _Chat, judge: str, messages: list[dict[str, Any]], params: dict[str, Any], meter: _Meter
) -> tuple[str, list[tuple[str, str]], str | None]:
    """Run a streamed completion; return its text, its tool calls assembled from deltas by index, and the
    finish reason."""
    text: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    finish: str | None = None
    async for chunk in _stream_chunks(chat, judge, messages, params, meter):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or ():
                if call.function is not None:
                    if call.function.name:
                        names[call.index] = call.function.name
                    arguments.setdefault(call.index, []).append(call.function.arguments or "")
    calls = [(names.get(i, ""), "".join(arguments.get(i, []))) for i in sorted(set(names) | set(arguments))]
    return "".join(text), calls, finish


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


# -- grade ----------------------------------------------------------------------------------------------


def parse_verdict(content: str) -> Verdict:
    """Parse the grader's JSON reply into a :class:`Verdict`.

    Raises:
        JudgeOutputError: not a JSON object, or ``label`` is not relevant, partial or irrelevant.
    """
    text = content.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise JudgeOutputError(f"grader reply is not JSON: {content[:200]!r}") from exc
    label = obj.get("label") if isinstance(obj, dict) else None
    label = label.strip().lower() if isinstance(label, str) else label
    if label not in _LABELS:
        raise JudgeOutputError(
            f"grader reply has no valid label (expected relevant, partial or irrelevant): {content[:200]!r}"
        )
    reason = obj.get("reason", "")
    return Verdict(label=label, reason=reason if isinstance(reason, str) else str(reason))


def _json_schema_unsupported(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 404, 415, 422, 501):
        return False
    text = _message(exc).lower()
    return any(word in text for word in ("response_format", "json_schema", "unsupported", "not supported"))


@define
class OpenAIGrader:
    """Grades one chunk with structured output (``json_schema``), falling back to JSON mode when unsupported.

    The first time the server rejects ``json_schema`` (HTTP 400/422 naming it), the grader retries that call
    with ``{"type": "json_object"}`` and keeps using JSON mode from then on.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; a fast, cheap one is enough.
        timeout_s: Per-request timeout in seconds.
        max_chars: Chunk text is cut to this many characters before grading.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    max_chars: int = field(default=2000, validator=_positive)
    temperature: float | None = 0.0
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["grade"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["grade"])
    compat: ServerCompat = field(factory=ServerCompat)
    _json_schema: bool = field(default=True, init=False)

    @property
    def uses_json_schema(self) -> bool:
        """False once the server has rejected ``json_schema`` and the grader fell back to JSON mode."""
        return self._json_schema

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Label ``hit`` for ``query``.

        Raises:
            JudgeOutputError: the reply is not a valid verdict.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        nonce = prompts.new_nonce()
        block = ContextBlock(
            n=1,
            text=prompts.truncate(hit.text, self.max_chars),
            source=hit.chunk.source,
            title=hit.chunk.title,
            chunk_id=hit.id,
            query=query,
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.grade_system_prompt(nonce, self.max_chars)},
            {"role": "user", "content": prompts.grade_user_prompt(query, prompts.fence_blocks([block], nonce))},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        if self._json_schema:
            try:
                return await chat.complete(
                    "grade", messages, _verdict_of, response_format=dict(prompts.GRADE_RESPONSE_FORMAT)
                )
            except JudgeError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, openai.APIStatusError) and _json_schema_unsupported(cause)):
                    raise
                self._json_schema = False
        return await chat.complete("grade", messages, _verdict_of, response_format={"type": "json_object"})

    async def grade_batch(self, query: str, hits: Sequence[Hit]) -> list[Verdict | None]:
        """Label all of ``query``'s hits in one call (:mod:`ragloop.llm.batch_grade`): one verdict per hit, in
        order, ``None`` where the reply has no valid verdict for it (the node fails open for that hit alone).

        The output cap is ``max_tokens`` per hit; each hit's text is cut to ``max_chars``.

        Raises:
            JudgeOutputError: the reply holds no valid verdict at all (JudgeTruncated when cut at the cap).
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        if not hits:
            return []
        nonce, n = prompts.new_nonce(), len(hits)
        fenced = prompts.fence_blocks(batch_grade.batch_blocks(query, hits, self.max_chars), nonce)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": batch_grade.batch_system_prompt(nonce, self.max_chars, n)},
            {"role": "user", "content": batch_grade.batch_user_prompt(query, fenced)},
        ]
        cap = None if self.max_tokens is None else self.max_tokens * n
        chat = _Chat(self.client, self.model, self.timeout_s, self.temperature, cap, self.budget, self.compat)

        def parse(completion: ChatCompletion) -> list[Verdict | None]:
            message = completion.choices[0].message
            if message.content is None:
                refusal = getattr(message, "refusal", None)
                raise JudgeOutputError(
                    f"batch grader reply has no content{f' (refusal: {refusal!r})' if refusal else ''}"
                )
            try:
                return batch_grade.parse_verdicts(message.content, n)
            except JudgeOutputError as exc:
                if _finish_reason(completion) == "length":
                    raise JudgeTruncated(f"batch grader reply stopped at the output cap: {exc}") from exc
                raise

        if self._json_schema:
            try:
                fmt = batch_grade.batch_response_format(n)
                return await chat.complete("grade", messages, parse, response_format=fmt)
            except JudgeError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, openai.APIStatusError) and _json_schema_unsupported(cause)):
                    raise
                self._json_schema = False
        return await chat.complete("grade", messages, parse, response_format={"type": "json_object"})


def _verdict_of(completion: ChatCompletion) -> Verdict:
    message = completion.choices[0].message
    if message.content is None:
        refusal = getattr(message, "refusal", None)
        raise JudgeOutputError(f"grader reply has no content{f' (refusal: {refusal!r})' if refusal else ''}")
    try:
        return parse_verdict(message.content)
    except JudgeOutputError as exc:
        if _finish_reason(completion) == "length":
            raise JudgeTruncated(f"grader reply stopped at the output cap: {exc}") from exc
        raise


# -- rewrite --------------------------------------------------------------------------------------------

_LABEL_PREFIX = re.compile(
    r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?(?:(?:new|rewritten|alternative|search)\s+)?(?:query|search)\s*[:：-]\s*",
    re.IGNORECASE,
)
_QUOTES = "\"'`“”‘’«»"


def clean_query(text: str) -> str:
    """The first non-blank line of a model reply, without list bullets, ``Query:`` labels or quotes."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _LABEL_PREFIX.sub("", line).strip()
    line = re.sub(r"^(?:[-*•]\s+|\d+[.)]\s+)", "", line).rstrip(". ")
    while len(line) >= 2 and line[0] in _QUOTES and line[-1] in _QUOTES:
        line = line[1:-1].strip()
    return line.strip(_QUOTES + " ").rstrip(".")


@define
class OpenAIRewriter:
    """Rewrites a failed query from a substantially different angle, built from the original question.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; a fast, cheap one is enough.
        timeout_s: Per-request timeout in seconds.
        temperature: Sampling temperature; a little above zero helps the new angle differ.
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    temperature: float | None = 0.3
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["rewrite"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["rewrite"])
    compat: ServerCompat = field(factory=ServerCompat)

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """Return one new query.

        Raises:
            JudgeOutputError: the reply is empty, cut at the output cap, not a usable query (too long,
                unprintable, markup or tool syntax: see :func:`~ragloop.llm.guards.query_problem`), or repeats
                a tried query.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        tried_all = list(dict.fromkeys([*tried, failed_query]))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.rewrite_system_prompt()},
            {"role": "user", "content": prompts.rewrite_user_prompt(question, failed_query, tried_all)},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        return await chat.complete("rewrite", messages, lambda c: self._query(c, tried_all))

    def _query(self, completion: ChatCompletion, tried: Sequence[str]) -> str:
        raw = completion.choices[0].message.content or ""
        if _finish_reason(completion) == "length":
            raise JudgeTruncated(
                f"rewriter: model {self.model!r} stopped at the output cap ({self.max_tokens} tokens): {raw[:80]!r}"
            )
        query = clean_query(raw)
        if not query:
            raise JudgeOutputError(f"rewriter: model {self.model!r} returned an empty query")
        problem = query_problem(query)
        if problem is not None:
            raise JudgeOutputError(f"rewriter: rejected {query[:80]!r}: {problem}")
        if _normal(query) in {_normal(q) for q in tried}:
            raise JudgeOutputError(f"rewriter: model {self.model!r} repeated an already tried query {query!r}")
        return query


# -- answer ---------------------------------------------------------------------------------------------


@define
class OpenAIAnswerer:
    """Streams the reply, with an outcome-specific system prompt and fenced, numbered context.

    With ``outcome="direct"`` and a ``direct_reply`` from the decider, that reply is streamed as is (no call).

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; use a capable one.
        timeout_s: Longest time for the whole stream (cut further by the turn's deadline); it also bounds
            each wait for the next chunk.
        max_history: How many earlier conversation messages to send.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        max_tokens: Output cap (completion tokens); an answer that reaches it ends with
            :class:`~ragloop.errors.JudgeTruncated` after its text.
        budget: Share of the turn's remaining time the answer may use, and the reserve it leaves for the
            offline answerer.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=60.0, validator=_positive)
    max_history: int = 6
    temperature: float | None = 0.2
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["answer"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["answer"])
    compat: ServerCompat = field(factory=ServerCompat)

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """Yield the reply's text as it streams. Claims cite blocks as ``[n]``.

        Leading whitespace is held back, so an answer with no text fails before its first token (and the node's
        fallback answers instead).

        Raises:
            JudgeError: the stream broke or ended early (after the tokens that did arrive).
            JudgeOutputError: a malformed stream chunk; no text at all; output withheld by a content filter.
            JudgeTruncated: the answer reached the output cap (after its text).
            JudgeTimeout: the stream ran past its budget, or a wait for a chunk past ``timeout_s``.
        """
        if outcome == "direct" and direct_reply:
            yield direct_reply
            return
        nonce = prompts.new_nonce()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.answer_system_prompt(outcome, nonce)},
            *prompts.history_messages(history, self.max_history),
            {"role": "user", "content": prompts.answer_user_prompt(question, blocks, outcome, missing, nonce)},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        with _Meter("answer", self.model) as meter:
            chunks = _stream_chunks(chat, "answer", messages, {}, meter)
            started = False
            finish: str | None = None
            try:
                async for chunk in chunks:
                    for choice in chunk.choices:
                        finish = choice.finish_reason or finish
                        text = choice.delta.content
                        if not text or not (started or text.strip()):
                            continue
                        started = True
                        yield text
            finally:
                await chunks.aclose()
            if not started:
                why = "withheld by a content filter" if finish == "content_filter" else "empty"
                raise JudgeOutputError(f"answer from model {self.model!r} was {why} (finish_reason={finish})")
            if finish == "content_filter":
                raise JudgeOutputError(f"answer from model {self.model!r} was cut by a content filter")
            if finish == "length":
                raise JudgeTruncated(
                    f"answer from model {self.model!r} stopped at the output cap ({self.max_tokens} tokens)"
                )


# -- bundle ---------------------------------------------------------------------------------------------


@frozen
class OpenAIJudges:
    """The four OpenAI-compatible judges, sharing one client.

    Attributes:
        decider: Decide step (fast model).
        grader: Grade step (fast model).
        rewriter: Rewrite step (fast model).
        answerer: Answer step (capable model).
    """

    decider: OpenAIDecider
    grader: OpenAIGrader
    rewriter: OpenAIRewriter
    answerer: OpenAIAnswerer

    @classmethod
    def create(  # noqa: PLR0913 (keyword-only knobs of one builder)
        cls,
        client: openai.AsyncOpenAI,
        *,
        fast_model: str,
        answer_model: str,
        timeout_s: float = 20.0,
        answer_timeout_s: float | None = None,
        glossary: Mapping[str, str] | None = None,
        grade_max_chars: int = 2000,
        decide_mode: DecideMode = "auto",
        max_tokens: Mapping[str, int | None] | None = None,
    ) -> OpenAIJudges:
        """Build all four judges: ``fast_model`` decides, grades and rewrites; ``answer_model`` answers.

        Args:
            client: The ``openai.AsyncOpenAI`` client (built, configured and closed by the caller).
            fast_model: A cheap, fast model for decide, grade and rewrite.
            answer_model: A capable model for the streamed answer.
            timeout_s: Per-request timeout for decide, grade and rewrite.
            answer_timeout_s: Per-request timeout for answer (per chunk while streaming); default 3x
                ``timeout_s``.
            glossary: Abbreviation → expansion for the decider.
            grade_max_chars: Chunk text budget for the grader.
            decide_mode: ``auto``, ``tools`` or ``json`` (see :class:`OpenAIDecider`).
            max_tokens: Output caps by judge name (``decide``, ``grade``, ``rewrite``, ``answer``) over
                :data:`~ragloop.llm.budget.DEFAULT_OUTPUT_TOKENS`; ``None`` sends no cap for that judge.

        Raises:
            ConfigError: ``max_tokens`` names an unknown judge.
        """
        caps: dict[str, int | None] = dict(DEFAULT_OUTPUT_TOKENS)
        unknown = sorted(set(max_tokens or {}) - set(caps))
        if unknown:
            raise ConfigError(f"max_tokens names unknown judges {unknown}; known: {', '.join(sorted(caps))}")
        caps.update(max_tokens or {})
        compat = ServerCompat()
        return cls(
            decider=OpenAIDecider(
                client,
                fast_model,
                timeout_s=timeout_s,
                glossary=dict(glossary or {}),
                mode=decide_mode,
                max_tokens=caps["decide"],
                compat=compat,
            ),
            grader=OpenAIGrader(
                client,
                fast_model,
                timeout_s=timeout_s,
                max_chars=grade_max_chars,
                max_tokens=caps["grade"],
                compat=compat,
            ),
            rewriter=OpenAIRewriter(client, fast_model, timeout_s=timeout_s, max_tokens=caps["rewrite"], compat=compat),
            answerer=OpenAIAnswerer(
                client,
                answer_model,
                timeout_s=answer_timeout_s or 3 * timeout_s,
                max_tokens=caps["answer"],
                compat=compat,
            ),
        )
