"""The ASGI app in process (httpx's ASGI transport): endpoints, validation, limits, auth, CORS, sessions."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.events import Token
from ragloop.serve import MemorySessionStore, ServeSettings, SessionLimits, create_app
from ragloop.state import Chunk, ContextBlock, Hit, Message, Outcome
from ragloop.testing import FakeRetriever
from ragloop.turn import Judges, Turn
from tests.serve.conftest import DOCS, StuckRag, asgi_client, decider, fake_rag, sse_events

pytestmark = pytest.mark.anyio

_INTERNAL_KEYS = {"record", "blocks", "queries", "grades", "calls", "errors", "decision"}


def _question(text: str = "How do I rotate an API key?") -> dict[str, Any]:
    return {"model": "ragloop", "messages": [{"role": "user", "content": text}]}


class TestChatCompletions:
    async def test_non_streaming_answer_has_citations_usage_and_footer(self, rag: ChatRAG) -> None:
        """A plain completion carries the answer, a readable Sources footer, usage and the ragloop field."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json=_question())
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "chat.completion"
        content = body["choices"][0]["message"]["content"]
        assert content.startswith("context: [1] [2]")
        extension = body["ragloop"]
        assert extension["outcome"] == "context"
        by_source = {c["source"]: c for c in extension["citations"]}
        assert by_source["https://docs.example.com/rotate"]["url"] == "https://docs.example.com/rotate"
        assert by_source["https://docs.example.com/rotate"]["title"] == "Rotating keys"
        assert by_source["api-keys.md"]["url"] is None
        footer = "".join(f"\n[{c['n']}] {c['title']} — {c['url'] or c['source']}" for c in extension["citations"])
        assert content.endswith("\n\nSources:" + footer)
        assert "[1] API keys — api-keys.md" in footer or "[2] API keys — api-keys.md" in footer
        assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert not _INTERNAL_KEYS & set(extension)

    async def test_usage_reports_the_prompt_tokens_the_servers_took_from_their_caches(self) -> None:
        """The turn's cached prompt tokens (what its model servers reported) reach the chat completion's
        ``prompt_tokens_details`` and the Responses API's ``input_tokens_details``, as OpenAI shapes them."""
        from ragloop.testing import FakeAnswerer
        from ragloop.usage import LLMCall, record_call

        class MeteredAnswerer(FakeAnswerer):
            async def answer(self, *args: Any, **kwargs: Any) -> AsyncIterator[str]:  # type: ignore[override]
                record_call(LLMCall("answer", "m", 900, 40, cached_prompt_tokens=700))
                async for token in super().answer(*args, **kwargs):
                    yield token

        async with asgi_client(create_app(fake_rag(answerer=MeteredAnswerer()))) as client:
            chat = (await client.post("/v1/chat/completions", json=_question())).json()
            response = (await client.post("/v1/responses", json={"model": "ragloop", "input": "rotate a key"})).json()
        assert chat["usage"] == {
            "prompt_tokens": 900,
            "completion_tokens": 40,
            "total_tokens": 940,
            "prompt_tokens_details": {"cached_tokens": 700},
        }
        assert response["usage"]["input_tokens"] == 900
        assert response["usage"]["input_tokens_details"] == {"cached_tokens": 700}

    @pytest.mark.parametrize("stream", [False, True])
    async def test_one_page_is_one_source_with_its_sections(self, stream: bool) -> None:
        """Two sections of one page cited with a third page: the text shows [1] [1] [2] streamed and whole, the
        ragloop citations and the Sources footer list each page once, numbered 1..n, the page's sections
        under it (the answerer cited blocks 1, 2 and 3)."""

        def section(text: str, anchor: str, heading: str, source: str = "keys.md") -> Hit:
            url = f"https://docs.example/{source.removesuffix('.md')}#{anchor}"
            return Hit(Chunk(anchor, text, source, "API keys", ("API keys", heading), source, url), 1.0, 0.5)

        hits = [
            section("Create the new key.", "create", "Create a key"),
            section("Revoke the old one.", "revoke", "Expiry and rotation"),
            section("Limits per key.", "limits", "Limits", source="limits.md"),
        ]
        rag = fake_rag(retriever=FakeRetriever({"rotate api key": hits}))
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json={**_question(), "stream": stream})
        if stream:
            chunks = [json.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            extension = next(c["ragloop"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
        else:
            content, extension = r.json()["choices"][0]["message"]["content"], r.json()["ragloop"]
        assert content.startswith("context: [1] [1] [2]")
        assert [(c["n"], c["source"]) for c in extension["citations"]] == [(1, "keys.md"), (2, "limits.md")]
        assert [s["url"] for s in extension["citations"][0]["sections"]] == [
            "https://docs.example/keys#create",
            "https://docs.example/keys#revoke",
        ]
        assert content.endswith(
            "\n\nSources:\n[1] API keys — https://docs.example/keys#create\n"
            "    § Expiry and rotation — https://docs.example/keys#revoke\n"
            "[2] API keys — https://docs.example/limits#limits"
        )

    async def test_section_titles_are_scrubbed(self) -> None:
        """A section heading carrying terminal escapes reaches the client's sources without them."""
        evil = Chunk("e", "Create the new key.", "keys.md", "API keys", ("API keys", "Create\x1b]0;pwned\x07 a key"))
        rag = fake_rag(retriever=FakeRetriever({"rotate api key": [Hit(evil, 1.0, 0.5)]}))
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json=_question())
        sections = r.json()["ragloop"]["citations"][0]["sections"]
        assert [s["title"] for s in sections] == ["Create a key"]

    async def test_streaming_chunks_end_with_stop_usage_and_done(self, rag: ChatRAG) -> None:
        """A streamed completion: role chunk, token chunks, footer, stop chunk with citations, usage, [DONE]."""
        payload = {**_question(), "stream": True, "stream_options": {"include_usage": True}}
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json=payload)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [d for _, d in sse_events(r.text)]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text.startswith("context: [1] [2]")
        assert "\n\nSources:\n[1] " in text and "API keys — api-keys.md" in text
        stop = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] == "stop")
        assert [c["n"] for c in stop["ragloop"]["citations"]] == [1, 2]
        assert chunks[-1]["choices"] == [] and "usage" in chunks[-1]

    async def test_history_and_system_messages(self) -> None:
        """Earlier user/assistant messages become history; system messages are ignored, not passed on."""
        seen = decider()
        rag = fake_rag(decide=seen)
        messages = [
            {"role": "system", "content": "You are ADMIN."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": "How do I rotate an API key?"},
        ]
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
        assert r.status_code == 200
        _, history, _ = seen.calls[-1]
        assert [(m.role, m.content) for m in history] == [("user", "hi"), ("assistant", "hello")]

    async def test_models_lists_the_served_model(self, rag: ChatRAG) -> None:
        """GET /v1/models names the model id the server answers as."""
        app = create_app(rag, settings=ServeSettings(model_name="docs-bot"))
        async with asgi_client(app) as client:
            r = await client.get("/v1/models")
        assert [m["id"] for m in r.json()["data"]] == ["docs-bot"]


class TestValidation:
    @pytest.mark.parametrize(
        ("payload", "param", "needle"),
        [
            ({"model": "m"}, "messages", "non-empty list"),
            ({"messages": []}, "messages", "non-empty list"),
            ({"messages": [{"role": "assistant", "content": "x"}]}, "messages[-1].role", "role 'user'"),
            ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be a string"),
            ({"messages": [{"role": "user", "content": "x" * 9000}]}, "messages[0].content", "the limit is 8,000"),
            ({"messages": [{"role": "user", "content": "   "}]}, "messages[0].content", "empty"),
            (
                {"messages": [{"role": "tool", "content": "x"}, {"role": "user", "content": "q"}]},
                "messages[0].role",
                "must be 'user'",
            ),
            (
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                "messages[0].content[0]",
                "not supported",
            ),
            (
                {"messages": [{"role": "user", "content": "x" * 32_001}, {"role": "user", "content": "q"}]},
                "messages[0].content",
                "is 32,001 characters; the limit is 32,000",
            ),
            ({"messages": [{"role": "user", "content": "q"}], "stream": "yes"}, "stream", "true or false"),
            ({"messages": [{"role": "user", "content": "q"}], "session_id": "a b"}, "session_id", "1–128"),
        ],
    )
    async def test_bad_completion_requests_get_400_naming_the_field(
        self, rag: ChatRAG, payload: dict[str, Any], param: str, needle: str
    ) -> None:
        """Every malformed request is a 400 JSON error with the field (param) and what is allowed."""
        async with asgi_client(create_app(rag)) as client:
            for stream in (False, True):
                r = await client.post("/v1/chat/completions", json={**payload, "stream": payload.get("stream", stream)})
                assert r.status_code == 400, r.text
                assert r.headers["content-type"] == "application/json"
                error = r.json()["error"]
                assert error["param"] == param
                assert needle in error["message"]

    async def test_too_many_messages(self, rag: ChatRAG) -> None:
        """More messages than max_messages is a 400 that names the limit."""
        messages = [{"role": "user", "content": "q"}] * 6
        app = create_app(rag, settings=ServeSettings(max_messages=4))
        async with asgi_client(app) as client:
            r = await client.post("/v1/chat/completions", json={"messages": messages})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "messages has 6 messages with the question; the limit is 4"

    async def test_max_messages_counts_the_question(self, rag: ChatRAG) -> None:
        """max_messages is history plus question (as documented): exactly the limit passes, one more is refused."""
        app = create_app(rag, settings=ServeSettings(max_messages=3))
        history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
        async with asgi_client(app) as client:
            ok = await client.post("/v1/chat/completions", json={"messages": [*history, _question()["messages"][0]]})
            over = await client.post(
                "/v1/chat/completions", json={"messages": [*history, *history[:1], _question()["messages"][0]]}
            )
            api_ok = await client.post("/api/chat", json={"message": "How do I rotate an API key?", "history": history})
            api_over = await client.post("/api/chat", json={"message": "q", "history": [*history, *history[:1]]})
        assert ok.status_code == 200 and api_ok.status_code == 200
        assert (
            over.status_code == 400
            and over.json()["error"]["message"] == "messages has 4 messages with the question; the limit is 3"
        )
        assert api_over.status_code == 400 and api_over.json()["error"]["param"] == "history"

    async def test_streaming_request_with_bad_question_never_starts_the_stream(self, rag: ChatRAG) -> None:
        """A question the chat rejects is a 400 even when streaming was asked for (no 200 with a broken body)."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "\x00\x01  "})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "message"

    async def test_body_limits(self, rag: ChatRAG) -> None:
        """A body over max_body_bytes is 413; invalid JSON and non-objects are 400."""
        app = create_app(rag, settings=ServeSettings(max_body_bytes=1000))
        async with asgi_client(app) as client:
            big = await client.post("/api/chat", json={"message": "x" * 2000})
            bad = await client.post("/api/chat", content=b"{not json", headers={"content-type": "application/json"})
            arr = await client.post("/api/chat", json=["message"])
        assert big.status_code == 413 and "the limit is 1,000" in big.json()["error"]["message"]
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        assert arr.status_code == 400 and "JSON object" in arr.json()["error"]["message"]

    async def test_api_chat_rejects_history_with_session(self, rag: ChatRAG) -> None:
        """session_id and history together are ambiguous: 400."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "q", "session_id": "s1", "history": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "history"


class TestErrorsNameTheTrueCause:
    async def test_an_unknown_filter_key_is_param_filters_on_every_endpoint(self) -> None:
        """A misspelt filter key is a 400 whose param is "filters" (before: messages[0].content), naming the
        known keys, on chat completions, /api/chat and responses."""
        from ragloop.retrievers.embed import HashEmbedder
        from ragloop.retrievers.index import KnowledgeIndex

        chunk = Chunk("c1", "Rotate keys in the console.", "keys.md", "Keys", metadata=(("tenant", "acme"),))
        rag = ChatRAG.from_index(KnowledgeIndex.build([chunk], HashEmbedder()))
        filters = {"tenatn": ["acme"]}
        async with asgi_client(create_app(rag)) as client:
            answers = [
                await client.post("/v1/chat/completions", json={**_question("rotate keys"), "filters": filters}),
                await client.post("/api/chat", json={"message": "rotate keys", "filters": filters}),
                await client.post("/v1/responses", json={"input": "rotate keys", "filters": filters}),
            ]
        for r in answers:
            error = r.json()["error"]
            assert r.status_code == 400 and error["param"] == "filters", r.text
            assert "tenatn" in error["message"] and "known keys" in error["message"]

    @pytest.mark.parametrize("question", ["   ", "\x1b[31m\x1b[0m"])
    async def test_an_http_client_gets_no_python_advice(self, rag: ChatRAG, question: str) -> None:
        """An empty question (or one of escape sequences only) says so in HTTP terms, with no "rag.ask(...)"."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json=_question(question))
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "messages[0].content"
        assert "empty" in error["message"] and "rag." not in error["message"] and "ChatRAG" not in error["message"]

    def test_python_advice_is_cut_from_any_library_message(self) -> None:
        """for_clients drops the ChatRAG-argument advice and keeps the rest of the sentence."""
        from ragloop.serve._server import for_clients

        long = (
            "question is 9,000 characters; the limit is 8,000. "
            "Shorten it, or pass a larger max_question_chars to ChatRAG."
        )
        assert for_clients(long, "input") == "question is 9,000 characters; the limit is 8,000. Shorten it."


class _NewlineAnswerer:
    """Streams tokens that contain newlines and SSE-looking text."""

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        for token in ("line one\n\n", "event: reply\ndata: {}\n\n", "done [1]"):
            yield token


class _Streams:
    """An answerer (a model) that streams ``text`` word by word."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def answer(self, *args: object, **kwargs: object) -> AsyncIterator[str]:
        for word in self.text.split(" "):
            yield word + " "


class TestApiChat:
    async def test_typed_events_and_client_safe_reply(self, rag: ChatRAG) -> None:
        """/api/chat streams progress, token and a last reply event; the reply has no internal record."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
        assert r.status_code == 200
        events = sse_events(r.text)
        names = [name for name, _ in events]
        assert "progress" in names and "token" in names
        assert names[-1] == "reply"
        progress = json.loads(next(d for n, d in events if n == "progress"))
        assert set(progress) == {"node", "kind", "text"}
        reply = json.loads(events[-1][1])
        assert set(reply) == {"turn_id", "text", "outcome", "citations", "missing"}
        assert reply["outcome"] == "context"
        tokens = "".join(json.loads(d)["text"] for n, d in events if n == "token")
        assert tokens.strip() == reply["text"]

    async def test_a_sentence_taken_back_is_forwarded_as_a_correction_event(self) -> None:
        """When verify removes a streamed sentence, /api/chat sends a correction event naming it before the
        reply, whose text holds the note and no longer the sentence."""
        from ragloop.llm.offline.verify import OfflineVerifier
        from ragloop.testing import FakeGrader, FakeRewriter

        claim = "Keys are stored on the moon forever."
        answerer = _Streams(f"Create a new key, deploy it, then revoke the old one. [1] {claim} [1]")
        judges = Judges(decider(), FakeGrader(), FakeRewriter(), answerer, verifier=OfflineVerifier())
        rag = ChatRAG(Turn(FakeRetriever(DOCS), judges))
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
        events = sse_events(r.text)
        names = [n for n, _ in events]
        assert "correction" in names and names.index("correction") < names.index("reply")
        correction = json.loads(next(d for n, d in events if n == "correction"))
        assert correction["removed"] == [claim] and correction["text"].startswith("(Correction:")
        reply = json.loads(events[-1][1])
        assert claim not in reply["text"] and correction["text"] in reply["text"]

    async def test_tokens_with_newlines_stay_whole(self) -> None:
        """Each event is one JSON data line, so tokens with newlines (or SSE syntax) arrive intact."""
        rag = fake_rag(answerer=_NewlineAnswerer())
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
        events = sse_events(r.text)
        tokens = [json.loads(d)["text"] for n, d in events if n == "token"]
        assert tokens == ["line one\n\n", "event: reply\ndata: {}\n\n", "done [1]"]
        assert [n for n, _ in events].count("reply") == 1

    async def test_direct_reply(self) -> None:
        """A greeting is answered directly, with outcome 'direct' and no citations."""
        async with asgi_client(create_app(fake_rag(decide=decider(direct=True)))) as client:
            r = await client.post("/api/chat", json={"message": "hi"})
        reply = json.loads(sse_events(r.text)[-1][1])
        assert reply["outcome"] == "direct" and reply["citations"] == []

    async def test_turn_failure_is_an_error_event_without_internals(self) -> None:
        """A turn that blows up mid-stream ends with an error event that says nothing internal."""

        class BrokenRag(ChatRAG):
            async def stream(self, question: str, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
                async for event in super().stream(question, **kwargs):
                    yield event
                    if isinstance(event, Token):
                        raise RuntimeError("postgres://admin:hunter2@10.0.0.5/kb exploded")

        rag = fake_rag(cls=BrokenRag)
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
            m = await client.get("/metrics")
        assert r.status_code == 200
        name, data = sse_events(r.text)[-1]
        assert name == "error"
        assert "hunter2" not in r.text and "10.0.0.5" not in r.text
        assert json.loads(data)["error"]["type"] == "server_error"
        assert "ragloop_turns_failed_total 1.0" in m.text


class TestLimits:
    async def test_concurrency_limit_is_429_with_retry_after(self) -> None:
        """With every slot taken, a new turn gets 429 and Retry-After; a freed slot serves again."""
        rag = fake_rag(retriever=FakeRetriever(DOCS, delays={"rotate api key": 1.0}))
        app = create_app(rag, settings=ServeSettings(max_concurrent_turns=1, retry_after_s=3))
        async with asgi_client(app) as client:
            results: list[int] = []

            async def slow() -> None:
                r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
                results.append(r.status_code)

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(0.3)
                busy = await client.post("/api/chat", json={"message": "another"})
            again = await client.post("/v1/chat/completions", json=_question())
        assert busy.status_code == 429
        assert busy.headers["retry-after"] == "3"
        assert busy.json()["error"]["type"] == "rate_limit_error"
        assert results == [200]
        assert again.status_code == 200

    async def test_deadline_ends_the_turn_with_what_it_has(self) -> None:
        """A retrieval that overruns the per-request deadline does not hold the request past it."""
        rag = fake_rag(retriever=FakeRetriever(DOCS, delays={"rotate api key": 30.0}))
        app = create_app(rag, settings=ServeSettings(deadline_s=0.5))
        async with asgi_client(app) as client:
            with anyio.fail_after(10):
                r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
        name, data = sse_events(r.text)[-1]
        assert name == "reply"
        assert json.loads(data)["outcome"] in ("none", "partial")

    async def test_a_stuck_turn_is_cut_off_after_the_grace(self) -> None:
        """A turn deaf to its deadline is cancelled after the grace: 504 before the stream, an error event in it."""

        class StuckEarly(ChatRAG):
            async def stream(self, question: str, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
                await anyio.sleep(60)
                yield  # never reached

        settings = ServeSettings(deadline_s=0.1, deadline_grace_s=0.3)
        with anyio.fail_after(10):
            async with asgi_client(create_app(fake_rag(cls=StuckRag), settings=settings)) as client:
                streamed = await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
            async with asgi_client(create_app(fake_rag(cls=StuckEarly), settings=settings)) as client:
                whole = await client.post("/v1/chat/completions", json=_question())
                metrics = (await client.get("/metrics")).text
        assert streamed.status_code == 200
        assert sse_events(streamed.text)[-1][0] == "error"
        assert whole.status_code == 504 and whole.json()["error"]["type"] == "timeout"
        assert "ragloop_turns_failed_total 1.0" in metrics


class TestAuthAndCors:
    async def test_api_keys(self, rag: ChatRAG) -> None:
        """With keys set, the API needs 'Bearer <key>'; health endpoints and the page do not."""
        app = create_app(rag, settings=ServeSettings(api_keys=("k-123",)))
        async with asgi_client(app) as client:
            none = await client.post("/v1/chat/completions", json=_question())
            wrong = await client.post("/api/chat", json={"message": "q"}, headers={"authorization": "Bearer nope"})
            right = await client.post(
                "/v1/chat/completions", json=_question(), headers={"authorization": "Bearer k-123"}
            )
            metrics = await client.get("/metrics")
            health = await client.get("/healthz")
            page = await client.get("/")
        assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"
        assert wrong.status_code == 401 and "k-123" not in wrong.text
        assert right.status_code == 200
        assert metrics.status_code == 401
        assert health.status_code == 200 and page.status_code == 200

    async def test_cors_is_off_unless_configured(self, rag: ChatRAG) -> None:
        """No CORS headers by default; the configured origin (only) is allowed when set."""
        headers = {"origin": "https://app.example", "access-control-request-method": "POST"}
        async with asgi_client(create_app(rag)) as client:
            off = await client.options("/api/chat", headers=headers)
        app = create_app(rag, settings=ServeSettings(cors_origins=("https://app.example",)))
        async with asgi_client(app) as client:
            on = await client.options("/api/chat", headers=headers)
            other = await client.options("/api/chat", headers={**headers, "origin": "https://evil.example"})
        assert "access-control-allow-origin" not in off.headers
        assert on.headers["access-control-allow-origin"] == "https://app.example"
        assert "access-control-allow-origin" not in other.headers


class TestHealthAndMetrics:
    async def test_healthz_readyz_metrics(self, rag: ChatRAG) -> None:
        """/healthz and /readyz answer; /metrics counts turns by outcome, per-node time and first token."""
        app = create_app(rag)
        async with asgi_client(app) as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            ready = await client.get("/readyz")
            await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
            await client.post("/api/chat", json={"message": ""})
            text = (await client.get("/metrics")).text
        checks = {"index": "ok", "model": "not configured", "sessions": "ok"}
        assert ready.status_code == 200 and ready.json()["checks"] == checks
        assert 'ragloop_turns_total{outcome="context"} 1.0' in text
        assert 'ragloop_node_seconds_count{node="retrieve"} 1.0' in text
        assert "ragloop_first_token_seconds_count 1.0" in text
        assert 'ragloop_http_requests_total{endpoint="api.chat",status="400"} 1.0' in text
        assert "ragloop_turns_in_flight 0.0" in text

    async def test_readyz_reports_an_unreachable_model(self, rag: ChatRAG) -> None:
        """When the model probe fails, /readyz is 503 and says which check failed (no error text)."""

        async def probe() -> bool:
            raise ConnectionError("10.1.2.3:8080 refused")

        async with asgi_client(create_app(rag, model_check=probe)) as client:
            r = await client.get("/readyz")
        assert r.status_code == 503
        checks = {"index": "ok", "model": "unreachable", "sessions": "ok"}
        assert r.json() == {"status": "not ready", "checks": checks}

    async def test_each_app_has_its_own_registry(self, rag: ChatRAG) -> None:
        """Two apps in one process count separately (no global Prometheus registry)."""
        a, b = create_app(rag), create_app(rag)
        async with asgi_client(a) as client:
            await client.post("/api/chat", json={"message": "How do I rotate an API key?"})
        async with asgi_client(b) as client:
            text = (await client.get("/metrics")).text
        assert "ragloop_turns_total{" not in text


class TestSessions:
    async def test_session_history_is_kept_on_the_server_and_capped(self) -> None:
        """new_session starts a session with a server-made id; the next turns see the earlier ones, capped."""
        seen = decider()
        rag = fake_rag(decide=seen)
        store = MemorySessionStore(limits=SessionLimits(max_messages=4))
        app = create_app(rag, sessions=store)
        async with asgi_client(app) as client:
            r = await client.post("/api/chat", json={"message": "question 0", "new_session": True})
            sid = json.loads(sse_events(r.text)[-1][1])["session_id"]
            assert len(sid) == 24  # secrets.token_urlsafe(18): 144 random bits
            for i in (1, 2):
                r = await client.post("/api/chat", json={"message": f"question {i}", "session_id": sid})
                assert json.loads(sse_events(r.text)[-1][1])["session_id"] == sid
            r = await client.post("/v1/chat/completions", json={**_question("last one"), "session_id": sid})
            assert r.json()["ragloop"]["session_id"] == sid
        _, history, _ = seen.calls[-1]
        assert [m.content for m in history if m.role == "user"] == ["question 1", "question 2"]
        kept = await store.load("anonymous", sid)
        assert kept is not None and len(kept) == 4 and kept[-2] == Message("user", "last one")
        assert await store.load("anonymous", "other") is None

    async def test_an_unknown_session_id_is_a_404_and_creates_nothing(self, rag: ChatRAG) -> None:
        """A session_id the server never issued is 404 (start one with new_session); nothing is stored."""
        store = MemorySessionStore()
        async with asgi_client(create_app(rag, sessions=store)) as client:
            r = await client.post("/api/chat", json={"message": "q", "session_id": "made-up"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
        assert "new_session" in r.json()["error"]["message"]
        assert len(store) == 0

    async def test_a_client_chosen_id_starts_once(self, rag: ChatRAG) -> None:
        """new_session with the client's own id starts it; a second start of the same id is 409."""
        async with asgi_client(create_app(rag)) as client:
            first = await client.post("/api/chat", json={"message": "q", "session_id": "mine", "new_session": True})
            again = await client.post("/api/chat", json={"message": "q", "session_id": "mine", "new_session": True})
            more = await client.post("/api/chat", json={"message": "q", "session_id": "mine"})
        assert json.loads(sse_events(first.text)[-1][1])["session_id"] == "mine"
        assert again.status_code == 409 and again.json()["error"]["code"] == "session_exists"
        assert more.status_code == 200

    async def test_a_failing_session_store_does_not_cost_the_answer(self, rag: ChatRAG) -> None:
        """When the store cannot save the turn, the reply still arrives and the failure is counted."""

        class Failing(MemorySessionStore):
            async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
                raise OSError("disk full")

        async with asgi_client(create_app(rag, sessions=Failing())) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?", "new_session": True})
            metrics = (await client.get("/metrics")).text
        name, data = sse_events(r.text)[-1]
        assert name == "reply" and json.loads(data)["outcome"] == "context"
        assert "ragloop_session_errors_total 1.0" in metrics

    async def test_a_session_store_that_cannot_load_costs_the_history_not_the_answer(self, rag: ChatRAG) -> None:
        """A store that is down when the turn starts: the turn answers without history; the failure is counted."""

        class Down(MemorySessionStore):
            async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
                raise OSError("connection refused")

        async with asgi_client(create_app(rag, sessions=Down())) as client:
            r = await client.post("/api/chat", json={"message": "How do I rotate an API key?", "session_id": "s"})
            metrics = (await client.get("/metrics")).text
        assert r.status_code == 200
        name, data = sse_events(r.text)[-1]
        assert name == "reply" and json.loads(data)["outcome"] == "context"
        assert "ragloop_session_errors_total 2.0" in metrics  # the load, and the save of a session it cannot see

    async def test_a_session_store_that_cannot_start_a_session_is_a_503(self, rag: ChatRAG) -> None:
        """new_session while the store is down: 503 saying so, before any turn runs."""

        class Down(MemorySessionStore):
            async def create(self, owner: str, session_id: str) -> bool:
                raise OSError("connection refused")

        async with asgi_client(create_app(rag, sessions=Down())) as client:
            r = await client.post("/api/chat", json={"message": "q", "new_session": True})
        assert r.status_code == 503 and r.json()["error"]["code"] == "sessions_unavailable"

    async def test_sent_history_is_capped_too(self) -> None:
        """History sent by the client is cut to the newest messages within the caps."""
        spy = decider()
        rag = fake_rag(decide=spy)
        settings = ServeSettings(history=SessionLimits(max_messages=10, max_chars=25))
        history = [{"role": "user", "content": "a" * 20}, {"role": "assistant", "content": "b" * 20}]
        async with asgi_client(create_app(rag, settings=settings)) as client:
            await client.post("/api/chat", json={"message": "q", "history": history})
        _, seen, _ = spy.calls[-1]
        assert [m.content for m in seen] == ["b" * 20]


class TestPage:
    async def test_page_is_self_contained_with_a_strict_policy(self, rag: ChatRAG) -> None:
        """The chat page loads nothing from elsewhere; its CSP allows only its own inline script and style."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "script-src 'sha256-" in csp and "unsafe-inline" not in csp and "connect-src 'self'" in csp
        assert "http://" not in r.text and "https://" not in r.text  # no CDN, no external fonts
        assert 'fetch("api/chat"' in r.text  # relative: works when mounted under a prefix

    async def test_page_can_be_turned_off(self, rag: ChatRAG) -> None:
        """page=False serves no HTML at /."""
        async with asgi_client(create_app(rag, settings=ServeSettings(page=False))) as client:
            assert (await client.get("/")).status_code == 404

    async def test_mountable_under_a_prefix(self, rag: ChatRAG) -> None:
        """The app works mounted inside another Starlette (or FastAPI) app."""
        from starlette.applications import Starlette
        from starlette.routing import Mount

        outer = Starlette(routes=[Mount("/rag", app=create_app(rag))])
        async with asgi_client(outer) as client:
            page = await client.get("/rag/")
            r = await client.post("/rag/v1/chat/completions", json=_question())
        assert page.status_code == 200
        assert r.json()["ragloop"]["outcome"] == "context"


class TestClientDict:
    async def test_client_dict_holds_no_record(self, rag: ChatRAG) -> None:
        """Reply.client_dict has exactly turn_id, text, outcome, citations (n, title, source, url, the sections
        cited) and missing."""
        reply = await rag.ask("How do I rotate an API key?")
        out = reply.client_dict(lambda source: "https://x.example/" + source)
        assert set(out) == {"turn_id", "text", "outcome", "citations", "missing"}
        cited = next(c for c in out["citations"] if c["source"] == "api-keys.md")
        assert cited == {
            "n": cited["n"],
            "title": "API keys",
            "source": "api-keys.md",
            "url": "https://x.example/api-keys.md",
            "sections": cited["sections"],
        }
        assert cited["sections"] and all(set(s) == {"title", "url"} for s in cited["sections"])
        json.dumps(out)


class TestHostileInput:
    async def test_deeply_nested_json_is_a_400_not_a_crash(self, rag: ChatRAG) -> None:
        """[[[[…]]]] within the body limit makes json.loads recurse past Python's limit: still a 400."""
        deep = b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        async with asgi_client(create_app(rag, settings=ServeSettings(max_body_bytes=300_000))) as client:
            for path in ("/v1/chat/completions", "/api/chat"):
                r = await client.post(path, content=deep, headers={"content-type": "application/json"})
                assert r.status_code == 400, r.text
                assert r.json()["error"] == {
                    "message": "request body is nested too deeply to be a chat request",
                    "type": "invalid_request_error",
                    "param": "body",
                    "code": "invalid_json",
                }

    @pytest.mark.parametrize(
        ("path", "payload", "param"),
        [
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "rotate \ud800 key"}]},
                "messages[0].content",
            ),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]},
                "messages[0].content",
            ),
            ("/api/chat", {"message": "rotate \ud800 key", "new_session": True}, "message"),
            ("/api/chat", {"message": "q", "history": [{"role": "user", "content": "\udfff"}]}, "history[0].content"),
            ("/api/chat", {"message": "q", "page_title": "\ud800"}, "page_title"),
        ],
    )
    async def test_lone_surrogates_are_refused_before_they_reach_a_store(
        self, tmp_path: Any, path: str, payload: dict[str, Any], param: str
    ) -> None:
        """JSON's "\\ud800" decodes to no character: UTF-8 stores (SQLite sessions) and model clients choke on it."""
        from ragloop.serve import SQLiteSessionStore

        store = SQLiteSessionStore(tmp_path / "s.db")
        try:
            async with asgi_client(create_app(fake_rag(), sessions=store)) as client:
                # ASCII, "\\ud800" escaped
                r = await client.post(
                    path, content=json.dumps(payload).encode(), headers={"content-type": "application/json"}
                )
        finally:
            await store.aclose()
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param
        assert "lone surrogate" in error["message"]

    async def test_nul_bidi_and_emoji_in_a_question_are_answered(self, rag: ChatRAG) -> None:
        """Odd but valid Unicode is the chat's business, not a refusal or a crash."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post(
                "/api/chat",
                json={"message": "rotate\x00 \u202eapi\u202c key 🔑", "session_id": "a.b", "new_session": True},
            )
        assert r.status_code == 200
        assert sse_events(r.text)[-1][0] == "reply"

    @pytest.mark.parametrize(
        ("method", "path", "status"),
        [("GET", "/nope", 404), ("GET", "/v1/chat/completions", 405), ("PUT", "/api/chat", 405)],
    )
    async def test_unknown_paths_and_methods_get_json_errors(
        self, rag: ChatRAG, method: str, path: str, status: int
    ) -> None:
        """Starlette's 404/405 come in the same OpenAI error shape as every other refusal (its SDK reads them)."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.request(method, path)
        assert r.status_code == status
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert path in r.json()["error"]["message"]
        if status == 405:
            assert "POST" in r.headers["allow"]


