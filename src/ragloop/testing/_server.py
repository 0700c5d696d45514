"""The scripted OpenAI-compatible HTTP server: its lifecycle, its script queues and its waiting helpers.

The request handling itself (reading requests, writing JSON and SSE answers) is in :mod:`._handler`.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import math
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from attrs import define, evolve, field

from ragloop.testing._handler import make_http_server
from ragloop.testing._recorded import RecordedRequest, ServerStats
from ragloop.testing._script import Latency, ScriptedResponse, embeddings_ok, error, rerank_ok

if TYPE_CHECKING:
    import openai

#: Chooses the scripted answer to one recorded request (the ``matcher=`` of :class:`ScriptedOpenAIServer`).
Matcher = Callable[[RecordedRequest], ScriptedResponse]
#: Maps one input text to its embedding vector (the server's ``/embeddings`` answers).
EmbedFn = Callable[[str], Sequence[float]]
#: ``(query, documents) -> one relevance score per document`` for ``/rerank``.
RerankFn = Callable[[str, Sequence[str]], Sequence[float]]


def _to_deque(items: Iterable[ScriptedResponse]) -> deque[ScriptedResponse]:
    return deque(items)


@define(eq=False)
class ScriptedOpenAIServer:
    """A scripted OpenAI-compatible HTTP server on ``127.0.0.1`` for tests and benchmarks.

    Chat requests are answered from ``script`` (a queue, first in first out), then by ``matcher``; with
    neither left the server answers a 500 that names the problem (and tells the SDK not to retry).
    Embedding requests get deterministic vectors (a seeded hash of the text, or ``embed``), unless
    :meth:`enqueue_embeddings` queued something else (a fault, a delay). ``/rerank`` requests (the common
    cross-encoder API: ``query``, ``documents``, ``top_n`` → ``results[].index``, ``relevance_score``) are scored by
    ``rerank`` (default: the share of the query's words each document holds), unless :meth:`enqueue_rerank`
    queued something else.

    Use it as a context manager (``with`` or ``async with``), or call :meth:`start` and :meth:`close`.

    Attributes:
        script: Responses for chat requests, in order.
        matcher: Called with each chat request once the script is used up.
        embed: Text → vector for ``/v1/embeddings``; default: a seeded hash, unit length.
        rerank: ``(query, documents) -> scores`` for ``/rerank``; default: query-word overlap.
        embedding_dim: Length of the default hash vectors.
        seed: Seed of the default hash vectors.
        latency: Default simulated latency for every chat response (benchmarks).
        requests: Every request received, in arrival order.
    """

    script: deque[ScriptedResponse] = field(default=(), converter=_to_deque)
    matcher: Matcher | None = None
    embed: EmbedFn | None = None
    rerank: RerankFn | None = None
    embedding_dim: int = 16
    seed: int = 0
    latency: Latency | None = None
    requests: list[RecordedRequest] = field(factory=list, init=False)
    _embedding_script: deque[ScriptedResponse] = field(factory=deque, init=False)
    _rerank_script: deque[ScriptedResponse] = field(factory=deque, init=False)
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
        httpd = make_http_server(self)
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

    def enqueue_rerank(self, *responses: ScriptedResponse) -> None:
        """Queue answers for the next ``/rerank`` requests (faults, or :func:`rerank_ok` with a delay)."""
        with self._lock:
            self._rerank_script.extend(responses)

    @property
    def rerank_requests(self) -> list[RecordedRequest]:
        """The recorded ``/rerank`` requests."""
        return [r for r in self.requests if r.path.endswith("/rerank")]

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

    def rerank_scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """The relevance scores the server's ``/rerank`` gives ``documents`` for ``query``."""
        if self.rerank is not None:
            return [float(x) for x in self.rerank(query, documents)]
        words = set(query.lower().split())
        return [len(words & set(d.lower().split())) / (len(words) or 1) for d in documents]

    # -- internals (called from handler threads) -------------------------------------------------------

    def _connection_opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            self._handlers.add(threading.current_thread())
            self._counts["connections_opened"] = self._counts.get("connections_opened", 0) + 1

    def _connection_closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
            self._handlers.discard(threading.current_thread())
            self._counts["connections_closed"] = self._counts.get("connections_closed", 0) + 1

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

    def _next_rerank(self) -> ScriptedResponse:
        with self._lock:
            if self._rerank_script:
                return self._rerank_script.popleft()
        return rerank_ok()

    def _next_embedding(self) -> ScriptedResponse:
        with self._lock:
            if self._embedding_script:
                return self._embedding_script.popleft()
        return embeddings_ok()
