"""The request handler behind :class:`~ragloop.testing.ScriptedOpenAIServer` (runs in its threads)."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from ragloop.testing._recorded import RecordedRequest
from ragloop.testing._script import Latency, ScriptedResponse, word_count


class ScriptOwner(Protocol):
    """What the handler needs of the server that owns the script (:class:`~ragloop.testing.ScriptedOpenAIServer`).

    A Protocol rather than the server's class, so that this module does not import the one that imports it.
    """

    latency: Latency | None
    _stopping: threading.Event

    def vector(self, text: str) -> list[float]: ...
    def rerank_scores(self, query: str, documents: Sequence[str]) -> list[float]: ...
    def _connection_opened(self, sock: socket.socket) -> None: ...
    def _connection_closed(self, sock: socket.socket) -> None: ...
    def _count(self, name: str) -> None: ...
    def _record(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> RecordedRequest: ...
    def _next_chat(self, request: RecordedRequest) -> ScriptedResponse: ...
    def _next_embedding(self) -> ScriptedResponse: ...
    def _next_rerank(self) -> ScriptedResponse: ...


class _ClientGone(Exception):
    """The client closed the connection while the server was waiting or writing."""


def make_http_server(owner: ScriptOwner) -> http.server.ThreadingHTTPServer:
    """A threading HTTP server bound to a free port on 127.0.0.1 whose handlers answer from ``owner``."""

    class Handler(_Handler):
        server_owner = owner

    return _Server(("127.0.0.1", 0), Handler)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the body would wait for the client's
    # delayed ACK (~40 ms on Linux), a server artefact that would show up as model latency.
    disable_nagle_algorithm = True
    server_owner: ScriptOwner

    # -- connection bookkeeping ---------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.server_owner._connection_opened(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server_owner._connection_closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    # -- request handling ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        """``GET /v1/models`` lists one model (readiness probes ask it); nothing else is served, nothing recorded."""
        path = self.path.split("?", 1)[0]
        if path.endswith("/models"):
            model = {"id": "scripted", "object": "model", "created": 0, "owned_by": "scripted-server"}
            self._send_json(200, {"object": "list", "data": [model]})
        else:
            self._send_json(
                404, {"error": {"message": f"scripted server has no route GET {path}", "type": "not_found"}}
            )

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
            elif path.endswith("/rerank"):
                self._answer_rerank(request, owner._next_rerank())
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

    def _usage(self, request: RecordedRequest, response: ScriptedResponse, completion: str) -> dict[str, Any]:
        cached: int | None = None
        if response.usage is not None:
            prompt, done, *rest = response.usage
            cached = rest[0] if rest else None
        else:
            prompt = sum(word_count(str(m.get("content") or "")) for m in request.messages) + 1
            done = word_count(completion) + 1
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

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
        tokens = sum(word_count(t) for t in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "scripted-embed"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _answer_rerank(self, request: RecordedRequest, response: ScriptedResponse) -> None:
        """The common ``/rerank`` API (Cohere, Jina, llama.cpp, vLLM, TEI's Cohere route): ``query``,
        ``documents``, ``top_n`` in; ``results[]`` of ``index`` and ``relevance_score``, best first, out."""
        if response.delay_s:
            self._wait(response.delay_s)
        if response.kind != "rerank":
            if response.raw_body is not None:
                self._send_raw(response.status, response.raw_body, response.headers)
            else:
                self._send_json(response.status, dict(response.body or {}), response.headers)
            return
        body = request.body if isinstance(request.body, dict) else {}
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list):
            self._send_json(400, {"error": {"message": "rerank needs query (a string) and documents (a list)"}})
            return
        texts = [d if isinstance(d, str) else str(d.get("text", "")) if isinstance(d, dict) else "" for d in documents]
        scores = self.server_owner.rerank_scores(query, texts)
        order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))
        top_n = body.get("top_n")
        if isinstance(top_n, int) and top_n >= 0:
            order = order[:top_n]
        results = [{"index": i, "relevance_score": scores[i]} for i in order]
        self._send_json(
            200,
            {
                "id": f"rerank-{uuid.uuid4().hex[:12]}",
                "model": body.get("model", "scripted-rerank"),
                "results": results,
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


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _delta_text(payload: str) -> str:
    """The content of one streamed chunk, read defensively: a scripted chunk may be deliberately malformed
    (``"choices": null``, a string delta); the server then counts nothing instead of failing."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return ""
    return "".join(str(_dict(_dict(c).get("delta")).get("content") or "") for c in _list(_dict(obj).get("choices")))


def _completion_text(body: Mapping[str, Any]) -> str:
    """The text of a completion body (for the usage estimate), read as defensively as :func:`_delta_text`."""
    parts: list[str] = []
    for choice in _list(body.get("choices")):
        message = _dict(_dict(choice).get("message"))
        parts.append(str(message.get("content") or ""))
        parts += [
            str(_dict(_dict(call).get("function")).get("arguments") or "") for call in _list(message.get("tool_calls"))
        ]
    return " ".join(parts)
