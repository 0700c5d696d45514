"""The app's endpoints: errors counted and shaped, a turn held to its slot and its hard deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ragloop._log import get_logger
from ragloop.serve._feedback import feedback_response
from ragloop.serve._principal import principal_of
from ragloop.serve._replies import _INTERNAL, _JSON, _api_stream, _Completion, _sse, _write_rejected
from ragloop.serve._server import _Server
from ragloop.serve._stream import Body, Rejected, Start, TurnResponse, error_body
from ragloop.serve._validate import _RequestChecks

log = get_logger("ragloop.serve")


class _Handlers:
    """The app's endpoints over one :class:`_Server`."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.metrics = server.metrics
        self.checks = _RequestChecks(server.settings)

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
        self.checks.authorize(request)
        turn, stream, include_usage = self.checks.openai_turn(await self.checks.read_json(request))
        turn = attrs.evolve(turn, principal=principal_of(request, self.server.settings))
        completion = _Completion(self.server, turn, include_usage)
        if stream:
            error = _sse(None, error_body(_INTERNAL, kind="server_error")) + b"data: [DONE]\n\n"
            return self.turn_response("chat.completions", completion.stream, error)
        return self.turn_response("chat.completions", completion.once, None)

    async def api_chat(self, request: Request) -> Response | TurnResponse:
        """``POST /api/chat``."""
        self.checks.authorize(request)
        turn = self.checks.api_turn(await self.checks.read_json(request))
        turn = attrs.evolve(turn, principal=principal_of(request, self.server.settings))

        async def write(start: Start, body: Body) -> None:
            await _api_stream(self.server, turn, start, body)

        return self.turn_response("api.chat", write, _sse("error", error_body(_INTERNAL, kind="server_error")))

    async def feedback(self, request: Request) -> Response:
        """``POST /v1/feedback``: a rating of one of the caller's turns."""
        self.checks.authorize(request)
        body = await self.checks.read_json(request)
        principal = principal_of(request, self.server.settings)
        return await feedback_response(self.server.rag, body, principal, self.metrics)

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
        self.checks.authorize(request)
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(self.metrics.exposition(), headers={"content-type": CONTENT_TYPE_LATEST})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model id this server answers as."""
        self.checks.authorize(request)
        model = {"id": self.server.settings.model_name, "object": "model", "created": 0, "owned_by": "ragloop"}
        return JSONResponse({"object": "list", "data": [model]})
