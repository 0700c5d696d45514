"""``POST /v1/responses`` through the real ``openai`` SDK behind a real uvicorn, and its refusals."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from ragloop.chat import ChatRAG
from ragloop.serve import ApiKey, ServeSettings, create_app
from ragloop.serve._responses import citation_notes
from ragloop.serve._responses_request import response_id, session_of
from ragloop.testing import FakeRetriever
from tests.serve.conftest import DOCS, StuckRag, asgi_client, fake_rag, serving, sse_events

pytestmark = pytest.mark.anyio

QUESTION = "How do I rotate an API key?"
KEYS = (ApiKey("alice", key="sk-alice"), ApiKey("bob", key="sk-bob"))


def sdk(url: str, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


class TestWithTheSDK:
    async def test_create_returns_text_annotations_usage_and_the_reply(self, sample_rag: ChatRAG) -> None:
        """responses.create: one message whose citations are url/file citation annotations on their [n] markers."""
        with serving(create_app(sample_rag)) as url:
            async with sdk(url) as client:
                response = await client.responses.create(model="ragloop", input=QUESTION)
        assert response.status == "completed" and response.usage is not None
        part = response.output[0].content[0]  # type: ignore[union-attr]
        extension = (response.model_extra or {})["ragloop"]
        assert response.output_text == extension["text"] and extension["outcome"] in ("context", "partial")
        assert len(part.annotations) == len(extension["citations"]) >= 1  # type: ignore[union-attr]
        for note, cite in zip(part.annotations, extension["citations"], strict=True):  # type: ignore[union-attr]
            if note.type == "url_citation":
                assert response.output_text[note.start_index : note.end_index] == f"[{cite['n']}]"
                assert note.title == cite["title"] and note.url == cite["url"]
            else:
                assert note.type == "file_citation" and note.file_id == cite["source"]

    async def test_stream_true_sends_the_apis_event_sequence(self, sample_rag: ChatRAG) -> None:
        """responses.create(stream=True): created, in_progress, item and part added, deltas, one annotation.added
        per citation, text done, part and item done, completed — numbered in order."""
        with serving(create_app(sample_rag)) as url:
            async with sdk(url) as client:
                stream = await client.responses.create(model="ragloop", input=QUESTION, stream=True)
                events = [event async for event in stream]
        kinds = [e.type for e in events]
        head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        assert kinds[:4] == head
        assert kinds[-4:] == [
            "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"
        ]  # fmt: skip
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        notes = [e for e in events if e.type == "response.output_text.annotation.added"]
        final = events[-1].response  # type: ignore[union-attr]
        assert len(deltas) > 3 and notes and len(notes) == len(final.output[0].content[0].annotations)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(d.delta for d in deltas) == final.output_text  # type: ignore[union-attr]

    async def test_the_stream_helper_and_previous_response_id(self, sample_rag: ChatRAG) -> None:
        """responses.stream gives the final response; previous_response_id continues that conversation."""
        with serving(create_app(sample_rag)) as url:
            async with sdk(url) as client:
                async with client.responses.stream(model="ragloop", input=QUESTION) as stream:
                    texts = [e.delta async for e in stream if e.type == "response.output_text.delta"]
                    first = await stream.get_final_response()
                follow = await client.responses.create(
                    model="ragloop", input="and how long does the old one keep working?", previous_response_id=first.id
                )
        assert "".join(texts) == first.output_text and first.status == "completed"
        assert follow.previous_response_id == first.id and session_of(follow.id) == session_of(first.id)

    async def test_a_foreign_response_id_is_unknown(self, rag: ChatRAG) -> None:
        """Bob continuing Alice's response gets the same 404 as for an id nobody has; store=false is not continuable."""
        with serving(create_app(rag, settings=ServeSettings(keys=KEYS))) as url:
            async with sdk(url, "sk-alice") as alice, sdk(url, "sk-bob") as bob:
                hers = await alice.responses.create(model="ragloop", input="rotate api key?")
                unstored = await alice.responses.create(model="ragloop", input="rotate api key?", store=False)
                errors = []
                for client, previous in ((bob, hers.id), (bob, response_id("made-up")), (alice, unstored.id)):
                    with pytest.raises(openai.NotFoundError) as caught:
                        await client.responses.create(model="ragloop", input="more?", previous_response_id=previous)
                    errors.append(caught.value.body["message"].replace(previous, "ID"))  # type: ignore[index]
                mine = await alice.responses.create(model="ragloop", input="more?", previous_response_id=hers.id)
        assert len(set(errors)) == 1 and mine.status == "completed"

    @pytest.mark.parametrize(
        ("extra", "param"),
        [
            ({"tools": [{"type": "web_search"}]}, "tools"),
            ({"background": True}, "background"),
            ({"conversation": "conv_1"}, "conversation"),
            ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
            ({"include": ["file_search_call.results"]}, "include"),
        ],
    )
    async def test_unsupported_fields_are_400s_naming_the_field(
        self, rag: ChatRAG, extra: dict[str, Any], param: str
    ) -> None:
        """A request's own tools, background, a conversation, structured output: 400 with the field, never ignored."""
        with serving(create_app(rag)) as url:
            async with sdk(url) as client:
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.responses.create(model="ragloop", input="q", **extra)
        assert caught.value.param == param  # type: ignore[attr-defined]


