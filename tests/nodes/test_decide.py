"""decide: direct replies, query dedup and cap, decider fallbacks."""

from __future__ import annotations

import pytest

from ragloop.errors import JudgeError
from ragloop.state import Decision, TurnState
from ragloop.testing import FakeDecider
from tests.strategies import turn_node

pytestmark = pytest.mark.anyio


class TestDecide:
    async def test_direct_reply_routes_to_answer(self) -> None:
        """A direct reply goes straight to answer without queries."""
        node = turn_node("decide", decider=FakeDecider(lambda q: Decision(reply="Hello!")))
        state = TurnState(question="hi")
        assert await node(state) == "answer"
        assert state.decision is not None and state.decision.direct and not state.queries

    async def test_queries_deduplicated_and_capped(self) -> None:
        """Queries are deduplicated (case/punctuation) and capped by max_queries."""
        node = turn_node(
            "decide",
            decider=FakeDecider(lambda q: Decision(queries=("SSO setup", "sso setup?", "a", "b", "c"))),
            max_queries=3,
        )
        state = TurnState(question="x")
        assert await node(state) == "retrieve"
        assert state.pending == ["SSO setup", "a", "b"]

    async def test_failing_decider_falls_back_to_question(self) -> None:
        """A decider error falls back to searching the question itself, and is recorded."""

        def broken(q: str) -> Decision:
            raise JudgeError("model down")

        state = TurnState(question="how do refunds work")
        assert await turn_node("decide", decider=FakeDecider(broken))(state) == "retrieve"
        assert state.pending == ["how do refunds work"]
        assert state.errors and "model down" in state.errors[0]

    async def test_fallback_decider_used(self) -> None:
        """When a fallback decider is configured it answers after the primary fails."""

        def broken(q: str) -> Decision:
            raise JudgeError("model down")

        state = TurnState(question="hello")
        node = turn_node("decide", decider=FakeDecider(broken), fallback=FakeDecider(lambda q: Decision(reply="hi")))
        assert await node(state) == "answer"


async def test_any_decider_exception_falls_back() -> None:
    """A custom decider raising a non-judge error still falls back to searching the question."""

    def broken(q: str) -> Decision:
        raise KeyError("bug in a custom decider")

    state = TurnState(question="refund policy")
    assert await turn_node("decide", decider=FakeDecider(broken))(state) == "retrieve"
    assert "KeyError" in state.errors[0]
