"""rewrite: new angles only, the attempt cap, honest give-ups."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import JudgeError
from ragloop.state import QueryState, TurnState
from ragloop.testing import FakeRewriter
from ragloop.text.novelty import is_near_duplicate
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio


class TestRewrite:
    async def test_new_angle_is_queued(self) -> None:
        """A novel rewrite becomes a pending query of the same root."""
        state = with_queries("reset password", status="short")
        node = turn_node("rewrite", rewriter=FakeRewriter(lambda q, f, t: "account recovery email link"))
        assert await node(state) == "retrieve"
        assert state.pending == ["account recovery email link"]
        new = state.queries["account recovery email link"]
        assert new.root == "reset password" and new.attempt == 1
        assert state.queries["reset password"].status == "rewritten"

    async def test_repeat_is_rejected(self) -> None:
        """A rewrite repeating a tried query is rejected and the query gives up with no_context."""
        state = with_queries("reset password", status="short")
        node = turn_node("rewrite", rewriter=FakeRewriter(lambda q, f, t: "Reset the password"))
        assert await node(state) == "answer"
        assert state.queries["reset password"].status == "no_context"
        assert state.rewrites[0].accepted is False

    async def test_attempt_cap(self) -> None:
        """After max_attempts the query is no_context and no rewrite is asked."""
        state = with_queries("x", status="short")
        state.queries["x"].attempt = 2
        rewriter = FakeRewriter()
        assert await turn_node("rewrite", rewriter=rewriter)(state) == "answer"
        assert rewriter.calls == [] and state.queries["x"].status == "no_context"

    async def test_rewriter_error_gives_up_honestly(self) -> None:
        """A rewriter failure marks the query no_context with the reason."""

        def broken(q: str, f: str, t: object) -> str:
            raise JudgeError("no new angle")

        state = with_queries("x", status="short")
        assert await turn_node("rewrite", rewriter=FakeRewriter(broken))(state) == "answer"
        assert "no new angle" in str(state.rewrites[0].reason)

    @given(
        st.lists(st.text("abcdefgh ", min_size=1, max_size=20), min_size=1, max_size=4),
        st.text("abcdefgh ", max_size=20),
    )
    def test_never_queues_a_near_repeat(self, tried: list[str], candidate: str) -> None:
        """Whatever the rewriter says, the node never queues a tried or near-duplicate query."""

        state = TurnState(question="q")
        for t in tried:
            state.queries.setdefault(t, QueryState(text=t, root=tried[0], status="short"))
        anyio.run(turn_node("rewrite", rewriter=FakeRewriter(lambda q, f, t: candidate)).__call__, state)
        for q in state.pending:
            others = [t for t in state.queries if t != q]
            assert not is_near_duplicate(q, others) and q.strip()
