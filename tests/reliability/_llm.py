"""The scripted OpenAI server wired for whole chat turns: a judge of each request, good answers, faults."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from ragloop.testing import (
    RecordedRequest,
    ScriptedResponse,
    empty_choices,
    rate_limited,
    reply,
    server_error,
    stream,
    tool_calls,
    verdicts,
)

__all__ = ["FAULTS", "JUDGES", "TIMEOUT_S", "fault_for", "good_response", "turn_matcher"]

JUDGES = ("decide", "grade", "rewrite", "answer")
#: Per-request timeout the judges get in these tests; a "timeout" fault answers well after it.
TIMEOUT_S = 0.25


def _question(request: RecordedRequest) -> str:
    return str(request.messages[-1]["content"])


def good_response(request: RecordedRequest, *, grade_label: str = "relevant") -> ScriptedResponse:
    """A well-formed answer for whichever judge sent ``request``."""
    judge = request.judge
    if judge == "decide":
        return tool_calls([("search", {"query": _question(request)})])
    if judge == "grade":
        # Per-query (batch) grading by default, per-passage when TurnSettings.per_passage_grading is set.
        return verdicts(request, grade_label)
    if judge == "rewrite":
        return reply(f"zebra angle {request.index}")
    return stream("Deliveries are retried 8 times [1].", chunk_size=6)


def fault_for(kind: str, judge: str) -> ScriptedResponse:
    """The ``kind`` fault as the ``judge``'s request would receive it."""
    streamed = judge == "answer"
    if kind == "rate_limited":
        return rate_limited(retry_after=0.01)
    if kind == "server_error":
        return server_error(503)
    if kind == "timeout":
        return (stream("late") if streamed else reply("late")).delayed(TIMEOUT_S * 4)
    if kind == "stream_cut":
        return stream("Deliveries are retried eight times, according to", chunk_size=6, cut_after=2)
    if kind == "malformed_json":
        return stream("Deliveries are retried", malformed_at=1) if streamed else ScriptedResponse(raw_body=b'{"cho')
    if kind == "malformed_tool_args":
        return tool_calls([("search", '{"query": "unterminated')])
    if kind == "empty_choices":
        return empty_choices()
    raise ValueError(f"unknown fault kind {kind!r}")


FAULTS = (
    "rate_limited",
    "server_error",
    "timeout",
    "stream_cut",
    "malformed_json",
    "malformed_tool_args",
    "empty_choices",
)


@attrs.define
class turn_matcher:
    """A matcher serving ``fault`` to every request of the judges in ``faulty``, good answers to the rest.

    Attributes:
        faulty: Judge → fault kind.
        grade_label: The label good grade answers carry ("irrelevant" sends every query to rewrite).
        served: Fault kind → how many times it was served.
    """

    faulty: Mapping[str, str]
    grade_label: str = "relevant"
    served: dict[str, int] = attrs.field(factory=dict)
    on_request: Callable[[RecordedRequest], None] | None = None

    def __call__(self, request: RecordedRequest) -> ScriptedResponse:
        if self.on_request is not None:
            self.on_request(request)
        judge = request.judge
        kind = self.faulty.get(judge)
        if kind is not None:
            self.served[kind] = self.served.get(kind, 0) + 1
            return fault_for(kind, judge)
        return good_response(request, grade_label=self.grade_label)
