"""The cases file: every rule broken is one error naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.kbcheck import OUTCOMES, CasesError, load_cases, parse_cases

GOOD = {"question": "How do I rotate an API key?", "expect_sources": ["api-keys.md"]}


class TestParse:
    def test_fields_read(self) -> None:
        """Every field of a full case is read; blank lines are skipped but count for line numbers."""
        full = {
            "id": "rotate",
            "question": " How do I rotate it? ",
            "history": [{"role": "user", "content": "API keys"}, {"role": "assistant", "content": "Sure."}],
            "filters": {"tenant": "acme", "version": ["1", "2"]},
            "expect_sources": ["api-keys.md"],
            "expect_phrases": ["revoke"],
            "expect_outcome": "context",
            "note": "keep",
        }
        [case] = parse_cases(["", json.dumps(full)])
        assert case.line == 2 and case.question == "How do I rotate it?" and case.id == "rotate"
        assert case.history == (("user", "API keys"), ("assistant", "Sure."))
        assert case.filters == {"tenant": ("acme",), "version": ("1", "2")}
        assert (case.expect_sources, case.expect_phrases) == (("api-keys.md",), ("revoke",))
        assert case.expect_outcome == "context"

    @pytest.mark.parametrize(
        ("line", "field"),
        [
            ("{not json", "not valid JSON"),
            ('["a list"]', "a case must be a JSON object"),
            ('{"expect_outcome": "context"}', "field 'question'"),
            ('{"question": "  ", "expect_outcome": "context"}', "field 'question'"),
            ('{"question": "q", "expect_source": ["a.md"]}', "unknown field 'expect_source'"),
            ('{"question": "q", "expect_sources": "a.md"}', "field 'expect_sources'"),
            ('{"question": "q", "expect_phrases": [""]}', "field 'expect_phrases'"),
            ('{"question": "q", "expect_outcome": "good"}', "field 'expect_outcome'"),
            ('{"question": "q"}', "give at least one"),
            (
                '{"question": "q", "expect_outcome": "none", "history": [{"role": "system", "content": "x"}]}',
                "field 'history[0]'",
            ),
            ('{"question": "q", "expect_outcome": "none", "filters": {"tenant": 3}}', "field 'filters.tenant'"),
            ('{"question": "q", "expect_outcome": "none", "id": 7}', "field 'id'"),
        ],
    )
    def test_bad_line_named(self, line: str, field: str) -> None:
        """A bad line is one error with the file name, its line number and what is wrong with which field."""
        with pytest.raises(CasesError) as info:
            parse_cases([json.dumps(GOOD), line], "cases.jsonl")
        message = str(info.value)
        assert message.startswith("cases.jsonl line 2: ") and field in message and "\n" not in message

    def test_empty_file(self, tmp_path: Path) -> None:
        """A file without cases, or no file, is an error that says what to write or where it looked."""
        (tmp_path / "c.jsonl").write_text("\n\n", encoding="utf-8")
        with pytest.raises(CasesError, match="holds no cases"):
            load_cases(tmp_path / "c.jsonl")
        with pytest.raises(CasesError, match="no cases file"):
            load_cases(tmp_path / "missing.jsonl")

    @given(
        st.text(min_size=1).filter(lambda t: t.strip()),
        st.lists(st.text(min_size=1).filter(lambda t: t.strip()), max_size=3),
        st.sampled_from((None, *OUTCOMES)),
    )
    def test_valid_cases_round_trip(self, question: str, phrases: list[str], outcome: str | None) -> None:
        """Any case with a question and at least one expectation parses to the values written."""
        obj: dict[str, object] = {"question": question, "expect_sources": ["a.md"], "expect_phrases": phrases}
        if outcome is not None:
            obj["expect_outcome"] = outcome
        [case] = parse_cases([json.dumps(obj)])
        assert case.question == question.strip() and case.expect_phrases == tuple(p.strip() for p in phrases)
        assert case.expect_outcome == outcome
