"""Scripting the server's answers: :class:`ScriptedResponse` and the builders that make one.

Each builder returns a frozen :class:`ScriptedResponse`: a JSON chat completion (:func:`reply`,
:func:`json_reply`, :func:`tool_calls`, :func:`empty_choices`), an error in OpenAI's envelope (:func:`error`,
:func:`rate_limited`, :func:`server_error`), an SSE stream (:func:`stream`, :func:`stream_tool_calls`) or the
default embeddings or rerank answer (:func:`embeddings_ok`, :func:`rerank_ok`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import evolve, frozen

#: Token counts a scripted response reports: ``(prompt, completion)`` or ``(prompt, completion, cached prompt)``.
Usage = tuple[int, int] | tuple[int, int, int]

#: A tool call to script: the function name and its arguments, as a mapping (sent as JSON) or as a raw
#: string (sent verbatim, so tests can script malformed arguments).
ToolCallSpec = tuple[str, Mapping[str, Any] | str]

_MALFORMED_CHUNK = '{"id": "chatcmpl-broken", "choices": [{"delta": {"content": "unterminated'


@frozen
class Latency:
    """Simulated model latency, applied before a response (and between stream chunks).

    Attributes:
        first_token_s: Seconds before the first token (for non-streamed replies: before the response).
        per_token_s: Seconds per further token (stream chunk, or completion token of a JSON reply).
    """

    first_token_s: float = 0.0
    per_token_s: float = 0.0


@frozen
class ScriptedResponse:
    """One scripted answer of the server. Build it with :func:`reply`, :func:`stream`, :func:`error` …

    Attributes:
        status: HTTP status code.
        body: JSON body for a non-streamed response (chat completion, error or embeddings envelope).
        raw_body: Bytes sent verbatim instead of ``body`` (for malformed bodies).
        headers: Extra response headers, e.g. ``(("retry-after", "0.01"),)``.
        chunks: SSE ``data:`` payloads for a streamed response, in order; ``None`` for a JSON response.
        done: Send ``data: [DONE]`` after the chunks.
        cut: Close the connection abruptly after the chunks (no ``[DONE]``, no chunked-encoding end).
        usage: ``(prompt_tokens, completion_tokens)``, or with a third number, the prompt tokens the server
            reports as taken from its prompt cache (``prompt_tokens_details.cached_tokens``); ``None`` estimates
            the first two from word counts.
        delay_s: Seconds to wait before sending anything (to trigger client timeouts).
        latency: Per-response simulated model latency (overrides the server's default).
        kind: What the response is, for readable reprs and assertions.
    """

    status: int = 200
    body: Mapping[str, Any] | None = None
    raw_body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[str, ...] | None = None
    done: bool = True
    cut: bool = False
    usage: Usage | None = None
    delay_s: float = 0.0
    latency: Latency | None = None
    kind: str = "reply"

    def delayed(self, seconds: float) -> ScriptedResponse:
        """This response, sent only after ``seconds`` (a slow server, to trigger client timeouts)."""
        return evolve(self, delay_s=seconds)

    def with_latency(self, first_token_s: float, per_token_s: float = 0.0) -> ScriptedResponse:
        """This response with simulated model latency (first token, then per token)."""
        return evolve(self, latency=Latency(first_token_s, per_token_s))


def word_count(text: str) -> int:
    return len(text.split())


def _message(content: str | None, calls: Sequence[ToolCallSpec] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{i}_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": name, "arguments": _arguments(args)},
            }
            for i, (name, args) in enumerate(calls)
        ]
    return message


def _arguments(args: Mapping[str, Any] | str) -> str:
    return args if isinstance(args, str) else json.dumps(dict(args))


def reply(text: str, *, usage: Usage | None = None, finish_reason: str = "stop") -> ScriptedResponse:
    """A non-streamed chat completion whose message content is ``text``."""
    body = {"choices": [{"index": 0, "message": _message(text), "finish_reason": finish_reason}]}
    return ScriptedResponse(body=body, usage=usage, kind="reply")


def json_reply(obj: Any, *, usage: Usage | None = None) -> ScriptedResponse:
    """A non-streamed chat completion whose content is ``obj`` serialised as JSON (structured output)."""
    return evolve(reply(json.dumps(obj), usage=usage), kind="json_reply")


def tool_calls(
    calls: Sequence[ToolCallSpec], *, content: str | None = None, usage: Usage | None = None
) -> ScriptedResponse:
    """A non-streamed chat completion with one tool call per entry of ``calls`` (several = parallel calls).

    Arguments given as a string are sent verbatim, e.g. ``tool_calls([("search", '{"query": ')])`` scripts
    malformed JSON arguments.
    """
    body = {"choices": [{"index": 0, "message": _message(content, calls), "finish_reason": "tool_calls"}]}
    return ScriptedResponse(body=body, usage=usage, kind="tool_calls")


def empty_choices(*, usage: Usage | None = None) -> ScriptedResponse:
    """A 200 chat completion with ``"choices": []`` (some proxies do this on content filtering)."""
    return ScriptedResponse(body={"choices": []}, usage=usage, kind="empty_choices")


def error(
    status: int,
    message: str = "scripted error",
    *,
    retry_after: float | None = None,
    error_type: str = "server_error",
    code: str | None = None,
) -> ScriptedResponse:
    """An HTTP error in OpenAI's error envelope; ``retry_after`` (seconds) sets the ``retry-after`` header."""
    headers: tuple[tuple[str, str], ...] = ()
    if retry_after is not None:
        headers = (("retry-after", repr(float(retry_after))),)
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return ScriptedResponse(status=status, body=body, headers=headers, kind=f"error_{status}")


def rate_limited(retry_after: float = 0.01, message: str = "Rate limit reached (scripted)") -> ScriptedResponse:
    """A 429 with a ``retry-after`` header; the SDK waits that long and retries."""
    return error(429, message, retry_after=retry_after, error_type="rate_limit_exceeded", code="rate_limit")


def server_error(
    status: int = 500, message: str = "Internal server error (scripted)", *, retry_after: float | None = 0.01
) -> ScriptedResponse:
    """A 5xx. ``retry_after`` defaults to 10 ms so SDK retries stay fast in tests; ``None`` omits it."""
    return error(status, message, retry_after=retry_after)


def _chunk(delta: Mapping[str, Any], finish_reason: str | None = None) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish_reason}]})


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def stream(
    text: str,
    *,
    chunk_size: int = 4,
    token_delay_s: float = 0.0,
    first_token_delay_s: float = 0.0,
    cut_after: int | None = None,
    malformed_at: int | None = None,
    done: bool = True,
    usage: Usage | None = None,
) -> ScriptedResponse:
    """A streamed (SSE) chat completion of ``text`` in ``chunk_size``-character content deltas.

    Args:
        text: The full reply.
        chunk_size: Characters per content delta (one delta counts as one token for latency).
        token_delay_s: Seconds between deltas.
        first_token_delay_s: Seconds before the first delta.
        cut_after: Close the connection abruptly after this many content deltas (no finish, no ``[DONE]``).
        malformed_at: Send a malformed JSON chunk in place of the delta with this index.
        done: Send ``data: [DONE]`` at the end (``False`` ends the body cleanly without it).
        usage: ``(prompt_tokens, completion_tokens)`` for the usage chunk; estimated when ``None``.
    """
    pieces = _split(text, chunk_size)
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": piece}) for piece in pieces]
    if malformed_at is not None:
        chunks[1 + malformed_at] = _MALFORMED_CHUNK
    cut = cut_after is not None
    if cut_after is not None:
        chunks = chunks[: 1 + cut_after]
    else:
        chunks.append(_chunk({}, finish_reason="stop"))
    return ScriptedResponse(
        chunks=tuple(chunks),
        done=done and not cut,
        cut=cut,
        usage=usage,
        latency=Latency(first_token_delay_s, token_delay_s) if (first_token_delay_s or token_delay_s) else None,
        kind="stream",
    )


