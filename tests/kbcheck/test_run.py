"""Judging replies against cases, the pass rate's Wilson interval, and JUnit XML that any text leaves well-formed."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.kbcheck import Case, CaseResult, judge, junit_xml, run_cases, summarize, wilson_interval, xml_text
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit
from ragloop.turn import Judges, Turn

pytestmark = pytest.mark.anyio

DOCS = {"How do I rotate a key?": [make_hit("Revoke the old key.", source="docs/api-keys.md", title="API keys")]}


def _rag() -> ChatRAG:
    return ChatRAG(Turn(FakeRetriever(DOCS), Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer())))


class TestJudge:
    async def test_every_broken_expectation_named(self) -> None:
        """A reply that cites another page, lacks a phrase and has another outcome fails with three reasons."""
        reply = await _rag().ask("How do I rotate a key?")  # the fake answer: "context: [1]"
        ok = Case(1, "q", expect_sources=("api-keys.md",), expect_phrases=("CONTEXT",), expect_outcome="context")
        assert judge(ok, reply) == ()  # a path suffix matches; phrases ignore case
        bad = Case(2, "q", expect_sources=("sso.md",), expect_phrases=("revoke",), expect_outcome="partial")
        reasons = judge(bad, reply)
        assert len(reasons) == 3
        assert "expected one of sso.md to be cited; cited: docs/api-keys.md" in reasons[0]
        assert "'revoke'" in reasons[1] and "outcome was context, expected partial" in reasons[2]

    def test_source_match_is_by_path_not_substring(self) -> None:
        """'keys.md' does not match 'api-keys.md': only the whole name or a path ending in it does."""
        from ragloop.kbcheck._run import _matches

        assert _matches("docs/api-keys.md", "api-keys.md") and _matches("api-keys.md", "/api-keys.md")
        assert not _matches("api-keys.md", "keys.md")

    async def test_a_turn_that_cannot_run_fails_its_case(self) -> None:
        """A case whose question the chat refuses fails with the reason, and the run goes on."""
        cases = [
            Case(1, "x" * 9_000, expect_outcome="none"),
            Case(2, "How do I rotate a key?", expect_outcome="context"),
        ]
        first, second = await run_cases(_rag(), cases)
        assert not first.passed and first.outcome == "error" and "limit" in first.reasons[0]
        assert second.passed


class TestSummary:
    @given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
    def test_interval_holds_the_rate(self, counts: tuple[int, int]) -> None:
        """The interval lies in [0, 1], holds the observed rate, and is strictly wider than a point."""
        passed, total = counts
        low, high = wilson_interval(passed, total)
        assert 0.0 <= low <= passed / total <= high <= 1.0
        assert low < high

    def test_all_passing_does_not_claim_certainty(self) -> None:
        """20 of 20 passing gives a lower bound of about 0.839, not 1 (the bootstrap said 100 %)."""
        low, high = wilson_interval(20, 20)
        assert low == pytest.approx(20 / (20 + 1.959964**2), abs=1e-4) and high == 1.0
        low, high = wilson_interval(0, 20)
        assert low == 0.0 and high == pytest.approx(1 - 20 / (20 + 1.959964**2), abs=1e-4)

    def test_known_value(self) -> None:
        """8 of 10 at 95 % is [0.490, 0.943] (the textbook Wilson interval)."""
        low, high = wilson_interval(8, 10)
        assert (round(low, 3), round(high, 3)) == (0.490, 0.943)

    def test_interval_narrows_with_more_cases(self) -> None:
        """Ten times the cases at the same rate give a narrower interval; no cases say nothing."""
        few, many = wilson_interval(8, 10), wilson_interval(80, 100)
        assert many[1] - many[0] < few[1] - few[0]
        assert wilson_interval(0, 0) == (0.0, 1.0)

    def test_summary_uses_it(self) -> None:
        """The summary's interval of all-passing results is below 1 at its lower end."""
        results = [CaseResult(Case(i, "q", expect_outcome="none"), True, (), "none", (), "", 0.0) for i in range(20)]
        summary = summarize(results)
        assert summary.rate == 1.0 and 0.83 < summary.low < 0.85 and summary.high == 1.0

    async def test_junit_counts_and_names_failures(self) -> None:
        """JUnit XML has one testcase per case and a failure element with the reasons for each failing one."""
        cases = [
            Case(1, "How do I rotate a key?", expect_outcome="context", id="ok"),
            Case(2, "How do I rotate a key?", expect_outcome="none"),
        ]
        results = await run_cases(_rag(), cases)
        assert summarize(results).passed == 1
        root = ET.fromstring(junit_xml(results).split("\n", 1)[1])
        suite = root.find("testsuite")
        assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
        failures = [c for c in suite.iter("testcase") if c.find("failure") is not None]
        assert [c.get("name") for c in failures] == ["line 2: How do I rotate a key?"]
        assert "expected none" in (failures[0].find("failure").get("message") or "")  # type: ignore[union-attr]


class TestPhrases:
    def test_markdown_marks_do_not_hide_a_phrase(self) -> None:
        """'retried 8 times' is said by 'retried **8 times**', and snake_case words keep their underscores."""
        from ragloop.kbcheck._run import _plain

        assert "retried 8 times" in _plain("Failed deliveries are retried **8 times** with `backoff`.")
        assert "error_code" in _plain("the _error_code_ field")


def _result(question: str, text: str, reasons: tuple[str, ...] = ("outcome was none, expected context",)) -> CaseResult:
    return CaseResult(Case(1, question, expect_outcome="context", id=None), False, reasons, "none", (), text, 0.1)


#: Any text a JSON string can carry: every code point, lone surrogates and control characters included.
ANY_TEXT = st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.integers(0, 0x1F).map(chr)))


class TestJUnitAnyText:
    @given(ANY_TEXT, ANY_TEXT)
    def test_any_text_gives_parseable_xml(self, question: str, answer: str) -> None:
        """Whatever a question or an answer holds (lone surrogates, control characters), the XML parses, encodes
        as UTF-8, and keeps every character XML can carry."""
        xml = junit_xml([_result(question or "q", answer, (f"the answer does not say {question!r}",))])
        xml.encode("utf-8")  # no lone surrogate left
        root = ET.fromstring(xml.split("\n", 1)[1])
        failure = root.find("testsuite/testcase/failure")
        assert failure is not None
        kept = xml_text(answer)[0].replace("\r\n", "\n").replace("\r", "\n")  # XML's own line-end rule
        assert kept in (failure.text or "")

    def test_surrogates_and_controls_replaced_and_said(self) -> None:
        """A lone surrogate becomes U+FFFD, a control character its \\u escape, and the suite counts them."""
        xml = junit_xml([_result("why \ud800 here\x01?", "a\x1bb")])
        root = ET.fromstring(xml.split("\n", 1)[1])
        suite = root.find("testsuite")
        assert suite is not None
        case = suite.find("testcase")
        assert case is not None and case.get("name") == "line 1: why \ufffd here\\u0001?"
        prop = suite.find("properties/property")
        assert prop is not None and prop.get("name") == "ragloop.xml_replaced" and prop.get("value") == "5"
        assert "replaced" in (suite.findtext("system-err") or "")

    def test_clean_text_untouched(self) -> None:
        """Tabs, newlines, emoji and non-BMP text pass through, and nothing is said."""
        assert xml_text("a\tb\nc 🙂 𝄞 é") == ("a\tb\nc 🙂 𝄞 é", 0)
        xml = junit_xml([_result("q", "fine")])
        assert "<system-err>" not in xml and 'value="0"' in xml
