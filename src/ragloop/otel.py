"""OpenTelemetry traces of chat turns (the ``[otel]`` extra: ``pip install 'ragloop[otel]'``).

:func:`instrument` hooks a chat (a graph of your own takes :meth:`TurnTracer.summarizer` as its ``summarize``
hook) so that every finished turn becomes a tree of spans, built from the turn's trace and decision record
once the turn is over (nothing runs per node while the turn is in flight, so tracing adds no latency to a
reply)::

    ragloop.turn                       outcome, fail-open count, calls, tokens, cost, cache hits
    ├── ragloop.node decide
    │   └── chat <model>               gen_ai.* attributes of one model call
    ├── ragloop.node retrieve
    │   └── ragloop.retrieval          query count and hits of that round
    ├── ragloop.node grade
    │   └── chat <model>
    └── ragloop.node answer
        └── chat <model>

Model-call spans follow the OpenTelemetry GenAI semantic conventions: ``gen_ai.operation.name`` (``chat``),
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``output_tokens`` and
``cache_read.input_tokens`` (as the server reported them), ``gen_ai.response.finish_reasons``, and ``error.type``
with an error status for a failed call. The user's words (question, search queries) are recorded only with
``capture_content=True``.

Spans go to the tracer provider you pass, or the global one (``opentelemetry.trace.set_tracer_provider``), so
any exporter works: OTLP to a collector, Jaeger, Phoenix, Langfuse. ``import ragloop`` never imports
OpenTelemetry; only this module does, when imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from attrs import evolve
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from ragloop._log import get_logger
from ragloop.errors import ConfigError
from ragloop.events import RunResult, Step
from ragloop.runner import Graph
from ragloop.state import TurnState
from ragloop.turn import BuiltTurn, TurnRecord, turn_record
from ragloop.usage import LLMCall

__all__ = ["TurnTracer", "instrument"]

_NS = 1_000_000_000
log = get_logger("ragloop.otel")


class TurnTracer:
    """Turns a finished turn (its run result and decision record) into spans.

    Args:
        tracer_provider: Where spans go; ``None``: the global tracer provider.
        capture_content: Record the user's question and the search queries (off by default: they may hold
            personal data).
        provider_name: ``gen_ai.provider.name`` of the model calls (the OpenAI-compatible API).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        capture_content: bool = False,
        provider_name: str = "openai",
    ) -> None:
        self.tracer: Tracer = trace.get_tracer("ragloop", tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self.provider_name = provider_name

    def summarizer(self, inner: Callable[[RunResult], Any]) -> Callable[[RunResult], Any]:
        """A graph's ``summarize`` hook that builds the record with ``inner`` and exports the turn's spans.

        A failing export is logged (``otel.export_failed``) and never costs the reply.
        """

        def summarize(result: RunResult) -> Any:
            record = inner(result)
            if isinstance(record, TurnRecord):
                try:
                    self.export(result, record)
                except Exception as exc:  # noqa: BLE001 — tracing never costs a reply
                    log.warning("otel.export_failed", error=f"{type(exc).__name__}: {exc}")
            return record

        return summarize

    def export(self, result: RunResult, record: TurnRecord, *, ended_ns: int | None = None) -> None:
        """Emit the spans of one turn that ended at ``ended_ns`` (``time.time_ns()`` by default)."""
        end = ended_ns if ended_ns is not None else time.time_ns()
        start = end - int(result.duration * _NS)
        state = result.state if isinstance(result.state, TurnState) else None
        turn = self.tracer.start_span("ragloop.turn", kind=SpanKind.INTERNAL, start_time=start)
        turn.set_attributes(
            {
                "ragloop.run_id": record.run_id,
                "ragloop.outcome": record.outcome,
                "ragloop.stopped_by": record.stopped_by,
                "ragloop.fail_open": record.fail_open,
                "ragloop.llm_calls": record.llm_calls,
                "ragloop.path": list(record.path),
                "ragloop.fast_path": record.fast_path,
                "ragloop.queries": len(record.queries),
                "gen_ai.usage.input_tokens": record.tokens.prompt,
                "gen_ai.usage.output_tokens": record.tokens.completion,
                "gen_ai.usage.cache_read.input_tokens": record.tokens.cached,
            }
        )
        if record.cost is not None:
            turn.set_attribute("ragloop.cost", record.cost)
        for cache, hits in record.cache_hits.items():
            turn.set_attribute(f"ragloop.cache_hits.{cache}", hits)
        if record.errors:
            turn.set_attribute("ragloop.errors", len(record.errors))
        if self.capture_content and state is not None:
            turn.set_attribute("ragloop.question", state.question)
        context = trace.set_span_in_context(turn)
        nodes: list[tuple[Step, Span]] = []
        rounds = _retrieval_rounds(record)
        for step in result.trace:
            s0 = start + int(step.started * _NS)
            s1 = s0 + int(step.duration * _NS)
            span = self.tracer.start_span(f"ragloop.node {step.node}", context=context, start_time=s0)
            span.set_attributes({"ragloop.node": step.node, "ragloop.step": step.step, "ragloop.forced": step.forced})
            if step.next is not None:
                span.set_attribute("ragloop.next", step.next)
            if step.error:
                span.set_status(Status(StatusCode.ERROR, step.error))
            if step.node == "retrieve":
                queries = rounds.pop(0) if rounds else []
                self._retrieval(span, queries, s0, s1)
            nodes.append((step, span))
        if state is not None:
            for call in state.usage.calls:
                if call.model != "offline":
                    self._model_call(call, nodes, context, start)
        for step, span in nodes:
            span.end(end_time=start + int((step.started + step.duration) * _NS))
        turn.end(end_time=end)

    def _retrieval(self, parent: Span, queries: Sequence[Any], s0: int, s1: int) -> None:
        span = self.tracer.start_span(
            "ragloop.retrieval", context=trace.set_span_in_context(parent), kind=SpanKind.CLIENT, start_time=s0
        )
        span.set_attributes(
            {
                "ragloop.retrieval.query_count": len(queries),
                "ragloop.retrieval.hits": sum(q.hits for q in queries),
                "ragloop.retrieval.failed": sum(1 for q in queries if q.error),
            }
        )
        if self.capture_content:
            span.set_attribute("ragloop.retrieval.queries", [q.text for q in queries])
        span.end(end_time=s1)

    def _model_call(self, call: LLMCall, nodes: Sequence[tuple[Step, Span]], context: Any, start: int) -> None:
        c1 = int(call.ended * _NS) if call.ended else time.time_ns()
        c0 = c1 - int(call.seconds * _NS)
        middle = (c0 + c1) // 2
        parent = context
        for step, span in nodes:  # the node that was running when the call was made
            if start + step.started * _NS <= middle <= start + (step.started + step.duration) * _NS:
                parent = trace.set_span_in_context(span)
                break
        span = self.tracer.start_span(f"chat {call.model}", context=parent, kind=SpanKind.CLIENT, start_time=c0)
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.provider_name,
                "gen_ai.request.model": call.model,
                "gen_ai.usage.input_tokens": call.prompt_tokens,
                "gen_ai.usage.output_tokens": call.completion_tokens,
                "gen_ai.usage.cache_read.input_tokens": call.cached_prompt_tokens,
                "ragloop.judge": call.judge,
            }
        )
        if call.finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", list(call.finish_reasons))
        if call.error:
            span.set_attribute("error.type", call.error.partition(":")[0])
            span.set_status(Status(StatusCode.ERROR, call.error))
        span.end(end_time=c1)


