"""The cases file: every rule broken is one error naming the file, the line and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.kbcheck import MAX_DEPTH, OUTCOMES, CasesError, load_cases, parse_cases

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


class TestHostileFiles:
    def test_byte_order_mark_accepted(self, tmp_path: Path) -> None:
        """A file saved with a UTF-8 BOM (Windows editors) reads like one without."""
        (tmp_path / "c.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n")
        [case] = load_cases(tmp_path / "c.jsonl")
        assert case.question == GOOD["question"] and case.line == 1

    @pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5_000, 200_000])
    def test_deep_json_is_one_error(self, depth: int) -> None:
        """A line nested deeper than a case can be is one error naming the line, never a RecursionError."""
        line = '{"question": "q", "expect_outcome": "none", "note": ' + "[" * depth + "]" * depth + "}"
        with pytest.raises(CasesError, match=r"^cases line 1: nested \d+ levels deep") as info:
            parse_cases([line])
        assert "\n" not in str(info.value)

    def test_brackets_inside_strings_do_not_count(self) -> None:
        """Brackets (and escaped quotes) inside a string are text, not nesting."""
        obj = {**GOOD, "note": '[[[[ "' + "{" * 100}
        [case] = parse_cases([json.dumps(obj)])
        assert case.note == obj["note"]

    def test_huge_integer_is_one_error(self) -> None:
        """An integer longer than Python converts is a line error, not a ValueError traceback."""
        with pytest.raises(CasesError, match="cases line 1: not usable JSON"):
            parse_cases(['{"question": "q", "expect_outcome": "none", "id": ' + "9" * 5_000 + "}"])

    def test_lone_surrogates_replaced_and_noted(self) -> None:
        """A lone surrogate escape becomes U+FFFD (it could never be printed or written) and the line is noted."""
        notes: list[str] = []
        [case] = parse_cases(['{"question": "why \\ud800?", "expect_phrases": ["\\udfff"]}'], "c", notes=notes)
        assert case.question == "why \ufffd?" and case.expect_phrases == ("\ufffd",)
        assert notes == ["c line 1: 2 lone surrogate(s) replaced by U+FFFD"]
        case.question.encode("utf-8")

    def test_paired_surrogates_are_one_character(self) -> None:
        """A surrogate pair escape is the character it names, untouched and not noted."""
        notes: list[str] = []
        [case] = parse_cases(['{"question": "clef \\ud834\\udd1e", "expect_outcome": "none"}'], notes=notes)
        assert case.question == "clef \U0001d11e" and notes == []

    def test_line_separator_inside_a_string(self, tmp_path: Path) -> None:
        """U+2028 or \\x1c written raw inside a JSON string (ensure_ascii=False writes them so) splits no line."""
        obj = {**GOOD, "question": "one\u2028two\x1cthree\x85four"}
        (tmp_path / "c.jsonl").write_text(json.dumps(obj, ensure_ascii=False) + "\n", encoding="utf-8")
        [case] = load_cases(tmp_path / "c.jsonl")
        assert case.question == obj["question"]

    def test_unusable_files(self, tmp_path: Path) -> None:
        """Not UTF-8, a directory: one error each that says what to pass."""
        (tmp_path / "latin.jsonl").write_bytes(b'{"question": "caf\xe9", "expect_outcome": "none"}\n')
        with pytest.raises(CasesError, match="is not UTF-8 text"):
            load_cases(tmp_path / "latin.jsonl")
        with pytest.raises(CasesError, match="is a directory"):
            load_cases(tmp_path)

    def test_error_quoting_the_file_stays_one_line(self) -> None:
        """A field name holding a newline or an escape sequence is quoted on one printable line."""
        with pytest.raises(CasesError) as info:
            parse_cases([json.dumps({**GOOD, "bad\nfield\x1b[31m": 1})])
        assert "\n" not in str(info.value) and "\x1b" not in str(info.value)

    @given(st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))))
    def test_any_line_parses_or_is_one_error(self, text: str) -> None:
        """Any line at all either parses or raises CasesError naming the line, with one line of text."""
        try:
            parse_cases([text, json.dumps(GOOD)])
        except CasesError as exc:
            assert "\n" not in str(exc)
