"""Issue 12 item 8, the model half: a hostile model server script, each case ending in a sane answer.

The scripted OpenAI-compatible server plays a model that answers one judge (decide, grade, rewrite or answer)
with something hostile: deltas that are not strings, numbers with thousands of digits, terminal escapes, cut
streams, megabyte outputs, fake citations. Every other judge answers well. Whatever the hostile answer, ``ask``
must return within the deadline with a non-empty reply whose citations all name real blocks, whose size stays
within the reply cap, and must never raise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.nodes.answer import MAX_ANSWER_CHARS
from ragloop.testing import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    json_reply,
    reply,
    stream,
    tool_calls,
    verdicts,
)
from ragloop.turn import TurnSettings
from tests.reliability._llm import good_response
from tests.reliability._support import small_index

pytestmark = pytest.mark.anyio

DEADLINE_S = 8.0
QUESTION = "How many times are failed webhook deliveries retried?"
MEGABYTE = "webhook " * 131_072
GIANT = "9" * 5000
ESCAPES = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b]0;pwned\x07\u202e\x9b31m\r"


def _chunk(delta: object, finish: str | None = None, *, choices: object = None) -> str:
    body = choices if choices is not None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"choices": body})


def raw_stream(*chunks: str, done: bool = True, cut: bool = False) -> ScriptedResponse:
    """A streamed response of exactly these SSE payloads."""
    return ScriptedResponse(chunks=(_chunk({"role": "assistant", "content": ""}), *chunks), done=done, cut=cut)


def deltas(*contents: object, finish: str | None = "stop") -> ScriptedResponse:
    """A stream whose content deltas are these JSON values (strings or not)."""
    tail = (_chunk({}, finish),) if finish else ()
    return raw_stream(*(_chunk({"content": c}) for c in contents), *tail)


#: case name -> (judge, hostile response). ``raw_giant`` is a JSON body with a 5,000-digit number.
CASES: dict[str, tuple[str, ScriptedResponse]] = {
    # decide
    "decide_four_megabyte_queries": ("decide", tool_calls([("search", {"query": MEGABYTE})] * 4)),
    "decide_query_not_a_string": ("decide", tool_calls([("search", {"query": [1, {"a": None}]})])),
    "decide_giant_number_query": ("decide", tool_calls([("search", '{"query": ' + GIANT + "}")])),
    "decide_escapes_in_query": ("decide", tool_calls([("search", {"query": "webhook retries" + ESCAPES})])),
    "decide_escapes_in_direct_reply": ("decide", reply("Hello!" + ESCAPES)),
    "decide_megabyte_direct_reply": ("decide", reply(MEGABYTE)),
    "decide_raw_giant_number": (
        "decide",
        ScriptedResponse(raw_body=b'{"id": "x", "object": "chat.completion", "created": ' + GIANT.encode() + b"}"),
    ),
    # grade
    "grade_label_giant_number": ("grade", json_reply({"label": int(GIANT[:300]), "reason": GIANT[:300]})),
    "grade_label_nested": ("grade", json_reply({"label": {"relevant": True}, "reason": ["x"]})),
    "grade_megabyte_reason": ("grade", json_reply({"label": "relevant", "reason": MEGABYTE})),
    "grade_batch_giant_ids": (
        "grade",
        json_reply({"verdicts": [{"id": GIANT[:400], "label": "relevant", "reason": "x"}] * 50}),
    ),
    "grade_batch_wrong_types": (
        "grade",
        json_reply({"verdicts": [{"id": 1, "label": ["relevant"], "reason": None}, "relevant", None, 7]}),
    ),
    "grade_batch_megabyte": ("grade", json_reply({"verdicts": [{"id": "1", "label": "relevant", "reason": MEGABYTE}]})),
    # rewrite
    "rewrite_megabyte": ("rewrite", reply(MEGABYTE)),
    "rewrite_escapes": ("rewrite", reply("zebra" + ESCAPES)),
    # answer
    "answer_null_delta": ("answer", deltas("Deliveries are retried ", None, "8 times [1].")),
    "answer_number_deltas": ("answer", deltas("Retried ", 8, 1e308, " times [1].")),
    "answer_object_and_list_deltas": ("answer", deltas("Retried ", {"text": "x"}, ["y"], True, "8 times [1].")),
    "answer_giant_citation": ("answer", deltas("Retried 8 times [" + GIANT + "] [1].")),
    "answer_giant_citation_split": ("answer", deltas("Retried 8 times [", GIANT[:2500], GIANT[2500:], "] [1].")),
    "answer_unknown_citations": ("answer", deltas("Retried 8 times [1][7] [99, 1] [0].")),
    "answer_escapes": ("answer", deltas("Retried" + ESCAPES + " 8 times [1].")),
    "answer_cut_mid_marker": ("answer", raw_stream(_chunk({"content": "Retried 8 times [1"}), cut=True)),
    "answer_no_done": ("answer", raw_stream(_chunk({"content": "Retried 8 times [1]."}), done=False)),
    "answer_finish_length": ("answer", deltas("Retried 8 times [1] and", finish="length")),
    "answer_five_megabytes": ("answer", deltas(*(["All work and no play [1]. "] * 200_000))),
    "answer_choices_not_a_list": ("answer", raw_stream(_chunk(None, choices={"0": "x"}), _chunk({"content": "ok"}))),
    "answer_delta_missing": ("answer", raw_stream(_chunk(None), _chunk({"content": "Retried 8 times [1]."}))),
    "answer_only_whitespace": ("answer", deltas(" ", "\n", "\t")),
    "answer_tool_call_deltas": (
        "answer",
        raw_stream(_chunk({"tool_calls": [{"index": 0, "function": {"name": "search", "arguments": GIANT}}]})),
    ),
    "answer_plain_json_not_a_stream": ("answer", reply("Retried 8 times [1].")),
    "answer_stream_cut": ("answer", stream("Retried 8 times, according to", chunk_size=4, cut_after=2)),
}


def matcher_for(judge: str, hostile: ScriptedResponse) -> Callable[[RecordedRequest], ScriptedResponse]:
    """Serve ``hostile`` to every request of ``judge`` (irrelevant grades for rewrite cases), good answers else."""

    def matcher(request: RecordedRequest) -> ScriptedResponse:
        if request.judge == judge:
            return hostile
        if request.judge == "grade":
            return verdicts(request, "irrelevant" if judge == "rewrite" else "relevant")
        return good_response(request)

    return matcher


@pytest.mark.parametrize("case", sorted(CASES))
async def test_hostile_model_output_ends_in_a_sane_answer(case: str) -> None:
    """The hostile answer is absorbed: a reply within the deadline, citations real, size capped, nothing raised."""
    judge, hostile = CASES[case]
    async with ScriptedOpenAIServer(matcher=matcher_for(judge, hostile)) as server, server.client() as client:
        rag = ChatRAG.from_index(
            small_index(), client, fast_model="fast", timeout_s=1.0, settings=TurnSettings(deadline_s=DEADLINE_S)
        )
        started = time.perf_counter()
        with anyio.fail_after(DEADLINE_S + 1.5):
            answer = await rag.ask(QUESTION)
        took = time.perf_counter() - started
        served = sum(1 for r in server.requests if r.judge == judge)
    assert served, f"{case}: the hostile answer was never asked for"
    assert isinstance(answer.text, str) and answer.text.strip(), case
    assert took < DEADLINE_S + 1.0, (case, took)
    assert len(answer.text) <= MAX_ANSWER_CHARS + 200, (case, len(answer.text))
    numbers = {b.n for b in answer.blocks}
    assert all(c.n in numbers for c in answer.citations), case
    assert all(len(q) <= 1_000 for q in answer.record.decision.queries), case
    json.dumps(answer.as_dict())  # the record serialises whatever the model said
