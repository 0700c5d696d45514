"""The default chat turn end to end over fakes: paths, outcomes, the step cap, streamed tokens."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import JudgeError
from ragloop.events import Token
from ragloop.state import Decision, TurnState, Verdict
from ragloop.testing import FakeBridger, FakeDecider, FakeGrader, FakeLiveSource, FakeRewriter
from ragloop.turn import TurnSettings, turn_record
from tests.strategies import graph_of

pytestmark = pytest.mark.anyio


class TestGraph:
    async def test_two_topic_turn(self) -> None:
        """Two queries are retrieved, graded and answered as context, with a full record."""
        g = graph_of(decider=FakeDecider(lambda q: Decision(queries=("pricing", "sso"))))
        result = await g.run(TurnState(question="pricing and sso"))  # type: ignore[attr-defined]
        assert result.path == ("decide", "retrieve", "grade", "answer")
        record = turn_record(result)
        assert record.outcome == "context" and record.decision.queries == ("pricing", "sso")
        assert len(record.grades) == 2 and record.stopped_by == "end"

    async def test_rewrite_loop_then_none(self) -> None:
        """Irrelevant hits are rewritten up to the cap, then answered honestly as none."""
        g = graph_of(grader=FakeGrader(lambda q, h: Verdict("irrelevant")))
        result = await g.run(TurnState(question="unanswerable"))  # type: ignore[attr-defined]
        assert result.path == (
            "decide",
            "retrieve",
            "grade",
            "rewrite",
            "retrieve",
            "grade",
            "rewrite",
            "retrieve",
            "grade",
            "answer",
        )
        state = result.state
        assert state.outcome == "none" and state.missing == ("unanswerable",)
        assert len(state.rewrites) == 2

    @given(
        st.lists(st.sampled_from(["relevant", "irrelevant", "raise", "partial"]), min_size=1, max_size=6),
        st.lists(st.sampled_from(["ok", "raise", "repeat"]), min_size=1, max_size=3),
        st.integers(1, 12),
        st.booleans(),
    )
    def test_every_run_ends_with_one_outcome(
        self, grades: list[str], rewrites: list[str], cap: int, decide_fails: bool
    ) -> None:
        """Whatever the judges do, a turn ends within the cap with exactly one outcome and an answer."""
        counter = {"g": 0, "r": 0}

        def grade(q: str, h: object) -> Verdict:
            action = grades[counter["g"] % len(grades)]
            counter["g"] += 1
            if action == "raise":
                raise JudgeError("grader down")
            return Verdict(action)  # type: ignore[arg-type]

        def rewrite(question: str, failed: str, tried: object) -> str:
            action = rewrites[counter["r"] % len(rewrites)]
            counter["r"] += 1
            if action == "raise":
                raise JudgeError("rewriter down")
            return failed if action == "repeat" else f"angle {counter['r']} {question}"

        def decide(q: str) -> Decision:
            if decide_fails:
                raise JudgeError("decider down")
            return Decision(queries=("one", "two"))

        g = graph_of(
            decider=FakeDecider(decide),
            grader=FakeGrader(grade),
            rewriter=FakeRewriter(rewrite),
            settings=TurnSettings(max_steps=cap),
        )
        result = anyio.run(lambda: g.run(TurnState(question="q")))  # type: ignore[attr-defined]
        assert len(result.trace) <= cap + 1
        assert result.path[-1] == "answer" and result.path.count("answer") == 1
        assert result.state.outcome in ("context", "partial", "none")
        assert result.state.answer


async def test_tokens_stream_through_runner() -> None:
    """Answer tokens reach the graph's event stream."""
    g = graph_of()
    tokens = [e.text async for e in g.stream(TurnState(question="x")) if isinstance(e, Token)]  # type: ignore[attr-defined]
    assert "".join(tokens).startswith("context:")


def test_longest_regular_turn_fits_the_default_cap() -> None:
    """Live, two rewrites and a hop in one turn still end by 'end', not by the step cap."""
    angles = iter(["refund policy details", "billing statement copy"])

    def grade(q: str, h: object) -> Verdict:
        # the decide query and its first rewrite come up short; the second rewrite and the hop are answered
        return Verdict("relevant" if q in ("billing statement copy", "hop follow up") else "irrelevant")

    g = graph_of(
        decider=FakeDecider(lambda q: Decision(queries=("ticket #1234",))),
        grader=FakeGrader(grade),
        rewriter=FakeRewriter(lambda q, f, t: next(angles)),
        live_sources=[FakeLiveSource()],
        bridger=FakeBridger(lambda q, found, tried: "hop follow up"),
    )
    result = anyio.run(lambda: g.run(TurnState(question="ticket #1234")))  # type: ignore[attr-defined]
    assert result.path == (
        "decide", "retrieve", "grade", "live", "rewrite", "retrieve", "grade", "rewrite", "retrieve", "grade",
        "hop", "retrieve", "grade", "answer",
    )  # fmt: skip
    assert result.stopped_by == "end"
