"""answer's freshness note: a reply resting on a page past its valid_until (or too old) says so, and the state
and the decision record list the page with its owner."""

from __future__ import annotations

import datetime as dt

import pytest

from ragloop import END
from ragloop.events import Token
from ragloop.freshness import Freshness
from ragloop.runner import Graph
from ragloop.state import Chunk, Graded, Hit, TurnState, Verdict
from ragloop.testing import FakeAnswerer
from ragloop.turn import TurnSettings, turn_record
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio


def _state(**meta: str) -> TurnState:
    state = with_queries("price", question="What does a seat cost?")
    state.queries["price"].status = "enough"
    chunk = Chunk("c1", "A seat costs $19.", source="pricing.md", title="Pricing", metadata=meta)
    state.graded.append(Graded("price", Hit(chunk, 1.0, 0.9), Verdict("relevant")))
    return state


class TestFreshnessNote:
    async def test_expired_page_named_in_the_reply_and_state(self) -> None:
        """A cited page past valid_until ends the reply with a note citing it, owner included, streamed as a token."""
        node = turn_node("answer", answerer=FakeAnswerer())
        state = _state(valid_until="2020-01-01", owner="billing")
        assert await node(state) == END
        assert state.answer.startswith("context: [1]")
        assert state.answer.endswith("[1] Pricing (valid until 2020-01-01; owner: billing).)")
        [stale] = state.stale
        assert (stale.source, stale.reason, stale.owner) == ("pricing.md", "expired", "billing")

    async def test_fresh_page_no_note(self) -> None:
        """A page without dates, or still valid, adds nothing."""
        for meta in ({}, {"valid_until": "2999-01-01"}):
            state = _state(**meta)
            await turn_node("answer", answerer=FakeAnswerer())(state)
            assert state.answer == "context: [1]" and state.stale == ()

    async def test_age_limit_from_the_settings(self) -> None:
        """TurnSettings.stale_after_days makes an old updated date stale; without it age alone never does."""
        old = dt.date.today() - dt.timedelta(days=400)
        state = _state(updated=old.isoformat())
        await turn_node("answer", answerer=FakeAnswerer())(state)
        assert state.stale == ()
        state = _state(updated=old.isoformat())
        await turn_node("answer", answerer=FakeAnswerer(), settings=TurnSettings(stale_after_days=365))(state)
        assert [s.reason for s in state.stale] == ["old"]

    async def test_no_check_without_freshness(self) -> None:
        """With freshness=None the answer node checks nothing."""
        state = _state(valid_until="2020-01-01")
        await turn_node("answer", answerer=FakeAnswerer(), freshness=None)(state)
        assert state.stale == () and "Note" not in state.answer

    async def test_record_carries_the_stale_pages(self) -> None:
        """The decision record of a turn that cited a stale page lists it; the note was streamed."""
        node = turn_node("answer", answerer=FakeAnswerer(), freshness=Freshness(today=dt.date(2025, 1, 1)))
        graph = Graph({"answer": node}, start="answer", finish="answer")
        tokens: list[str] = []
        async with graph.stream(_state(valid_until="2024-12-31")) as events:
            async for event in events:
                if isinstance(event, Token):
                    tokens.append(event.text)
        result = await graph.run(_state(valid_until="2024-12-31"))
        record = turn_record(result)
        assert [s.source for s in record.stale] == ["pricing.md"]
        assert record.as_dict()["stale"][0]["valid_until"] == "2024-12-31"
        assert any("may be out of date" in t for t in tokens)
