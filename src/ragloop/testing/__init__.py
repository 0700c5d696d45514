"""The public test kit: in-memory fakes of every seam of a chat turn, and a scripted OpenAI-compatible server.

**Fakes** stand in for the judges, the retriever and a live source when you unit-test a node or your own graph.
Each is deterministic, records how it was called, and can be told to fail or to be slow for a given input::

    from ragloop.testing import FakeGrader, FakeRetriever, make_hit

    retriever = FakeRetriever({"sso": [make_hit("SSO uses SAML.")]}, errors={"billing": OSError("down")})

**The scripted server** is a real HTTP server on ``127.0.0.1`` that speaks enough of the OpenAI API
(``POST /v1/chat/completions`` with JSON or SSE streaming, ``POST /v1/embeddings``) for the real ``openai``
SDK to talk to it. Tests script its answers, inject faults (429, 5xx, slow or cut streams, malformed
chunks) and assert on the exact requests it received::

    from ragloop.testing import ScriptedOpenAIServer, reply, tool_calls

    async def test_my_graph() -> None:
        async with ScriptedOpenAIServer(script=[tool_calls([("search", {"query": "redis ttl"})])]) as server:
            async with server.client() as client:
                ...  # drive your judges / graph with ``client``
        assert server.requests[0].messages[-1]["content"] == "how do keys expire?"

See ``docs/testing.md`` for the full guide. Everything public is imported from here; the underscored modules
(``_fakes``, ``_script``, ``_recorded``, ``_server``, ``_handler``) are private.
"""

from __future__ import annotations

from ragloop.testing._fakes import (
    FakeAnswerer,
    FakeBridger,
    FakeDecider,
    FakeGrader,
    FakeLiveSource,
    FakeRetriever,
    FakeRewriter,
    make_hit,
)
from ragloop.testing._grading import verdicts
from ragloop.testing._recorded import RecordedRequest, ServerStats
from ragloop.testing._script import (
    Latency,
    ScriptedResponse,
    ToolCallSpec,
    embeddings_ok,
    empty_choices,
    error,
    json_reply,
    rate_limited,
    reply,
    rerank_ok,
    server_error,
    stream,
    stream_tool_calls,
    tool_calls,
)
from ragloop.testing._server import EmbedFn, Matcher, ScriptedOpenAIServer

__all__ = [
    "EmbedFn",
    "FakeAnswerer",
    "FakeBridger",
    "FakeDecider",
    "FakeGrader",
    "FakeLiveSource",
    "FakeRetriever",
    "FakeRewriter",
    "Latency",
    "Matcher",
    "RecordedRequest",
    "ScriptedOpenAIServer",
    "ScriptedResponse",
    "ServerStats",
    "ToolCallSpec",
    "embeddings_ok",
    "empty_choices",
    "error",
    "json_reply",
    "make_hit",
    "rate_limited",
    "reply",
    "rerank_ok",
    "server_error",
    "stream",
    "stream_tool_calls",
    "tool_calls",
    "verdicts",
]
