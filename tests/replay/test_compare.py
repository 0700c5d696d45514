"""The verdict on one replayed question, and the report's order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.replay import VERDICTS, Outcome, ReplayItem, order, verdict

OUTCOMES = ("context", "partial", "none", "direct", "error")
PAGES = st.lists(st.sampled_from(("a.md", "b.md", "c.md")), max_size=3)


class TestVerdict:
    @pytest.mark.parametrize(
        ("before", "after", "expected"),
        [
            (Outcome("none"), Outcome("context", ("z.md",)), "fixed"),
            (Outcome("partial", ("a.md",)), Outcome("context", ("a.md",)), "fixed"),
            (Outcome("none"), Outcome("context"), "changed"),  # "answered" with no citation is not a fix
            (Outcome("none"), Outcome("partial", ("a.md",)), "changed"),
            (Outcome("none"), Outcome("none"), "same"),
            (Outcome("context", ("a.md",)), Outcome("none"), "broken"),
            (Outcome("context", ("a.md",)), Outcome("partial", ("a.md",)), "broken"),
            (Outcome("context", ("a.md",)), Outcome("error"), "broken"),
            (Outcome("direct"), Outcome("none"), "broken"),
            (Outcome("context", ("a.md",)), Outcome("context", ("b.md",)), "changed"),
            (Outcome("context", ("a.md",)), Outcome("context", ("a.md",)), "same"),
            (Outcome("direct"), Outcome("direct"), "same"),
        ],
    )
    def test_cases(self, before: Outcome, after: Outcome, expected: str) -> None:
        """Each verdict, from the issue's definitions."""
        assert verdict(before, after, None)[0] == expected

    def test_a_gone_page_breaks_an_answer(self) -> None:
        """A page the logged answer cited that the knowledge base no longer has is broken, even if another
        page now answers; the reason names it."""
        which, reason = verdict(Outcome("context", ("a.md",)), Outcome("context", ("b.md",)), {"b.md"})
        assert which == "broken" and reason == "cited page gone: a.md"
        assert verdict(Outcome("context", ("a.md",)), Outcome("context", ("b.md",)), {"a.md", "b.md"})[0] == "changed"

    @given(st.sampled_from(OUTCOMES), PAGES)
    def test_nothing_changed_is_same(self, outcome: str, pages: list[str]) -> None:
        """A reply identical to its logged turn, on a knowledge base that still has its pages, is 'same'."""
        side = Outcome.of(outcome, pages)
        assert verdict(side, side, set(pages))[0] == "same"

    @given(st.sampled_from(OUTCOMES[:4]), PAGES, st.sampled_from(OUTCOMES), PAGES)  # a logged turn never errs
    def test_broken_only_from_answered_and_fixed_only_to_cited(
        self, b: str, bp: list[str], a: str, ap: list[str]
    ) -> None:
        """'broken' needs an answered turn before; 'fixed' needs a gap before and a cited answer after."""
        which, _ = verdict(Outcome.of(b, bp), Outcome.of(a, ap), None)
        assert which in VERDICTS
        if which == "broken":
            assert b in ("context", "direct")
        if which == "fixed":
            assert b in ("none", "partial") and a == "context" and ap


def _item(question: str, which: str, turns: int = 1) -> ReplayItem:
    ids = tuple(f"t{n}" for n in range(turns))
    return ReplayItem(question, (), ids, 0.0, Outcome("none"), Outcome("none"), which, "")  # type: ignore[arg-type]


class TestOrder:
    @given(st.permutations([_item("q1", "same"), _item("q2", "broken"), _item("q3", "fixed", 3), _item("q4", "fixed")]))
    def test_worst_first_whatever_the_input_order(self, items: list[ReplayItem]) -> None:
        """Broken first, then fixed (most asked first), changed, same: the same order from any input order."""
        assert [i.question for i in order(items)] == ["q2", "q3", "q4", "q1"]
