"""The ASGI app: an OpenAI-compatible chat endpoint, an SSE endpoint, health, metrics and a chat page.

Every request is validated completely before the first byte of a response is sent, so a bad request gets
a 400 with a JSON error naming the field and the limit — never a 200 with a broken stream. A turn holds
one of ``max_concurrent_turns`` slots (429 with ``Retry-After`` when none is free), runs under a
deadline, and is cancelled, model calls included, the moment its client disconnects. Responses carry
the client-safe reply (:meth:`ragloop.chat.Reply.client_dict`), never the decision record.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import html as htmllib
import importlib.resources
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ragloop.serve._documents import Documents
from ragloop.serve._handlers import _Handlers
from ragloop.serve._handoff import Handoff, HandoffRoutes
from ragloop.serve._hosts import HostAllowlist
from ragloop.serve._replies import _JSON
from ragloop.serve._server import _Server
from ragloop.serve._sessions import MemorySessionStore, SessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected

if TYPE_CHECKING:
    import openai

    from ragloop.chat import ChatRAG

__all__ = ["ServeSettings", "create_app"]


def _check_scopes(rag: ChatRAG, settings: ServeSettings) -> None:
    """Refuse, before serving, a principal scoped to a metadata key no indexed chunk has: its every request
    would be refused (or, with filters unchecked, find nothing) instead of reading its tenant's documents."""
    from ragloop.errors import ConfigError, UnknownFilterKey

    for principal in settings.keyring().principals():
        scope = principal.scope(settings.tenant_key)
        try:
            rag.check_filters(scope)
        except UnknownFilterKey as exc:
            raise ConfigError(
                f"principal {principal.name!r} is scoped to {_scope_text(scope)}, but {exc}; index its documents "
                f"with --meta {settings.tenant_key}=… (or set the tenant key the documents carry)"
            ) from None


