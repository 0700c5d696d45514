"""live: exact-id lookups in live sources, mismatches rejected, failures recorded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.nodes.live import split_matches
from ragloop.retrievers.live import LiveRecord
from ragloop.testing import FakeLiveSource
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio


def _ticket(i: str) -> LiveRecord:
    return LiveRecord("tickets", i, f"Ticket #{i}", f"Ticket {i} is about SSO.")


class TestLive:
    async def test_exact_id_accepted(self) -> None:
        """A record with the requested id answers the query."""
        state = with_queries("ticket #1234", status="short")
        source = FakeLiveSource({"1234": _ticket("1234")})
        assert await turn_node("live", live_sources=[source])(state) == "answer"
        assert state.queries["ticket #1234"].status == "enough"
        assert state.live[0].accepted == ("1234",) and state.graded[0].hit.chunk.title == "Ticket #1234"

    async def test_wrong_id_rejected(self) -> None:
        """#1233 returned for #1234 is a recorded mismatch, not an answer."""
        state = with_queries("ticket #1234", status="short")
        source = FakeLiveSource({"1233": _ticket("1233")}, wrong={"1234": "1233"})
        assert await turn_node("live", live_sources=[source])(state) == "rewrite"
        assert state.live[0].mismatches == ("1233",) and not state.graded

    async def test_no_signal_no_call(self) -> None:
        """Queries without the signal never reach the source."""
        state = with_queries("pricing", status="short")
        source = FakeLiveSource()
        await turn_node("live", live_sources=[source])(state)
        assert source.lookups == []

    async def test_source_down_is_recorded(self) -> None:
        """A failing source is recorded and the turn goes on."""
        state = with_queries("ticket #1234", status="short")
        await turn_node("live", live_sources=[FakeLiveSource(fail_times=1)])(state)
        assert "down" in str(state.live[0].error)

    @given(st.integers(1000, 99999), st.integers(1000, 99999))
    def test_split_never_accepts_other_id(self, asked: int, got: int) -> None:
        """The id matcher never accepts a different id of the same kind."""
        accepted, rejected = split_matches([str(asked)], [_ticket(str(got))])
        assert (accepted != []) == (asked == got)
        assert len(accepted) + len(rejected) == 1
