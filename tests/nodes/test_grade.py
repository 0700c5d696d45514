"""grade: per-query grading, fail-open, statuses; routing goes through the policy."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import JudgeError
from ragloop.nodes.grade import grade_all
from ragloop.state import Verdict
from ragloop.testing import FakeGrader, FakeLiveSource, make_hit
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio


class TestGrade:
    async def test_each_query_graded_against_itself(self) -> None:
        """A chunk found by one query is graded against that query only."""
        grader = FakeGrader()
        state = with_queries("a", "b")
        state.queries["a"].hits = [make_hit("for a")]
        state.queries["b"].hits = [make_hit("for b")]
        await turn_node("grade", grader=grader)(state)
        assert sorted((q, t) for q, t in [(c[0], c[1]) for c in grader.calls]) == sorted(
            [("a", state.queries["a"].hits[0].id), ("b", state.queries["b"].hits[0].id)]
        )

    async def test_fail_open_on_error_and_timeout(self) -> None:
        """A grader error or timeout keeps the chunk, flags it and records the reason."""

        def judge(q: str, hit: object) -> Verdict:
            raise JudgeError("bad json")

        state = with_queries("a")
        state.queries["a"].hits = [make_hit("t")]
        assert await turn_node("grade", grader=FakeGrader(judge))(state) == "answer"
        [failed] = [g.verdict for g in state.graded if g.verdict.fail_open]
        assert failed.keep and "bad json" in failed.reason
        assert state.queries["a"].status == "enough"
        slow = with_queries("a")
        slow.queries["a"].hits = [make_hit("t")]
        await turn_node("grade", grader=FakeGrader(delay_s=5), timeout_s=0.02)(slow)
        assert [g.verdict.fail_open and "timed out" in g.verdict.reason for g in slow.graded] == [True]

    async def test_grades_fail_open_before_the_turn_deadline(self) -> None:
        """With less of the turn left than timeout_s, a hung grader fails open within half of it: the hits
        reach the answer instead of being cancelled with the node at the deadline."""
        state = with_queries("a")
        state.queries["a"].hits = [make_hit("t")]
        with anyio.move_on_after(1.0) as scope:
            await turn_node("grade", grader=FakeGrader(delay_s=60), timeout_s=10.0)(state)
        assert not scope.cancelled_caught
        assert [g.verdict.fail_open and "timed out" in g.verdict.reason for g in state.graded] == [True]

    async def test_short_query_routes_to_rewrite_then_answer(self) -> None:
        """Short queries with attempts left go to rewrite; without, to answer."""
        state = with_queries("a")
        state.queries["a"].hits = [make_hit("t")]
        grader = FakeGrader(lambda q, h: Verdict("irrelevant"))
        assert await turn_node("grade", grader=grader)(state) == "rewrite"
        assert state.queries["a"].status == "short"
        state2 = with_queries("a")
        state2.queries["a"].attempt = 2
        assert await turn_node("grade", grader=grader)(state2) == "answer"

    async def test_signal_routes_to_live(self) -> None:
        """A short query carrying a live source's signal goes to live."""
        state = with_queries("status of ticket #1234")
        assert await turn_node("grade", grader=FakeGrader(), live_sources=[FakeLiveSource()])(state) == "live"

    @given(st.lists(st.sampled_from(["ok", "no", "raise"]), min_size=1, max_size=12))
    def test_failure_pattern_keeps_exactly_failed(self, pattern: list[str]) -> None:
        """Any pattern of grader failures keeps exactly the failed chunks (fail-open) and counts them."""
        hits = [make_hit(f"text {i}", chunk_id=f"c{i}") for i in range(len(pattern))]
        plan = {h.id: p for h, p in zip(hits, pattern, strict=True)}

        def judge(q: str, hit: object) -> Verdict:
            action = plan[hit.id]  # type: ignore[attr-defined]
            if action == "raise":
                raise JudgeError("boom")
            return Verdict("relevant" if action == "ok" else "irrelevant")

        graded = anyio.run(
            lambda: grade_all(FakeGrader(judge), [("q", h) for h in hits], timeout_s=1, max_concurrency=4)
        )
        assert [g.hit.id for g in graded] == [h.id for h in hits]
        failed = {g.hit.id for g in graded if g.verdict.fail_open}
        assert failed == {i for i, p in plan.items() if p == "raise"}
        assert all(g.verdict.keep for g in graded if g.verdict.fail_open)
        assert {g.hit.id for g in graded if g.verdict.keep} == {i for i, p in plan.items() if p != "no"}
