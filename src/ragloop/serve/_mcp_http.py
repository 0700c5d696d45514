"""``/mcp``: the MCP server over streamable HTTP, behind the app's API keys, body limits and body deadline.

Every request is authorised with the app's keys first (401 in the app's JSON shape, before the SDK sees it) and
a POST body is read under ``max_body_bytes`` and ``body_timeout_s`` (413 / 408 / 415 as on every endpoint), then
replayed to the SDK's :class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager`. The principal
is also handed to the SDK as the request's user, so a (pre-2026 protocol) MCP session started with one key is
"Session not found" to any other key. The manager needs a running task group: the app's lifespan starts it
(:meth:`McpEndpoint.lifespan`); without it a request gets 503 saying so.

Sessions are capped per principal (``mcp_sessions_per_key``): a key holding that many gets 429 on another
``initialize`` (until it closes one with DELETE or one goes idle for ``mcp_idle_s``), so one key's flood never
fills the server-wide cap (``mcp_max_sessions``) that everyone else needs.
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
from ragloop.serve._quota import KeyedSessions, QuotaCounts
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
        counts: Where refusals by the per-key session cap are counted (``/metrics``).
    """

    def __init__(
        self, server: Server[Any], checks: _RequestChecks, metrics: Metrics, counts: QuotaCounts | None = None
    ) -> None:
        settings = checks.settings
        self.checks = checks
        self.metrics = metrics
        self.counts = counts if counts is not None else QuotaCounts()
        self.manager = StreamableHTTPSessionManager(
            app=server,
            max_request_body_size=settings.max_body_bytes,
            max_sessions=settings.mcp_max_sessions,
            session_idle_timeout=settings.mcp_idle_s,
        )
        #: Open sessions by principal (and initializes being answered, so a burst cannot pass the cap).
        self.sessions = KeyedSessions(settings.mcp_sessions_per_key, settings.mcp_idle_s)
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

        session_id = request.headers.get("mcp-session-id")
        if session_id is not None:
            self.sessions.touch(session_id)
            try:
                await self.manager.handle_request(scope, replay, send)
            finally:
                if scope.get("method") == "DELETE":
                    self.sessions.discard(session_id)
            return
        await self._open(principal.name, scope, replay, send)

    def _forget_closed(self) -> None:
        """Stop counting sessions the SDK has closed (idle, crashed, deleted) or that went idle."""
        for sid in self.sessions.idle():
            self.sessions.discard(sid)
        # The SDK keeps no public list of its sessions; read its table when there is one (else idle expiry only).
        known = getattr(self.manager, "_server_instances", None)
        if isinstance(known, dict):
            for key in list(self.sessions.keys()):
                for sid in self.sessions.of(key):
                    if not sid.startswith("\0") and sid not in known:
                        self.sessions.discard(sid)

    async def _open(self, principal: str, scope: Any, receive: Any, send: Any) -> None:
        """A request without a session (an ``initialize``): under the principal's session cap, or 429."""
        if self.sessions.count(principal) >= self.sessions.per_key:
            self._forget_closed()
        if self.sessions.count(principal) >= self.sessions.per_key:
            self.counts.add("mcp_sessions_per_key", "refused")
            self.metrics.rejected.labels(reason="mcp_sessions_per_key").inc()
            await self._refuse(send, Rejected(
                429,
                f"this API key holds {self.sessions.per_key} open MCP sessions (mcp_sessions_per_key): close one "
                "(DELETE /mcp with its mcp-session-id) or reuse it, or retry once one has gone idle",
                kind="rate_limit_error", code="too_many_sessions",
                headers={"retry-after": str(max(1, self.checks.settings.retry_after_s))},
            ))  # fmt: skip
            return
        reservation = f"\0{id(scope)}"  # counts against the cap while the SDK answers
        self.sessions.add(principal, reservation)

        async def watch(message: Any) -> None:
            if message.get("type") == "http.response.start" and message.get("status", 500) < 400:
                for name, value in message.get("headers") or ():
                    if name.lower() == b"mcp-session-id":
                        self.sessions.add(principal, value.decode("latin-1"))
            await send(message)

        try:
            await self.manager.handle_request(scope, receive, watch)
        finally:
            self.sessions.discard(reservation)
