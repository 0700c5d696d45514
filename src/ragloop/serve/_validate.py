"""The checks a request passes before its turn takes a slot: key, body size, JSON, the two request shapes.

Each refusal is a :class:`~ragloop.serve._stream.Rejected` naming the field and the limit.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen
from starlette.requests import ClientDisconnect, Request

from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected
from ragloop.state import Message

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@frozen
class _Turn:
    """A validated request for one turn."""

    question: str
    history: tuple[Message, ...]
    session_id: str | None
    page_url: str | None
    page_title: str | None
    question_param: str
    principal: str = "anonymous"


class _RequestChecks:
    """The request checks under one app's settings."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings

    def authorize(self, request: Request) -> None:
        keys = self.settings.api_keys
        if not keys:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip().encode()
        ok = scheme.lower() == "bearer" and any(hmac.compare_digest(given, key.encode()) for key in keys)
        if not ok:
            raise Rejected(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                kind="authentication_error",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )

    async def read_json(self, request: Request) -> dict[str, Any]:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Rejected(413, f"request body is {int(declared):,} bytes; the limit is {limit:,}", param="body")
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise Rejected(413, f"request body is over the limit of {limit:,} bytes", param="body")
        except ClientDisconnect:
            raise Rejected(499, "the client went away while sending the request", param="body") from None
        try:
            obj = json.loads(body)
        except ValueError:
            raise Rejected(400, "request body is not valid JSON", param="body", code="invalid_json") from None
        except RecursionError:  # [[[[…]]]]: the decoder recurses once per level
            raise Rejected(
                400, "request body is nested too deeply to be a chat request", param="body", code="invalid_json"
            ) from None
        if not isinstance(obj, dict):
            raise Rejected(400, f"request body must be a JSON object, got {type(obj).__name__}", param="body")
        return obj

    # --- validation of the two request shapes ---------------------------------------------------------

    def _text(self, value: object, param: str, limit: int | None) -> str:
        if isinstance(value, list):
            parts = []
            for j, part in enumerate(value):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise Rejected(
                        400,
                        f"{param}[{j}] must be a text part {{'type': 'text', 'text': '…'}}; "
                        "images, audio and files are not supported",
                        param=f"{param}[{j}]",
                    )
                parts.append(part["text"])
            value = "\n".join(parts)
        if not isinstance(value, str):
            raise Rejected(400, f"{param} must be a string, got {type(value).__name__}", param=param)
        lone = _LONE_SURROGATE.search(value)
        if lone is not None:  # JSON lets "\ud800" through; it is no character and cannot be stored or sent on
            raise Rejected(
                400,
                f"{param} holds a lone surrogate (\\u{ord(lone.group()):04x}) at character {lone.start():,}: "
                "not valid Unicode",
                param=param,
            )
        if limit is not None and len(value) > limit:
            raise Rejected(
                400, f"{param} is {len(value):,} characters; the limit is {limit:,}", param=param, code="too_long"
            )
        return value

    def _session_id(self, body: Mapping[str, Any]) -> str | None:
        sid = body.get("session_id")
        if sid is None:
            return None
        if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
            raise Rejected(
                400,
                "session_id must be 1–128 characters of letters, digits and . _ : -",
                param="session_id",
            )
        return sid

    def _history(self, items: object, param: str) -> tuple[Message, ...]:
        if items is None:
            return ()
        if not isinstance(items, list):
            raise Rejected(400, f"{param} must be a list of messages", param=param)
        limit = self.settings.max_messages - 1  # the question is one of max_messages
        if len(items) > limit:
            raise Rejected(
                400,
                f"{param} has {len(items) + 1:,} messages with the question; the limit is {limit + 1:,}",
                param=param,
            )
        out: list[Message] = []
        for i, item in enumerate(items):
            where = f"{param}[{i}]"
            if not isinstance(item, dict):
                raise Rejected(400, f"{where} must be an object with role and content", param=where)
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise Rejected(
                    400,
                    f"{where}.role must be 'user', 'assistant' or 'system', got {role!r:.40}",
                    param=f"{where}.role",
                )
            text = self._text(item.get("content"), f"{where}.content", self.settings.max_message_chars)
            if role in ("user", "assistant"):  # system prompts are the server's business: ignored
                out.append(Message(role, text))
        return self.settings.history.cap(out)

    def _page(self, body: Mapping[str, Any], name: str) -> str | None:
        value = body.get(name)
        if value is None:
            return None
        return self._text(value, name, 2048)

    def openai_turn(self, body: Mapping[str, Any]) -> tuple[_Turn, bool, bool]:
        """The turn of an OpenAI chat request, whether to stream, and whether to add a usage chunk."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Rejected(400, "messages must be a non-empty list of {role, content} objects", param="messages")
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "user":
            raise Rejected(400, "the last message must have role 'user' (the question)", param="messages[-1].role")
        history = self._history(messages[:-1], "messages")
        question = self._text(last.get("content"), f"messages[{len(messages) - 1}].content", None)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise Rejected(400, "stream must be true or false", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise Rejected(400, "stream_options must be an object", param="stream_options")
        usage = options.get("include_usage", False) is True
        sid = self._session_id(body)
        turn = _Turn(question, history, sid, None, None, f"messages[{len(messages) - 1}].content")
        return turn, stream, usage

    def api_turn(self, body: Mapping[str, Any]) -> _Turn:
        """The turn of an ``/api/chat`` request."""
        if "message" not in body:
            raise Rejected(400, "message is required: the user's question as a string", param="message")
        question = self._text(body["message"], "message", None)
        sid = self._session_id(body)
        if sid is not None and body.get("history") is not None:
            raise Rejected(
                400, "send either session_id (the server keeps the history) or history, not both", param="history"
            )
        return _Turn(
            question,
            self._history(body.get("history"), "history"),
            sid,
            self._page(body, "page_url"),
            self._page(body, "page_title"),
            "message",
        )