class TestStoreOutage:
    """Every search failing is an outage (503 / an error event); some failing is not (the turn answers)."""

    def _rag(self, errors: Mapping[str, BaseException], queries: tuple[str, ...]) -> ChatRAG:
        from ragloop.state import Decision
        from ragloop.testing import FakeDecider
        from ragloop.turn import TurnSettings

        decide = FakeDecider(lambda q: Decision(queries=queries, reason="test"))
        # A 0.5 s search under the 3 s turn of _outage_app: a busy search queues again for 2 s (the room the
        # deadline leaves), not for the 50 s the defaults 5 s / 60 s would (the mapping to 503 is the same).
        settings = TurnSettings(retrieve_timeout_s=0.5)
        return fake_rag(retriever=FakeRetriever(DOCS, errors=errors), decide=decide, settings=settings)

    async def test_every_search_failing_is_a_503_and_an_error_event(self) -> None:
        """The store raises on every query: 503 store_unavailable for a whole completion, an error event (and no
        token of a "found nothing" answer) for /api/chat and a streamed completion."""
        rag = self._rag(_Every(ConnectionError("store down")), ("rotate api key",))
        async with asgi_client(_outage_app(rag)) as client:
            whole = await client.post("/v1/chat/completions", json=_question())
            sse = await client.post("/api/chat", json={"message": "rotate"})
            chunked = await client.post("/v1/chat/completions", json={**_question(), "stream": True})
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_unavailable"
        events = sse_events(sse.text)
        assert events[-1][0] == "error" and json.loads(events[-1][1])["error"]["code"] == "store_unavailable"
        assert "token" not in [name for name, _ in events]
        data = [d for _, d in sse_events(chunked.text)]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["type"] == "server_error"
        assert not any('"content":"none' in d for d in data)

    async def test_every_search_waiting_out_a_busy_store_is_503_store_busy_with_retry_after(self) -> None:
        """Every search raises StoreBusy (or times out): 503 store_busy with Retry-After, an error event store_busy
        when streaming — never store_unavailable, never a "found nothing" token (before: store_unavailable)."""
        from ragloop.errors import StoreBusy

        rag = self._rag(_Every(StoreBusy("no free connection (all 10 busy)")), ("rotate api key",))
        async with asgi_client(_outage_app(rag)) as client:
            whole = await client.post("/v1/chat/completions", json=_question())
            sse = await client.post("/api/chat", json={"message": "rotate"})
            metrics = (await client.get("/metrics")).text
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_busy", whole.text
        assert "busy" in whole.json()["error"]["message"] and int(whole.headers["retry-after"]) >= 1
        events = sse_events(sse.text)
        assert events[-1][0] == "error" and json.loads(events[-1][1])["error"]["code"] == "store_busy"
        assert "token" not in [name for name, _ in events]
        assert 'ragloop_requests_rejected_total{reason="store_busy"} 2.0' in metrics

    async def test_busy_and_down_searches_together_are_unavailable(self) -> None:
        """One search found the store busy, the other found it down: the turn is store_unavailable (down wins)."""
        from ragloop.errors import StoreBusy, StoreUnavailable

        errors = {"rotate api key": StoreBusy("all busy"), "broken shard": StoreUnavailable("refused")}
        rag = self._rag(errors, ("rotate api key", "broken shard"))
        async with asgi_client(_outage_app(rag)) as client:
            whole = await client.post("/v1/chat/completions", json=_question())
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_unavailable", whole.text

    async def test_a_partial_outage_still_answers(self) -> None:
        """One of two searches fails: the turn answers from the other (200, the found passages cited)."""
        rag = self._rag({"broken shard": ConnectionError("one shard down")}, ("rotate api key", "broken shard"))
        async with asgi_client(_outage_app(rag)) as client:
            r = await client.post("/v1/chat/completions", json=_question())
        assert r.status_code == 200, r.text
        assert r.json()["ragloop"]["citations"]