def _retrieval_rounds(record: TurnRecord) -> list[list[Any]]:
    """The turn's queries per retrieve round: decide's queries, then each round of rewrites, then hops."""
    plain = [q for q in record.queries if not q.hop]
    last = max((q.attempt for q in plain), default=-1)
    rounds: list[list[Any]] = [[q for q in plain if q.attempt == n] for n in range(last + 1)]
    hops = [q for q in record.queries if q.hop]
    if hops:
        rounds.append(hops)
    return rounds


def instrument(
    chat: Any,
    tracer_provider: TracerProvider | None = None,
    *,
    capture_content: bool = False,
) -> TurnTracer:
    """Trace every turn of a :class:`~ragloop.chat.ChatRAG` from now on; returns the tracer.

    The chat's graph is rebuilt with a ``summarize`` hook that exports each finished turn's spans, then returns
    its decision record as before; the rebuilt graph replaces the one in the chat's built turn (``chat.turn``),
    which everything the chat does reads. A :class:`~ragloop.runner.Graph` of your own cannot be changed once
    built: give it ``summarize=tracer.summarizer(turn_record)`` when you build it.

    Args:
        chat: The chat (anything with a ``graph`` attribute it runs its turns on).
        tracer_provider: Where spans go; ``None``: the global tracer provider.
        capture_content: Record the user's question and the search queries in the spans.

    Raises:
        ConfigError: ``chat`` is a bare graph.
    """
    if isinstance(chat, Graph) or not isinstance(getattr(chat, "graph", None), Graph):
        raise ConfigError(
            "instrument() needs a ChatRAG; a built Graph cannot be changed: build it with "
            "summarize=TurnTracer(provider).summarizer(turn_record) instead"
        )
    tracer = TurnTracer(tracer_provider, capture_content=capture_content)
    graph: Graph = chat.graph
    traced = Graph(
        graph.nodes,
        start=graph.start,
        finish=graph.finish,
        edges=graph.edges,
        max_steps=graph.max_steps,
        finish_grace_s=graph.finish_grace_s,
        summarize=tracer.summarizer(graph.summarize or turn_record),
        context=graph.context,
    )
    if isinstance(built := getattr(chat, "turn", None), BuiltTurn):
        chat.turn = evolve(built, graph=traced)  # a ChatRAG reads its graph through its built turn
    else:
        chat.graph = traced
    return tracer
