"""Tests for ragloop.llm.openai._plan (the model planner, the SQL writer) through the real SDK and a scripted server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from ragloop._redact import redact
from ragloop.errors import JudgeError, JudgeOutputError, JudgeTruncated, QueryRefused
from ragloop.llm.openai import OpenAIPlanner, OpenAISQLWriter, plan_from_json
from ragloop.plan import build_waves
from ragloop.retrievers.sources import DocumentSource
from ragloop.retrievers.sql import SQLiteSource
from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path
from ragloop.testing import FakeRetriever, ScriptedOpenAIServer, ScriptedResponse, error, json_reply, reply
from ragloop.usage import UsageMeter, metering

pytestmark = pytest.mark.anyio

PLAN = {
    "needs_sources": True,
    "intent": "customer plan, then its price",
    "notes": "cite the row for the plan",
    "subqueries": [
        {
            "id": "sql1",
            "source": "sql",
            "query": "plan of Harbor Lane Bank",
            "depends_on": [],
            "purpose": "find the plan",
            "slots": [],
            "filters": [],
        },
        {
            "id": "docs1",
            "source": "documents",
            "query": "{plan} plan price per seat",
            "depends_on": ["sql1"],
            "purpose": "price",
            "slots": [{"name": "plan", "from": "sql1", "column": "plan"}],
            "filters": [],
        },
    ],
}


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAIServer]:
    """A running scripted server."""
    async with ScriptedOpenAIServer() as running:
        yield running


@pytest.fixture
async def client(server: ScriptedOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    """An SDK client for the scripted server, no retries."""
    async with server.client() as c:
        yield c


def _planner(client: openai.AsyncOpenAI) -> OpenAIPlanner:
    sources = (SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW), DocumentSource(FakeRetriever()))
    return OpenAIPlanner(client, "planner-model", sources)


class TestOpenAIPlanner:
    async def test_plan_from_structured_output(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """The model's JSON becomes a typed plan with two waves; the call is metered."""
        server.enqueue(json_reply(PLAN, usage=(120, 40)))
        meter = UsageMeter()
        with metering(meter):
            plan = await _planner(client).plan("What plan is Harbor Lane Bank on and what does it cost?")
        assert plan is not None
        assert build_waves(plan.subqueries) == (("sql1",), ("docs1",))
        assert plan.subqueries[1].slots[0].column == "plan"
        assert [(c.judge, c.model, c.prompt_tokens) for c in meter.calls] == [("plan", "planner-model", 120)]

    async def test_request_shape(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """Temperature 0, a strict JSON schema whose source is an enum, the allowlisted schema in the prompt."""
        server.enqueue(json_reply(PLAN))
        await _planner(client).plan("q?")
        body = server.requests[0].body
        assert body["temperature"] == 0.0 and body["max_completion_tokens"] == 800
        schema = body["response_format"]["json_schema"]["schema"]
        source = schema["properties"]["subqueries"]["items"]["properties"]["source"]
        assert source["enum"] == ["sql", "documents"]
        system = server.requests[0].messages[0]["content"]
        assert "customers(id INTEGER" in system and "plan is one of Business, Enterprise, Free, Team" in system
        assert "secrets" not in system and "api_token" not in system
        assert server.requests[0].messages[-1] == {"role": "user", "content": "q?"}

    async def test_no_sources_needed(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """needs_sources false means no plan: the decide route."""
        server.enqueue(json_reply({"needs_sources": False, "intent": "", "notes": "", "subqueries": []}))
        assert await _planner(client).plan("hi") is None

    async def test_bad_json(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A reply that is not JSON is a JudgeOutputError (the node falls back to the offline planner)."""
        server.enqueue(reply("sure! here is a plan"))
        with pytest.raises(JudgeOutputError, match="not JSON"):
            await _planner(client).plan("q")

    async def test_output_cap(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A plan cut at the output cap is a JudgeOutputError that says so (the node falls back)."""
        server.enqueue(reply('{"needs_sources": true, "subq', finish_reason="length"))
        with pytest.raises(JudgeOutputError, match="output cap"):
            await _planner(client).plan("q")

    async def test_server_rejecting_max_completion_tokens_gets_max_tokens(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """The planner shares the judges' call path: a 400 naming max_completion_tokens is retried with max_tokens,
        and the server's answer is learned for the next call (ServerCompat)."""
        server.enqueue(error(400, "Unrecognized request argument supplied: max_completion_tokens"))
        server.enqueue(json_reply(PLAN))
        planner = _planner(client)
        assert await planner.plan("q") is not None
        assert "max_completion_tokens" in server.requests[0].body and server.requests[1].body["max_tokens"] == 800
        assert planner.compat.cap_param == "max_tokens"

    async def test_body_that_is_not_json(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A 200 whose body is not JSON (a proxy's error page) is a JudgeOutputError, not a crash."""
        server.enqueue(ScriptedResponse(raw_body=b"<html>bad gateway</html>"))
        with pytest.raises(JudgeOutputError, match="a body that is not JSON"):
            await _planner(client).plan("q")

    async def test_finish_reason_and_failure_metered(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """Every plan call is recorded with its finish reasons; a cut plan is JudgeTruncated and recorded too."""
        server.enqueue(json_reply(PLAN, usage=(10, 5)))
        server.enqueue(reply('{"needs_sources": true', finish_reason="length"))
        meter = UsageMeter()
        with metering(meter):
            await _planner(client).plan("q")
            with pytest.raises(JudgeTruncated, match="output cap"):
                await _planner(client).plan("q")
        assert [c.finish_reasons for c in meter.calls] == [("stop",), ("length",)]
        assert meter.calls[0].error is None and "JudgeTruncated" in (meter.calls[1].error or "")

    async def test_server_message_is_withheld_from_records(
        self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI
    ) -> None:
        """A failing server's own words are quoted as upstream text, which the decision record withholds."""
        server.enqueue(error(500, "worker db-primary.internal:5432 lost its connection"))
        with pytest.raises(JudgeError, match="HTTP 500") as caught:
            await _planner(client).plan("q")
        assert "db-primary.internal" not in redact(str(caught.value))
        assert "server message withheld" in redact(str(caught.value))

    def test_malformed_subquery(self) -> None:
        """A sub-query without its fields is a JudgeOutputError naming the problem."""
        with pytest.raises(JudgeOutputError, match="malformed"):
            plan_from_json({"needs_sources": True, "subqueries": [{"id": "a"}]})


class TestOpenAISQLWriter:
    async def test_sql_and_params(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """The writer's statement runs through the checks and binds its parameters."""
        server.enqueue(
            json_reply(
                {"sql": "SELECT plan FROM customers WHERE name = ?", "params": ["Harbor Lane Bank"], "reason": ""}
            )
        )
        source = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, OpenAISQLWriter(client, "sql-model"))
        result = await source.run("plan of Harbor Lane Bank", {})
        assert [r["plan"] for r in result.rows] == ["Enterprise"]
        assert len(source.statements) == 1
        assert source.statements[0].startswith("SELECT plan, customers.id FROM (SELECT ")  # read through its allowlist
        assert source.statements[0].endswith(") AS customers WHERE name = ? LIMIT 50")

    async def test_model_says_it_cannot(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """An empty statement is a refusal carrying the model's reason."""
        server.enqueue(json_reply({"sql": "", "params": [], "reason": "no churn dates in the schema"}))
        writer = OpenAISQLWriter(client, "sql-model")
        source = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, writer)
        with pytest.raises(QueryRefused, match="no churn dates in the schema"):
            await source.run("churn last quarter", {})

    async def test_model_write_is_refused(self, server: ScriptedOpenAIServer, client: openai.AsyncOpenAI) -> None:
        """A model that proposes a write is refused before anything runs."""
        server.enqueue(json_reply({"sql": "DELETE FROM customers", "params": [], "reason": ""}))
        source = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, OpenAISQLWriter(client, "sql-model"))
        with pytest.raises(QueryRefused, match="starts with 'DELETE'"):
            await source.run("remove everyone", {})
        assert source.statements == []
