"""Item 1: LLM faults at every judge, through the real SDK and the scripted server.

Every fault kind is served to every request of one judge (decide, grade, rewrite or answer); the turn must
end before its deadline with an answer or an explicit statement of the gap, the decision record must name the
fault, and nothing may raise to the caller.
"""

from __future__ import annotations

import time

import anyio
import pytest

from ragloop.chat import ChatRAG, Reply, ReplyReady
from ragloop.testing import ScriptedOpenAIServer, rate_limited
from ragloop.turn import TurnSettings
from tests.reliability._llm import FAULTS, JUDGES, TIMEOUT_S, turn_matcher
from tests.reliability._support import count, small_index

pytestmark = pytest.mark.anyio

DEADLINE_S = 4.0
QUESTION = "How many times are failed webhook deliveries retried?"

#: What the failed call's error in the record says, per fault kind (judge-specific where the SDK differs).
MARKERS: dict[str, str] = {
    "rate_limited": "HTTP 429",
    "server_error": "HTTP 503",
    "timeout": "JudgeTimeout",
    "stream_cut": "connection dropped",
    "malformed_json": "not JSON",
    "malformed_tool_args": "JudgeOutputError",
    "empty_choices": "no choices",
}
_ANSWER_MARKERS = {
    "malformed_json": "malformed stream chunk",
    "malformed_tool_args": "ended before the model finished",
    "empty_choices": "ended before the model finished",
}
_TOOL_ARGS = {"decide": "malformed JSON arguments", "grade": "no content", "rewrite": "empty query"}


def marker(kind: str, judge: str) -> str:
    """The text the record's failed call must contain for ``kind`` served to ``judge``."""
    if judge == "answer" and kind in _ANSWER_MARKERS:
        return _ANSWER_MARKERS[kind]
    if kind == "malformed_tool_args":
        return _TOOL_ARGS[judge]
    return MARKERS[kind]


#: The per-call timeout and deadline of a fault that is not a timeout: what is under test is how the fault is
#: absorbed, and at load 20 the SDK's retry of a dropped stream, or a good call, outlasted the 0.25 s timeout
#: (the record then said JudgeTimeout, not the fault served).
PATIENT_TIMEOUT_S, PATIENT_DEADLINE_S = 10.0, 60.0


def llm_rag(client: object, timeout_s: float = TIMEOUT_S, deadline_s: float = DEADLINE_S) -> ChatRAG:
    """The small index with OpenAI judges (offline fallbacks) and a short per-call timeout (retries included)."""
    return ChatRAG.from_index(
        small_index(),
        client,
        fast_model="fast",
        answer_model="big",
        timeout_s=timeout_s,
        settings=TurnSettings(deadline_s=deadline_s),
    )


