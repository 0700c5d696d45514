"""Judges that call any OpenAI-compatible chat server (OpenAI, vLLM, Ollama, llama.cpp ``llama-server``).

Each judge takes an ``openai.AsyncOpenAI`` client built by the caller (never here), a model name and an
explicit per-request timeout; the client's own retries (``max_retries``) handle 429 and 5xx answers.
Every call, failed ones too, is recorded on the turn's usage meter with the server-reported token counts.

Failures surface as :class:`~ragloop.errors.JudgeError` subclasses the nodes can fail open on:

- :class:`~ragloop.errors.JudgeTimeout`: the request (or a stalled stream) ran past ``timeout_s``;
- :class:`~ragloop.errors.JudgeOutputError`: unparseable output (bad tool arguments, bad JSON, empty
  choices, a malformed stream chunk);
- :class:`~ragloop.errors.JudgeError`: HTTP errors after the retries, connection failures, cut streams.

This module imports ``openai``; import it only where the OpenAI judges are wanted.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import openai
from attrs import define, field, frozen

from ragloop.errors import ConfigError, JudgeError, JudgeOutputError, JudgeTimeout
from ragloop.llm import prompts
from ragloop.state import ContextBlock, Decision, Hit, Label, Message, Outcome, PageContext, Verdict
from ragloop.usage import LLMCall, record_call

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = [
    "OpenAIAnswerer",
    "OpenAIDecider",
    "OpenAIGrader",
    "OpenAIJudges",
    "OpenAIRewriter",
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
        return JudgeError(f"{where} failed with HTTP {exc.status_code} {retries}: {_message(exc)}; {hint}")
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


@define
class _Chat:
    """What every judge shares: the client, the model, the timeout, and one metered completion call."""

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float
    temperature: float | None

    async def complete(
        self, judge: str, messages: list[dict[str, Any]], parse: Callable[[ChatCompletion], _T], **params: Any
    ) -> _T:
        """One metered call; ``parse`` runs inside the meter, so output errors count as failed calls."""
        if self.temperature is not None:
            params.setdefault("temperature", self.temperature)
        with _Meter(judge, self.model) as meter:
            try:
                completion: ChatCompletion = await _create(self.client)(
                    model=self.model, messages=messages, timeout=self.timeout_s, **params
                )
            except openai.APIError as exc:
                raise _wrap(exc, judge=judge, model=self.model, timeout_s=self.timeout_s, client=self.client) from exc
            except ValueError as exc:  # json.JSONDecodeError: a 200 whose body is not JSON (proxy, broken server)
                raise JudgeOutputError(
                    f"{judge}: model {self.model!r} answered with a body that is not JSON ({exc}); "
                    "the server or a proxy broke the response"
                ) from exc
            meter.usage(completion.usage)
            if not completion.choices:
                raise JudgeOutputError(
                    f"{judge}: model {self.model!r} returned no choices (empty 'choices'); "
                    "the server may have filtered the output"
                )
            return parse(completion)


def _chat(client: openai.AsyncOpenAI, model: str, timeout_s: float, temperature: float | None) -> _Chat:
    return _Chat(client, model, timeout_s, temperature)


def _positive(instance: object, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name} must be a positive number of seconds/characters, got {value!r}"
        )


# -- decide ---------------------------------------------------------------------------------------------


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


@define
class OpenAIDecider:
    """Decides with native tool calling: ``search(query)`` calls (parallel) or a direct text reply.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call (built and closed by the caller).
        model: Model name; a fast, cheap one is enough.
        timeout_s: Per-request timeout in seconds (the SDK's default is 10 minutes).
        glossary: Abbreviation → expansion, rendered into the system prompt.
        max_history: How many earlier conversation messages to send.
        stream: Request a streamed completion and assemble tool calls from their deltas (for servers and
            proxies that only stream); the Decision is the same.
        temperature: Sampling temperature; ``None`` leaves the server's default.
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=20.0, validator=_positive)
    glossary: Mapping[str, str] = field(factory=dict)
    max_history: int = 6
    stream: bool = False
    temperature: float | None = 0.0

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Return ``Decision(queries=…)`` from the model's search calls, or ``Decision(reply=…)``.

        Raises:
            JudgeOutputError: malformed or empty tool arguments, an unknown tool, or neither calls nor text.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.decide_system_prompt(page, self.glossary)},
            *prompts.history_messages(history, self.max_history),
            {"role": "user", "content": question},
        ]
        params: dict[str, Any] = {
            "tools": [prompts.SEARCH_TOOL],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
        chat = _chat(self.client, self.model, self.timeout_s, self.temperature)
        if self.stream:
            with _Meter("decide", self.model) as meter:
                content, calls = await _streamed_message(chat, "decide", messages, params, meter)
                return self._decision(content, calls)
        return await chat.complete("decide", messages, self._parse_completion, **params)

    def _parse_completion(self, completion: ChatCompletion) -> Decision:
        message = completion.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in (message.tool_calls or ()) if c.type == "function"]
        return self._decision(message.content or "", calls)

    def _decision(self, content: str, calls: Sequence[tuple[str, str]]) -> Decision:
        if calls:
            queries = parse_search_calls(calls)
            return Decision(queries=queries, reason=f"model called search {len(calls)}x")
        if content.strip():
            return Decision(reply=content.strip(), reason="model replied without searching")
        raise JudgeOutputError(f"decider: model {self.model!r} returned neither a search call nor a reply")


