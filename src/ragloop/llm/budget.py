"""Time and output budgets of one judge call, derived from what is left of the turn's deadline.

The runner runs every node inside a cancel scope that ends at the turn's deadline (and the finish node inside
its grace period), so a judge can read how much time is left with :func:`time_left` without anything being
threaded through. That is the innermost deadline: a node that wraps each call in its own limit (grade, rewrite)
shows the judge that limit instead. A model call then gets :meth:`CallBudget.seconds`: at most its own timeout,
at most a share of what is left, and never so much that the offline fallbacks behind it (the offline decider,
the offline answerer) lose their time to run. The budget covers the whole call, the SDK's retries included.

Everything here is pure apart from reading the running task's deadline.
"""

from __future__ import annotations

import math

from attrs import frozen

from ragloop.errors import ConfigError

__all__ = ["DEFAULT_BUDGETS", "DEFAULT_OUTPUT_TOKENS", "CallBudget", "time_left"]


def time_left() -> float | None:
    """Seconds until the innermost deadline of the running task (the turn's), or ``None`` when there is none."""
    import anyio

    deadline = anyio.current_effective_deadline()
    if math.isinf(deadline):
        return None
    return deadline - anyio.current_time()


@frozen
class CallBudget:
    """How long one judge's model call may take, as a function of the time left in the turn.

    Attributes:
        share: Largest fraction of the time left the call may use.
        reserve_s: Seconds always left over after the call, for the fallbacks and the steps behind it.
        min_s: A call with less than this available is not sent at all (it could not finish).
    """

    share: float = 0.5
    reserve_s: float = 2.0
    min_s: float = 0.2

    def __attrs_post_init__(self) -> None:
        if not 0 < self.share <= 1 or self.reserve_s < 0 or self.min_s <= 0:
            raise ConfigError(
                f"CallBudget needs 0 < share <= 1, reserve_s >= 0 and min_s > 0; got share={self.share}, "
                f"reserve_s={self.reserve_s}, min_s={self.min_s}"
            )

    def seconds(self, timeout_s: float, left: float | None) -> float:
        """The call's total time limit: ``timeout_s``, cut to the share of ``left`` and to ``left - reserve_s``.

        Returns 0.0 when less than ``min_s`` would be available: the caller should not send the call.
        """
        if left is None:
            return timeout_s
        budget = min(timeout_s, self.share * left, left - self.reserve_s)
        return budget if budget >= self.min_s else 0.0


#: Default budgets per judge. decide and answer have offline fallbacks that run in the same node after a
#: failure: decide leaves room for the offline decider and the rest of the turn, answer leaves the offline answerer
#: its second. grade and rewrite fail open at once, so they may use all the time their node gives them — the
#: innermost deadline is then the node's own per-call limit (``grade_timeout_s``), which a reserve would eat.
DEFAULT_BUDGETS: dict[str, CallBudget] = {
    "decide": CallBudget(share=0.4, reserve_s=3.0),
    "grade": CallBudget(share=1.0, reserve_s=0.0),
    "rewrite": CallBudget(share=1.0, reserve_s=0.0),
    "answer": CallBudget(share=1.0, reserve_s=1.0),
}

#: Default output caps (completion tokens) per judge; every request carries one.
DEFAULT_OUTPUT_TOKENS: dict[str, int] = {"decide": 256, "grade": 96, "rewrite": 48, "answer": 600}
