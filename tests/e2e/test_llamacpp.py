"""The model path against a real server: llama.cpp's own HTTP server with SmolLM2-135M (see tests/llamacpp_server.py).

SmolLM2's chat template has no tool support, so llama.cpp drops the ``search`` tool and the model answers in
plain text; ragloop must notice, decide with ``json_schema`` instead, grade with ``json_schema``, cap every
request and stream a non-empty answer. With ``tests/smollm2_tools.jinja`` as chat template the same model makes
real tool calls, which llama.cpp parses into ``tool_calls``: decide's tool path runs end to end. Output caps and
settings keep the whole file to a few dozen model calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from ragloop.chat import ChatRAG, ReplyReady
from ragloop.errors import JudgeOutputError
from ragloop.events import Token
from ragloop.llm.doctor import diagnose
from ragloop.llm.openai import OpenAIDecider, OpenAIJudges
from ragloop.sample import sample_index
from ragloop.state import PageContext
from ragloop.turn import Judges, Turn, TurnSettings
from tests.llamacpp_server import LlamaCppServer

pytestmark = [pytest.mark.anyio, pytest.mark.llamacpp]

#: Small caps: SmolLM2 runs to whatever cap it gets.
CAPS = {"decide": 32, "grade": 32, "rewrite": 16, "answer": 48}


def recording_client(
    server: LlamaCppServer, bodies: list[dict[str, Any]], tool_replies: list[dict[str, Any]] | None = None
) -> openai.AsyncOpenAI:
    """An SDK client for ``server`` that keeps every request body it sends, and into ``tool_replies`` the JSON
    the server answered to each request that offered tools (those are never streamed here)."""

    async def keep(request: Any) -> None:
        if request.url.path.endswith("/chat/completions"):
            bodies.append(json.loads(request.content))

    async def keep_reply(response: Any) -> None:
        if tool_replies is not None and "tools" in json.loads(response.request.content or b"{}"):
            tool_replies.append(json.loads(await response.aread()))

    hooks = {"request": [keep], "response": [keep_reply]}
    http = openai.DefaultAsyncHttpxClient(event_hooks=hooks, timeout=120.0)
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, http_client=http)


def _rag(
    client: openai.AsyncOpenAI,
    model: str,
    sample_cache: Path,
    caps: dict[str, int] = CAPS,
    settings: TurnSettings | None = None,
    **judge_options: Any,
) -> tuple[ChatRAG, Any]:
    """A real turn over the sample knowledge base with the OpenAI judges on ``client`` (every output capped)."""
    index = sample_index(sample_cache)
    offline = Judges.offline([c.text for c in index.chunks])
    judges = OpenAIJudges.create(
        client,
        fast_model=model,
        answer_model=model,
        timeout_s=300.0,  # generous: a loaded 2-core machine runs SmolLM2 at a few tokens per second
        grade_max_chars=300,
        max_tokens=caps,
        **judge_options,
    )
    if settings is None:
        settings = TurnSettings(
            max_queries=2, k=2, per_query_budget=2, total_budget=3, max_attempts=0, grade_concurrency=1
        )
    model_judges = Judges(
        decider=judges.decider,
        grader=judges.grader,
        rewriter=judges.rewriter,
        answerer=judges.answerer,
        fallback_decider=offline.decider,
        fallback_answerer=offline.answerer,
    )
    rag = ChatRAG(Turn(index.retriever("hybrid"), model_judges, settings=settings))
    return rag, judges


async def test_doctor_reports_what_llamacpp_supports(llamacpp: LlamaCppServer) -> None:
    """Tools dropped (SmolLM2's template), json_schema enforced, streaming with usage, the cap honoured, one slot:
    decide mode json."""
    async with openai.AsyncOpenAI(base_url=llamacpp.base_url, api_key="none", max_retries=0, timeout=120) as client:
        report = await diagnose(client, llamacpp.model, max_tokens=24)
    probes = {p.name: p for p in report.probes}
    assert probes["models"].status == "ok" and "smollm2" in probes["models"].detail
    assert report.slots == 1 and "no tool support" in probes["server"].detail
    assert probes["tool calls"].status == "warn" and probes["tool calls"].detail.startswith("dropped")
    assert probes["json_schema"].status == "ok"
    assert probes["streaming"].status == "ok" and probes["output cap"].status == "ok"
    assert report.decide_mode == "json"


async def test_turn_against_llamacpp(llamacpp: LlamaCppServer, sample_cache: Path) -> None:
    """A whole turn: never a direct reply to a real question, decide and grading through json_schema, every
    request capped, the answer streamed and non-empty, with an outcome and a decision record."""
    bodies: list[dict[str, Any]] = []
    client = recording_client(llamacpp, bodies)
    rag, judges = _rag(client, llamacpp.model, sample_cache)
    tokens: list[str] = []
    reply = None
    async with client:
        async for event in rag.stream("How do I rotate an API key?", deadline_s=900.0):
            if isinstance(event, Token):
                tokens.append(event.text)
            elif isinstance(event, ReplyReady):
                reply = event.reply
    assert reply is not None and reply.text.strip() and reply.outcome in ("context", "partial", "none")
    record = reply.record.as_dict()
    assert record["decision"]["queries"] and not record["decision"]["direct"]
    assert isinstance(judges.decider, OpenAIDecider) and judges.decider.mode_in_use == "json"
    kinds = [_kind(b) for b in bodies]
    assert kinds[:2] == ["decide", "decide_json"] and "grade" in kinds and kinds[-1] == "answer"
    for body, kind in zip(bodies, kinds, strict=True):  # a per-query grading call gets the grade cap per passage
        cap, sent = CAPS[kind.removesuffix("_json")], body.get("max_completion_tokens")
        assert sent == cap or (kind == "grade" and isinstance(sent, int) and sent % cap == 0)
    assert len(tokens) > 1 and record["llm_calls"] == len(bodies)


class TestToolCallsAgainstLlamaCpp:
    """SmolLM2 under ``tests/smollm2_tools.jinja``: real ``tool_calls`` from llama.cpp, decide in ``tools`` mode."""

    async def test_doctor_reports_tool_calls_honoured(self, llamacpp_tools: LlamaCppServer) -> None:
        """The template has tool support, a search call comes back, json_schema still works: decide mode tools."""
        async with openai.AsyncOpenAI(
            base_url=llamacpp_tools.base_url, api_key="none", max_retries=0, timeout=120
        ) as client:
            report = await diagnose(client, llamacpp_tools.model, max_tokens=24)
        probes = {p.name: p for p in report.probes}
        assert "chat template has tool support" in probes["server"].detail
        assert probes["tool calls"].status == "ok" and probes["tool calls"].detail.startswith("honoured: search(")
        assert probes["json_schema"].status == "ok"
        assert report.decide_mode == "tools"

    async def test_turn_decides_with_a_real_tool_call(self, llamacpp_tools: LlamaCppServer, sample_cache: Path) -> None:
        """One decide request offering the tool, answered with a parsed search call; the search ran with the model's
        query; no json_schema fallback; the streamed reply is non-empty and cites only the blocks it was given."""
        bodies: list[dict[str, Any]] = []
        tool_replies: list[dict[str, Any]] = []
        client = recording_client(llamacpp_tools, bodies, tool_replies)
        caps = {**CAPS, "decide": 64}  # room for one whole <tool_call> block
        rag, judges = _rag(client, llamacpp_tools.model, sample_cache, caps, decide_mode="tools")
        tokens: list[str] = []
        reply = None
        async with client:
            async for event in rag.stream("How do I rotate an API key?", deadline_s=900.0):
                if isinstance(event, Token):
                    tokens.append(event.text)
                elif isinstance(event, ReplyReady):
                    reply = event.reply
        assert reply is not None and reply.text.strip() and len(tokens) > 1
        kinds = [_kind(b) for b in bodies]
        assert kinds[0] == "decide" and kinds.count("decide") == 1 and "decide_json" not in kinds
        assert bodies[0]["tool_choice"] == "auto" and bodies[0]["tools"][0]["function"]["name"] == "search"
        (answered,) = tool_replies
        choice = answered["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"]
        calls = [c["function"] for c in choice["message"]["tool_calls"]]
        assert all(c["name"] == "search" for c in calls)
        model_queries = [" ".join(json.loads(c["arguments"])["query"].split()) for c in calls]
        record = reply.record.as_dict()
        assert not record["decision"]["direct"] and record["decision"]["reason"].startswith("model called search")
        assert list(record["decision"]["queries"]) == list(dict.fromkeys(model_queries))
        searched = [q for q in record["queries"] if q["attempt"] == 0]
        assert [q["text"] for q in searched] == list(record["decision"]["queries"])
        assert all(q["error"] is None for q in searched) and sum(q["hits"] for q in searched) > 0
        assert isinstance(judges.decider, OpenAIDecider) and judges.decider.mode_in_use == "tools"
        assert not judges.decider.compat.tools_dropped
        given = {b.n for b in reply.blocks}
        assert {c.n for c in reply.citations} <= given
        assert all(b.query in record["decision"]["queries"] for b in reply.blocks)

    async def test_small_talk_is_answered_in_text_with_tools_offered(self, llamacpp_tools: LlamaCppServer) -> None:
        """A greeting with the tool offered comes back as text, which the decider takes as a direct reply."""
        async with openai.AsyncOpenAI(
            base_url=llamacpp_tools.base_url, api_key="none", max_retries=0, timeout=120
        ) as client:
            decider = OpenAIDecider(client, llamacpp_tools.model, mode="tools", timeout_s=300.0, max_tokens=24)
            decision = await decider.decide("hello!", (), PageContext())
        assert decision.reply and not decision.queries

    async def test_a_call_cut_by_the_cap_is_never_searched(self, llamacpp_tools: LlamaCppServer) -> None:
        """Capped at 8 tokens, the model stops inside its <tool_call>: the decider raises instead of searching
        with half a query (the turn then falls back to the offline decider)."""
        async with openai.AsyncOpenAI(
            base_url=llamacpp_tools.base_url, api_key="none", max_retries=0, timeout=120
        ) as client:
            decider = OpenAIDecider(client, llamacpp_tools.model, mode="tools", timeout_s=300.0, max_tokens=8)
            with pytest.raises(JudgeOutputError):
                await decider.decide("How do I rotate an API key?", (), PageContext())


def _kind(body: dict[str, Any]) -> str:
    schema = (body.get("response_format") or {}).get("json_schema") or {}
    if "tools" in body:
        return "decide"
    if schema.get("name") == "search_decision":
        return "decide_json"
    if schema:
        return "grade"
    return "answer" if body.get("stream") else "rewrite"


def _llm_rag(client: openai.AsyncOpenAI, llamacpp: LlamaCppServer, cache: Path) -> ChatRAG:
    """The sample knowledge base over llama.cpp's server, small caps, one query, the offline judges behind it."""
    settings = TurnSettings(max_queries=1, k=2, per_query_budget=2, total_budget=2, max_attempts=0, grade_concurrency=1)
    return _rag(client, llamacpp.model, cache, settings=settings)[0]


async def test_answer_guarantees_hold_for_a_real_weak_model(llamacpp: LlamaCppServer, sample_cache: Path) -> None:
    """Whatever SmolLM2 writes: an answered turn cites only blocks it was given, never an empty reply; a
    question the knowledge base does not cover is abstained on before the model answers (no context sent), and
    the reply cites nothing."""
    import re

    bodies: list[dict[str, Any]] = []
    client = recording_client(llamacpp, bodies)
    rag = _llm_rag(client, llamacpp, sample_cache)
    async with client:
        answered = await rag.ask("How do I rotate an API key?", deadline_s=900.0)
        outside = await rag.ask("How do I deploy Lumen on Kubernetes?", deadline_s=900.0)
    for reply in (answered, outside):
        assert reply.text.strip()
        assert {c.n for c in reply.citations} <= {b.n for b in reply.blocks}
        assert {int(n) for n in re.findall(r"\[(\d+)\]", reply.text)} <= {b.n for b in reply.blocks}
    assert outside.outcome == "none" and not outside.citations and outside.record.abstention is not None
    last_answer = [b for b in bodies if _kind(b) == "answer"][-1]
    assert "UNTRUSTED_CONTEXT" not in json.dumps(last_answer["messages"][-1])


async def test_gap_questions_sorted_by_a_real_weak_model(llamacpp: LlamaCppServer) -> None:
    """``ragloop gaps --model``'s one call against llama.cpp: JSON mode (llama.cpp's grammar), output capped, and
    whatever SmolLM2 writes is read without raising, one place per question, as a hint only."""
    from ragloop.gaps import sort_topics

    bodies: list[dict[str, Any]] = []
    questions = [
        "Do you support e-signatures on contracts?",
        "Can clients approve a quote DocuSign-style?",
        "Is there a dark mode?",
        "Can the screen go black at night?",
    ]
    async with recording_client(llamacpp, bodies) as client:
        got = await sort_topics(client, llamacpp.model, questions, timeout_s=120)
    assert [b["response_format"]["type"] for b in bodies] == ["json_schema"] and bodies[0]["max_tokens"] <= 112
    assert len(got.topic_of) == 4 and all(t >= -1 for t in got.topic_of)
    assert got.note.startswith("the model sorted") or "held no topics list" in got.note, got.note


async def test_a_second_grading_request_reuses_the_first_ones_instructions(llamacpp: LlamaCppServer) -> None:
    """The grader's system prompt names its fresh nonce only in its last line, so llama.cpp takes all the lines
    before it from its cache for the next grading request: the server reports most of that request's prompt as
    cached (``prompt_tokens_details.cached_tokens``), and the call records it. With the nonce in the second line,
    as before, two requests shared a few dozen tokens."""
    import contextlib

    from ragloop.errors import JudgeError
    from ragloop.llm.openai import OpenAIGrader
    from ragloop.state import Chunk, Hit
    from ragloop.usage import UsageMeter, metering

    def hit(text: str, source: str) -> Hit:
        return Hit(Chunk(source, text, source, source.removesuffix(".md")), 1.0, 0.5)

    meter = UsageMeter()
    async with openai.AsyncOpenAI(base_url=llamacpp.base_url, api_key="none", max_retries=0, timeout=120) as client:
        grader = OpenAIGrader(client, llamacpp.model, timeout_s=120.0, max_chars=300, max_tokens=24)
        with metering(meter):
            for query, passage, source in (
                ("rotate an API key", "Create the new key, deploy it, then revoke the old one.", "api-keys.md"),
                ("export a workspace", "Owners export every project as CSV or JSON from Settings.", "export.md"),
            ):
                with contextlib.suppress(JudgeError):  # SmolLM2's verdict may be cut at the cap: not the point
                    await grader.grade(query, hit(passage, source))
    first, second = meter.calls
    assert first.prompt_tokens > 200 and second.prompt_tokens > 200
    assert second.cached_prompt_tokens >= 0.6 * second.prompt_tokens, (second.cached_prompt_tokens, second)
    assert meter.cached_prompt_tokens >= second.cached_prompt_tokens
