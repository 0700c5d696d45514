"""Item 8: the fuzzing gaps left by tests/retrievers/test_ingest.py and tests/llm (which already cover cleaning
of markup, chunk bounds, decide never crashing and id extraction never crashing).

Added here: cleaning is idempotent on *arbitrary* unicode (not only markup fragments) and chunking never raises
on it; topic splitting keeps every meaningful question non-empty; identifiers embedded in arbitrary text are
always found, and their normal form is idempotent and symmetric. ``HYPOTHESIS_PROFILE=soak`` runs more examples.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from ragloop.llm.offline.decide import OfflineDecider, split_topics
from ragloop.retrievers.ingest import Document, chunk_document, clean_text
from ragloop.state import PageContext
from ragloop.text.ids import extract_ids, id_matches, normalise_id
from tests.reliability._support import TOPICS, count
from tests.strategies import markup_text, words

FORMATS = st.sampled_from(["markdown", "text", "html", "beir"])
#: Arbitrary unicode, with the characters that break cleaners made likely.
nasty_text = st.one_of(
    st.text(),
    st.lists(
        st.one_of(
            st.sampled_from(["<", ">", "&", ";", "`", "```", "\n", "#", "[", "]", "(", ")", "{{", "}}", "\u200b"]),
            st.sampled_from(["&amp;", "&lt;", "&#", "<b>", "</b>", "<!--", "-->", "\r\n", "\x00", "\ud800", "é"]),
            words,
            st.text(max_size=3),
        ),
        max_size=40,
    ).map("".join),
)
#: The key facts of the sample topics, as meaningful English questions.
meaningful_questions = st.sampled_from([text for _, _, text in TOPICS]).map(
    lambda t: f"Why {t[0].lower()}{t[1:].rstrip('.')}?"
)


class TestCleaning:
    @given(st.one_of(nasty_text, markup_text), FORMATS)
    @example("&amp;amp;", "html")
    @example("<b>&lt;b&gt;</b>", "text")
    def test_idempotent_on_arbitrary_text(self, text: str, fmt: str) -> None:
        """Cleaning arbitrary unicode never raises, and cleaning a cleaned text changes nothing."""
        once = clean_text(text, fmt)
        assert clean_text(once, fmt) == once
        count("fuzz_clean_examples")

    @given(nasty_text, st.integers(20, 300), FORMATS)
    def test_chunking_arbitrary_text(self, text: str, max_tokens: int, fmt: str) -> None:
        """Chunking arbitrary unicode never raises; chunks are non-empty and within the token limit."""
        from ragloop.retrievers.embed import minilm_tokenizer
        from ragloop.retrievers.ingest import index_text

        tok = minilm_tokenizer()
        assert tok is not None
        doc = Document(id="d", title="t", text=text, source="s", fmt=fmt)
        chunks = chunk_document(doc, max_tokens=max_tokens, tokenizer=tok)
        assert all(c.text.strip() for c in chunks)
        assert all(len(s) + 2 <= max_tokens for s in tok.token_spans([index_text(c) for c in chunks]))
        count("fuzz_chunk_examples")


class TestQuerySplitting:
    @given(nasty_text)
    def test_split_never_raises_and_never_yields_blanks(self, text: str) -> None:
        """split_topics on arbitrary text returns stripped, non-blank topics."""
        topics = split_topics(text)
        assert all(t.strip() and t == t.strip(" \t\n,;:.!?") for t in topics)
        count("fuzz_split_examples")

    @given(meaningful_questions, st.sampled_from(["", "?", "  ", " please", "!!", "\n"]))
    def test_meaningful_question_is_never_lost(self, question: str, tail: str) -> None:
        """A meaningful question always yields at least one topic and at least one search query."""
        assert split_topics(question + tail)
        decision = OfflineDecider().decide_sync(question + tail, (), PageContext())
        assert decision.queries and decision.reply is None
        count("fuzz_split_examples")

    @given(st.lists(meaningful_questions, min_size=2, max_size=3, unique=True))
    def test_joined_questions_keep_every_topic(self, questions: list[str]) -> None:
        """Several questions in one message give one query per question at least (up to the cap)."""
        decision = OfflineDecider().decide_sync(" ".join(questions), (), PageContext())
        assert len(decision.queries) >= min(len(questions), 4)
        count("fuzz_split_examples")


#: Separators that cannot glue to an id (so the id must be found).
_seps = st.sampled_from([" ", "\n", ", ", " (", ": ", "; "])
_filler = st.lists(words, max_size=5).map(" ".join)


class TestIdExtraction:
    @given(_filler, _seps, st.integers(1, 10**9), _seps, _filler)
    def test_embedded_ticket_is_found(self, before: str, s1: str, n: int, s2: str, after: str) -> None:
        """A ticket id written as #N inside arbitrary words is always extracted, in normal form."""
        text = f"{before}{s1}#{n}{s2}{after}"
        assert f"#{n}" in extract_ids(text).get("ticket", frozenset())
        count("fuzz_id_examples")

    @given(_filler, _seps, st.integers(100, 999_999), _seps, _filler)
    def test_embedded_error_code_is_found(self, before: str, s1: str, n: int, s2: str, after: str) -> None:
        """An error code written as E<digits> inside arbitrary words is always extracted."""
        code = f"E{n}"
        assert code in extract_ids(f"{before}{s1}{code}{s2}{after}").get("error", frozenset())
        count("fuzz_id_examples")

    @given(
        st.one_of(st.text(max_size=30), st.integers(0, 10**9).map(str), st.integers(0, 10**6).map(lambda n: f"#{n}"))
    )
    @example("ticket 1234")
    @example("v2.3.1")
    @example("err_x1")
    def test_normal_form_is_idempotent_and_matching_is_an_equivalence(self, value: str) -> None:
        """normalise_id(normalise_id(x)) == normalise_id(x), and an id always matches its normal form."""
        normal = normalise_id(value)
        assert normalise_id(normal) == normal
        assert id_matches(value, value) and id_matches(value, normal) and id_matches(normal, value)
        count("fuzz_id_examples")
