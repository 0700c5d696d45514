"""Public test helpers for ragloop users: a scripted OpenAI-compatible server (and, later, in-memory fakes).

The scripted server is a real HTTP server on ``127.0.0.1`` that speaks enough of the OpenAI API
(``POST /v1/chat/completions`` with JSON or SSE streaming, ``POST /v1/embeddings``) for the real ``openai``
SDK to talk to it. Tests script its answers, inject faults (429, 5xx, slow or cut streams, malformed
chunks) and assert on the exact requests it received::

    from ragloop.testing import ScriptedOpenAIServer, reply, tool_calls

    async def test_my_graph() -> None:
        async with ScriptedOpenAIServer(script=[tool_calls([("search", {"query": "redis ttl"})])]) as server:
            async with server.client() as client:
                ...  # drive your judges / graph with ``client``
        assert server.requests[0].messages[-1]["content"] == "how do keys expire?"

See ``docs/testing.md`` for the full guide.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import math
import select
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from attrs import define, evolve, field, frozen

if TYPE_CHECKING:
    import openai

__all__ = [
    "Latency",
    "RecordedRequest",
    "ScriptedOpenAIServer",
    "ScriptedResponse",
    "ServerStats",
    "embeddings_ok",
    "empty_choices",
    "error",
    "json_reply",
    "rate_limited",
    "reply",
    "server_error",
    "stream",
    "stream_tool_calls",
    "tool_calls",
]

# =====================================================================================================
# Scripted OpenAI-compatible server
# =====================================================================================================

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
        usage: ``(prompt_tokens, completion_tokens)``; ``None`` estimates them from word counts.
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
    usage: tuple[int, int] | None = None
    delay_s: float = 0.0
    latency: Latency | None = None
    kind: str = "reply"

    def delayed(self, seconds: float) -> ScriptedResponse:
        """This response, sent only after ``seconds`` (a slow server, to trigger client timeouts)."""
        return evolve(self, delay_s=seconds)

    def with_latency(self, first_token_s: float, per_token_s: float = 0.0) -> ScriptedResponse:
        """This response with simulated model latency (first token, then per token)."""
        return evolve(self, latency=Latency(first_token_s, per_token_s))


def _words(text: str) -> int:
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


def reply(text: str, *, usage: tuple[int, int] | None = None, finish_reason: str = "stop") -> ScriptedResponse:
    """A non-streamed chat completion whose message content is ``text``."""
    body = {"choices": [{"index": 0, "message": _message(text), "finish_reason": finish_reason}]}
    return ScriptedResponse(body=body, usage=usage, kind="reply")


def json_reply(obj: Any, *, usage: tuple[int, int] | None = None) -> ScriptedResponse:
    """A non-streamed chat completion whose content is ``obj`` serialised as JSON (structured output)."""
    return evolve(reply(json.dumps(obj), usage=usage), kind="json_reply")


def tool_calls(
    calls: Sequence[ToolCallSpec], *, content: str | None = None, usage: tuple[int, int] | None = None
) -> ScriptedResponse:
    """A non-streamed chat completion with one tool call per entry of ``calls`` (several = parallel calls).

    Arguments given as a string are sent verbatim, e.g. ``tool_calls([("search", '{"query": ')])`` scripts
    malformed JSON arguments.
    """
    body = {"choices": [{"index": 0, "message": _message(content, calls), "finish_reason": "tool_calls"}]}
    return ScriptedResponse(body=body, usage=usage, kind="tool_calls")


def empty_choices(*, usage: tuple[int, int] | None = None) -> ScriptedResponse:
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
    usage: tuple[int, int] | None = None,
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
    usage: tuple[int, int] | None = None,
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


def embeddings_ok(*, delay_s: float = 0.0) -> ScriptedResponse:
    """The server's normal deterministic embeddings answer (optionally delayed); for embedding scripts."""
    return ScriptedResponse(delay_s=delay_s, kind="embeddings")


