"""Checks on what a model wrote before ragloop acts on it (``ragloop.llm.guards``)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.llm.guards import (
    MAX_QUERY_CHARS,
    flat_objects,
    is_small_talk,
    model_json,
    query_problem,
    reply_problem,
)


class TestQueryProblem:
    @pytest.mark.parametrize("query", ["rotate an API key", "SSO SAML Okta", "E4001 CSV import limit", "données 日本"])
    def test_a_plain_query_is_searchable(self, query: str) -> None:
        """Words in any script, codes and initials pass."""
        assert query_problem(query) is None

    @pytest.mark.parametrize(
        ("query", "reason"),
        [
            ("   ", "empty query"),
            ('<tool_call>{"name": "search"}</tool_call>', "markup"),
            ('{"query": "sso"}', "markup"),
            ("sso <|im_end|>", "markup"),
            ("```sso```", "markup"),
            ("sso\x00setup", "unprintable"),
            ("!!! ??? ...", "no words"),
            ("1/2/3/4/5/6/7/8/9/0/1/2/3 a", "mostly punctuation"),
        ],
    )
    def test_what_a_model_must_not_search_is_named(self, query: str, reason: str) -> None:
        """Tool-call syntax, template tokens, control characters and symbol runs each get their reason."""
        assert reason in (query_problem(query) or "")

    def test_the_length_limit_names_both_numbers(self) -> None:
        """An over-long query's reason says its length and the limit."""
        assert query_problem("a" * (MAX_QUERY_CHARS + 1)) == "query is 201 characters; the limit is 200"

    @given(st.text(alphabet=st.characters(categories=("L", "N")), min_size=MAX_QUERY_CHARS + 1, max_size=400))
    def test_over_the_limit_is_never_searched(self, query: str) -> None:
        """Property: however wordy, a query longer than the limit is refused."""
        assert query_problem(query) is not None

    @given(st.text(alphabet=st.characters(exclude_categories=("Cc",)), max_size=300))
    def test_spacing_does_not_change_the_verdict(self, query: str) -> None:
        """Property: the check judges the query's words, not its spacing (runs of spaces, tabs, newlines)."""
        spaced = "\n " + query.replace(" ", " \t  ") + "\t"
        assert query_problem(spaced) == query_problem(query)


class TestReplyProblem:
    def test_a_reply_is_shown(self) -> None:
        """A sentence is a usable direct reply."""
        assert reply_problem("Hello! Ask me about the product docs.") is None

    @pytest.mark.parametrize(
        ("reply", "reason"),
        [("", "empty reply"), ("<tool_call>x</tool_call>", "markup"), ("\x07beep", "unprintable"), ("?!", "no words")],
    )
    def test_an_unusable_reply_is_named(self, reply: str, reason: str) -> None:
        """Empty, markup, control characters and no words each get their reason."""
        assert reason in (reply_problem(reply) or "")

    def test_the_reply_limit_is_its_own(self) -> None:
        """A long reply is refused at ``max_chars``, not at the query limit."""
        assert reply_problem("word " * 100) is None
        assert "limit for a direct reply is 10" in (reply_problem("word " * 3, max_chars=10) or "")


class TestSmallTalk:
    @pytest.mark.parametrize("question", ["hi", "Thanks! Bye.", "hello, who are you?"])
    def test_every_part_small_talk(self, question: str) -> None:
        """Greetings, thanks and goodbyes, alone or together, are small talk."""
        assert is_small_talk(question)

    @pytest.mark.parametrize("question", ["", "hi, how do I rotate an API key?", "What is SSO?"])
    def test_a_question_in_it_is_not(self, question: str) -> None:
        """A real question anywhere, or nothing at all, is not small talk."""
        assert not is_small_talk(question)


#: Replies a lying model or server can send that exhaust the JSON decoder's recursion, or nearly.
DEEP = [
    "[" * 100_000,
    '{"verdicts": ' + "[" * 100_000 + "}",
    'x {"id": ' + "[" * 100_000 + "} y",
    "[" * 500 + "]" * 500,
]


class TestModelJSON:
    @pytest.mark.parametrize("text", DEEP[:2])
    def test_nesting_too_deep_to_read_is_a_value_error(self, text: str) -> None:
        """``[[[[…`` a hundred thousand deep is ``ValueError`` (what every parser of model output catches), never
        a ``RecursionError``."""
        with pytest.raises(ValueError, match="nested too deeply"):
            model_json(text)

    @given(st.text(max_size=200) | st.sampled_from(DEEP))
    def test_any_text_parses_or_is_a_value_error(self, text: str) -> None:
        """Whatever a model wrote, reading it as JSON returns a value or raises ``ValueError``; the flat objects
        found in it are dicts."""
        with contextlib.suppress(ValueError):
            model_json(text)
        assert all(isinstance(obj, dict) for obj in flat_objects(text))

    def test_flat_objects_are_what_survives_of_a_cut_reply(self) -> None:
        """Complete objects without an object inside, in order; broken ones and the cut tail are skipped."""
        text = 'Sure! {"id": "1", "label": "relevant"}, {"id": 2, bad}, {"id": "3", "x": [1, [2]]}, {"id": "4", "la'
        assert flat_objects(text) == [{"id": "1", "label": "relevant"}, {"id": "3", "x": [1, [2]]}]