class TestRequestChecks:
    async def test_file_and_image_inputs_are_refused_by_position(self, rag: ChatRAG) -> None:
        """An input_file or input_image part is a 400 naming input[i].content[j]."""
        body = {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "what is in"},
                                             {"type": "input_file", "file_id": "file_1"}]}
            ]
        }  # fmt: skip
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/responses", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[1]"

    async def test_the_last_input_must_be_the_question(self, rag: ChatRAG) -> None:
        """Input that ends with an assistant message, or a function call output, is a 400 naming it."""
        async with asgi_client(create_app(rag)) as client:
            last = await client.post("/v1/responses", json={"input": [{"role": "assistant", "content": "hi"}]})
            call = await client.post(
                "/v1/responses", json={"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}
            )
        assert last.status_code == 400 and last.json()["error"]["param"] == "input[0].role"
        assert call.status_code == 400 and call.json()["error"]["param"] == "input[0]"

    async def test_limits_are_the_chat_endpoints(self, rag: ChatRAG) -> None:
        """The body limit, JSON only and the busy slots hold on /v1/responses as on /v1/chat/completions."""
        app = create_app(rag, settings=ServeSettings(max_body_bytes=500, max_concurrent_turns=1))
        async with asgi_client(app) as client:
            big = await client.post("/v1/responses", json={"input": "x" * 600})
            text = await client.post("/v1/responses", content=b"{}", headers={"content-type": "text/plain"})
        assert big.status_code == 413 and text.status_code == 415

    async def test_a_turn_that_fails_mid_stream_ends_with_response_failed(self) -> None:
        """A stream whose turn overruns its hard deadline ends with response.failed carrying the reason."""
        app = create_app(fake_rag(cls=StuckRag), settings=ServeSettings(deadline_s=0.1, deadline_grace_s=0.2))
        async with asgi_client(app) as client:
            r = await client.post("/v1/responses", json={"input": "q", "stream": True})
        events = sse_events(r.text)
        assert r.status_code == 200 and events[0][0] == "response.created"
        assert [name for name, _ in events].count("response.output_text.delta") == 1
        assert events[-1][0] == "response.failed" and "deadline" in events[-1][1]

    async def test_a_turn_stopped_at_its_deadline_is_incomplete(self, rag: ChatRAG) -> None:
        """A turn that answered with what it had at its deadline is status incomplete, reason deadline."""
        slow = fake_rag(retriever=FakeRetriever(DOCS, delays={"rotate api key": 5.0}))
        app = create_app(slow, settings=ServeSettings(deadline_s=0.3))
        async with asgi_client(app) as client:
            r = await client.post("/v1/responses", json={"input": "q"})
        body = r.json()
        assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "deadline"}


class TestCitationNotes:
    def test_notes_sit_on_their_markers(self) -> None:
        """A url citation spans its [n] marker; a file citation points after it; a missing marker: the end."""
        text = "Rotate it [1], then revoke [2]."
        notes = citation_notes(
            text,
            [
                {"n": 1, "title": "Keys", "source": "k.md", "url": "https://x/k"},
                {"n": 2, "title": "Revoke", "source": "r.md", "url": None},
                {"n": 3, "title": "Other", "source": "o.md", "url": None},
            ],
        )
        assert text[notes[0]["start_index"] : notes[0]["end_index"]] == "[1]"
        assert notes[1] == {"type": "file_citation", "file_id": "r.md", "filename": "Revoke", "index": 30}
        assert notes[2]["index"] == len(text)

    def test_ids_round_trip(self) -> None:
        """A response id names its session; an id the server did not make names none."""
        assert session_of(response_id("Ab_c-1")) == "Ab_c-1"
        assert session_of(response_id(None)) is None and session_of("resp_x") is None
