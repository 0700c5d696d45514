"""Serve a :class:`~ragloop.chat.ChatRAG` over HTTP: an ASGI app, also mountable in FastAPI or Starlette.

::

    from ragloop import ChatRAG
    from ragloop.serve import create_app

    app = create_app(ChatRAG.from_index("kb-index/"))    # uvicorn module:app
    # or, inside an existing FastAPI app:  fastapi_app.mount("/rag", app)

Endpoints: ``POST /v1/chat/completions`` (OpenAI-compatible, streaming and not; the citations travel in
the ``ragloop`` extension field and in a readable ``Sources:`` footer), ``POST /v1/responses`` (the OpenAI
Responses API, citations as annotations), ``POST /api/chat`` (server-sent events ``progress``, ``token``,
``reply``, each a JSON payload; ``?format=ai-sdk``: the Vercel AI SDK's UI message stream), ``/mcp`` (an MCP
server over streamable HTTP: tools ``search`` and ``ask``, document resources, a prompt), ``GET /healthz``,
``GET /readyz``, ``GET /metrics`` (Prometheus), ``GET /v1/models`` and the chat page at ``/``. ``ragloop
serve`` runs it with uvicorn, ``ragloop mcp`` serves MCP over stdio. Needs the ``[serve]`` extra (starlette,
uvicorn, prometheus-client, mcp).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragloop.serve._app import create_app
from ragloop.serve._documents import Document, Documents, IndexDocuments, StoreDocuments
from ragloop.serve._handoff import Handoff, sign
from ragloop.serve._principals import ANONYMOUS, ApiKey, Principal, load_keys
from ragloop.serve._quota import SessionQuota, SessionsFull
from ragloop.serve._sessions import MemorySessionStore, SessionLimits, SessionStore
from ragloop.serve._sessions_sql import PostgresSessionStore, SQLiteSessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._uvicorn import CleanExitServer, h11_protocol

if TYPE_CHECKING:
    from ragloop.serve._mcp import create_mcp_server

__all__ = [
    "ANONYMOUS",
    "ApiKey",
    "CleanExitServer",
    "Document",
    "Documents",
    "Handoff",
    "IndexDocuments",
    "MemorySessionStore",
    "PostgresSessionStore",
    "Principal",
    "SQLiteSessionStore",
    "ServeSettings",
    "SessionLimits",
    "SessionQuota",
    "SessionStore",
    "SessionsFull",
    "StoreDocuments",
    "create_app",
    "create_mcp_server",
    "h11_protocol",
    "load_keys",
    "sign",
]


def __getattr__(name: str) -> Any:
    """``create_mcp_server`` imports the MCP SDK (about a second) only when it is asked for."""
    if name == "create_mcp_server":
        from ragloop.serve._mcp import create_mcp_server

        return create_mcp_server
    raise AttributeError(f"module 'ragloop.serve' has no attribute {name!r}")
