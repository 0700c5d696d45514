"""The turn's promises against a badly behaved model server (issue 11's seven failures), through the real SDK.

Each test scripts one way a real server (llama.cpp with a tiny model, a proxy, a queueing server) broke a turn:
a server that never answers, tools dropped from the prompt, no output cap, truncation, server-side queueing,
garbage rewrites and a library that printed.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from attrs import evolve

from ragloop.chat import ChatRAG, Reply
from ragloop.errors import JudgeOutputError, JudgeTruncated
from ragloop.llm.openai import OpenAIDecider, OpenAIJudges, OpenAIRewriter
from ragloop.sample import sample_index
from ragloop.state import PageContext
from ragloop.testing import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    error,
    json_reply,
    reply,
    stream,
    tool_calls,
    verdicts,
)
from ragloop.turn import Judges, Turn, TurnSettings

pytestmark = pytest.mark.anyio

QUESTION = "How do I rotate an API key?"


def kind(request: RecordedRequest) -> str:
    """Which call a request is: decide (tools), decide_json, grade, rewrite or answer."""
    body: dict[str, Any] = request.body if isinstance(request.body, dict) else {}
    schema = (body.get("response_format") or {}).get("json_schema") or {}
    if "tools" in body:
        return "decide"
    if schema.get("name") == "search_decision":
        return "decide_json"
    if "response_format" in body:
        return "grade"
    return "answer" if body.get("stream") else "rewrite"


def scripted(**by_kind: Callable[[RecordedRequest], ScriptedResponse]) -> Callable[[RecordedRequest], ScriptedResponse]:
    """A matcher: per kind of call a response builder; sensible defaults for the rest."""
    defaults: dict[str, Callable[[RecordedRequest], ScriptedResponse]] = {
        "decide": lambda r: tool_calls([("search", {"query": "rotate API key"})]),
        "decide_json": lambda r: json_reply({"action": "search", "queries": ["rotate API key"], "reply": ""}),
        "grade": lambda r: verdicts(r, "relevant"),
        "rewrite": lambda r: reply("api key rotation steps"),
        "answer": lambda r: stream("Rotate it under Settings, API keys [1].", chunk_size=8),
    }
    defaults.update(by_kind)
    return lambda request: defaults[kind(request)](request)


def llm_rag(client: openai.AsyncOpenAI, cache: Path, settings: TurnSettings = TurnSettings(), **judges: Any) -> ChatRAG:
    """The sample knowledge base with OpenAI judges over ``client`` and the offline judges as fallbacks."""
    index = sample_index(Path(cache))
    offline = Judges.offline([c.text for c in index.chunks])
    bundle = OpenAIJudges.create(client, fast_model="fast", answer_model="big", **judges)
    model = Judges(
        decider=bundle.decider,
        grader=bundle.grader,
        rewriter=bundle.rewriter,
        answerer=bundle.answerer,
        fallback_decider=offline.decider,
        fallback_answerer=offline.answerer,
    )
    return ChatRAG(Turn(index.retriever("hybrid"), model, settings=settings))


def record(result: Reply) -> dict[str, Any]:
    """The decision record as the JSON it is logged and served as."""
    out: dict[str, Any] = json.loads(json.dumps(result.as_dict()))["record"]
    return out


def calls(rec: dict[str, Any], judge: str) -> list[dict[str, Any]]:
    """The model calls (not the offline judges') of one judge in the record."""
    return [c for c in rec["calls"] if c["judge"] == judge and c["model"] != "offline"]


class TestSlowServer:
    """Failure 1: a slow or silent server used up the whole deadline and the reply came back empty."""

    async def test_server_that_never_answers_gets_an_offline_answer_in_time(self, sample_cache: Path) -> None:
        """Every request hangs: decide and answer time out within their budgets, the offline judges answer before
        deadline + grace (the answer step may use the grace), and the record names the judges that timed out
        and after how long."""
        never = scripted(**dict.fromkeys(["decide", "decide_json", "grade", "rewrite", "answer"], _hang))
        async with ScriptedOpenAIServer(matcher=never) as server, server.client(max_retries=2, timeout_s=30) as client:
            rag = llm_rag(client, sample_cache, TurnSettings(deadline_s=4.0))
            started = time.perf_counter()
            result = await rag.ask(QUESTION)
            elapsed = time.perf_counter() - started
        rec = record(result)
        assert result.text.strip() and elapsed < 4.0 + 5.0
        assert rec["decision"]["queries"] and rec["decision"]["reason"] != "decide did not run"
        (decide,) = calls(rec, "decide")
        assert "JudgeTimeout" in decide["error"] and "timed out after" in decide["error"]
        assert 0.5 < decide["seconds"] < 1.6
        assert any("JudgeTimeout" in (c["error"] or "") for c in calls(rec, "answer"))

    async def test_budget_includes_the_sdk_retries(self, sample_cache: Path) -> None:
        """A server answering 503 after a second, with two SDK retries: decide gives up within its budget
        (about 1 s with a 4 s deadline), not after three attempts."""
        slow_503 = scripted(decide=lambda r: error(503, "busy", retry_after=0.01).delayed(0.6))
        async with (
            ScriptedOpenAIServer(matcher=slow_503) as server,
            server.client(max_retries=2, timeout_s=30) as client,
        ):
            rag = llm_rag(client, sample_cache, TurnSettings(deadline_s=4.0))
            result = await rag.ask(QUESTION)
        (decide,) = calls(record(result), "decide")
        assert "JudgeTimeout" in decide["error"] and decide["seconds"] < 1.3
        assert result.text.strip()


def _hang(request: RecordedRequest) -> ScriptedResponse:
    return reply("far too late").delayed(60.0)


class TestToolsDropped:
    """Failure 2: a chat template without tool support made every turn skip retrieval."""

    async def test_plain_text_reply_switches_to_json_schema_decide(self, sample_cache: Path) -> None:
        """A plain-text answer to a real question is not a direct reply: auto mode asks again with json_schema,
        searches, and decides with json_schema from then on."""
        dropped = scripted(decide=lambda r: reply("To rotate an API key, use the npm rotate command."))
        async with ScriptedOpenAIServer(matcher=dropped) as server, server.client() as client:
            rag = llm_rag(client, sample_cache)
            first = await rag.ask(QUESTION)
            second = await rag.ask("What does error code E403 mean?")
            kinds = [kind(r) for r in server.chat_requests]
        assert first.outcome != "direct" and record(first)["decision"]["queries"] == ["rotate API key"]
        assert "switched to json_schema decide" in record(first)["decision"]["reason"]
        assert kinds[:2] == ["decide", "decide_json"]
        assert "decide" not in kinds[2:] and second.outcome != "direct"

    async def test_tools_mode_falls_back_to_the_offline_decider(self, sample_cache: Path) -> None:
        """With tools forced, the suspect reply fails the decider and the offline decider searches."""
        dropped = scripted(decide=lambda r: reply("Just use npm."))
        async with ScriptedOpenAIServer(matcher=dropped) as server, server.client() as client:
            result = await llm_rag(client, sample_cache, decide_mode="tools").ask(QUESTION)
        rec = record(result)
        assert result.outcome != "direct" and rec["decision"]["queries"]
        assert any("ToolsDropped" in e for e in rec["errors"])

    @pytest.mark.parametrize(
        "text",
        ['<tool_call>\n{"name": "search", "arguments": {"query": "api key"}}\n</tool_call>', "", "\x07\x08"],
    )
    async def test_garbage_or_empty_decision_is_never_a_reply(self, sample_cache: Path, text: str) -> None:
        """Tool syntax in the text, no text, control characters: never shown as a direct reply, even for small
        talk; the turn searches instead or the offline decider replies."""
        garbage = scripted(
            decide=lambda r: reply(text),
            decide_json=lambda r: json_reply({"action": "reply", "queries": [], "reply": text}),
        )
        async with ScriptedOpenAIServer(matcher=garbage) as server, server.client() as client:
            result = await llm_rag(client, sample_cache).ask(QUESTION)
        assert result.outcome != "direct" and record(result)["decision"]["queries"]

    async def test_json_reply_to_a_real_question_is_refused(self) -> None:
        """In json mode a 'reply' to a question that needs a search becomes a search of its queries; nonsense
        queries are rejected."""
        nonsense = {"action": "reply", "queries": ["api key rotation", "1. 1.0.0.0/8/1/1.0.0.0/8/1"], "reply": "npm"}
        async with ScriptedOpenAIServer(script=[json_reply(nonsense)]) as server, server.client() as client:
            decision = await OpenAIDecider(client, "fast", mode="json").decide(QUESTION, (), PageContext())
        assert decision.reply is None and decision.queries == ("api key rotation",)
        assert "refused" in decision.reason and "mostly punctuation" in decision.reason

    async def test_small_talk_still_replies_directly(self) -> None:
        """A greeting answered in text stays a direct reply (no extra call)."""
        async with ScriptedOpenAIServer(script=[reply("Hello! How can I help?")]) as server, server.client() as client:
            decision = await OpenAIDecider(client, "fast").decide("hi there!", (), PageContext())
            assert decision.reply == "Hello! How can I help?" and len(server.chat_requests) == 1


class TestOutputCaps:
    """Failure 3: no request carried an output cap."""

    async def test_every_request_carries_its_cap(self, sample_cache: Path) -> None:
        """decide, grade and answer requests all send max_completion_tokens, per judge and settable."""
        async with ScriptedOpenAIServer(matcher=scripted()) as server, server.client() as client:
            await llm_rag(client, sample_cache, max_tokens={"grade": 40}).ask(QUESTION)
            caps = {kind(r): r.body.get("max_completion_tokens") for r in server.chat_requests}
        assert caps["decide"] == 256 and caps["answer"] == 600
        assert caps.get("grade", 40) % 40 == 0  # per passage: a per-query batch of n passages gets 40 * n
        assert all(r.body.get("max_completion_tokens") for r in server.chat_requests)

    async def test_server_rejecting_max_completion_tokens_gets_max_tokens(self, sample_cache: Path) -> None:
        """A 400 naming max_completion_tokens: the call is repeated with max_tokens, and later calls use it."""
        normal = scripted()

        def old_server(request: RecordedRequest) -> ScriptedResponse:
            if "max_completion_tokens" in request.body:
                return error(400, "Unrecognized request argument supplied: max_completion_tokens")
            return normal(request)

        async with ScriptedOpenAIServer(matcher=old_server) as server, server.client() as client:
            result = await llm_rag(client, sample_cache).ask(QUESTION)
            bodies = [r.body for r in server.chat_requests]
        assert result.outcome == "context" and not record(result)["errors"]
        assert "max_completion_tokens" in bodies[0] and bodies[1]["max_tokens"] == 256
        assert all("max_tokens" in b and "max_completion_tokens" not in b for b in bodies[2:])


def _cut(response: ScriptedResponse, finish: str) -> ScriptedResponse:
    body = json.loads(json.dumps(response.body))
    body["choices"][0]["finish_reason"] = finish
    return evolve(response, body=body)


def _stream_ending(text: str, finish: str) -> ScriptedResponse:
    chunks = [json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    chunks += [json.dumps({"choices": [{"index": 0, "delta": {"content": w + " "}}]}) for w in text.split()]
    chunks.append(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    return ScriptedResponse(chunks=tuple(chunks), kind="stream")


class TestTruncation:
    """Failure 4: cut output was thrown away or shown as complete."""

    async def test_decide_keeps_its_complete_tool_calls(self) -> None:
        """finish_reason=length with one complete and one cut call: the complete one is kept."""
        cut = _cut(
            tool_calls([("search", {"query": "rotate API key"}), ("search", '{"query": "api key expi')]), "length"
        )
        async with ScriptedOpenAIServer(script=[cut]) as server, server.client() as client:
            decision = await OpenAIDecider(client, "fast").decide(QUESTION, (), PageContext())
        assert decision.queries == ("rotate API key",) and "kept 1 complete call" in decision.reason

    async def test_cut_text_decision_is_not_a_reply(self) -> None:
        """Text cut at the cap is never a direct reply, even for small talk."""
        cut = _cut(reply("Hello! I can help you with"), "length")
        async with ScriptedOpenAIServer(script=[cut]) as server, server.client() as client:
            with pytest.raises(JudgeTruncated):
                await OpenAIDecider(client, "fast", mode="tools").decide("hello", (), PageContext())

    async def test_cut_text_to_a_real_question_switches_to_json(self) -> None:
        """Plain text cut at the cap for a question that needs a search (what SmolLM2 does behind a template
        without tools): tools were dropped, so auto mode decides with json_schema."""
        script = [
            _cut(reply("To rotate an API key you need to use the npm"), "length"),
            json_reply({"action": "search", "queries": ["rotate API key"], "reply": ""}),
        ]
        async with ScriptedOpenAIServer(script=script) as server, server.client() as client:
            decider = OpenAIDecider(client, "fast")
            decision = await decider.decide(QUESTION, (), PageContext())
        assert decision.queries == ("rotate API key",) and decider.mode_in_use == "json"

    async def test_truncated_answer_is_marked(self, sample_cache: Path) -> None:
        """An answer ending with finish_reason=length says so in the reply and in the record."""
        cut = scripted(answer=lambda r: _stream_ending("Rotate the key under Settings then", "length"))
        async with ScriptedOpenAIServer(matcher=cut) as server, server.client() as client:
            result = await llm_rag(client, sample_cache).ask(QUESTION)
        assert result.text.startswith("Rotate the key under Settings then")
        assert "cut off at the model's output limit" in result.text
        assert any("JudgeTruncated" in e for e in record(result)["errors"])

    @pytest.mark.parametrize(("text", "finish"), [("", "content_filter"), ("   ", "stop"), ("", "length")])
    async def test_empty_or_filtered_answer_falls_back(self, sample_cache: Path, text: str, finish: str) -> None:
        """No text (filtered, blank, or cut before any word): the offline answerer answers; the record says why."""
        empty = scripted(answer=lambda r: _stream_ending(text, finish))
        async with ScriptedOpenAIServer(matcher=empty) as server, server.client() as client:
            result = await llm_rag(client, sample_cache).ask(QUESTION)
        assert result.text.strip() and "cut off" not in result.text
        assert any(e.startswith("answer: JudgeOutputError") for e in record(result)["errors"])


class TestGradeQueueing:
    """Failure 5: grades timed out while they queued for the server's only slot."""

    @pytest.mark.parametrize(("concurrency", "failing_open"), [(1, False), (16, True)])
    async def test_one_slot_server(self, sample_cache: Path, concurrency: int, failing_open: bool) -> None:
        """A server that serves one request at a time (0.3 s each) and a 0.55 s limit per grade: with
        grade_concurrency=1 each grade's limit starts when it is sent and all of them hold; with 16 sent at once
        the queued ones run out of time while they wait (what the setting is for)."""
        slot = threading.Lock()
        normal = scripted(
            decide=lambda r: tool_calls([("search", {"query": "rotate API key"}), ("search", {"query": "SSO SAML"})])
        )

        def one_slot(request: RecordedRequest) -> ScriptedResponse:
            with slot:
                if kind(request) == "grade":
                    time.sleep(0.3)
                return normal(request)

        settings = TurnSettings(
            grade_concurrency=concurrency, grade_timeout_s=0.55, deadline_s=60.0, per_passage_grading=True
        )
        async with ScriptedOpenAIServer(matcher=one_slot) as server, server.client() as client:
            result = await llm_rag(client, sample_cache, settings).ask(QUESTION)
            grades = [r.received_at for r in server.chat_requests if kind(r) == "grade"]
        rec = record(result)
        assert len(grades) >= 2 and (rec["fail_open"] > 0) is failing_open
        if not failing_open:
            assert all(b - a >= 0.25 for a, b in itertools.pairwise(grades))


class TestGarbageRewrites:
    """Failure 6: the rewriter's garbage became new search queries."""

    @pytest.mark.parametrize(
        "garbage",
        ["<tool_call>", "search\x07 \x1b[31mkeys", "1. " + "1.0.0.0/8/1/" * 12, "<|im_end|>api keys", "x" * 240],
    )
    async def test_rewriter_rejects(self, garbage: str) -> None:
        """Markup, control characters, symbol noise, template tokens and over-long text are rejected."""
        async with ScriptedOpenAIServer(script=[reply(garbage)]) as server, server.client() as client:
            with pytest.raises(JudgeOutputError, match="rejected"):
                await OpenAIRewriter(client, "fast").rewrite(QUESTION, "api key", [])

    async def test_rejected_rewrite_is_recorded_and_the_query_given_up(self, sample_cache: Path) -> None:
        """A garbage rewrite is never searched: the record shows it rejected and the query ends as no_context."""
        nothing = scripted(
            decide=lambda r: tool_calls([("search", {"query": "Lumen flux capacitor warranty"})]),
            grade=lambda r: verdicts(r, "irrelevant"),
            rewrite=lambda r: reply('<tool_call>{"name": "search"}</tool_call>'),
        )
        async with ScriptedOpenAIServer(matcher=nothing) as server, server.client() as client:
            result = await llm_rag(client, sample_cache).ask("Is the Lumen flux capacitor under warranty?")
        rec = record(result)
        assert rec["rewrites"] and not any(r["accepted"] for r in rec["rewrites"])
        assert all("tool-call syntax" in r["reason"] or "markup" in r["reason"] for r in rec["rewrites"])
        assert not any("tool_call" in q["text"] for q in rec["queries"])
        assert {q["status"] for q in rec["queries"]} == {"no_context"} and result.outcome == "none"


_SILENT_TURN = """
import anyio, sys
from ragloop.chat import ChatRAG
from ragloop.testing import ScriptedOpenAIServer
sys.path.insert(0, {tests!r})
from e2e.test_model_guarantees import QUESTION, llm_rag, scripted

async def main():
    async with ScriptedOpenAIServer(matcher=scripted()) as server, server.client() as client:
        reply = await llm_rag(client, {cache!r}).ask(QUESTION)
        assert reply.text
    offline = ChatRAG.sample(None, cache_dir={cache!r})
    await offline.ask("hi, how do I rotate an API key?")
    await offline.ask("x" * 10, deadline_s=0.000001)

anyio.run(main)
"""


def test_library_prints_nothing_without_logging_config(sample_cache: Path) -> None:
    """Failure 7: turns (a model turn, an offline turn, one stopped by its deadline) run in a fresh interpreter
    that configured no logging write nothing to stdout or stderr."""
    code = _SILENT_TURN.format(tests=str(Path(__file__).parents[1]), cache=str(sample_cache))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr == ""


def test_decision_record_as_json_logs(sample_cache: Path) -> None:
    """With ``logging.basicConfig(level="INFO", format="%(message)s")`` every turn logs its decision record as one
    JSON line (the README's recipe)."""
    code = (
        "import logging, anyio\nfrom ragloop.chat import ChatRAG\n"
        'logging.basicConfig(level="INFO", format="%(message)s")\n'
        f"rag = ChatRAG.sample(None, cache_dir={str(sample_cache)!r})\n"
        "anyio.run(rag.ask, 'How do I rotate an API key?')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == ""
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]  # faiss logs too
    (finished,) = [e for e in events if e["event"] == "turn.finished"]
    assert finished["decision"]["queries"] and finished["outcome"] and finished["run_id"]
