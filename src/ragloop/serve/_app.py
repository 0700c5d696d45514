"""The ASGI app: an OpenAI-compatible chat endpoint, an SSE endpoint, health, metrics and a chat page.

Every request is validated completely before the first byte of a response is sent, so a bad request gets
a 400 with a JSON error naming the field and the limit — never a 200 with a broken stream. A turn holds
one of ``max_concurrent_turns`` slots (429 with ``Retry-After`` when none is free), runs under a
deadline, and is cancelled, model calls included, the moment its client disconnects. Responses carry
the client-safe reply (:meth:`ragloop.chat.Reply.client_dict`), never the decision record.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.resources
import json
import re
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio
from attrs import field, frozen
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ragloop._log import get_logger
from ragloop.chat import ReplyReady
from ragloop.errors import ConfigError, InputError
from ragloop.events import Event, EventStream, NodeFinished, Progress, Token
from ragloop.serve._metrics import Metrics
from ragloop.serve._sessions import MemorySessionStore, SessionLimits, SessionStore
from ragloop.serve._stream import Body, Rejected, Start, TurnResponse, error_body, json_bytes
from ragloop.state import Message

if TYPE_CHECKING:
    import openai

    from ragloop.chat import ChatRAG, Reply

__all__ = ["ServeSettings", "create_app"]

log = get_logger("ragloop.serve")

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SSE_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx: do not buffer the stream
}
_JSON = {"content-type": "application/json"}


@frozen
class ServeSettings:
    """Limits and switches of the app.

    Attributes:
        max_concurrent_turns: Turns that may run at once; one more gets 429 with ``Retry-After``.
        retry_after_s: The ``Retry-After`` value sent with 429, in seconds.
        deadline_s: Time limit of one turn (the turn then answers with what it has); ``None``: the rag's own.
        deadline_grace_s: A turn still running this long after ``deadline_s`` is stuck: it is cancelled and
            the client gets 504 (or, mid-stream, an error event).
        max_body_bytes: Largest request body (413 above it).
        max_messages: Most messages in one request (history plus question).
        max_message_chars: Longest history message, in characters (the question's limit is the rag's own).
        history: Caps on the history a turn sees (oldest dropped first), for sessions and sent history alike.
        api_keys: Bearer keys that may call the API; empty: no authentication.
        cors_origins: Origins allowed to call the API from a browser; empty: CORS off.
        model_name: The model id reported by the OpenAI-compatible endpoint.
        page: Serve the chat page at ``/``.
    """

    max_concurrent_turns: int = 64
    retry_after_s: int = 1
    deadline_s: float | None = 60.0
    deadline_grace_s: float = 15.0
    max_body_bytes: int = 256_000
    max_messages: int = 100
    max_message_chars: int = 32_000
    history: SessionLimits = field(factory=SessionLimits)
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    model_name: str = "ragloop"
    page: bool = True

    def __attrs_post_init__(self) -> None:
        if self.max_concurrent_turns < 1:
            raise ConfigError(f"max_concurrent_turns must be at least 1, got {self.max_concurrent_turns}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ConfigError(f"deadline_s must be a positive number of seconds or None, got {self.deadline_s}")
        if any(not key for key in self.api_keys):
            raise ConfigError("api_keys must not contain an empty key")


@frozen
class _Turn:
    """A validated request for one turn."""

    question: str
    history: tuple[Message, ...]
    session_id: str | None
    page_url: str | None
    page_title: str | None
    question_param: str


class _Server:
    """The app's state: the rag, the limits, the session store, the metrics, the slots in use."""

    def __init__(
        self,
        rag: ChatRAG,
        settings: ServeSettings,
        sessions: SessionStore,
        source_url: Callable[[str], str | None] | None,
        model_check: Callable[[], Awaitable[bool]] | None,
    ) -> None:
        self.rag = rag
        self.settings = settings
        self.sessions = sessions
        self.source_url = source_url
        self.model_check = model_check
        self.metrics = Metrics()
        self.active = 0
        self._ready_at = 0.0
        self._ready = False

    # --- request checks --------------------------------------------------------------------------------

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
        if not isinstance(obj, dict):
            raise Rejected(400, f"request body must be a JSON object, got {type(obj).__name__}", param="body")
        return obj

    def take_slot(self) -> None:
        limit = self.settings.max_concurrent_turns
        if self.active >= limit:
            self.metrics.rejected.labels(reason="busy").inc()
            raise Rejected(
                429,
                f"server busy: {limit} turns in flight (the limit); retry after {self.settings.retry_after_s} s",
                kind="rate_limit_error",
                code="busy",
                headers={"retry-after": str(self.settings.retry_after_s)},
            )
        self.active += 1
        self.metrics.in_flight.inc()

    def release_slot(self) -> None:
        self.active -= 1
        self.metrics.in_flight.dec()

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
        limit = self.settings.max_messages
        if len(items) > limit:
            raise Rejected(400, f"{param} has {len(items):,} messages; the limit is {limit:,}", param=param)
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

    # --- running a turn -------------------------------------------------------------------------------

    async def events(self, turn: _Turn) -> AsyncGenerator[Event, None]:
        """The turn's events, counted in the metrics; raises :class:`Rejected` (before the first event) on bad input.

        The first event comes as soon as the input is accepted (so a caller can send its status line then);
        callers use :class:`Progress`, :class:`Token` and :class:`ReplyReady` and skip the rest.
        """
        started = time.perf_counter()
        first_token = True
        history = turn.history
        if turn.session_id is not None:
            history = self.settings.history.cap(await self.sessions.load(turn.session_id))
        metrics = self.metrics
        try:  # ChatRAG.stream checks its input when called; an override written as a generator checks it later
            stream: EventStream | AsyncGenerator[Event, None] = self.rag.stream(
                turn.question,
                history=history,
                page_url=turn.page_url,
                page_title=turn.page_title,
                deadline_s=self.settings.deadline_s,
            )
        except InputError as exc:
            metrics.rejected.labels(reason="invalid").inc()
            raise Rejected(400, str(exc), param=turn.question_param) from None
        async with aclosing(stream):
            try:
                event = await anext(stream)
            except InputError as exc:
                metrics.rejected.labels(reason="invalid").inc()
                raise Rejected(400, str(exc), param=turn.question_param) from None
            while True:
                if isinstance(event, NodeFinished):
                    metrics.node_seconds.labels(node=event.node).observe(event.duration)
                elif first_token and isinstance(event, Token) and event.text:
                    metrics.first_token_seconds.observe(time.perf_counter() - started)
                    first_token = False
                if isinstance(event, ReplyReady):
                    reply = event.reply
                    metrics.observe_record(reply.outcome, reply.record.as_dict())
                    if turn.session_id is not None:
                        await self._remember(turn, reply.text)
                yield event
                try:
                    event = await anext(stream)
                except StopAsyncIteration:
                    return

    async def _remember(self, turn: _Turn, answer: str) -> None:
        assert turn.session_id is not None
        try:
            await self.sessions.append(turn.session_id, (Message("user", turn.question), Message("assistant", answer)))
        except Exception:  # a session store outage must not cost the user the answer in hand (logged)
            log.exception("session store failed", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()

    def client_reply(self, reply: Reply, session_id: str | None) -> dict[str, Any]:
        out = reply.client_dict(self.source_url)
        if session_id is not None:
            out["session_id"] = session_id
        return out

    async def ready(self) -> tuple[bool, dict[str, str]]:
        checks = {"index": "ok"}
        if self.model_check is None:
            checks["model"] = "not configured"
            return True, checks
        now = time.monotonic()
        if now - self._ready_at > 5.0:  # a probe at most every 5 s, however often /readyz is polled
            try:
                with anyio.fail_after(3.0):
                    self._ready = await self.model_check()
            except Exception:  # noqa: BLE001 — fail-open: any probe failure means "not ready", never a 500
                self._ready = False
            self._ready_at = now
        checks["model"] = "ok" if self._ready else "unreachable"
        return self._ready, checks


def _footer(citations: Sequence[Mapping[str, Any]]) -> str:
    """The sources as text a person can read at the end of the answer."""
    if not citations:
        return ""
    lines = [f"[{c['n']}] {c['title']} — {c['url'] or c['source']}" for c in citations]
    return "\n\nSources:\n" + "\n".join(lines)


def _usage(reply: Reply) -> dict[str, int]:
    tokens = reply.record.as_dict().get("tokens") or {}
    prompt, completion = int(tokens.get("prompt", 0)), int(tokens.get("completion", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _write_rejected(start: Start, body: Body, exc: Rejected) -> None:
    await start(exc.status, {**_JSON, **exc.headers})
    await body(exc.body())


_INTERNAL = "the turn failed on the server; the error is in the server log"


def _sse(name: str | None, payload: Any) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + (payload if isinstance(payload, bytes) else json_bytes(payload)) + b"\n\n"


class _Completion:
    """One OpenAI-compatible chat completion, written whole or as ``chat.completion.chunk`` events."""

    def __init__(self, server: _Server, turn: _Turn, include_usage: bool) -> None:
        self.server = server
        self.turn = turn
        self.include_usage = include_usage
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = server.settings.model_name

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish}
        return _sse(None, {**self._envelope("chat.completion.chunk"), "choices": [choice], **extra})

    async def stream(self, start: Start, body: Body) -> None:
        """Stream the turn: a role chunk, the tokens, the sources footer, a stop chunk, usage, ``[DONE]``."""
        async with aclosing(self.server.events(self.turn)) as events:
            event = await anext(events, None)  # bad input raises here, before any byte
            await start(200, _SSE_HEADERS)
            await body(self._chunk({"role": "assistant", "content": ""}))
            streamed = False
            while event is not None:
                if isinstance(event, Token) and event.text:
                    streamed = True
                    await body(self._chunk({"content": event.text}))
                elif isinstance(event, ReplyReady):
                    reply = self.server.client_reply(event.reply, self.turn.session_id)
                    text = ("" if streamed else event.reply.text) + _footer(reply["citations"])
                    if text:
                        await body(self._chunk({"content": text}))
                    await body(self._chunk({}, "stop", ragloop=reply))
                    if self.include_usage:
                        usage = {**self._envelope("chat.completion.chunk"), "choices": [], "usage": _usage(event.reply)}
                        await body(_sse(None, usage))
                event = await anext(events, None)
        await body(b"data: [DONE]\n\n")

    async def once(self, start: Start, body: Body) -> None:
        """Run the turn, then write one ``chat.completion``."""
        reply: Reply | None = None
        async with aclosing(self.server.events(self.turn)) as events:
            async for event in events:
                if isinstance(event, ReplyReady):
                    reply = event.reply
        if reply is None:
            raise RuntimeError("the turn ended without a reply")
        client = self.server.client_reply(reply, self.turn.session_id)
        message = {"role": "assistant", "content": reply.text + _footer(client["citations"])}
        obj = {
            **self._envelope("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": _usage(reply),
            "ragloop": client,
        }
        await start(200, _JSON)
        await body(json_bytes(obj))


async def _api_stream(server: _Server, turn: _Turn, start: Start, body: Body) -> None:
    """``/api/chat``: ``progress``, ``token`` and a last ``reply`` event, each one JSON payload."""
    async with aclosing(server.events(turn)) as events:
        event = await anext(events, None)  # bad input raises here, before any byte
        await start(200, _SSE_HEADERS)
        while event is not None:
            if isinstance(event, Progress):
                await body(_sse("progress", {"node": event.node, "kind": event.kind, "text": event.message}))
            elif isinstance(event, Token) and event.text:
                await body(_sse("token", {"text": event.text}))
            elif isinstance(event, ReplyReady):
                await body(_sse("reply", server.client_reply(event.reply, turn.session_id)))
            event = await anext(events, None)


class _Handlers:
    """The app's endpoints over one :class:`_Server`."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.metrics = server.metrics

    def guarded(
        self, endpoint: str, handler: Callable[[Request], Awaitable[Response | TurnResponse]]
    ) -> Callable[[Request], Awaitable[Any]]:
        """``handler`` with :class:`Rejected` turned into its JSON error and every status counted."""

        async def route(request: Request) -> Any:
            try:
                response = await handler(request)
            except Rejected as exc:
                self.metrics.requests.labels(endpoint=endpoint, status=str(exc.status)).inc()
                return Response(exc.body(), status_code=exc.status, headers={**_JSON, **exc.headers})
            if isinstance(response, Response):
                self.metrics.requests.labels(endpoint=endpoint, status=str(response.status_code)).inc()
            return response

        return route

    def turn_response(
        self, endpoint: str, write: Callable[[Start, Body], Awaitable[None]], stream_error: bytes | None
    ) -> TurnResponse:
        """A response holding one turn slot while ``write`` runs, under the hard deadline.

        ``stream_error`` is the frame written when the turn fails after the stream started.
        """
        server, metrics = self.server, self.metrics
        server.take_slot()
        status = {"code": ""}
        deadline = server.settings.deadline_s
        # A turn overrunning its deadline by this much is stuck somewhere: cut it off.
        hard_limit = None if deadline is None else deadline + server.settings.deadline_grace_s

        async def produce(start: Start, body: Body) -> None:
            async def tracked_start(code: int, headers: Mapping[str, str]) -> None:
                status["code"] = str(code)
                await start(code, headers)

            with anyio.move_on_after(hard_limit) as scope:
                try:
                    await write(tracked_start, body)
                except Rejected as exc:
                    await _write_rejected(tracked_start, body, exc)
                except Exception:
                    log.exception("turn failed", endpoint=endpoint)
                    metrics.turns_failed.inc()
                    if not status["code"]:
                        await _write_rejected(tracked_start, body, Rejected(500, _INTERNAL, kind="server_error"))
                    elif stream_error is not None:
                        await body(stream_error)
            if scope.cancelled_caught:
                metrics.turns_failed.inc()
                timeout = Rejected(504, "the turn ran past its deadline", kind="timeout")
                if not status["code"]:
                    await _write_rejected(tracked_start, body, timeout)
                elif stream_error is not None:
                    await body(stream_error)

        def cancelled() -> None:
            status["code"] = "499"  # nginx's "client closed request"
            metrics.turns_cancelled.inc()

        def done() -> None:
            server.release_slot()
            metrics.requests.labels(endpoint=endpoint, status=status["code"] or "500").inc()

        return TurnResponse(produce, on_disconnect=cancelled, on_done=done)

    async def completions(self, request: Request) -> Response | TurnResponse:
        """``POST /v1/chat/completions``."""
        self.server.authorize(request)
        turn, stream, include_usage = self.server.openai_turn(await self.server.read_json(request))
        completion = _Completion(self.server, turn, include_usage)
        if stream:
            error = _sse(None, error_body(_INTERNAL, kind="server_error")) + b"data: [DONE]\n\n"
            return self.turn_response("chat.completions", completion.stream, error)
        return self.turn_response("chat.completions", completion.once, None)

    async def api_chat(self, request: Request) -> Response | TurnResponse:
        """``POST /api/chat``."""
        self.server.authorize(request)
        turn = self.server.api_turn(await self.server.read_json(request))

        async def write(start: Start, body: Body) -> None:
            await _api_stream(self.server, turn, start, body)

        return self.turn_response("api.chat", write, _sse("error", error_body(_INTERNAL, kind="server_error")))

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: the process is up."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """``GET /readyz``: the index is loaded and the model endpoint (when there is one) answers."""
        ok, checks = await self.server.ready()
        return JSONResponse(
            {"status": "ready" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503
        )

    async def metrics_text(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format."""
        self.server.authorize(request)
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), headers={"content-type": CONTENT_TYPE_LATEST})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model id this server answers as."""
        self.server.authorize(request)
        model = {"id": self.server.settings.model_name, "object": "model", "created": 0, "owned_by": "ragloop"}
        return JSONResponse({"object": "list", "data": [model]})


def create_app(
    rag: ChatRAG,
    *,
    settings: ServeSettings = ServeSettings(),
    sessions: SessionStore | None = None,
    source_url: Callable[[str], str | None] | None = None,
    llm: openai.AsyncOpenAI | None = None,
    model_check: Callable[[], Awaitable[bool]] | None = None,
) -> Starlette:
    """An ASGI app serving ``rag``; run it with uvicorn or mount it in FastAPI (``app.mount("/rag", ...)``).

    Args:
        rag: The chat to serve.
        settings: Limits, keys, CORS origins.
        sessions: Where ``session_id`` conversations live (default: in memory, LRU).
        source_url: Maps a citation's source to a link for clients (default: sources that are URLs).
        llm: The model client ``rag`` uses; ``/readyz`` then checks that its endpoint answers.
        model_check: A custom readiness probe instead (``True`` when the model is reachable).

    Returns:
        A Starlette app; ``app.state.ragloop_metrics`` holds its Prometheus registry and
        ``app.state.ragloop_sessions`` its session store (close it with ``await store.aclose()``).
    """
    if model_check is None and llm is not None:
        model_check = _openai_probe(llm)
    store = sessions if sessions is not None else MemorySessionStore(limits=settings.history)
    server = _Server(rag, settings, store, source_url, model_check)
    h = _Handlers(server)
    routes = [
        Route("/v1/chat/completions", h.guarded("chat.completions", h.completions), methods=["POST"]),
        Route("/v1/models", h.guarded("models", h.models), methods=["GET"]),
        Route("/api/chat", h.guarded("api.chat", h.api_chat), methods=["POST"]),
        Route("/healthz", h.healthz, methods=["GET"]),
        Route("/readyz", h.readyz, methods=["GET"]),
        Route("/metrics", h.guarded("metrics", h.metrics_text), methods=["GET"]),
    ]
    if settings.page:
        html, csp = _page()
        headers = {
            "content-security-policy": csp,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
        }

        async def page(request: Request) -> Response:
            return HTMLResponse(html, headers=headers)

        routes.append(Route("/", page, methods=["GET"]))
    middleware: list[Middleware] = []
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type"],
            )
        )
    app = Starlette(routes=routes, middleware=middleware)
    app.state.ragloop_metrics = server.metrics.registry
    app.state.ragloop_sessions = server.sessions
    return app


def _page() -> tuple[str, str]:
    """The chat page and a Content-Security-Policy that allows exactly its own inline script and style."""
    html = importlib.resources.files("ragloop.serve").joinpath("static/chat.html").read_text(encoding="utf-8")

    def digest(tag: str) -> str:
        found = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        if found is None:
            return "'none'"
        return "'sha256-" + base64.b64encode(hashlib.sha256(found.group(1).encode()).digest()).decode() + "'"

    return html, (
        f"default-src 'none'; script-src {digest('script')}; style-src {digest('style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _openai_probe(llm: openai.AsyncOpenAI) -> Callable[[], Awaitable[bool]]:
    """A readiness probe: the model endpoint answers HTTP (any status below 500 counts as reachable)."""

    async def probe() -> bool:
        import openai

        try:
            await llm.with_options(max_retries=0, timeout=2.0).models.list()
        except openai.APIStatusError as exc:
            return exc.status_code < 500
        except openai.APIError:
            return False
        return True

    return probe