async def ask_within_deadline(
    rag: ChatRAG, question: str = QUESTION, deadline_s: float = DEADLINE_S
) -> tuple[Reply, float]:
    """Ask through stream() (the SSE path), fail if anything raises or the deadline passes; reply and seconds."""
    started = time.perf_counter()
    with anyio.fail_after(deadline_s + 1.0):
        events = [e async for e in rag.stream(question)]
    last = events[-1]
    assert isinstance(last, ReplyReady)
    return last.reply, time.perf_counter() - started


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("judge", JUDGES)
async def test_fault_at_judge_is_absorbed_and_recorded(judge: str, kind: str) -> None:
    """Every fault kind at every judge: the turn ends in time with an honest answer and the record names it."""
    matcher = turn_matcher({judge: kind}, grade_label="irrelevant" if judge == "rewrite" else "relevant")
    # The timeout fault needs the short timeout (it answers after 4x TIMEOUT_S) and the short deadline it must
    # end within; every other fault gets limits no load reaches.
    timeout_s, deadline_s = (TIMEOUT_S, DEADLINE_S) if kind == "timeout" else (PATIENT_TIMEOUT_S, PATIENT_DEADLINE_S)
    async with ScriptedOpenAIServer(matcher=matcher) as server, server.client() as client:
        reply, seconds = await ask_within_deadline(llm_rag(client, timeout_s, deadline_s), deadline_s=deadline_s)
    served = matcher.served.get(kind, 0)
    assert served >= 1, f"the {kind} fault was never served to {judge}"
    count(kind, served, group="faults_injected")
    count("turns_llm_faults")
    record = reply.record
    assert record.stopped_by == "end" and seconds < deadline_s
    assert reply.text.strip()
    failed = [c for c in record.calls if c.judge == judge and c.error]
    assert failed, f"no failed {judge} call in the record: {record.calls}"
    assert all(marker(kind, judge) in c.error for c in failed), failed
    want = marker(kind, judge)
    if judge == "decide":
        # The offline decider took over: the turn still searched and answered from context.
        assert any(e.startswith("decide: ") and want in e for e in record.errors)
        assert reply.outcome == "context" and reply.citations
    elif judge == "grade":
        # Fail-open: every graded chunk kept, each verdict naming the failure.
        assert record.fail_open == len(record.grades) > 0
        assert all(g.fail_open and want in g.reason for g in record.grades)
        assert reply.outcome == "context"
    elif judge == "rewrite":
        # A failed rewrite ends that query's search honestly: outcome none, the query listed as missing.
        assert record.rewrites and all(not r.accepted and want in str(r.reason) for r in record.rewrites)
        assert reply.outcome == "none" and record.missing and not reply.citations
    else:
        assert any(e.startswith("answer: ") and want in e for e in record.errors)
        if kind in ("stream_cut", "malformed_json"):
            # Tokens had already been streamed: the reply says it was cut off instead of pretending.
            assert reply.text.endswith("(The answer was cut off by an error; it may be incomplete.)")
        else:
            # Failed before the first token: the offline answerer wrote a cited answer instead.
            assert "8 times" in reply.text and reply.citations
    if judge == "rewrite":
        answer_requests = [r for r in server.chat_requests if r.judge == "answer"]
        system, user = answer_requests[-1].messages[0]["content"], answer_requests[-1].messages[-1]["content"]
        assert "found nothing relevant" in system and "Searched for but not found" in user


async def test_every_judge_failing_at_once_still_answers_honestly() -> None:
    """With all four judges failing, offline fallbacks answer and the record names all four failures."""
    faulty = {"decide": "server_error", "grade": "timeout", "rewrite": "rate_limited", "answer": "empty_choices"}
    matcher = turn_matcher(faulty)
    async with ScriptedOpenAIServer(matcher=matcher) as server, server.client() as client:
        reply, seconds = await ask_within_deadline(llm_rag(client), "How long are deleted tasks kept in the trash?")
    for kind, n in matcher.served.items():
        count(kind, n, group="faults_injected")
    count("turns_llm_faults")
    assert reply.record.stopped_by == "end" and seconds < DEADLINE_S
    assert {c.judge for c in reply.record.calls if c.error} >= {"decide", "grade", "answer"}
    assert reply.outcome == "context" and "30 days" in reply.text and reply.citations


async def test_gap_is_stated_when_rewrite_and_answer_fail() -> None:
    """Nothing relevant, rewriter and answerer down: the offline answerer says plainly nothing was found."""
    matcher = turn_matcher({"rewrite": "server_error", "answer": "server_error"}, grade_label="irrelevant")
    async with ScriptedOpenAIServer(matcher=matcher) as server, server.client() as client:
        reply, _ = await ask_within_deadline(llm_rag(client))
    for kind, n in matcher.served.items():
        count(kind, n, group="faults_injected")
    count("turns_llm_faults")
    assert reply.outcome == "none" and not reply.citations
    assert reply.text.startswith("The knowledge base doesn't cover this")


async def test_rate_limit_retry_after_is_honoured() -> None:
    """A 429 with retry-after is retried by the client after that long, and the turn records no failure."""
    retry_after = 0.3
    served: list[float] = []

    def first_decide_limited(request: object) -> object:
        from tests.reliability._llm import good_response

        if request.judge == "decide" and not served:
            served.append(time.monotonic())
            return rate_limited(retry_after=retry_after)
        return good_response(request)

    async with ScriptedOpenAIServer(matcher=first_decide_limited) as server:
        async with server.client(max_retries=2) as client:
            # A judge's time budget covers the SDK's retries: give this one room for the wait the server asks.
            reply, _ = await ask_within_deadline(llm_rag(client, timeout_s=1.0))
        decides = [r for r in server.chat_requests if r.judge == "decide"]
    count("rate_limited", 1, group="faults_injected")
    count("turns_llm_faults")
    assert len(decides) == 2 and decides[1].received_at - decides[0].received_at >= retry_after * 0.9
    assert not any(c.error for c in reply.record.calls) and reply.outcome == "context"
