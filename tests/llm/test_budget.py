"""Time budgets of one judge call (``ragloop.llm.budget``)."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget, time_left


class TestCallBudget:
    def test_no_deadline_gives_the_timeout(self) -> None:
        """Without a turn deadline a call gets its own timeout."""
        assert CallBudget().seconds(30.0, None) == 30.0

    def test_a_share_of_what_is_left(self) -> None:
        """With 10 s left, share 0.5 and a 2 s reserve, the call gets 5 s; with 3 s left, 1 s (the reserve wins)."""
        budget = CallBudget(share=0.5, reserve_s=2.0)
        assert budget.seconds(30.0, 10.0) == 5.0
        assert budget.seconds(30.0, 3.0) == 1.0

    def test_too_little_time_sends_nothing(self) -> None:
        """Below ``min_s`` the budget is 0.0: the caller does not send a call that could not finish."""
        assert CallBudget(reserve_s=2.0, min_s=0.2).seconds(30.0, 2.1) == 0.0

    @pytest.mark.parametrize("bad", [{"share": 0.0}, {"share": 1.5}, {"reserve_s": -1.0}, {"min_s": 0.0}])
    def test_bad_settings_are_refused(self, bad: dict[str, float]) -> None:
        """A share outside (0, 1], a negative reserve or a non-positive minimum is a ConfigError naming them."""
        with pytest.raises(ConfigError, match="CallBudget needs"):
            CallBudget(**bad)

    @given(
        share=st.floats(0.01, 1.0),
        reserve=st.floats(0.0, 5.0),
        min_s=st.floats(0.01, 1.0),
        timeout=st.floats(0.0, 120.0),
        left=st.floats(-5.0, 300.0),
    )
    def test_never_more_than_any_bound(
        self, share: float, reserve: float, min_s: float, timeout: float, left: float
    ) -> None:
        """Property: the budget is 0 or at least ``min_s``, and never above the timeout, the share or left - reserve."""
        got = CallBudget(share=share, reserve_s=reserve, min_s=min_s).seconds(timeout, left)
        assert got == 0.0 or (
            got >= min_s and got <= timeout and got <= share * left + 1e-9 and got <= left - reserve + 1e-9
        )

    def test_every_judge_has_a_budget_and_an_output_cap(self) -> None:
        """decide, grade, rewrite and answer each have a default budget and completion-token cap."""
        assert set(DEFAULT_BUDGETS) == set(DEFAULT_OUTPUT_TOKENS) == {"decide", "grade", "rewrite", "answer"}


class TestTimeLeft:
    @pytest.mark.anyio
    async def test_reads_the_innermost_deadline(self) -> None:
        """No deadline is None; inside ``fail_after(5)`` a little under 5 s are left."""
        assert time_left() is None
        with anyio.fail_after(5):
            left = time_left()
        assert left is not None and 4.0 < left <= 5.0
