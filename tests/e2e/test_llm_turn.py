"""The chat turn end to end through the real ``openai`` SDK against the scripted OpenAI-compatible server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ragloop.chat import ChatRAG
from ragloop.retrievers.live import SQLiteTicketSource
from ragloop.testing import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    reply,
    server_error,
    stream,
    tool_calls,
    verdicts,
)
from ragloop.turn import TurnSettings

pytestmark = pytest.mark.anyio

Matcher = Callable[[RecordedRequest], ScriptedResponse]


def user_text(request: RecordedRequest) -> str:
    return str(request.messages[-1]["content"])


def matcher(
    *,
    decide: Callable[[str], ScriptedResponse],
    grade: Callable[[str], str] = lambda prompt: "relevant",
    rewrite: Callable[[str], str] = lambda prompt: "lumen account recovery procedure",
    answer: str = "From the docs: see [1].",
) -> Matcher:
    def match(request: RecordedRequest) -> ScriptedResponse:
        judge = request.judge
        if judge == "decide":
            return decide(user_text(request))
        if judge == "grade":
            return verdicts(request, grade(user_text(request)))
        if judge == "rewrite":
            return reply(rewrite(user_text(request)))
        return stream(answer, chunk_size=5)

    return match


def rag_for(server: ScriptedOpenAIServer, client: object, cache: Path, **kwargs: object) -> ChatRAG:
    return ChatRAG.sample(client, cache_dir=cache, fast_model="fast-model", answer_model="answer-model", **kwargs)  # type: ignore[arg-type]


async def test_greeting_takes_no_search(sample_cache: Path) -> None:
    """A greeting: one decide call, no tool call, no grading, no answer call; outcome direct."""
    m = matcher(decide=lambda q: reply("Hello! How can I help with Lumen today?"))
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0) as client:
        result = await rag_for(server, client, sample_cache).ask("hi there")
    assert result.outcome == "direct" and result.text.startswith("Hello!")
    assert [r.judge for r in server.chat_requests] == ["decide"]
    assert result.record.path == ("decide", "answer") and result.record.llm_calls == 1


async def test_two_topics_issue_two_parallel_searches(sample_cache: Path) -> None:
    """Two tool calls in one decide response become two searches graded per query, then one streamed answer."""
    m = matcher(
        decide=lambda q: tool_calls(
            [("search", {"query": "Lumen plan pricing per seat"}), ("search", {"query": "Lumen SAML SSO setup"})]
        )
    )
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0) as client:
        result = await rag_for(server, client, sample_cache).ask("Compare plan pricing and SSO setup")
    judges = [r.judge for r in server.chat_requests]
    decide_body = server.chat_requests[0].body
    assert decide_body["parallel_tool_calls"] is True and decide_body["model"] == "fast-model"
    assert result.record.decision.queries == ("Lumen plan pricing per seat", "Lumen SAML SSO setup")
    graded_queries = {g.query for g in result.record.grades}
    assert graded_queries == {"Lumen plan pricing per seat", "Lumen SAML SSO setup"}
    assert judges.count("answer") == 1 and judges[-1] == "answer"
    assert server.chat_requests[-1].body["model"] == "answer-model"
    assert result.outcome == "context" and result.text == "From the docs: see [1]."
    assert result.citations and result.citations[0].n == 1
    assert result.record.tokens.total > 0 and result.record.llm_calls == len(judges)


async def test_ticket_question_goes_live_and_rejects_wrong_id(sample_cache: Path) -> None:
    """Irrelevant KB hits for a ticket question trigger the live source; a neighbour's id is rejected."""
    m = matcher(
        decide=lambda q: tool_calls([("search", {"query": "status of Lumen support ticket #1234"})]),
        grade=lambda prompt: "irrelevant",
    )
    source = SQLiteTicketSource(related=True, require_caller=False)
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0) as client:
        rag = rag_for(server, client, sample_cache, live_sources=(source,))
        result = await rag.ask("What's the status of ticket #1234?")
        await rag.aclose()
    assert "live" in result.record.path
    lookup = result.record.live[0]
    assert lookup.accepted == ("1234",) and lookup.mismatches
    assert result.outcome == "context"
    answer_prompt = server.chat_requests[-1].messages[-1]["content"]
    assert "Ticket #1234" in answer_prompt
    assert all(f"Ticket #{m}:" not in answer_prompt for m in lookup.mismatches)


