"""Tests for ragloop.text.terms: tokenizer, stemmer, CorpusStats, glossary mining."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ragloop.text.terms import (
    CorpusStats,
    content_words,
    key_terms,
    merge_glossary,
    mine_glossary,
    stem,
    tokenize,
)
from tests.strategies import OFFLINE_CORPUS


class TestTokenize:
    def test_keeps_identifiers_whole(self) -> None:
        """Ticket ids, versions, error constants and command names survive as single tokens."""
        tokens = tokenize("See #1234: ERR_TIMEOUT on v2.3.1 (also 2.3.1) after ZADD")
        assert {"#1234", "err_timeout", "v2.3.1", "2.3.1", "zadd"} <= set(tokens)

    def test_unicode_words_and_hyphens(self) -> None:
        """Unicode letters stay in words; hyphenated words split into their parts."""
        assert tokenize("Naïve café single sign-on") == ["naïve", "café", "single", "sign", "on"]

    @given(st.text())
    def test_never_crashes(self, text: str) -> None:
        """Any unicode text tokenizes to lower-case non-empty tokens."""
        for token in tokenize(text):
            assert token and token == token.lower()


class TestKeyTerms:
    def test_drops_stopwords_and_stems(self) -> None:
        """Key terms are stemmed content words in order, without question words or repeats."""
        terms = key_terms("How do I reset passwords? Password resets!")
        assert [t.stem for t in terms] == [stem("reset"), stem("passwords")]
        assert terms[0].surface == "reset"

    def test_a_caller_changing_its_list_changes_no_later_answer(self) -> None:
        """The terms are memoised per text (issue 35's profile): each call gets a list of its own."""
        first = key_terms("rotate the API key")
        first.clear()
        assert [t.surface for t in key_terms("rotate the API key")] == ["rotate", "api", "key"]

    @given(st.text())
    def test_memoised_terms_equal_fresh_ones(self, text: str) -> None:
        """The memoised terms are exactly what a fresh pass over the same text gives."""
        from ragloop.text.terms import _key_terms

        assert key_terms(text) == list(_key_terms.__wrapped__(text))

    def test_content_words_keep_case(self) -> None:
        """content_words keeps the words as written, for readable queries."""
        assert content_words("What is SSO in the Admin console?") == ["SSO", "Admin", "console"]


class TestCorpusStats:
    def test_counts_and_idf(self) -> None:
        """Document frequency counts documents, and rarer terms get a higher IDF."""
        stats = CorpusStats.from_texts(["sso okta sso", "sso saml", "billing"])
        assert stats.n_docs == 3
        assert stats.doc_freq("sso") == 2
        assert stats.doc_freq("missing") == 0
        assert stats.idf("okta") > stats.idf("sso") > 0
        assert stats.idf("missing") == math.log(1 + 3.5 / 0.5)

    def test_cooccurrence_and_pmi(self) -> None:
        """Co-occurrence counts documents with both terms; PMI is -inf for terms never together."""
        stats = CorpusStats.from_texts(["sso okta", "sso okta saml", "billing invoice", "sso"])
        assert stats.cooccurrence("sso", "okta") == 2
        assert stats.cooccurrence(stem("okta"), stem("invoice")) == 0
        assert stats.pmi(stem("okta"), stem("invoice")) == -math.inf
        assert stats.pmi(stem("billing"), stem("invoice")) > stats.pmi("sso", "okta") > 0

    def test_associated_terms_come_from_the_topic(self) -> None:
        """Terms associated with "okta" are from SSO documents, never billing ones, and exclude given stems."""
        stats = CorpusStats.from_texts(OFFLINE_CORPUS)
        assoc = [t for t, _ in stats.associated([stem("okta")], k=8)]
        assert assoc, "expected some associated terms"
        assert stem("saml") in assoc
        assert stem("invoices") not in assoc
        excluded = stats.associated([stem("okta")], k=8, exclude=[stem("saml")])
        assert stem("saml") not in [t for t, _ in excluded]

    def test_surface_form(self) -> None:
        """A stem maps back to its most frequent surface form."""
        stats = CorpusStats.from_texts(["configuring sso", "configuring okta", "configured saml"])
        assert stats.surface_of(stem("configuring")) == "configuring"

    def test_empty_corpus(self) -> None:
        """An empty corpus builds and associates nothing."""
        stats = CorpusStats.from_texts([])
        assert stats.n_docs == 0
        assert stats.associated(["sso"]) == []


class TestGlossary:
    def test_long_form_then_abbreviation(self) -> None:
        """'Long Form (LF)' is mined when the initials spell the abbreviation."""
        found = mine_glossary(["We use Single Sign-On (SSO) and role-based access control (RBAC) daily."])
        assert found == {"SSO": "single sign-on", "RBAC": "role-based access control"}

    def test_abbreviation_then_long_form(self) -> None:
        """'LF (Long Form)' is mined too."""
        assert mine_glossary(["Enable SCIM (System for Cross-domain Identity Management) first."]) == {
            "SCIM": "system for cross-domain identity management"
        }

    def test_rejects_parentheses_that_do_not_define(self) -> None:
        """A parenthesised abbreviation whose letters do not appear before it is not a definition."""
        assert mine_glossary(["Click the button (OK) to continue.", "the cell (CE) value"]) == {}

    def test_stats_mine_the_corpus_and_configuration_wins(self) -> None:
        """CorpusStats mines its texts; a configured entry overrides a mined one."""
        stats = CorpusStats.from_texts(OFFLINE_CORPUS)
        assert stats.glossary["SSO"] == "single sign-on"
        merged = merge_glossary(stats.glossary, {"SSO": "secure sign-on"})
        assert merged["SSO"] == "secure sign-on"
        assert merged["SCIM"].startswith("system for cross-domain")
