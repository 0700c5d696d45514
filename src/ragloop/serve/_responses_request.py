"""What a ``POST /v1/responses`` request may ask, checked before its turn takes a slot.

The Responses API has many fields a retrieval chat cannot honour (a request's own tools, background runs, file
and image inputs, structured output). Each one is refused with a 400 naming the field — never ignored — and so
is any field this module does not know. Sampling fields (``temperature``, ``max_output_tokens``…) are accepted
and ignored, as on ``/v1/chat/completions``: the server owns its models and prompts.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from ragloop.serve._principals import Principal
from ragloop.serve._stream import Rejected
from ragloop.serve._validate import _ChatRequest, _RequestChecks

#: Fields accepted and ignored (sampling, caching and bookkeeping hints the server has no use for).
_IGNORED = frozenset(
    {
        "model", "temperature", "top_p", "max_output_tokens", "user", "safety_identifier", "prompt_cache_key",
        "parallel_tool_calls", "truncation", "instructions", "reasoning", "service_tier", "top_logprobs",
        "stream_options", "prompt_cache_retention",
    }
)  # fmt: skip
#: Fields read here.
_READ = frozenset(
    {"input", "stream", "previous_response_id", "store", "metadata", "tools", "tool_choice", "text", "include",
     "background", "filters"}
)  # fmt: skip
_TEXT_PARTS = ("input_text", "output_text", "text")
_FILE_PARTS = ("input_image", "input_file", "input_audio")
#: A response id made by this server: ``resp_`` and the session id, a dot, 8 hex digits (no dot in the session id).
_RESPONSE_ID = re.compile(r"resp_([A-Za-z0-9_-]{1,128})\.[0-9a-f]{8}")


def response_id(session_id: str | None) -> str:
    """A new response id; one that continues a session names it (``resp_<session>.<random>``)."""
    if session_id is None:
        return "resp_" + secrets.token_hex(16)  # store: false: an id nothing can continue
    return f"resp_{session_id}.{secrets.token_hex(4)}"


def session_of(previous: str) -> str | None:
    """The session a response id continues, or ``None`` for an id this server did not make."""
    found = _RESPONSE_ID.fullmatch(previous)
    return found.group(1) if found else None


@frozen
class ResponsesRequest:
    """A checked ``/v1/responses`` request.

    Attributes:
        turn: The turn to run (its session resolved later, by the server).
        stream: Answer with server-sent events.
        store: Keep the conversation so that ``previous_response_id`` can continue it.
        previous_response_id: The response this one continues, as sent.
        metadata: Echoed back on the response.
    """

    turn: _ChatRequest
    stream: bool
    store: bool
    previous_response_id: str | None
    metadata: Mapping[str, str]


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    unknown = sorted(set(body) - _IGNORED - _READ)
    if unknown:
        raise Rejected(
            400,
            f"unsupported field {unknown[0]!r:.80}: this server answers from its knowledge base and supports input, "
            "stream, previous_response_id, store, metadata and filters (sampling fields are accepted and ignored)",
            param=unknown[0][:80],
        )
    if body.get("tools"):
        raise Rejected(
            400,
            "tools are not supported: the server runs its own knowledge-base search; send no tools",
            param="tools",
        )
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise Rejected(400, "tool_choice must be 'auto' or 'none' (the request has no tools)", param="tool_choice")
    if body.get("background") not in (None, False):
        raise Rejected(400, "background responses are not supported: leave out background", param="background")
    if body.get("include"):
        raise Rejected(400, "include is not supported: leave it out or send []", param="include")
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text")):
            raise Rejected(
                400,
                "text.format must be {'type': 'text'}: structured (json_schema) output is not supported",
                param="text.format",
            )


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise Rejected(400, f"{name} must be true or false", param=name)
    return value


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    raw = body.get("metadata")
    if raw is None:
        return {}
    if (
        not isinstance(raw, dict)
        or len(raw) > 16
        or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in raw.items())
    ):
        raise Rejected(
            400, "metadata must map up to 16 keys (64 characters) to strings (512 characters)", param="metadata"
        )
    return dict(raw)


def _messages(checks: _RequestChecks, raw: object) -> list[dict[str, str]]:
    """The input as ``{role, content}`` messages with plain-text content; files and other items refused."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise Rejected(400, "input must be a string or a non-empty list of messages", param="input")
    out = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise Rejected(
                400,
                f"{where} is a {kind!r:.40} item; only messages ({{'role', 'content'}}) are supported",
                param=where,
            )
        content = item.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in _FILE_PARTS:
                    raise Rejected(
                        400,
                        f"{where}.content[{j}] is an {part['type']}: file, image and audio inputs are not supported",
                        param=f"{where}.content[{j}]",
                    )
        text = checks._text(content, f"{where}.content", None, _TEXT_PARTS)
        out.append({"role": str(item.get("role")), "content": text})
    return out


def responses_request(checks: _RequestChecks, body: Mapping[str, Any], principal: Principal) -> ResponsesRequest:
    """The checked request, or :class:`Rejected` naming the field at fault."""
    _refuse_unsupported(body)
    stream, store = _flag(body, "stream", False), _flag(body, "store", True)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise Rejected(400, "previous_response_id must be a string", param="previous_response_id")
    messages = _messages(checks, body.get("input"))
    last = len(messages) - 1
    if messages[-1]["role"] != "user":
        raise Rejected(400, "the last input message must have role 'user' (the question)", param=f"input[{last}].role")
    if previous is not None and last:
        raise Rejected(
            400,
            "with previous_response_id send only the new user message: the server keeps the conversation",
            param="input",
        )
    history = checks._history(messages[:-1], "input")
    question = messages[-1]["content"]
    param = "input" if isinstance(body.get("input"), str) else f"input[{last}].content"
    session = session_of(previous) if previous is not None else None
    if previous is not None and session is None:
        raise unknown_response(previous)
    turn = _ChatRequest(
        question,
        history,
        session,
        None,
        None,
        param,
        principal,
        checks._filters(body, principal),
        new_session=previous is None and store,
    )
    return ResponsesRequest(turn, stream, store, previous, _metadata(body))


def unknown_response(previous: str) -> Rejected:
    """The 404 of a ``previous_response_id`` this principal has no conversation by (whoever else may)."""
    return Rejected(
        404,
        f"unknown previous_response_id {previous!r:.160}: start a new conversation without it",
        param="previous_response_id",
        code="unknown_response",
    )