async def test_failed_retrieval_is_rewritten_then_answered_honestly(sample_cache: Path) -> None:
    """All hits irrelevant: rewrites from new angles up to the cap, then an honest 'none' answer."""
    angles = iter(["time machine repair coverage", "interstellar shipping insurance claims"])
    m = matcher(
        decide=lambda q: tool_calls([("search", {"query": "Lumen flux capacitor warranty"})]),
        grade=lambda prompt: "irrelevant",
        rewrite=lambda prompt: next(angles),
        answer="I could not find this in the Lumen docs.",
    )
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0) as client:
        result = await rag_for(server, client, sample_cache).ask("Is the flux capacitor under warranty?")
    assert result.outcome == "none" and result.missing == ("Lumen flux capacitor warranty",)
    assert [r.to for r in result.record.rewrites] == [
        "time machine repair coverage",
        "interstellar shipping insurance claims",
    ]
    rewrite_prompts = [user_text(r) for r in server.chat_requests if r.judge == "rewrite"]
    assert "time machine repair coverage" in rewrite_prompts[1]  # tried queries are shown to the model
    system = server.chat_requests[-1].messages[0]["content"]
    assert "UNTRUSTED_CONTEXT" not in server.chat_requests[-1].messages[-1]["content"]
    assert system != server.chat_requests[0].messages[0]["content"]
    assert result.text == "I could not find this in the Lumen docs."


async def test_faults_at_every_call_still_answer(sample_cache: Path) -> None:
    """Every LLM call failing (5xx, no retries): offline fallbacks decide and answer, grades fail open."""
    async with (
        ScriptedOpenAIServer(matcher=lambda r: server_error(503)) as server,
        server.client(max_retries=0) as client,
    ):
        result = await rag_for(server, client, sample_cache).ask("How many times are failed webhooks retried?")
    assert result.text and result.outcome in ("context", "partial", "none")
    record = result.record
    assert any(e.startswith("decide:") and "503" in e for e in record.errors)
    assert any(e.startswith("answer:") for e in record.errors)
    assert record.fail_open == len(record.grades) > 0
    assert all(c.error for c in record.calls if c.model != "offline")
    assert "8 times" in result.text  # the offline answerer still quotes the page


async def test_malformed_tool_arguments_fall_back(sample_cache: Path) -> None:
    """Malformed tool-call JSON from the model is recorded; the offline decider takes over."""
    m = matcher(decide=lambda q: tool_calls([("search", '{"query": "sso')]))
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0) as client:
        result = await rag_for(server, client, sample_cache).ask("How do I set up SAML single sign-on?")
    assert any("decide:" in e and "JudgeOutputError" in e for e in result.record.errors)
    assert result.record.decision.queries and result.outcome == "context"


async def test_deadline_still_answers(sample_cache: Path) -> None:
    """A slow model and a deadline too short for it: no model call is even sent, the offline judges answer in time
    and the record says which judge ran out of time."""
    m = matcher(decide=lambda q: reply("too late").delayed(3.0))
    async with ScriptedOpenAIServer(matcher=m) as server, server.client(max_retries=0, timeout_s=10) as client:
        rag = rag_for(server, client, sample_cache, settings=TurnSettings(deadline_s=0.3))
        result = await rag.ask("How do I rotate an API key?")
    assert result.text and result.record.seconds < 0.3 + 1.0
    record = json.loads(json.dumps(result.as_dict()))["record"]
    assert record["stopped_by"] in ("end", "deadline")
    assert any(c["judge"] == "decide" and "JudgeTimeout" in (c["error"] or "") for c in record["calls"])
