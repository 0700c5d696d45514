"""The checks a request passes before its turn takes a slot: key, body type, size and time, JSON, the two shapes.

Each refusal is a :class:`~ragloop.serve._stream.Rejected` naming the field and the limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import anyio
from attrs import frozen
from starlette.requests import ClientDisconnect, Request

from ragloop.errors import ConfigError
from ragloop.retrievers.filters import FilterKey, filter_key, normalize_filters
from ragloop.serve._principals import ANONYMOUS, Principal, narrow
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected
from ragloop.state import Caller, Message

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@frozen
class _ChatRequest:
    """A validated request for one turn.

    ``session_id`` with ``new_session`` starts that session (the id the server made, or the client's own);
    without it, continues one the principal already has.
    """

    question: str
    history: tuple[Message, ...]
    session_id: str | None
    page_url: str | None
    page_title: str | None
    question_param: str
    principal: Principal = ANONYMOUS
    filters: FilterKey = ()
    new_session: bool = False

    @property
    def caller(self) -> Caller | None:
        """Who asks, for the live sources (``None`` for the anonymous principal of a server without keys)."""
        if self.principal is ANONYMOUS:
            return None
        return Caller(tenant=self.principal.tenant, user=self.principal.name)


_CLOSE = {"connection": "close"}
_DRAIN_BYTES = 1 << 20  # a refused body up to this size is read before the reply, so closing sends FIN, not RST
_DRAIN_S = 1.0


async def _drain(request: Request, declared: str = "") -> None:
    """Read and drop what is left of a refused body, up to :data:`_DRAIN_BYTES` and :data:`_DRAIN_S`.

    The refusal closes the connection; closing a socket with unread bytes makes the kernel send a reset, which
    can reach the client before it reads the 413/415 and turn a clear refusal into "connection reset by peer".
    A body declared larger than the cap is not read: that client gets the reset risk rather than our time.
    """
    if declared.isdigit() and int(declared) > _DRAIN_BYTES:
        return
    seen = 0
    with anyio.move_on_after(_DRAIN_S):
        try:
            async for chunk in request.stream():
                seen += len(chunk)
                if seen > _DRAIN_BYTES:
                    return
        except (ClientDisconnect, RuntimeError):  # gone, or the stream was already consumed
            return


class _RequestChecks:
    """The request checks under one app's settings."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.keys = settings.keyring()

    def authorize(self, request: Request) -> Principal:
        """The caller's principal (:data:`ANONYMOUS` when no keys are configured); 401 for a missing or wrong key."""
        if not self.keys:
            return ANONYMOUS
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        principal = self.keys.find(token.strip())
        if scheme.lower() != "bearer" or principal is None:
            raise Rejected(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                kind="authentication_error",
                code="invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )
        return principal

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object: ``application/json``, within the size limit and the body timeout."""
        body = await self.read_body(request)
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

    async def read_body(self, request: Request) -> bytes:
        """The raw body of a JSON request: ``application/json``, within the size limit and the body timeout."""
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        declared = request.headers.get("content-length", "")
        if media != "application/json":
            # A browser sends text/plain, form or multipart bodies across origins without a CORS preflight:
            # requiring JSON keeps such a "simple request" from ever running a turn.
            await _drain(request, declared)
            raise Rejected(
                415,
                f"request body must be JSON: send 'Content-Type: application/json' (got {media or 'none'!r:.60})",
                param="content-type",
                code="unsupported_media_type",
                headers=_CLOSE,
            )
        limit = self.settings.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            await _drain(request, declared)
            raise Rejected(
                413, f"request body is {int(declared):,} bytes; the limit is {limit:,}", param="body", headers=_CLOSE
            )
        body = bytearray()
        timeout = self.settings.body_timeout_s
        try:
            with anyio.fail_after(timeout):
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > limit:
                        await _drain(request)
                        raise Rejected(
                            413, f"request body is over the limit of {limit:,} bytes", param="body", headers=_CLOSE
                        )
        except ClientDisconnect:
            raise Rejected(499, "the client went away while sending the request", param="body") from None
        except TimeoutError:
            raise Rejected(
                408,
                f"the request body did not arrive within {timeout:g} s (body_timeout_s); send it at once",
                param="body",
                code="request_timeout",
                headers=_CLOSE,
            ) from None
        return bytes(body)

    # --- validation of the two request shapes ---------------------------------------------------------

    def _text(self, value: object, param: str, limit: int | None, kinds: tuple[str, ...] = ("text",)) -> str:
        """A message's text: a string, or a list of text parts whose ``type`` is one of ``kinds``."""
        if isinstance(value, list):
            parts = []
            for j, part in enumerate(value):
                if not (isinstance(part, dict) and part.get("type") in kinds and isinstance(part.get("text"), str)):
                    raise Rejected(
                        400,
                        f"{param}[{j}] must be a text part {{'type': '{kinds[0]}', 'text': '…'}}; "
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

    def _session(self, body: Mapping[str, Any]) -> tuple[str | None, bool]:
        """The session id asked for and whether to start it (``new_session``)."""
        sid = body.get("session_id")
        new = body.get("new_session", False)
        if not isinstance(new, bool):
            raise Rejected(400, "new_session must be true or false", param="new_session")
        if sid is None:
            return None, new
        if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
            raise Rejected(
                400,
                "session_id must be 1–128 characters of letters, digits and . _ : -",
                param="session_id",
            )
        return sid, new

    def _filters(self, body: Mapping[str, Any], principal: Principal) -> FilterKey:
        """The turn's filters: the principal's scope, narrowed by the request's ``filters`` (403 to widen it)."""
        raw = body.get("filters")
        if raw is not None and not isinstance(raw, dict):
            raise Rejected(400, 'filters must be an object like {"version": ["1.0", "1.1"]}', param="filters")
        try:
            asked = normalize_filters(raw)
        except ConfigError as exc:
            raise Rejected(400, f"filters: {exc}", param="filters") from None
        if any(len(k) > 128 or len(v) > 100 or any(len(x) > 256 for x in v) for k, v in asked.items()):
            raise Rejected(
                400, "filters: keys up to 128 and values up to 256 characters, 100 values a key", param="filters"
            )
        filters, refused = narrow(self.principal_scope(principal), asked)
        if refused is not None:
            raise Rejected(403, refused, kind="permission_error", param="filters", code="filter_outside_scope")
        return filter_key(filters)

    def principal_scope(self, principal: Principal) -> dict[str, tuple[str, ...]]:
        """The server-side filters of ``principal``'s turns."""
        return principal.scope(self.settings.tenant_key)

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

    def openai_request(
        self, body: Mapping[str, Any], principal: Principal = ANONYMOUS
    ) -> tuple[_ChatRequest, bool, bool]:
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
        sid, new = self._session(body)
        filters = self._filters(body, principal)
        if sid is not None or new:  # the server-side history replaces the sent one
            history = ()
        param = f"messages[{len(messages) - 1}].content"
        turn = _ChatRequest(question, history, sid, None, None, param, principal, filters, new)
        return turn, stream, usage

    def api_request(self, body: Mapping[str, Any], principal: Principal = ANONYMOUS) -> _ChatRequest:
        """The turn of an ``/api/chat`` request."""
        if "message" not in body:
            raise Rejected(400, "message is required: the user's question as a string", param="message")
        question = self._text(body["message"], "message", None)
        sid, new = self._session(body)
        if (sid is not None or new) and body.get("history") is not None:
            raise Rejected(
                400,
                "send either a session (session_id or new_session; the server keeps the history) or history, not both",
                param="history",
            )
        return _ChatRequest(
            question,
            self._history(body.get("history"), "history"),
            sid,
            self._page(body, "page_url"),
            self._page(body, "page_title"),
            "message",
            principal,
            self._filters(body, principal),
            new,
        )