def stream_tool_calls(
    calls: Sequence[ToolCallSpec],
    *,
    chunk_size: int = 6,
    interleave: bool = True,
    content: str | None = None,
    usage: Usage | None = None,
) -> ScriptedResponse:
    """A streamed chat completion with tool calls whose arguments arrive as deltas across chunks.

    With ``interleave=True`` the argument deltas of parallel calls alternate (call 0, call 1, call 0, …), as
    some servers emit them; the client must assemble them by ``index``.
    """
    chunks = [_chunk({"role": "assistant", "content": content or ""})]
    per_call: list[list[str]] = []
    for i, (name, args) in enumerate(calls):
        head = {
            "tool_calls": [
                {
                    "index": i,
                    "id": f"call_{i}_{uuid.uuid4().hex[:8]}",
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }
        pieces = [_chunk(head)]
        pieces += [
            _chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            for piece in _split(_arguments(args), chunk_size)
        ]
        per_call.append(pieces)
    if interleave:
        longest = max((len(p) for p in per_call), default=0)
        for step in range(longest):
            chunks += [pieces[step] for pieces in per_call if step < len(pieces)]
    else:
        for pieces in per_call:
            chunks += pieces
    chunks.append(_chunk({}, finish_reason="tool_calls"))
    return ScriptedResponse(chunks=tuple(chunks), usage=usage, kind="stream_tool_calls")


def rerank_ok(*, delay_s: float = 0.0) -> ScriptedResponse:
    """The server's normal ``/rerank`` answer (the scores of its ``rerank`` function), optionally delayed."""
    return ScriptedResponse(delay_s=delay_s, kind="rerank")


def embeddings_ok(*, delay_s: float = 0.0) -> ScriptedResponse:
    """The server's normal deterministic embeddings answer (optionally delayed); for embedding scripts."""
    return ScriptedResponse(delay_s=delay_s, kind="embeddings")