async def _streamed_message(
    chat: _Chat, judge: str, messages: list[dict[str, Any]], params: dict[str, Any], meter: _Meter
) -> tuple[str, list[tuple[str, str]]]:
    """Run a streamed completion; return its text and its tool calls assembled from deltas by index."""
    text: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    async for chunk in _stream_chunks(chat, judge, messages, params, meter):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                text.append(delta.content)
            for call in delta.tool_calls or ():
                if call.function is not None:
                    if call.function.name:
                        names[call.index] = call.function.name
                    arguments.setdefault(call.index, []).append(call.function.arguments or "")
    calls = [(names.get(i, ""), "".join(arguments.get(i, []))) for i in sorted(set(names) | set(arguments))]
    return "".join(text), calls


async def _stream_chunks(
    chat: _Chat, judge: str, messages: list[dict[str, Any]], params: dict[str, Any], meter: _Meter
) -> AsyncGenerator[Any, None]:
    """Yield a streamed completion's chunks, usage to ``meter``; raise a JudgeError if it breaks or never ends."""
    if chat.temperature is not None:
        params.setdefault("temperature", chat.temperature)
    finished = False
    try:
        response = await _create(chat.client)(
            model=chat.model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            timeout=chat.timeout_s,
            **params,
        )
        async with response:
            async for chunk in response:
                if chunk.usage is not None:
                    meter.usage(chunk.usage)
                if any(choice.finish_reason for choice in chunk.choices):
                    finished = True
                yield chunk
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
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    max_chars: int = field(default=2000, validator=_positive)
    temperature: float | None = 0.0
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
        chat = _chat(self.client, self.model, self.timeout_s, self.temperature)
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


def _verdict_of(completion: ChatCompletion) -> Verdict:
    message = completion.choices[0].message
    if message.content is None:
        refusal = getattr(message, "refusal", None)
        raise JudgeOutputError(f"grader reply has no content{f' (refusal: {refusal!r})' if refusal else ''}")
    return parse_verdict(message.content)


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
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    temperature: float | None = 0.3

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """Return one new query.

        Raises:
            JudgeOutputError: the reply is empty or repeats a tried query.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        tried_all = list(dict.fromkeys([*tried, failed_query]))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.rewrite_system_prompt()},
            {"role": "user", "content": prompts.rewrite_user_prompt(question, failed_query, tried_all)},
        ]
        chat = _chat(self.client, self.model, self.timeout_s, self.temperature)
        return await chat.complete("rewrite", messages, lambda c: self._query(c, tried_all))

    def _query(self, completion: ChatCompletion, tried: Sequence[str]) -> str:
        query = clean_query(completion.choices[0].message.content or "")
        if not query:
            raise JudgeOutputError(f"rewriter: model {self.model!r} returned an empty query")
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
        timeout_s: Per-request timeout in seconds; for a stream it bounds each wait for the next chunk.
        max_history: How many earlier conversation messages to send.
        temperature: Sampling temperature; ``None`` leaves the server's default.
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=60.0, validator=_positive)
    max_history: int = 6
    temperature: float | None = 0.2

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

        Raises:
            JudgeError: the stream broke or ended early (after the tokens that did arrive).
            JudgeOutputError: a malformed stream chunk.
            JudgeTimeout: the request, or the wait for a chunk, timed out.
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
        chat = _chat(self.client, self.model, self.timeout_s, self.temperature)
        with _Meter("answer", self.model) as meter:
            chunks = _stream_chunks(chat, "answer", messages, {}, meter)
            try:
                async for chunk in chunks:
                    for choice in chunk.choices:
                        if choice.delta.content:
                            yield choice.delta.content
            finally:
                await chunks.aclose()


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
    def create(
        cls,
        client: openai.AsyncOpenAI,
        *,
        fast_model: str,
        answer_model: str,
        timeout_s: float = 20.0,
        answer_timeout_s: float | None = None,
        glossary: Mapping[str, str] | None = None,
        grade_max_chars: int = 2000,
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
        """
        return cls(
            decider=OpenAIDecider(client, fast_model, timeout_s=timeout_s, glossary=dict(glossary or {})),
            grader=OpenAIGrader(client, fast_model, timeout_s=timeout_s, max_chars=grade_max_chars),
            rewriter=OpenAIRewriter(client, fast_model, timeout_s=timeout_s),
            answerer=OpenAIAnswerer(client, answer_model, timeout_s=answer_timeout_s or 3 * timeout_s),
        )