@frozen
class RecordedRequest:
    """One request the server received.

    Attributes:
        index: 0-based arrival order over all endpoints.
        method: HTTP method.
        path: Request path, e.g. ``/v1/chat/completions``.
        headers: Request headers, names lower-cased.
        body: The parsed JSON body (``None`` if it was not JSON).
        received_at: ``time.monotonic()`` when the request arrived.
    """

    index: int
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    received_at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat ``messages`` sent (empty for other endpoints)."""
        if isinstance(self.body, dict):
            return list(self.body.get("messages", []))
        return []

    @property
    def model(self) -> str | None:
        """The ``model`` requested."""
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def judge(self) -> str:
        """Which ragloop judge sent this chat request, from its shape: ``decide`` offers tools, ``grade``
        asks for a ``response_format``, ``answer`` streams, ``rewrite`` is the plain completion left."""
        body = self.body if isinstance(self.body, dict) else {}
        if "tools" in body:
            return "decide"
        if "response_format" in body:
            return "grade"
        return "answer" if body.get("stream") else "rewrite"


@frozen
class ServerStats:
    """Connection and request counters, for checking that clients close what they open.

    Attributes:
        connections_opened: TCP connections accepted.
        connections_closed: TCP connections finished (by either side).
        requests_started: Requests whose body was read.
        requests_finished: Requests whose response was sent completely (a scripted cut counts here).
        requests_aborted: Requests the client gave up on (disconnected while the server waited or wrote).
    """

    connections_opened: int = 0
    connections_closed: int = 0
    requests_started: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0

    @property
    def open_connections(self) -> int:
        """Connections still open."""
        return self.connections_opened - self.connections_closed

    @property
    def in_flight(self) -> int:
        """Requests started but neither finished nor aborted."""
        return self.requests_started - self.requests_finished - self.requests_aborted


Matcher = Callable[[RecordedRequest], ScriptedResponse]
EmbedFn = Callable[[str], Sequence[float]]


def _to_deque(items: Iterable[ScriptedResponse]) -> deque[ScriptedResponse]:
    return deque(items)


class _ClientGone(Exception):
    """The client closed the connection while the server was waiting or writing."""


@define(eq=False)
class ScriptedOpenAIServer:
    """A scripted OpenAI-compatible HTTP server on ``127.0.0.1`` for tests and benchmarks.

    Chat requests are answered from ``script`` (a queue, first in first out), then by ``matcher``; with
    neither left the server answers a 500 that names the problem (and tells the SDK not to retry).
    Embedding requests get deterministic vectors (a seeded hash of the text, or ``embed``), unless
    :meth:`enqueue_embeddings` queued something else (a fault, a delay).

    Use it as a context manager (``with`` or ``async with``), or call :meth:`start` and :meth:`close`.

    Attributes:
        script: Responses for chat requests, in order.
        matcher: Called with each chat request once the script is used up.
        embed: Text → vector for ``/v1/embeddings``; default: a seeded hash, unit length.
        embedding_dim: Length of the default hash vectors.
        seed: Seed of the default hash vectors.
        latency: Default simulated latency for every chat response (benchmarks).
        requests: Every request received, in arrival order.
    """

    script: deque[ScriptedResponse] = field(default=(), converter=_to_deque)
    matcher: Matcher | None = None
    embed: EmbedFn | None = None
    embedding_dim: int = 16
    seed: int = 0
    latency: Latency | None = None
    requests: list[RecordedRequest] = field(factory=list, init=False)
    _embedding_script: deque[ScriptedResponse] = field(factory=deque, init=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False)
    _stopping: threading.Event = field(factory=threading.Event, init=False)
    _httpd: http.server.ThreadingHTTPServer | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _sockets: set[socket.socket] = field(factory=set, init=False)
    _handlers: set[threading.Thread] = field(factory=set, init=False)
    _counts: dict[str, int] = field(factory=dict, init=False)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> ScriptedOpenAIServer:
        """Bind to a free port on 127.0.0.1 and serve in a daemon thread. Returns ``self``."""
        if self._httpd is not None:
            return self
        handler = _make_handler(self)
        httpd = _Server(("127.0.0.1", 0), handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="ragloop-scripted-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, close every open connection and join the server's threads. Idempotent."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            open_sockets = list(self._sockets)
            handlers = list(self._handlers)
        for sock in open_sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in handlers:
            thread.join(timeout=5.0)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> ScriptedOpenAIServer:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Joining handler threads blocks; do it off the event loop so clients can finish closing.
        await anyio.to_thread.run_sync(self.close)

    # -- public helpers -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The API root to hand to a client, e.g. ``http://127.0.0.1:53211/v1``."""
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not running; use it as a context manager or call start()")
        return f"http://127.0.0.1:{self._httpd.server_port}/v1"

    def client(self, *, max_retries: int = 0, timeout_s: float = 5.0) -> openai.AsyncOpenAI:
        """A new ``openai.AsyncOpenAI`` pointed at this server (close it: ``async with server.client():``)."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key="test", max_retries=max_retries, timeout=timeout_s)

    def enqueue(self, *responses: ScriptedResponse) -> None:
        """Append responses to the chat script."""
        with self._lock:
            self.script.extend(responses)

    def enqueue_embeddings(self, *responses: ScriptedResponse) -> None:
        """Queue answers for the next embedding requests (faults, or :func:`embeddings_ok` with a delay)."""
        with self._lock:
            self._embedding_script.extend(responses)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The recorded ``/chat/completions`` requests."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def stats(self) -> ServerStats:
        """A snapshot of the connection and request counters."""
        with self._lock:
            return ServerStats(**self._counts)

    async def wait_idle(self, timeout_s: float = 5.0) -> ServerStats:
        """Wait until no request is in flight and every connection is closed; return the counters.

        Raises:
            TimeoutError: if that does not happen within ``timeout_s`` (the message shows the counters).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats
            if stats.in_flight == 0 and stats.open_connections == 0:
                return stats
            if time.monotonic() >= deadline:
                raise TimeoutError(f"scripted server not idle after {timeout_s}s: {stats}")
            await anyio.sleep(0.01)

    async def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``count`` requests have arrived (e.g. before cancelling a client mid-call).

        Raises:
            TimeoutError: if fewer arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while len(self.requests) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"scripted server got {len(self.requests)} of {count} requests in {timeout_s}s")
            await anyio.sleep(0.005)
        return list(self.requests)

    def vector(self, text: str) -> list[float]:
        """The embedding the server returns for ``text``."""
        if self.embed is not None:
            return [float(x) for x in self.embed(text)]
        digest = b""
        counter = 0
        while len(digest) < 4 * self.embedding_dim:
            digest += hashlib.blake2b(f"{self.seed}:{counter}:{text}".encode(), digest_size=64).digest()
            counter += 1
        raw = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{self.embedding_dim}I", digest[: 4 * self.embedding_dim])]
        norm = math.sqrt(sum(x * x for x in raw)) or 1.0
        return [x / norm for x in raw]

    # -- internals (called from handler threads) -------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def _record(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> RecordedRequest:
        with self._lock:
            request = RecordedRequest(
                index=len(self.requests),
                method=method,
                path=path,
                headers=dict(headers),
                body=body,
                received_at=time.monotonic(),
            )
            self.requests.append(request)
            self._counts["requests_started"] = self._counts.get("requests_started", 0) + 1
        return request

    def _next_chat(self, request: RecordedRequest) -> ScriptedResponse:
        with self._lock:
            if self.script:
                return self.script.popleft()
        if self.matcher is not None:
            return self.matcher(request)
        return evolve(
            error(
                500,
                f"scripted server: script exhausted at request #{request.index}; enqueue() more "
                "responses or pass matcher=",
            ),
            headers=(("x-should-retry", "false"),),
        )

    def _next_embedding(self) -> ScriptedResponse:
        with self._lock:
            if self._embedding_script:
                return self._embedding_script.popleft()
        return embeddings_ok()


