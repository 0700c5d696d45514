"""Fixtures for the ASGI app: chats over fakes or the sample index, an in-process client, a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("starlette", reason="the [serve] extra is not installed: pip install 'ragloop[serve]'")

import httpx
import uvicorn

from ragloop.chat import ChatRAG
from ragloop.events import Token
from ragloop.state import Decision
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit
from ragloop.turn import TurnSettings

DOCS = {
    "rotate api key": [
        make_hit(
            "Create a new key, deploy it, then revoke the old one.",
            source="https://docs.example.com/rotate",
            title="Rotating keys",
        ),
        make_hit("Keys can be scoped to one workspace.", source="api-keys.md", title="API keys"),
    ]
}


def decider(*, direct: bool = False) -> FakeDecider:
    """A decider that searches 'rotate api key' for every question (or answers directly); it records calls."""

    def decide(question: str) -> Decision:
        if direct:
            return Decision(reply="Hello! Ask me about API keys.", reason="greeting")
        return Decision(queries=("rotate api key",), reason="one topic")

    return FakeDecider(decide)


def fake_rag(
    *,
    retriever: FakeRetriever | None = None,
    answerer: Any = None,
    decide: FakeDecider | None = None,
    cls: type[ChatRAG] = ChatRAG,
    settings: TurnSettings | None = None,
) -> ChatRAG:
    """A chat over fakes (no model, no index), with the default turn settings unless ``settings``."""
    return cls(
        retriever=retriever or FakeRetriever(DOCS),
        decider=decide or decider(),
        grader=FakeGrader(),
        rewriter=FakeRewriter(),
        answerer=answerer or FakeAnswerer(),
        settings=settings or TurnSettings(),
    )


class StuckRag(ChatRAG):
    """A chat deaf to its deadline: it stops for a minute after its first token."""

    async def stream(self, question: str, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for event in super().stream(question, **kwargs):
            yield event
            if isinstance(event, Token):
                await anyio.sleep(60)  # deaf to the deadline


@pytest.fixture
def rag() -> ChatRAG:
    """A chat over fakes (no model, no index)."""
    return fake_rag()


@pytest.fixture(scope="session")
def sample_rag(sample_cache: Path) -> ChatRAG:
    """The offline chat over the bundled sample knowledge base."""
    return ChatRAG.sample(cache_dir=sample_cache)


def asgi_client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver")


def sse_events(text: str) -> list[tuple[str, str]]:
    """``(event name, data)`` pairs of a server-sent-events body (comment blocks, ``: keep-alive``, skipped)."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip() or all(line.startswith(":") for line in block.split("\n") if line):
            continue
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
        out.append((name, "\n".join(data)))
    return out


@contextlib.contextmanager
def serving(app: Any, *, close: Callable[[], Awaitable[None]] | None = None, **config: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread; yields its base URL.

    ``close`` runs in the server's event loop after it stops (to close clients the app used there); ``config``
    goes to ``uvicorn.Config`` (``http=ragloop.serve.h11_protocol(...)``).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {"log_level": "error", "lifespan": "off", "ws": "none", "timeout_graceful_shutdown": 2}
    server = uvicorn.Server(uvicorn.Config(app, **{**options, **config}))

    async def main() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            if close is not None:
                await close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# The real PostgreSQL fixture is engineer D's (tests/retrievers/conftest.py): reused, not copied.
from tests.retrievers.conftest import pg_server, pg_url  # noqa: E402

__all__ = ["pg_server", "pg_url"]
