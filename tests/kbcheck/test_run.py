"""Judging replies against cases, the pass rate's bootstrap interval, and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.kbcheck import Case, bootstrap_interval, judge, junit_xml, run_cases, summarize
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit

pytestmark = pytest.mark.anyio

DOCS = {"How do I rotate a key?": [make_hit("Revoke the old key.", source="docs/api-keys.md", title="API keys")]}


def _rag() -> ChatRAG:
    return ChatRAG(
        retriever=FakeRetriever(DOCS),
        decider=FakeDecider(),
        grader=FakeGrader(),
        rewriter=FakeRewriter(),
        answerer=FakeAnswerer(),
    )


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
    @given(st.lists(st.booleans(), min_size=1, max_size=60))
    def test_interval_holds_the_rate(self, passed: list[bool]) -> None:
        """The interval lies in [0, 1], holds the observed rate, and is the same on every call."""
        rate = sum(passed) / len(passed)
        low, high = bootstrap_interval(passed, resamples=500)
        assert 0.0 <= low <= rate <= high <= 1.0
        assert (low, high) == bootstrap_interval(passed, resamples=500)

    def test_interval_narrows_with_more_cases(self) -> None:
        """Ten times the cases at the same rate give a narrower interval."""
        few = bootstrap_interval([True] * 8 + [False] * 2)
        many = bootstrap_interval([True] * 80 + [False] * 20)
        assert many[1] - many[0] < few[1] - few[0]

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
