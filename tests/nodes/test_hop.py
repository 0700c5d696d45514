"""hop: a follow-up search from the relevant passages, at most the policy's hops."""

from __future__ import annotations

import pytest

from ragloop.nodes.answer import decide_outcome
from ragloop.policy import RoutingPolicy, next_step
from ragloop.state import Graded, HopAttempt, QueryState, TurnState, Verdict
from ragloop.testing import FakeBridger, make_hit
from tests.strategies import graph_of, turn_node, with_queries

pytestmark = pytest.mark.anyio


class TestHop:
    async def test_follow_up_is_queued_as_a_hop(self) -> None:
        """A follow-up becomes a pending hop query under the first root, built from relevant passages."""
        state = with_queries("film cast", status="enough")
        state.graded.append(Graded("film cast", make_hit("Shirley Temple starred."), Verdict("relevant")))
        state.graded.append(Graded("film cast", make_hit("Unrelated."), Verdict("irrelevant")))
        bridger = FakeBridger(lambda q, found, tried: "Shirley Temple government position")
        assert await turn_node("hop", bridger=bridger)(state) == "retrieve"
        hop = state.queries["Shirley Temple government position"]
        assert hop.hop and hop.root == "film cast" and state.pending == [hop.text]
        assert bridger.calls == [("q", 1)] and state.hops[0].accepted is True

    async def test_no_follow_up_or_failure_goes_to_answer(self) -> None:
        """No follow-up, a repeat, or a failing bridger all end in answer, recorded."""

        def broken(q: str, f: object, t: object) -> str:
            raise RuntimeError("bridge down")

        for bridger in (FakeBridger(), FakeBridger(lambda q, f, t: "film cast"), FakeBridger(broken)):
            state = with_queries("film cast", status="enough")
            assert await turn_node("hop", bridger=bridger)(state) == "answer"
            assert state.hops[0].accepted is False
        assert "bridge down" in str(state.hops[0].reason)

    async def test_short_hop_never_triggers_a_rewrite(self) -> None:
        """A hop query that finds nothing is not a short query: the turn answers with what it has."""
        state = with_queries("film cast", status="enough")
        state.queries["bridge"] = QueryState(text="bridge", root="film cast", status="short", hop=True)
        state.hops.append(HopAttempt("bridge", 1, True, "follow-up"))
        assert next_step(state, RoutingPolicy(max_attempts=2, max_hops=1), after="grade") == "answer"
        assert decide_outcome(state) == ("context", ())

    async def test_graph_hops_once_then_answers(self) -> None:
        """With a bridger, a fully answered turn searches once more and then answers."""
        bridger = FakeBridger(lambda q, found, tried: None if len(tried) > 1 else "second hop query")
        g = graph_of(bridger=bridger)
        result = await g.run(TurnState(question="first hop"))  # type: ignore[attr-defined]
        assert result.path == ("decide", "retrieve", "grade", "hop", "retrieve", "grade", "answer")
        assert result.state.outcome == "context"
