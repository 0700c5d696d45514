"""OpenTelemetry spans of a turn (the SDK's in-memory exporter), and no OpenTelemetry import without asking."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ragloop.chat import ChatRAG, Reply, ReplyReady
from ragloop.llm.openai import OpenAIJudges
from ragloop.otel import instrument
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream, tool_calls, verdicts
from ragloop.turn import Judges, Turn, TurnSettings
from ragloop.usage import Price

pytestmark = pytest.mark.anyio

QUESTION = "How much does the Business plan cost per seat?"
#: Every time limit of a traced turn: well past any load.
_PATIENT_S = 300.0


def _model(request: RecordedRequest) -> ScriptedResponse:
    if request.judge == "decide":
        return tool_calls([("search", {"query": "Business plan price per seat"})])
    if request.judge == "grade":
        return verdicts(request, "relevant")
    return stream("The Business plan costs per seat [1].", chunk_size=8)


async def _traced_turn(sample_cache: Path, *, capture_content: bool) -> tuple[Reply, list[ReadableSpan]]:
    from ragloop.sample import sample_index

    index = sample_index(sample_cache)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ScriptedOpenAIServer(matcher=_model) as server, server.client() as client:
        # Time limits far past any load (at load 20 a 5 s search or a 20 s judge call timed out, and the turn
        # fell back): the spans are under test here, not the limits.
        judges = OpenAIJudges.create(client, fast_model="fast", answer_model="big", timeout_s=_PATIENT_S)
        settings = TurnSettings(
            fast_path_confidence=1.01,
            prices={"fast": Price(1.0, 2.0), "big": Price(10.0, 20.0)},
            retrieve_timeout_s=_PATIENT_S,
            grade_timeout_s=_PATIENT_S,
            deadline_s=None,
        )
        parts = Judges(judges.decider, judges.grader, judges.rewriter, judges.answerer)
        rag = ChatRAG(Turn(index.retriever("hybrid"), parts, settings=settings))
        instrument(rag, provider, capture_content=capture_content)
        reply = await rag.ask(QUESTION)
    return reply, list(exporter.get_finished_spans())


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


class TestSpans:
    async def test_turn_nodes_model_calls_and_retrieval(self, sample_cache: Path) -> None:
        """One turn span holds a span per node; model calls sit under their node with GenAI attributes; the
        retrieve node has a retrieval span with the query count and hits; the question is not recorded."""
        reply, spans = await _traced_turn(sample_cache, capture_content=False)
        turn = _one(spans, "ragloop.turn")
        attrs = dict(turn.attributes or {})
        assert attrs["ragloop.outcome"] == reply.outcome == "context"
        assert attrs["ragloop.fail_open"] == reply.record.fail_open == 0
        assert attrs["ragloop.llm_calls"] == reply.record.llm_calls == 3
        assert attrs["ragloop.cost"] == pytest.approx(reply.record.cost)
        assert reply.record.cost is not None and reply.record.cost > 0
        nodes = {s.name.removeprefix("ragloop.node "): s for s in spans if s.name.startswith("ragloop.node ")}
        assert list(nodes) == list(reply.record.path) == ["decide", "retrieve", "grade", "answer"]
        for span in nodes.values():
            assert span.parent is not None and span.parent.span_id == turn.context.span_id
            assert turn.start_time <= span.start_time <= span.end_time <= turn.end_time  # type: ignore[operator]
        calls = [s for s in spans if s.name.startswith("chat ")]
        assert len(calls) == 3
        by_node = {}
        for call in calls:
            a = dict(call.attributes or {})
            assert call.kind == SpanKind.CLIENT and a["gen_ai.operation.name"] == "chat"
            assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
            parent = next(n for n, s in nodes.items() if call.parent and s.context.span_id == call.parent.span_id)
            by_node[parent] = (a["gen_ai.request.model"], a["gen_ai.response.finish_reasons"])
        assert by_node == {
            "decide": ("fast", ("tool_calls",)),
            "grade": ("fast", ("stop",)),
            "answer": ("big", ("stop",)),
        }
        retrieval = _one(spans, "ragloop.retrieval")
        r = dict(retrieval.attributes or {})
        assert retrieval.parent is not None and retrieval.parent.span_id == nodes["retrieve"].context.span_id
        assert r["ragloop.retrieval.query_count"] == 1 and r["ragloop.retrieval.hits"] == reply.record.queries[0].hits
        texts = [str(v) for s in spans for v in (s.attributes or {}).values()]
        assert not any("Business plan" in t for t in texts)

    async def test_user_text_only_when_the_app_opts_in(self, sample_cache: Path) -> None:
        """With capture_content the question and the queries are on the spans."""
        _, spans = await _traced_turn(sample_cache, capture_content=True)
        assert dict(_one(spans, "ragloop.turn").attributes or {})["ragloop.question"] == QUESTION
        queries = dict(_one(spans, "ragloop.retrieval").attributes or {})["ragloop.retrieval.queries"]
        assert queries == ("Business plan price per seat",)

    async def test_failed_call_is_an_error_span(self, sample_cache: Path) -> None:
        """A model call that failed is marked as an error with its type; the turn still answers."""
        from ragloop.sample import sample_index
        from ragloop.testing import server_error

        index = sample_index(sample_cache)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))

        def failing_grade(request: RecordedRequest) -> ScriptedResponse:
            return server_error(500, "down") if request.judge == "grade" else _model(request)

        async with ScriptedOpenAIServer(matcher=failing_grade) as server, server.client() as client:
            judges = OpenAIJudges.create(client, fast_model="fast", answer_model="big")
            rag = ChatRAG(
                Turn(
                    index.retriever("hybrid"),
                    Judges(judges.decider, judges.grader, judges.rewriter, judges.answerer),
                    settings=TurnSettings(fast_path_confidence=1.01),
                )
            )
            instrument(rag, provider)
            reply = await rag.ask(QUESTION)
        spans = list(exporter.get_finished_spans())
        failed = [s for s in spans if s.name == "chat fast" and s.status.status_code == StatusCode.ERROR]
        assert failed and dict(failed[0].attributes or {})["error.type"] == "JudgeError"
        assert dict(_one(spans, "ragloop.turn").attributes or {})["ragloop.fail_open"] == reply.record.fail_open > 0

    async def test_the_chats_built_turn_is_instrumented(self, sample_cache: Path) -> None:
        """instrument() replaces the graph inside the chat's built turn: ``rag.turn``, ``ask`` and ``stream``
        all see the traced graph (it used to replace a copy, leaving ``rag.turn.graph`` untraced)."""
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        rag = ChatRAG.sample(cache_dir=sample_cache)
        untraced = rag.turn.graph
        instrument(rag, provider)
        assert rag.turn.graph is rag.graph is not untraced and rag.nodes == untraced.nodes
        reply = await rag.ask("How many times does Lumen retry a failed webhook delivery?")
        async with rag.stream("How do I rotate an API key?") as events:
            streamed = [e async for e in events][-1]
        assert isinstance(streamed, ReplyReady)
        turns = [s for s in exporter.get_finished_spans() if s.name == "ragloop.turn"]
        assert len(turns) == 2 and reply.text
        again = ChatRAG(rag.turn)  # a chat over the instrumented turn traces too
        await again.ask("Hello!")
        assert len([s for s in exporter.get_finished_spans() if s.name == "ragloop.turn"]) == 3


def test_import_ragloop_does_not_import_opentelemetry() -> None:
    """Importing ragloop (and building an offline chat) loads no OpenTelemetry module."""
    code = (
        "import sys, ragloop, ragloop.chat, ragloop.turn, ragloop.caches\n"
        "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not bad, bad\n"
        "import ragloop.otel\n"
        "assert 'opentelemetry.trace' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