def _make_handler(owner: ScriptedOpenAIServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(_Handler):
        server_owner = owner

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: ScriptedOpenAIServer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the body would wait for the client's
    # delayed ACK (~40 ms on Linux), a server artefact that would show up as model latency.
    disable_nagle_algorithm = True
    server_owner: ScriptedOpenAIServer

    # -- connection bookkeeping ---------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        owner = self.server_owner
        with owner._lock:
            owner._sockets.add(self.connection)
            owner._handlers.add(threading.current_thread())
            owner._counts["connections_opened"] = owner._counts.get("connections_opened", 0) + 1

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        owner = self.server_owner
        with owner._lock:
            owner._sockets.discard(self.connection)
            owner._handlers.discard(threading.current_thread())
            owner._counts["connections_closed"] = owner._counts.get("connections_closed", 0) + 1

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    # -- request handling ---------------------------------------------------------------------------------

    def do_POST(self) -> None:
        owner = self.server_owner
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = self.path.split("?", 1)[0]
        request = owner._record("POST", path, headers, body)
        try:
            if path.endswith("/chat/completions"):
                self._answer_chat(request, owner._next_chat(request))
            elif path.endswith("/embeddings"):
                self._answer_embeddings(request, owner._next_embedding())
            else:
                self._send_json(
                    404, {"error": {"message": f"scripted server has no route {path}", "type": "not_found"}}
                )
        except (_ClientGone, ConnectionError, TimeoutError):
            owner._count("requests_aborted")
            self.close_connection = True
            return
        owner._count("requests_finished")

    def _wait(self, seconds: float) -> None:
        """Sleep, but notice a client that hangs up (or a server shutting down) meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            if self.server_owner._stopping.is_set():
                raise _ClientGone("server closing")
            if self._client_gone(max(0.0, min(remaining, 0.02))):
                raise _ClientGone("client disconnected")
            if remaining <= 0:
                return

    def _client_gone(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.connection], [], [], timeout)
        if not readable:
            return False
        try:
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
            return peeked == b""
        except OSError:
            return True

    def _latency(self, response: ScriptedResponse) -> Latency:
        return response.latency or self.server_owner.latency or Latency()

    def _usage(self, request: RecordedRequest, response: ScriptedResponse, completion: str) -> dict[str, int]:
        if response.usage is not None:
            prompt, done = response.usage
        else:
            prompt = sum(_words(str(m.get("content") or "")) for m in request.messages) + 1
            done = _words(completion) + 1
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def _envelope(self, request: RecordedRequest, obj: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": obj,
            "created": int(time.time()),
            "model": request.model or "scripted",
        }

    def _answer_chat(self, request: RecordedRequest, response: ScriptedResponse) -> None:
        if response.delay_s:
            self._wait(response.delay_s)
        if response.chunks is not None:
            self._send_stream(request, response)
            return
        if response.raw_body is not None:
            self._send_raw(response.status, response.raw_body, response.headers)
            return
        body = dict(response.body or {})
        if response.status == 200:
            completion = _completion_text(body)
            latency = self._latency(response)
            usage = self._usage(request, response, completion)
            if latency.first_token_s or latency.per_token_s:
                self._wait(latency.first_token_s + latency.per_token_s * max(0, usage["completion_tokens"] - 1))
            body = {**self._envelope(request, "chat.completion"), **body, "usage": usage}
        self._send_json(response.status, body, response.headers)

    def _answer_embeddings(self, request: RecordedRequest, response: ScriptedResponse) -> None:
        if response.delay_s:
            self._wait(response.delay_s)
        if response.kind != "embeddings":
            if response.raw_body is not None:
                self._send_raw(response.status, response.raw_body, response.headers)
            else:
                self._send_json(response.status, dict(response.body or {}), response.headers)
            return
        body = request.body if isinstance(request.body, dict) else {}
        inputs = body.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(x) for x in inputs]
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vector = self.server_owner.vector(text)
            embedding: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        tokens = sum(_words(t) for t in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "scripted-embed"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # -- writing ------------------------------------------------------------------------------------------

    def _send_json(self, status: int, body: Mapping[str, Any], headers: Iterable[tuple[str, str]] = ()) -> None:
        self._send_raw(status, json.dumps(body).encode(), headers)

    def _send_raw(self, status: int, payload: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send_stream(self, request: RecordedRequest, response: ScriptedResponse) -> None:
        latency = self._latency(response)
        envelope = self._envelope(request, "chat.completion.chunk")
        self.send_response(response.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        completion = ""
        for i, payload in enumerate(response.chunks or ()):
            wait = latency.first_token_s if i == 1 else (latency.per_token_s if i > 1 else 0.0)
            if wait:
                self._wait(wait)
            if self._client_gone(0.0):
                raise _ClientGone("client disconnected")
            self._write_chunk(b"data: " + _with_envelope(payload, envelope).encode() + b"\n\n")
            completion += _delta_text(payload)
        if response.cut:
            # Abrupt close mid-body: no terminating chunk, so the client sees an incomplete message.
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        options = request.body.get("stream_options") if isinstance(request.body, dict) else None
        if isinstance(options, dict) and options.get("include_usage"):
            usage_chunk = {**envelope, "choices": [], "usage": self._usage(request, response, completion)}
            self._write_chunk(b"data: " + json.dumps(usage_chunk).encode() + b"\n\n")
        if response.done:
            self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")


def _with_envelope(payload: str, envelope: Mapping[str, Any]) -> str:
    try:
        obj = json.loads(payload)
    except ValueError:
        return payload  # deliberately malformed; send as is
    if isinstance(obj, dict):
        return json.dumps({**envelope, **obj})
    return payload


def _delta_text(payload: str) -> str:
    try:
        obj = json.loads(payload)
        return "".join(str(c.get("delta", {}).get("content") or "") for c in obj.get("choices", []))
    except (ValueError, AttributeError):
        return ""


def _completion_text(body: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for choice in body.get("choices", []):
        message = choice.get("message", {})
        parts.append(str(message.get("content") or ""))
        parts += [str(call["function"]["arguments"]) for call in message.get("tool_calls", [])]
    return " ".join(parts)


# =====================================================================================================
# End of the scripted server
# =====================================================================================================
