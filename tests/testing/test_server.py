"""The scripted OpenAI-compatible server of ``ragloop.testing``, driven through the real ``openai`` SDK."""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from ragloop.testing import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    embeddings_ok,
    empty_choices,
    error,
    json_reply,
    rate_limited,
    reply,
    stream,
    stream_tool_calls,
    tool_calls,
)

pytestmark = pytest.mark.anyio
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "how do keys expire?"}]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAIServer]:
    """A running scripted server."""
    async with ScriptedOpenAIServer() as running:
        yield running


@pytest.fixture
async def client(server: ScriptedOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client without retries."""
    async with server.client(max_retries=0, timeout_s=5.0) as sdk:
        yield sdk


class TestChat:
    async def test_reply_and_recording(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A scripted reply reaches the SDK; the request body, headers and path are recorded."""
        server.enqueue(reply("Keys expire via TTL.", usage=(12, 4)))
        completion = await client.chat.completions.create(model="m1", messages=USER, temperature=0)
        assert completion.choices[0].message.content == "Keys expire via TTL."
        assert completion.model == "m1"
        assert completion.usage is not None and completion.usage.prompt_tokens == 12
        (request,) = server.requests
        assert request.path == "/v1/chat/completions" and request.method == "POST"
        assert request.messages == USER and request.model == "m1" and request.body["temperature"] == 0
        assert request.headers["authorization"] == "Bearer test"
        assert server.chat_requests == [request]

    async def test_parallel_tool_calls(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """Several tool calls arrive as one message with distinct ids and JSON arguments."""
        server.enqueue(tool_calls([("search", {"query": "a"}), ("search", {"query": "b"})]))
        completion = await client.chat.completions.create(model="m", messages=USER)
        calls = completion.choices[0].message.tool_calls or []
        assert [json.loads(c.function.arguments)["query"] for c in calls] == ["a", "b"]  # type: ignore[union-attr]
        assert len({c.id for c in calls}) == 2
        assert completion.choices[0].finish_reason == "tool_calls"

    async def test_json_reply_and_empty_choices(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """json_reply sends JSON content; empty_choices sends none."""
        server.enqueue(json_reply({"label": "relevant"}), empty_choices())
        first = await client.chat.completions.create(model="m", messages=USER)
        assert json.loads(first.choices[0].message.content or "") == {"label": "relevant"}
        second = await client.chat.completions.create(model="m", messages=USER)
        assert second.choices == []

    @pytest.mark.parametrize(
        "body",
        [
            {"choices": None},
            {"choices": "none"},
            {"choices": [None, {"message": None}, {"message": {"tool_calls": None}}]},
            {"choices": [{"message": {"tool_calls": [None, {"function": None}]}}]},
        ],
    )
    async def test_a_malformed_scripted_body_is_sent_and_the_server_keeps_serving(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI, body: dict[str, Any]
    ) -> None:
        """A scripted body with "choices": null (or other wrong shapes) reaches the client as written, with its
        usage, and the next request is answered (before: the handler raised and the client got no answer)."""
        server.enqueue(ScriptedResponse(body=body), reply("still here"))
        raw = await client.with_options(max_retries=0).chat.completions.with_raw_response.create(
            model="m", messages=USER
        )
        assert raw.http_response.status_code == 200 and "usage" in raw.http_response.json()
        after = await client.chat.completions.create(model="m", messages=USER)
        assert after.choices[0].message.content == "still here"

    async def test_a_malformed_streamed_chunk_is_sent_and_counted_as_nothing(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """A streamed chunk with "choices": null does not stop the stream or the server."""
        chunks = ('{"choices": null}', '{"choices": [{"delta": "x"}]}', '{"choices": [{"delta": {"content": "ok"}}]}')
        server.enqueue(ScriptedResponse(chunks=chunks), reply("next"))
        async with client.with_options(max_retries=0).chat.completions.with_streaming_response.create(
            model="m", messages=USER, stream=True
        ) as response:
            text = await response.http_response.aread()
        assert b'"content": "ok"' in text and b"[DONE]" in text
        assert (await client.chat.completions.create(model="m", messages=USER)).choices[0].message.content == "next"

    async def test_matcher_after_script(self, client: openai.AsyncOpenAI) -> None:
        """The script is used first, then the matcher sees each request."""

        def echo(request: RecordedRequest) -> ScriptedResponse:
            return reply(f"echo: {request.messages[-1]['content']}")

        async with (
            ScriptedOpenAIServer(script=[reply("scripted")], matcher=echo) as running,
            running.client() as sdk,
        ):
            texts = [
                (await sdk.chat.completions.create(model="m", messages=USER)).choices[0].message.content
                for _ in range(2)
            ]
        assert texts == ["scripted", "echo: how do keys expire?"]

    async def test_exhausted_script_is_a_clear_error(self, server: ScriptedOpenAIServer) -> None:
        """With nothing scripted the server answers 500 naming the fix, and tells the SDK not to retry."""
        async with server.client(max_retries=3) as sdk:
            with pytest.raises(openai.InternalServerError, match="script exhausted"):
                await sdk.chat.completions.create(model="m", messages=USER)
        assert len(server.requests) == 1

    async def test_rate_limit_carries_retry_after(self, server: ScriptedOpenAIServer) -> None:
        """A 429 is retried by the SDK after the scripted retry-after; both requests are recorded."""
        server.enqueue(rate_limited(0.05), reply("ok"))
        async with server.client(max_retries=1) as sdk:
            completion = await sdk.chat.completions.create(model="m", messages=USER)
        assert completion.choices[0].message.content == "ok"
        first, second = server.requests
        assert second.received_at - first.received_at >= 0.05

    async def test_error_envelope(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """Errors use OpenAI's envelope, so the SDK raises the matching class with the message."""
        server.enqueue(error(404, "model 'nope' not found", error_type="invalid_request_error"))
        with pytest.raises(openai.NotFoundError, match="model 'nope' not found"):
            await client.chat.completions.create(model="nope", messages=USER)

    async def test_latency_delays_reply(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A response with latency is not sent before its first-token delay."""
        server.enqueue(reply("slowly").with_latency(0.1))
        start = time.monotonic()
        await client.chat.completions.create(model="m", messages=USER)
        assert time.monotonic() - start >= 0.1


class TestModels:
    async def test_models_are_listed_and_not_recorded(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """``GET /v1/models`` lists one model through the SDK (a readiness probe's question) and is not a recorded
        request; another GET is a 404 naming the route (before: 501 for every GET, so /readyz of a server on the
        scripted model said "model: unreachable")."""
        models = await client.models.list()
        assert [m.id for m in models.data] == ["scripted"]
        with pytest.raises(openai.NotFoundError, match="no route GET"):
            await client.get("/files", cast_to=object)
        assert server.requests == []


class TestStreaming:
    async def test_stream_chunks_and_usage(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """Content arrives in chunk_size pieces, then a finish reason, then the usage chunk when asked for."""
        server.enqueue(stream("abcdefg", chunk_size=3, usage=(9, 3)))
        response = await client.chat.completions.create(
            model="m",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], [], None
        async for chunk in response:
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
            usage = chunk.usage or usage
        assert pieces == ["abc", "def", "g"] and finish == ["stop"]
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (9, 3)

    async def test_interleaved_tool_call_deltas(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """Argument deltas of two calls alternate by index and join to the scripted arguments."""
        server.enqueue(stream_tool_calls([("search", {"query": "first topic"}), ("search", {"query": "second"})]))
        response = await client.chat.completions.create(model="m", messages=USER, stream=True)
        order: list[int] = []
        arguments: dict[int, str] = {}
        async for chunk in response:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    order.append(call.index)
                    arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")  # type: ignore[union-attr]
        assert [json.loads(arguments[i])["query"] for i in (0, 1)] == ["first topic", "second"]
        assert order[:4] == [0, 1, 0, 1]

    async def test_cut_stream_raises_connection_error(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """cut_after closes the connection mid-body: the SDK yields what came, then raises."""
        server.enqueue(stream("abcdefghi", chunk_size=3, cut_after=1))
        response = await client.chat.completions.create(model="m", messages=USER, stream=True)
        pieces: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            async for chunk in response:
                pieces += [c.delta.content for c in chunk.choices if c.delta.content]
        assert pieces == ["abc"]

    async def test_malformed_chunk(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """malformed_at replaces a delta with broken JSON, which the SDK fails to decode."""
        server.enqueue(stream("abcdef", chunk_size=3, malformed_at=1))
        response = await client.chat.completions.create(model="m", messages=USER, stream=True)
        with pytest.raises(json.JSONDecodeError):
            async for _ in response:
                pass


class TestEmbeddings:
    async def test_deterministic_unit_vectors(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """The same text gets the same unit vector, in float or base64 encoding; different texts differ."""
        floats = await client.embeddings.create(model="e", input=["alpha", "beta"], encoding_format="float")
        b64 = await client.embeddings.create(model="e", input="alpha", encoding_format="base64")
        alpha, beta = (d.embedding for d in floats.data)
        assert len(alpha) == server.embedding_dim
        assert math.isclose(sum(x * x for x in alpha), 1.0, rel_tol=1e-6)
        assert alpha != beta
        raw = base64.b64decode(str(b64.data[0].embedding))
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(alpha, abs=1e-6)
        assert alpha == pytest.approx(server.vector("alpha"))

    async def test_seed_and_custom_function(self) -> None:
        """Another seed changes the vectors; a user function replaces them."""
        with ScriptedOpenAIServer(seed=1) as one, ScriptedOpenAIServer(embed=lambda t: [float(len(t)), 0.0]) as fn:
            assert one.vector("x") != ScriptedOpenAIServer().vector("x")
            async with fn.client() as sdk:
                result = await sdk.embeddings.create(model="e", input=["abc"], encoding_format="float")
        assert result.data[0].embedding == [3.0, 0.0]

    async def test_embedding_faults(self, server: ScriptedOpenAIServer) -> None:
        """Queued embedding faults come first, then normal vectors; chat scripts are untouched."""
        server.enqueue_embeddings(rate_limited(0.01), embeddings_ok())
        async with server.client(max_retries=1) as sdk:
            result = await sdk.embeddings.create(model="e", input=["a"])
        assert len(result.data) == 1 and len(server.requests) == 2


class TestRerank:
    async def test_the_common_rerank_api(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """/v1/rerank answers results[] of index and relevance_score, best first, cut at top_n; the default scores
        are the share of the query's words a document holds."""
        body = {"query": "rotate key", "documents": ["nothing", "rotate the key", "key"], "top_n": 2}
        answer = await client.post("/rerank", cast_to=object, body=body)
        assert answer["results"] == [{"index": 1, "relevance_score": 1.0}, {"index": 2, "relevance_score": 0.5}]  # type: ignore[index]
        assert server.rerank_requests[0].body == body

    async def test_scores_faults_and_bad_bodies(self) -> None:
        """A scoring function of one's own; queued faults come first; a body without documents is a 400."""
        with ScriptedOpenAIServer(rerank=lambda q, docs: [float(len(d)) for d in docs]) as server:
            server.enqueue_rerank(rate_limited(0.01))
            async with server.client(max_retries=0) as sdk:
                with pytest.raises(openai.RateLimitError):
                    await sdk.post("/rerank", cast_to=object, body={"query": "q", "documents": ["a"]})
                answer = await sdk.post("/rerank", cast_to=object, body={"query": "q", "documents": ["a", "abc"]})
                with pytest.raises(openai.BadRequestError, match="documents"):
                    await sdk.post("/rerank", cast_to=object, body={"query": "q"})
        assert [r["index"] for r in answer["results"]] == [1, 0]  # type: ignore[index]


class TestLifecycle:
    async def test_counts_connections_and_aborts(self, server: ScriptedOpenAIServer) -> None:
        """A client that times out is counted as an abort; closed clients leave no open connection."""
        server.enqueue(reply("late").delayed(2.0), reply("fine"))
        async with server.client(max_retries=0, timeout_s=0.2) as sdk:
            with pytest.raises(openai.APITimeoutError):
                await sdk.chat.completions.create(model="m", messages=USER)
            await sdk.chat.completions.create(model="m", messages=USER)
        stats = await server.wait_idle()
        assert (stats.requests_started, stats.requests_finished, stats.requests_aborted) == (2, 1, 1)
        assert stats.connections_opened == stats.connections_closed >= 1

    async def test_wait_idle_times_out_with_counters(self, server: ScriptedOpenAIServer) -> None:
        """wait_idle names the counters when a client keeps a connection open."""
        server.enqueue(reply("x"))
        async with server.client() as sdk:
            await sdk.chat.completions.create(model="m", messages=USER)
            with pytest.raises(TimeoutError, match=r"open_connections|connections_opened"):
                await server.wait_idle(timeout_s=0.05)

    def test_sync_context_manager_and_idempotent_close(self) -> None:
        """The server works as a plain ``with`` block; close() twice is fine; base_url needs a running server."""
        server = ScriptedOpenAIServer()
        with pytest.raises(RuntimeError, match="not running"):
            _ = server.base_url
        with server:
            assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        server.close()

    async def test_close_with_stuck_request_returns(self) -> None:
        """Closing while a response is still delayed ends promptly and the client sees a dropped connection."""
        running = ScriptedOpenAIServer(script=[reply("never").delayed(30.0)]).start()
        errors: list[Exception] = []
        async with running.client(timeout_s=10.0) as sdk:

            async def call() -> None:
                try:
                    await sdk.chat.completions.create(model="m", messages=USER)
                except openai.APIError as exc:
                    errors.append(exc)

            start = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await running.wait_for_requests(1)
                await anyio.to_thread.run_sync(running.close)
        assert time.monotonic() - start < 5.0
        assert len(errors) == 1 and isinstance(errors[0], openai.APIConnectionError)
        assert running.stats.requests_aborted == 1


def test_recorded_request_names_the_judge() -> None:
    """RecordedRequest.judge tells decide, grade, answer and rewrite requests apart by their shape."""
    from ragloop.testing import RecordedRequest

    def req(body: dict[str, object]) -> RecordedRequest:
        return RecordedRequest(0, "POST", "/v1/chat/completions", {}, body, 0.0)

    assert req({"tools": [], "messages": []}).judge == "decide"
    assert req({"response_format": {"type": "json_object"}}).judge == "grade"
    assert req({"stream": True}).judge == "answer"
    assert req({"messages": []}).judge == "rewrite"
