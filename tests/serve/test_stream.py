"""The turn response's event streams stay open through proxies: ``: keep-alive`` comments while a model stalls.

The model is ``ragloop.testing``'s scripted server, whose answer stream waits before its first token (a slow model
thinking); the clients are the real ``openai`` SDK and plain httpx. A bound here is the stall the test scripts
(seconds) against the interval it sets (a tenth of a second): twenty intervals of margin, whatever the load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError
from ragloop.serve import ServeSettings, create_app
from ragloop.serve._stream import KEEPALIVE
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream
from tests.reliability._llm import good_response
from tests.reliability._walls import tenant_index
from tests.serve.conftest import serving, sse_events

pytestmark = pytest.mark.anyio

_STALL_S = 2.0
_INTERVAL_S = 0.1
_ANSWER = "Deliveries are retried 8 times [1]."
_Q = "How often are webhook deliveries retried?"


@asynccontextmanager
async def _stalling_app(keepalive_s: float | None) -> AsyncIterator[str]:
    """A server whose model thinks ``_STALL_S`` before the answer's first token; yields its base URL."""

    def matcher(request: RecordedRequest) -> ScriptedResponse:
        if request.judge == "answer":
            return stream(_ANSWER, chunk_size=6, first_token_delay_s=_STALL_S)
        return good_response(request)

    async with ScriptedOpenAIServer(matcher=matcher) as model:
        llm = model.client(timeout_s=30.0)
        rag = ChatRAG.from_index(tenant_index(), llm, fast_model="m", timeout_s=30.0)
        app = create_app(rag, settings=ServeSettings(keepalive_s=keepalive_s))
        with serving(app, close=llm.close) as url:
            yield url


#: Per SSE endpoint: the path, the request body, and the marker of its first answer token in the raw stream.
_ENDPOINTS: dict[str, tuple[str, dict[str, Any], bytes]] = {
    "api-chat": ("/api/chat", {"message": _Q}, b"event: token"),
    "completions": (
        "/v1/chat/completions",
        {"model": "ragloop", "messages": [{"role": "user", "content": _Q}], "stream": True},
        b'"content":"Deliv',
    ),
    "responses": ("/v1/responses", {"model": "ragloop", "input": _Q, "stream": True}, b"response.output_text.delta"),
    "ai-sdk": (
        "/api/chat?format=ai-sdk",
        {"messages": [{"id": "1", "role": "user", "parts": [{"type": "text", "text": _Q}]}]},
        b'"type":"text-delta"',
    ),
}


async def _raw(url: str, endpoint: str) -> bytes:
    path, body, _ = _ENDPOINTS[endpoint]
    async with httpx.AsyncClient(base_url=url, timeout=60) as client, client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        return b"".join([chunk async for chunk in r.aiter_raw()])


class TestKeepAlive:
    @pytest.mark.parametrize("endpoint", list(_ENDPOINTS))
    async def test_a_stalled_model_gets_comments_before_its_first_token(self, endpoint: str) -> None:
        """The model thinks 2 s before its first token: every SSE endpoint writes ``: keep-alive`` comments in
        that silence (interval 0.1 s), after its first frame and before the first token, and the stream still ends
        as its protocol says (before: nothing was written for the whole stall, and nginx cuts a stream idle 60 s)."""
        async with _stalling_app(_INTERVAL_S) as url:
            raw = await _raw(url, endpoint)
        first_token = raw.index(_ENDPOINTS[endpoint][2])
        assert raw.count(KEEPALIVE, 0, first_token) >= 2, raw[:first_token]
        assert not raw.startswith(KEEPALIVE)  # the stream's own first frame comes first
        events = sse_events(raw.decode())
        last = {"api-chat": "reply", "completions": "message", "responses": "response.completed", "ai-sdk": "message"}
        assert events[-1][0] == last[endpoint], events[-3:]
        if endpoint in ("completions", "ai-sdk"):
            assert events[-1][1] == "[DONE]"

    async def test_the_openai_sdk_reads_through_the_comments(self) -> None:
        """The openai SDK streams a chat completion and a response through the keep-alive comments: the whole
        answer arrives, the completion ends with finish_reason stop and the response with response.completed."""
        async with _stalling_app(_INTERVAL_S) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
            async with client:
                chunks = [
                    c
                    async for c in await client.chat.completions.create(
                        model="ragloop", messages=[{"role": "user", "content": _Q}], stream=True
                    )
                ]
                async with client.responses.stream(model="ragloop", input=_Q) as events:
                    kinds = [e.type async for e in events]
                    final = await events.get_final_response()
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.startswith(_ANSWER)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert kinds[-1] == "response.completed" and final.output_text == _ANSWER

    async def test_none_turns_them_off(self) -> None:
        """``keepalive_s=None``: the stalled stream carries no comment at all."""
        async with _stalling_app(None) as url:
            raw = await _raw(url, "api-chat")
        assert KEEPALIVE not in raw and b"event: reply" in raw

    def test_a_bad_interval_is_refused(self) -> None:
        """A zero or negative interval is a ConfigError naming the setting."""
        for bad in (0.0, -1.0):
            with pytest.raises(ConfigError, match="keepalive_s"):
                ServeSettings(keepalive_s=bad)
