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
import importlib.resources
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ragloop.serve._handlers import _Handlers
from ragloop.serve._replies import _JSON
from ragloop.serve._server import _Server
from ragloop.serve._sessions import MemorySessionStore, SessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected

if TYPE_CHECKING:
    import openai

    from ragloop.chat import ChatRAG

__all__ = ["ServeSettings", "create_app"]


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
        Route("/v1/feedback", h.guarded("feedback", h.feedback), methods=["POST"]),
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
    app = Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error})
    app.state.ragloop_metrics = server.metrics.registry
    app.state.ragloop_sessions = server.sessions
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown path, wrong method) in the same JSON shape as every other error."""
    assert isinstance(exc, HTTPException)
    what = {404: "no such endpoint", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
    error = Rejected(exc.status_code, f"{what}: {request.method} {request.url.path:.200}")
    return Response(error.body(), status_code=exc.status_code, headers={**(exc.headers or {}), **_JSON})


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
