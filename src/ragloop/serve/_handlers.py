"""The app's endpoints: errors counted and shaped, a turn held to its slot and its hard deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ragloop._log import get_logger
from ragloop.serve._aisdk import ai_sdk_error, ai_sdk_request, ai_sdk_stream
from ragloop.serve._feedback import feedback_response
from ragloop.serve._replies import (
    _INTERNAL,
    _JSON,
    _api_error,
    _api_stream,
    _Completion,
    _completion_error,
    _write_rejected,
)
from ragloop.serve._responses import _Response
from ragloop.serve._responses_request import responses_request
from ragloop.serve._server import _Server
from ragloop.serve._stream import Body, Rejected, Start, StreamedResponse
from ragloop.serve._validate import _RequestChecks

_FAILED = Rejected(500, _INTERNAL, kind="server_error")
_TIMEOUT = Rejected(504, "the turn ran past its deadline", kind="timeout")
_STOPPING = Rejected(
    503, "the server is shutting down; retry on another replica or in a moment", kind="server_error",
    code="shutting_down",
)  # fmt: skip

log = get_logger("ragloop.serve")


class _Handlers:
    """The app's endpoints over one :class:`_Server`."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.metrics = server.metrics
        self.checks = _RequestChecks(server.settings)

    def guarded(
        self, endpoint: str, handler: Callable[[Request], Awaitable[Response | StreamedResponse]]
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

    def streamed_response(
        self,
        endpoint: str,
        principal: str,
        write: Callable[[Start, Body], Awaitable[None]],
        stream_error: Callable[[Rejected], bytes],
    ) -> StreamedResponse:
        """A response holding one of ``principal``'s turn slots while ``write`` runs, under the hard deadline.

        ``stream_error`` renders the last frame written when the turn fails after the stream started (a store
        outage, a server error, the deadline, the server shutting down).
        """
        server, metrics = self.server, self.metrics
        server.take_slot(principal)
        status = {"code": ""}

        async def produce(start: Start, body: Body) -> None:
            async def tracked_start(code: int, headers: Mapping[str, str]) -> None:
                status["code"] = str(code)
                await start(code, headers)

            async def fail(exc: Rejected) -> None:
                if not status["code"]:
                    await _write_rejected(tracked_start, body, exc)
                else:
                    await body(stream_error(exc))

            with server.bounded() as bounds:
                try:
                    await write(tracked_start, body)
                except Rejected as exc:
                    await fail(exc)
                except Exception:
                    log.exception("turn failed", endpoint=endpoint)
                    metrics.turns_failed.inc()
                    await fail(_FAILED)
            if bounds.stopped:
                metrics.turns_cancelled.inc()
                await fail(_STOPPING)
            elif bounds.timed_out:
                metrics.turns_failed.inc()
                await fail(_TIMEOUT)

        def cancelled() -> None:
            status["code"] = "499"  # nginx's "client closed request"
            metrics.turns_cancelled.inc()

        def done() -> None:
            server.release_slot(principal)
            metrics.requests.labels(endpoint=endpoint, status=status["code"] or "500").inc()

        return StreamedResponse(produce, on_disconnect=cancelled, on_done=done, keepalive_s=server.settings.keepalive_s)

    async def completions(self, request: Request) -> Response | StreamedResponse:
        """``POST /v1/chat/completions``."""
        principal = self.checks.authorize(request)
        turn, stream, include_usage = self.checks.openai_request(await self.checks.read_json(request), principal)
        completion = _Completion(self.server, turn, include_usage)
        return self.streamed_response(
            "chat.completions", principal.name, completion.stream if stream else completion.once, _completion_error
        )

    async def api_chat(self, request: Request) -> Response | StreamedResponse:
        """``POST /api/chat`` (``?format=ai-sdk``: the Vercel AI SDK's UI message stream)."""
        principal = self.checks.authorize(request)
        fmt = request.query_params.get("format", "ragloop")
        if fmt not in ("ragloop", "ai-sdk"):
            raise Rejected(
                400, f"format must be 'ai-sdk' or left out (ragloop's own events), got {fmt!r:.40}", param="format"
            )
        body = await self.checks.read_json(request)
        if fmt == "ai-sdk":
            turn = ai_sdk_request(self.checks, body, principal)

            async def write_ui(start: Start, out: Body) -> None:
                await ai_sdk_stream(self.server, turn, start, out)

            return self.streamed_response("api.chat.ai-sdk", principal.name, write_ui, ai_sdk_error)
        turn = self.checks.api_request(body, principal)

        async def write(start: Start, out: Body) -> None:
            await _api_stream(self.server, turn, start, out)

        return self.streamed_response("api.chat", principal.name, write, _api_error)

    async def responses(self, request: Request) -> Response | StreamedResponse:
        """``POST /v1/responses`` (the OpenAI Responses API)."""
        principal = self.checks.authorize(request)
        asked = responses_request(self.checks, await self.checks.read_json(request), principal)
        response = _Response(self.server, asked)
        write = response.stream if asked.stream else response.once
        return self.streamed_response("responses", principal.name, write, response.failed)

    async def feedback(self, request: Request) -> Response:
        """``POST /v1/feedback``: a rating of one of the caller's turns (another principal's turn is a 404)."""
        principal = self.checks.authorize(request)
        body = await self.checks.read_json(request)
        self.server.count_feedback(principal.name)
        return await feedback_response(self.server.rag, body, principal.name, self.metrics)

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: the process is up."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """``GET /readyz``: the index is loaded; the model endpoint, the store and the session store answer."""
        ok, checks = await self.server.ready()
        return JSONResponse(
            {"status": "ready" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503
        )

    async def metrics_text(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format."""
        self.checks.authorize(request)
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), headers={"content-type": CONTENT_TYPE_LATEST})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model id this server answers as."""
        self.checks.authorize(request)
        model = {"id": self.server.settings.model_name, "object": "model", "created": 0, "owned_by": "ragloop"}
        return JSONResponse({"object": "list", "data": [model]})
