"""``/mcp``: the MCP server over streamable HTTP, behind the app's API keys, body limits and body deadline.

Every request is authorised with the app's keys first (401 in the app's JSON shape, before the SDK sees it) and
a POST body is read under ``max_body_bytes`` and ``body_timeout_s`` (413 / 408 / 415 as on every endpoint), then
replayed to the SDK's :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager`. The principal
is also handed to the SDK as the request's user, so a (pre-2026 protocol) MCP session started with one key is
"Session not found" to any other key. The manager needs a running task group: the app's lifespan starts it
(:meth:`McpEndpoint.lifespan`); without it a request gets 503 saying so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request

from ragloop.serve._metrics import Metrics
from ragloop.serve._replies import _JSON
from ragloop.serve._stream import Rejected
from ragloop.serve._validate import _RequestChecks

__all__ = ["McpEndpoint"]

_NOT_STARTED = Rejected(
    503,
    "the MCP endpoint is not started: run the app with its lifespan (uvicorn's default; when you mount the app, "
    "enter app.router.lifespan_context(app) in your own lifespan)",
    kind="server_error",
    code="mcp_not_started",
)


class McpEndpoint:
    """The ASGI app mounted at ``/mcp``.

    Args:
        server: The MCP server (:func:`ragloop.serve._mcp.build_mcp_server`).
        checks: The app's request checks (keys, body limits).
        metrics: The app's metrics (refusals are counted as endpoint ``mcp``).
    """

    def __init__(self, server: Server[Any], checks: _RequestChecks, metrics: Metrics) -> None:
        self.checks = checks
        self.metrics = metrics
        self.manager = StreamableHTTPSessionManager(
            app=server, max_request_body_size=checks.settings.max_body_bytes, max_sessions=1000
        )
        self.running = False

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run the session manager while the app serves."""
        async with self.manager.run():
            self.running = True
            try:
                yield
            finally:
                self.running = False

    async def _refuse(self, send: Any, exc: Rejected) -> None:
        self.metrics.requests.labels(endpoint="mcp", status=str(exc.status)).inc()
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in {**_JSON, **exc.headers}.items()]
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": exc.body()})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Authorise, read the body under the limits, then hand the request to the SDK."""
        request = Request(scope, receive)
        try:
            principal = self.checks.authorize(request)
            if not self.running:
                raise _NOT_STARTED
            body = await self.checks.read_body(request) if scope.get("method") == "POST" else None
        except Rejected as exc:
            await self._refuse(send, exc)
            return
        scope["user"] = AuthenticatedUser(AccessToken(token="-", client_id=principal.name, scopes=[]))
        replay = receive
        if body is not None:
            pending = [{"type": "http.request", "body": body, "more_body": False}]

            async def replay() -> Any:
                return pending.pop() if pending else await receive()

        await self.manager.handle_request(scope, replay, send)
