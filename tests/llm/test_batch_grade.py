"""Per-query grading in one call: the batch prompt, its parser, and the real SDK against the scripted server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import openai
import pytest

from ragloop.errors import JudgeOutputError
from ragloop.llm.batch_grade import batch_response_format, parse_verdicts
from ragloop.llm.openai import OpenAIGrader
from ragloop.llm.prompts import FENCE_OPEN
from ragloop.nodes.grade import Grade
from ragloop.policy import RoutingPolicy
from ragloop.state import Chunk, Hit, QueryState, TurnState
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, error, json_reply, reply
from ragloop.usage import UsageMeter, metering

pytestmark = pytest.mark.anyio


def _hit(i: int, text: str) -> Hit:
    return Hit(chunk=Chunk(id=f"doc#{i}", text=text, source=f"docs/{i}.md", title=f"T{i}"), score=1.0 - i / 10)


HITS = (
    _hit(1, "Keys expire after their TTL in seconds."),
    _hit(2, "The Business plan costs 12 dollars per seat."),
    _hit(3, "Use EXPIRE to set a timeout on a key. " * 200),
)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAIServer]:
    """A running scripted server."""
    async with ScriptedOpenAIServer() as running:
        yield running


@pytest.fixture
async def client(server: ScriptedOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client that never retries."""
    async with server.client(max_retries=0, timeout_s=5.0) as sdk:
        yield sdk


class TestParseVerdicts:
    def test_one_verdict_per_id_in_order(self) -> None:
        """Verdicts land on their ids whatever order the reply lists them in."""
        content = json.dumps(
            {
                "verdicts": [
                    {"id": "2", "label": "irrelevant", "reason": "pricing"},
                    {"id": "1", "label": "relevant", "reason": "ttl"},
                ]
            }
        )
        out = parse_verdicts(content, 2)
        assert [v.label if v else None for v in out] == ["relevant", "irrelevant"]
        assert out[1] is not None and out[1].reason == "pricing"

    def test_missing_unknown_and_invalid_are_none(self) -> None:
        """A missing id, an id out of range and an invalid label leave that passage without a verdict."""
        content = json.dumps(
            {
                "verdicts": [
                    {"id": "1", "label": "relevant", "reason": ""},
                    {"id": "3", "label": "maybe", "reason": ""},
                    {"id": "9", "label": "relevant", "reason": ""},
                ]
            }
        )
        assert [v.label if v else None for v in parse_verdicts(content, 4)] == ["relevant", None, None, None]

    def test_cut_reply_keeps_complete_verdicts(self) -> None:
        """A reply cut mid-way keeps every verdict object that was complete."""
        content = '{"verdicts": [{"id": "1", "label": "partial", "reason": "a"}, {"id": "2", "label": "rel'
        assert [v.label if v else None for v in parse_verdicts(content, 2)] == ["partial", None]

    def test_no_valid_verdict_raises(self) -> None:
        """A reply with no usable verdict at all is an output error (the whole batch fails open)."""
        with pytest.raises(JudgeOutputError, match="no valid verdict"):
            parse_verdicts("I think they are all fine.", 3)

    def test_schema_enumerates_the_ids(self) -> None:
        """The json_schema format allows exactly the ids of this batch."""
        schema = batch_response_format(3)["json_schema"]["schema"]
        assert schema["properties"]["verdicts"]["items"]["properties"]["id"]["enum"] == ["1", "2", "3"]


def _verdicts_without(missing: str) -> object:
    def match(request: RecordedRequest) -> ScriptedResponse:
        n = request.messages[-1]["content"].count(f"{FENCE_OPEN} id=")
        ids = [str(i) for i in range(1, n + 1) if str(i) != missing]
        return json_reply({"verdicts": [{"id": i, "label": "irrelevant", "reason": "scripted"} for i in ids]})

    return match


class TestThroughTheSDK:
    async def test_one_request_per_query_and_fail_open_for_a_missing_verdict(self) -> None:
        """Two queries' six hits cost two grading requests; the passage the reply skipped is kept, fail-open."""
        async with ScriptedOpenAIServer(matcher=_verdicts_without("2")) as server, server.client(max_retries=0) as sdk:
            grade = Grade(
                OpenAIGrader(sdk, "fast", max_chars=300),
                policy=RoutingPolicy(max_attempts=0, max_hops=0),
                min_relevant=1,
                timeout_s=5.0,
                max_concurrency=4,
            )
            state = TurnState(question="ttl and pricing?")
            state.queries = {q: QueryState(q, q, hits=list(HITS)) for q in ("key ttl", "plan price")}
            meter = UsageMeter()
            with metering(meter):
                await grade(state)
        grading = server.chat_requests
        assert len(grading) == 2
        assert sum(c.judge == "grade" for c in meter.calls) == 2
        for request in grading:
            assert request.body["response_format"]["json_schema"]["name"] == "relevance_verdicts"
            user = request.messages[-1]["content"]
            assert user.count(f"{FENCE_OPEN} id=") == 3
            assert "[truncated]" in user  # the long passage is cut to the per-passage budget
            assert len(user) < 3 * 300 + 1200
        by_id = {(g.query, g.hit.id): g.verdict for g in state.graded}
        assert len(by_id) == 6
        for query in ("key ttl", "plan price"):
            skipped = by_id[(query, "doc#2")]
            assert skipped.fail_open and skipped.label == "relevant"
            assert "no valid verdict" in skipped.reason
            assert by_id[(query, "doc#1")].label == "irrelevant" and not by_id[(query, "doc#1")].fail_open

    async def test_json_object_fallback(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A server that rejects json_schema gets the same batch in JSON mode, and keeps getting JSON mode."""
        ok = json_reply({"verdicts": [{"id": "1", "label": "relevant", "reason": "ttl"}]})
        server.enqueue(
            error(400, "response_format type 'json_schema' is not supported", error_type="invalid_request"), ok, ok
        )
        grader = OpenAIGrader(client, "fast")
        for _ in range(2):
            out = await grader.grade_batch("key ttl", HITS[:1])
            assert out[0] is not None and out[0].label == "relevant"
        formats = [r.body["response_format"]["type"] for r in server.requests]
        assert formats == ["json_schema", "json_object", "json_object"]
        assert not grader.uses_json_schema

    async def test_garbage_reply_fails_the_batch(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """A reply with no verdict at all is an output error the node fails open on."""
        server.enqueue(reply("all good"))
        with pytest.raises(JudgeOutputError):
            await OpenAIGrader(client, "fast").grade_batch("key ttl", HITS[:2])


@pytest.mark.parametrize("content", ["[" * 100_000, '{"verdicts": ' + "[" * 100_000 + "}"])
def test_a_reply_nested_too_deep_to_read_is_an_output_error(content: str) -> None:
    """A lying model's ``[[[[…`` is a ``JudgeOutputError`` (the passages are kept, fail-open, by the grade node),
    never a ``RecursionError`` the node cannot name."""
    with pytest.raises(JudgeOutputError):
        parse_verdicts(content, 3)
