"""Serve a :class:`~ragloop.chat.ChatRAG` over HTTP: an ASGI app, also mountable in FastAPI or Starlette.

::

    from ragloop import ChatRAG
    from ragloop.serve import create_app

    app = create_app(ChatRAG.from_index("kb-index/"))    # uvicorn module:app
    # or, inside an existing FastAPI app:  fastapi_app.mount("/rag", app)

Endpoints: ``POST /v1/chat/completions`` (OpenAI-compatible, streaming and not; the citations travel in
the ``ragloop`` extension field and in a readable ``Sources:`` footer), ``POST /api/chat`` (server-sent
events ``progress``, ``token``, ``reply``, each a JSON payload), ``GET /healthz``, ``GET /readyz``,
``GET /metrics`` (Prometheus), ``GET /v1/models`` and the chat page at ``/``. ``ragloop serve`` runs it
with uvicorn. Needs the ``[serve]`` extra (starlette, uvicorn, prometheus-client).
"""

from __future__ import annotations

from ragloop.serve._app import create_app
from ragloop.serve._principals import ANONYMOUS, ApiKey, Principal, load_keys
from ragloop.serve._sessions import MemorySessionStore, SessionLimits, SessionStore
from ragloop.serve._sessions_sql import PostgresSessionStore, SQLiteSessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._uvicorn import CleanExitServer, h11_protocol

__all__ = [
    "ANONYMOUS",
    "ApiKey",
    "CleanExitServer",
    "MemorySessionStore",
    "PostgresSessionStore",
    "Principal",
    "SQLiteSessionStore",
    "ServeSettings",
    "SessionLimits",
    "SessionStore",
    "create_app",
    "h11_protocol",
    "load_keys",
]