def _scope_text(scope: dict[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{key}={','.join(values)}" for key, values in sorted(scope.items()))


def create_app(  # noqa: PLR0913 — every collaborator of the app, by keyword
    rag: ChatRAG,
    *,
    settings: ServeSettings = ServeSettings(),
    sessions: SessionStore | None = None,
    source_url: Callable[[str], str | None] | None = None,
    llm: openai.AsyncOpenAI | None = None,
    model_check: Callable[[], Awaitable[bool]] | None = None,
    store_check: Callable[[], Awaitable[bool]] | None = None,
    documents: Documents | None = None,
    handoff: Handoff | None = None,
) -> Starlette:
    """An ASGI app serving ``rag``; run it with uvicorn or mount it in FastAPI (``app.mount("/rag", ...)``).

    Args:
        rag: The chat to serve.
        settings: Limits, keys and principals, allowed hosts, CORS origins, timeouts.
        sessions: Where ``session_id`` conversations live (default: in memory, LRU).
        source_url: Maps a citation's source to a link for clients (default: sources that are URLs); a link
            that is not ``http(s)`` or relative is dropped.
        llm: The model client ``rag`` uses; ``/readyz`` then checks that its endpoint answers.
        model_check: A custom readiness probe instead (``True`` when the model is reachable).
        store_check: A readiness probe of the knowledge store (default: for a chat over a Postgres store
            (:meth:`ChatRAG.from_store`), one cheap query of the collection).
        documents: What the MCP ``search`` tool and ``ragloop://doc/{id}`` resources read
            (:class:`~ragloop.serve.IndexDocuments` over the chat's index); ``None``: MCP offers ``ask`` only.
        handoff: Where hand-offs go (:class:`~ragloop.serve.Handoff`: the drafts folder, the webhook); with it
            (and a turn log) the app serves ``POST /v1/handoff`` and ``POST /v1/handoff/{id}/resolution``.

    Returns:
        A Starlette app; ``app.state.ragloop_metrics`` holds its Prometheus registry,
        ``app.state.ragloop_sessions`` its session store (close it with ``await store.aclose()``) and
        ``app.state.ragloop_shut_down`` a function that refuses new turns (503) and cancels those in flight
        (each ends with an error saying the server is shutting down); call it when your server stops. The
        app's lifespan runs the MCP endpoint (``/mcp``) and the hand-off webhook's periodic re-send: when you
        mount the app, enter
        ``app.router.lifespan_context(app)`` in your own lifespan.

    Raises:
        ConfigError: A principal's tenant or filters name a metadata key that no indexed chunk has.
    """
    _check_scopes(rag, settings)
    if model_check is None and llm is not None:
        model_check = _openai_probe(llm)
    if store_check is None and getattr(rag, "store", None) is not None:
        store_check = _store_probe(rag)
    store = sessions if sessions is not None else MemorySessionStore(settings.history, settings.session_quota)
    checks = {name: check for name, check in (("model", model_check), ("store", store_check)) if check is not None}
    checks["sessions"] = _sessions_probe(store)
    server = _Server(rag, settings, store, source_url, checks)
    h = _Handlers(server)
    handoff_routes = HandoffRoutes(h, rag, handoff) if handoff is not None else None
    routes = [
        Route("/v1/chat/completions", h.guarded("chat.completions", h.completions), methods=["POST"]),
        Route("/v1/responses", h.guarded("responses", h.responses), methods=["POST"]),
        Route("/v1/models", h.guarded("models", h.models), methods=["GET"]),
        Route("/api/chat", h.guarded("api.chat", h.api_chat), methods=["POST"]),
        Route("/v1/feedback", h.guarded("feedback", h.feedback), methods=["POST"]),
        *(handoff_routes.routes() if handoff_routes is not None else ()),
        Route("/healthz", h.healthz, methods=["GET"]),
        Route("/readyz", h.readyz, methods=["GET"]),
        Route("/metrics", h.guarded("metrics", h.metrics_text), methods=["GET"]),
    ]
    if settings.page:
        html, csp = _page(settings.page_title, settings.page_colour)
        headers = {
            "content-security-policy": csp,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
        }

        async def page(request: Request) -> Response:
            return HTMLResponse(html, headers=headers)

        routes.append(Route("/", page, methods=["GET"]))
    middleware: list[Middleware] = []
    if settings.allowed_hosts:
        middleware.append(Middleware(HostAllowlist, allowed=settings.allowed_hosts))
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
    endpoint = None
    if settings.mcp:
        from ragloop.serve._mcp import build_mcp_server
        from ragloop.serve._mcp_http import McpEndpoint

        endpoint = McpEndpoint(build_mcp_server(server, documents), h.checks, server.metrics, server.quota_counts)
        routes.append(Route("/mcp", endpoint))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if endpoint is not None:
                await stack.enter_async_context(endpoint.lifespan())
            if handoff_routes is not None:  # re-sends the webhook's given-up deliveries now and then
                await stack.enter_async_context(handoff_routes.lifespan())
            yield

    app = Starlette(
        routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error}, lifespan=lifespan
    )
    app.state.ragloop_metrics = server.metrics.registry
    app.state.ragloop_sessions = server.sessions
    app.state.ragloop_shut_down = server.shut_down
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong method) in the same JSON shape as every other error."""
    assert isinstance(exc, HTTPException)
    what = {404: "no such endpoint", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
    error = Rejected(exc.status_code, f"{what}: {request.method} {request.url.path:.200}")
    return Response(error.body(), status_code=exc.status_code, headers={**(exc.headers or {}), **_JSON})


def _page(title: str | None = None, colour: str | None = None) -> tuple[str, str]:
    """The chat page (with its title and accent colour, when given) and a Content-Security-Policy that allows
    exactly its own inline script and style."""
    html = importlib.resources.files("ragloop.serve").joinpath("static/chat.html").read_text(encoding="utf-8")
    if title is not None:  # escaped: a title is text, never markup
        shown = htmllib.escape(" ".join(title.split()), quote=True)
        html = html.replace("<title>Ask the docs · ragloop</title>", f"<title>{shown}</title>", 1)
        html = html.replace("<h1>Ask the docs</h1>", f"<h1>{shown}</h1>", 1)
    if colour is not None:  # validated by ServeSettings: #rgb, #rrggbb or a colour name
        html = html.replace("</style>", f":root {{ --accent: {colour}; }}\n</style>", 1)

    def digest(tag: str) -> str:
        found = re.search(rf"<{tag}>(.*?)</{tag}>", html, re.S)
        if found is None:
            return "'none'"
        return "'sha256-" + base64.b64encode(hashlib.sha256(found.group(1).encode()).digest()).decode() + "'"

    return html, (
        f"default-src 'none'; script-src {digest('script')}; style-src {digest('style')}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _store_probe(rag: ChatRAG) -> Callable[[], Awaitable[bool]]:
    """A readiness probe of the chat's Postgres store: one cheap query of its collection."""

    async def probe() -> bool:
        assert rag.store is not None
        await rag.store.info()
        return True

    return probe


def _sessions_probe(store: SessionStore) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        await store.ping()
        return True

    return probe


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
