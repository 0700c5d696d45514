"""A replay as JSON, as a pull-request comment, and as JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from ragloop.replay import Outcome, ReplayItem, ReplayReport, as_dict, junit_xml, markdown, order

ANY_TEXT = st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.integers(0, 0x1F).map(chr)))


def _report(*items: ReplayItem) -> ReplayReport:
    return ReplayReport(order(items), turns=sum(len(i.turn_ids) for i in items), skipped=(("no question kept", 2),))


def _item(question: str, which: str, before: Outcome, after: Outcome, turns: int = 1) -> ReplayItem:
    ids = tuple(f"{question[:3]}{n}" for n in range(turns))
    return ReplayItem(question, (("tenant", ("acme",)),), ids, 1.0, before, after, which, "why")  # type: ignore[arg-type]


REPORT = _report(
    _item("How do I connect Zapier?", "fixed", Outcome("none"), Outcome("context", ("zapier.md",)), 3),
    _item("When are invoices sent?", "broken", Outcome("context", ("billing.md",)), Outcome("none")),
    _item("How do I rotate a key?", "same", Outcome("context", ("keys.md",)), Outcome("context", ("keys.md",))),
)


class TestRender:
    def test_json(self) -> None:
        """Counts per verdict, questions, turns, skipped, ok; every item with its before and after."""
        data = json.loads(json.dumps(as_dict(REPORT)))
        assert data["summary"] == {
            "broken": 1,
            "fixed": 1,
            "changed": 0,
            "same": 1,
            "questions": 3,
            "turns": 5,
            "skipped": {"no question kept": 2},
            "ok": False,
        }
        assert data["items"][0]["verdict"] == "broken" and data["items"][0]["filters"] == {"tenant": ["acme"]}
        assert data["items"][1]["after"] == {"outcome": "context", "pages": ["zapier.md"]}

    def test_markdown_lists_broken_first_and_counts_same(self) -> None:
        """The comment says something broke, gives the counts, lists broken before fixed with before/after
        outcome and pages, and never lists the 'same' questions."""
        text = markdown(REPORT)
        assert text.startswith("### ragloop replay: ❌ something broke")
        assert "**1** broken · **1** fixed · **0** changed · **1** same" in text
        assert text.index("#### broken (1)") < text.index("#### fixed (1)")
        assert "| When are invoices sent? | 1 | context: `billing.md` | none: — |" in text
        assert "rotate a key" not in text and "2 turns not replayed: no question kept" in text

    def test_markdown_cell_cannot_break_the_table(self) -> None:
        """A question holding pipes, newlines or markup stays in its cell."""
        odd = _item("a | b\n## c <img src=x>", "broken", Outcome("context", ("a.md",)), Outcome("none"))
        row = next(line for line in markdown(_report(odd)).splitlines() if line.startswith("| a"))
        assert row.count("|") - row.count("\\|") == 5 and row.count("<") == row.count("\\<") == 1

    @given(ANY_TEXT)
    def test_junit_parses_for_any_question(self, question: str) -> None:
        """Whatever a logged question holds, the JUnit XML parses; a broken question is a failure."""
        report = _report(_item(question or "q", "broken", Outcome("context", ("a.md",)), Outcome("none")))
        xml = junit_xml(report)
        xml.encode("utf-8")
        suite = ET.fromstring(xml.split("\n", 1)[1]).find("testsuite")
        assert suite is not None and suite.get("failures") == "1"
        assert suite.find("testcase/failure") is not None
