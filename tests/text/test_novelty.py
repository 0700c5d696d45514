"""Tests for ragloop.text.novelty: normalised terms, near-duplicate queries and the content key of a text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.text.novelty import content_key, is_near_duplicate, normalised_terms
from tests.strategies import topics


class TestNormalisedTerms:
    def test_stopwords_case_and_inflection(self) -> None:
        """Stopwords, case and inflection do not change the terms."""
        assert normalised_terms("How do I configure SSO?") == normalised_terms("configuring sso")

    @given(st.text())
    def test_never_crashes(self, text: str) -> None:
        """Any unicode text gives a frozenset of non-empty strings."""
        assert all(normalised_terms(text))


class TestIsNearDuplicate:
    def test_rephrasings_are_duplicates(self) -> None:
        """A reordering or re-inflection of a tried query is a duplicate; a subset is too."""
        assert is_near_duplicate("sso configuration okta", ["Configure Okta SSO"])
        assert is_near_duplicate("okta", ["okta sso setup"])

    def test_new_angle_is_not(self) -> None:
        """A query sharing one term of four is new."""
        assert not is_near_duplicate("okta saml metadata", ["okta sso setup"])
        assert not is_near_duplicate("anything", [])

    def test_threshold(self) -> None:
        """Jaccard 0.5 is a duplicate at threshold 0.5 but not at 0.6."""
        assert is_near_duplicate("sso okta saml", ["sso okta scim"], threshold=0.5)
        assert not is_near_duplicate("sso okta saml", ["sso okta scim"], threshold=0.6)

    @given(topics, st.lists(topics, max_size=3))
    def test_identical_term_sets_are_duplicates(self, query: str, others: list[str]) -> None:
        """A query is always a duplicate of itself (and of its upper-cased form) among other tries."""
        assert is_near_duplicate(query, [*others, query.upper()])


class TestContentKey:
    def test_copies_share_a_key(self) -> None:
        """Case, punctuation and runs of whitespace do not change the key; different words do."""
        assert (
            content_key("  Reset the SSO\n\tpassword!  ")
            == content_key("reset  the sso password")
            == ("reset the sso password")
        )
        assert content_key("reset the password") != content_key("reset the sso password")

    def test_casefold_not_lower(self) -> None:
        """The key folds case the Unicode way (German sharp s matches "ss")."""
        assert content_key("Straße") == content_key("STRASSE")

    @given(st.text())
    def test_the_key_is_its_own_key(self, text: str) -> None:
        """The key is already normal: keying it again changes nothing, and it has no edge or double spaces."""
        key = content_key(text)
        assert content_key(key) == key
        assert key == key.strip() and "  " not in key