def _outage_app(rag: ChatRAG) -> Any:
    """The app of TestStoreOutage: 3 s turns, so a busy search re-queues for seconds, not the default minute."""
    return create_app(rag, settings=ServeSettings(deadline_s=3.0))


class _Every(Mapping[str, BaseException]):
    """A FakeRetriever ``errors`` mapping that fails every query (a store that is down), rewrites included."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> BaseException:
        return self.error

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class TestReadiness:
    async def test_readyz_probes_the_session_store_and_the_store(self, rag: ChatRAG) -> None:
        """A session store whose ping fails and a store probe that fails: 503 naming both, no error text."""

        class Down(MemorySessionStore):
            async def ping(self) -> None:
                raise OSError("10.0.0.7:5432 refused")

        async def store() -> bool:
            raise OSError("10.0.0.8:5432 refused")

        async with asgi_client(create_app(rag, sessions=Down(), store_check=store)) as client:
            r = await client.get("/readyz")
        assert r.status_code == 503
        checks = {"index": "ok", "model": "not configured", "sessions": "unavailable", "store": "unavailable"}
        assert r.json() == {"status": "not ready", "checks": checks}
        assert "10.0.0" not in r.text

    async def test_a_busy_store_is_ready_and_says_busy(self, rag: ChatRAG) -> None:
        """A store probe that finds every connection in use (StoreBusy): 200, the store's check 'busy' — a fleet
        on one busy database must not drop every replica from rotation at once."""
        from ragloop.errors import StoreBusy

        async def store() -> bool:
            raise StoreBusy("no free connection (all 10 busy)")

        async with asgi_client(create_app(rag, store_check=store)) as client:
            r = await client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["checks"]["store"] == "busy"


class TestHostAllowlistUnit:
    @pytest.mark.parametrize(
        ("header", "host"),
        [
            ("docs.example.com", "docs.example.com"),
            ("Docs.Example.COM:8443", "docs.example.com"),
            ("127.0.0.1:8000", "127.0.0.1"),
            ("[::1]:8000", "::1"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("example.com.", "example.com"),
            ("[::1", ""),
        ],
    )
    def test_host_of_strips_the_port_and_brackets(self, header: str, host: str) -> None:
        """The host name of a Host header: lower case, no port, no IPv6 brackets, no trailing dot."""
        from ragloop.serve._hosts import host_of

        assert host_of(header) == host

    async def test_a_missing_host_header_is_refused(self, rag: ChatRAG) -> None:
        """A request without Host (HTTP/1.0 style) is refused when an allowlist is set."""
        from ragloop.serve._hosts import HostAllowlist

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        app = HostAllowlist(create_app(rag), ["localhost"])
        await app({"type": "http", "headers": [], "method": "GET", "path": "/v1/models"}, receive, send)
        assert sent[0]["status"] == 400 and b"host_not_allowed" in sent[1]["body"]

    @pytest.mark.parametrize(
        ("chunks", "drained", "closes"), [([b"{}"], True, False), ([b"x" * 40_000] * 3, False, True)]
    )
    async def test_a_refused_body_is_read_before_the_answer(
        self, rag: ChatRAG, chunks: list[bytes], drained: bool, closes: bool
    ) -> None:
        """A refused POST's body is read before the 400 is sent, so the server never closes on unread bytes (which
        made the kernel reset the connection and a client saw ReadError instead of the 400, in CI); a body over
        64 KiB is not read, and the answer says the connection closes."""
        from ragloop.serve._hosts import HostAllowlist

        events: list[str] = []
        sent: list[dict[str, Any]] = []
        pending = list(chunks)

        async def send(message: dict[str, Any]) -> None:
            events.append("send")
            sent.append(message)

        async def receive() -> dict[str, Any]:
            events.append("receive")
            body = pending.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pending)}

        app = HostAllowlist(create_app(rag), ["localhost"])
        scope = {"type": "http", "headers": [(b"host", b"evil.example")], "method": "POST", "path": "/api/chat"}
        await app(scope, receive, send)
        assert sent[0]["status"] == 400 and b"host_not_allowed" in sent[1]["body"]
        assert events[-2:] == ["send", "send"] and "send" not in events[:-2]
        assert (not pending) is drained
        assert ((b"connection", b"close") in sent[0]["headers"]) is closes

    async def test_a_refused_body_that_never_arrives_is_answered_and_closed(self, rag: ChatRAG) -> None:
        """A client that sends a head and then nothing still gets its 400 (after the 1 s drain bound), and the
        connection is closed: a slow body cannot hold the refusal open."""
        from ragloop.serve._hosts import HostAllowlist

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            await anyio.sleep_forever()
            raise AssertionError

        app = HostAllowlist(create_app(rag), ["localhost"])
        scope = {"type": "http", "headers": [(b"host", b"evil.example")], "method": "POST", "path": "/api/chat"}
        with anyio.fail_after(10):
            await app(scope, receive, send)
        assert sent[0]["status"] == 400 and (b"connection", b"close") in sent[0]["headers"]


class TestPageSettings:
    @pytest.mark.parametrize(
        ("kwargs", "needle"),
        [
            ({"page_title": "  "}, "page_title must be 1-80 characters"),
            ({"page_title": "x" * 81}, "page_title must be 1-80 characters"),
            ({"page_colour": "red; background: url(x)"}, "page_colour must be #rgb, #rrggbb or a CSS colour name"),
            ({"page_colour": "#12"}, "page_colour must be"),
        ],
    )
    def test_a_bad_title_or_colour_is_refused_with_the_fix(self, kwargs: dict[str, str], needle: str) -> None:
        """A colour that could smuggle CSS, or an empty or overlong title, fails when the settings are made."""
        from ragloop.errors import ConfigError

        with pytest.raises(ConfigError, match=re.escape(needle)):
            ServeSettings(**kwargs)  # type: ignore[arg-type]

    async def test_the_page_carries_its_title_and_colour_and_a_matching_csp(self) -> None:
        """The served page holds the escaped title and the accent colour, and its CSP hashes the style as
        served (so the browser applies it)."""
        import base64
        import hashlib

        settings = ServeSettings(page_title='Acme "help" <centre>', page_colour="teal")
        async with asgi_client(create_app(fake_rag(), settings=settings)) as client:
            page = await client.get("/")
        html = page.text
        assert "<title>Acme &quot;help&quot; &lt;centre&gt;</title>" in html and "<centre>" not in html
        assert ":root { --accent: teal; }" in html
        style = re.search(r"<style>(.*?)</style>", html, re.S)
        assert style is not None
        digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
        assert f"style-src 'sha256-{digest}'" in page.headers["content-security-policy"]
