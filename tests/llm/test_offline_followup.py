"""Tests for ragloop.llm.offline.followup: fragments, references and continuations read against the conversation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.llm.offline.followup import FollowupResolver, is_follow_on, one_anaphora, references
from ragloop.text.terms import STOPWORDS, CorpusStats
from tests.strategies import topic_words

#: A few pages shaped like the sample's: plans in tables, two SSO protocols, keys, imports.
CORPUS = tuple(
    [
        "Plans\n| Free | 60 |\n| Team | 300 |\n| Business | 1,000 |\n| Enterprise | 3,000 |",
        "Pricing: Team is $9 per seat, Business is $19 per seat, Enterprise is custom.",
        "Storage: 2 GB on Free, 100 GB on Team, 1 TB on Business.",
        "Single sign-on supports SAML 2.0 and OIDC. SAML or OIDC: pick one protocol.",
        "Set up OIDC with an issuer URL and a client secret; SAML uses metadata XML.",
        "API keys: rotate a key by creating a new one and revoking the old one. Keys live at most 365 days.",
        "Deleted tasks go to the trash for 30 days; restore them from the trash.",
        "Import from Jira needs an API token. Import from CSV needs a UTF-8 file of at most 10,000 rows.",
        "The GitHub integration links pull requests. GitHub Enterprise Server needs the Enterprise plan.",
        "Recovery objectives: RPO 1 hour, RTO 4 hours.",
        "Undo a CSV import within 24 hours from the import history.",
    ]
    + [f"Filler page {i} about the workspace, members, settings and how to get started." for i in range(12)]
)


@pytest.fixture(scope="module")
def resolver() -> FollowupResolver:
    return FollowupResolver(CorpusStats.from_texts(CORPUS))


def rewrite(resolver: FollowupResolver, question: str, previous: str, reply: str = "") -> str | None:
    followed = resolver.resolve(question, previous, lambda: resolver.subject(previous, reply), reply)
    return None if followed is None else followed.standalone


class TestFragments:
    def test_same_preposition_takes_the_phrase(self, resolver: FollowupResolver) -> None:
        """ "and on Business?" puts Business where "on the Team plan" was."""
        previous = "How many API requests per minute can a key make on the Team plan?"
        assert rewrite(resolver, "and on Business?", previous) == (
            "How many API requests per minute can a key make on Business"
        )

    def test_sibling_name_is_swapped(self, resolver: FollowupResolver) -> None:
        """ "what about OIDC?" after a SAML question asks the same for OIDC (the names go together in the corpus)."""
        assert rewrite(resolver, "what about OIDC?", "How do I set up SAML single sign-on?") == (
            "How do I set up OIDC single sign-on"
        )

    def test_plan_swap_without_preposition(self, resolver: FollowupResolver) -> None:
        """ "and Team?" after a Business price question swaps the plan."""
        assert rewrite(resolver, "and Team?", "How much does the Business plan cost per seat?") == (
            "How much does the Team plan cost per seat"
        )

    def test_shared_head_is_replaced_whole(self, resolver: FollowupResolver) -> None:
        """ "GitHub Enterprise Server" replaces "GitHub", the word it shares, not another name."""
        previous = "Which plan does the GitHub integration need?"
        assert rewrite(resolver, "what about GitHub Enterprise Server?", previous) == (
            "Which plan does the GitHub Enterprise Server integration need"
        )

    def test_possessive_is_not_part_of_the_name(self, resolver: FollowupResolver) -> None:
        """ "and the RTO?" after "What is Lumen's RPO?" keeps "Lumen's"."""
        assert rewrite(resolver, "and the RTO?", "What is Lumen's RPO?") == "What is Lumen's RTO"

    def test_one_anaphora_inside_a_fragment(self, resolver: FollowupResolver) -> None:
        """ "and a Business one?" swaps the plan; "one" is the thing asked about, not a word to search."""
        assert rewrite(resolver, "and a Business one?", "How much storage does a Team workspace get?") == (
            "How much storage does a Business workspace get"
        )

    def test_same_opening_swaps_the_noun_phrase(self, resolver: FollowupResolver) -> None:
        """ "and how many API keys?" after "How many webhook endpoints can a workspace have?" keeps the rest."""
        previous = "How many webhook endpoints can a workspace have?"
        assert rewrite(resolver, "and how many workspace API keys?", previous) == (
            "How many workspace API keys can a workspace have"
        )

    def test_no_fragment_without_a_follow_on_mark(self, resolver: FollowupResolver) -> None:
        """A bare noun phrase with no "and" / "what about" is a new search, not a fragment ("webhooks")."""
        assert rewrite(resolver, "webhooks", "How do I set up SAML single sign-on?") is None


class TestReferences:
    def test_the_old_one(self, resolver: FollowupResolver) -> None:
        """ "the old one" is the previous question's subject: the API key."""
        out = rewrite(resolver, "and how long is the old one valid?", "How do I rotate an API key?")
        assert out is not None and out.startswith("how long is the old") and "API key" in out and "one" not in out

    def test_them_is_the_subject(self, resolver: FollowupResolver) -> None:
        """ "can I get them back?" after a trash question asks about the deleted tasks."""
        out = rewrite(resolver, "can I get them back?", "How long are deleted tasks kept in the trash?")
        assert out == "can I get deleted tasks trash back"

    def test_words_already_asked_are_not_repeated(self, resolver: FollowupResolver) -> None:
        """ "can I export it …" after "How do I export a project?" says "export" once."""
        out = rewrite(resolver, "can I export it to a spreadsheet?", "How do I export a project?")
        assert out == "can I export project to a spreadsheet"

    def test_expletive_it_is_no_reference(self) -> None:
        """ "is it possible …" refers to nothing; "that" as a conjunction neither."""
        assert not references("is it possible to export data")
        assert not references("make sure that the key expires")
        assert references("does it expire") and references("the old one") and references("when one is opened")

    def test_one_anaphora_keeps_the_modifier(self) -> None:
        """ "the old one" → "the old API key"; "one of the keys" is a count, left alone."""
        assert one_anaphora("is the old one valid", "API key") == "is the old API key valid"
        assert one_anaphora("is one of the keys valid", "API key") == "is one of the keys valid"


class TestContinuations:
    def test_no_subject_of_its_own(self, resolver: FollowupResolver) -> None:
        """ "how long do I have?" names nothing: it continues the previous subject."""
        assert rewrite(resolver, "how long do I have?", "How do I undo a CSV import?") == (
            "how long do I have for undo CSV import"
        )

    def test_why_not(self, resolver: FollowupResolver) -> None:
        """ "why not?" is the previous question's "why"."""
        out = rewrite(resolver, "why not?", "Can I get SMS codes for 2FA?")
        assert out is not None and out.startswith("why not for") and "SMS" in out and "2FA" in out

    def test_definite_thing_the_reply_named(self, resolver: FollowupResolver) -> None:
        """ "how long is the grace period?" names only what the previous reply talked about."""
        previous = "Can a Team workspace require 2FA for every member?"
        reply = "Members without 2FA get a 7-day grace period [1]."
        out = rewrite(resolver, "how long is the grace period?", previous, reply)
        assert out is not None and out.startswith("how long is the grace period for") and "2FA" in out

    def test_new_topic_is_left(self, resolver: FollowupResolver) -> None:
        """A question with a subject of its own that the previous turn never mentioned is a new topic."""
        assert rewrite(resolver, "How do I import issues from Jira?", "How do I set up SAML single sign-on?") is None

    def test_nothing_before_nothing_to_resolve(self, resolver: FollowupResolver) -> None:
        """Without a previous question nothing is rewritten."""
        assert resolver.resolve("and on Business?", "", "", "") is None


class TestProperties:
    @given(
        words=st.lists(topic_words, min_size=2, max_size=4, unique=True),
        opener=st.sampled_from(["How do I configure", "What is the", "Where can I find the", "Explain"]),
    )
    def test_a_question_without_anaphora_is_never_rewritten(self, words: list[str], opener: str) -> None:
        """A question that names words of its own (absent from the previous turn), with no pronoun, no "one" and
        no follow-on mark, is a new topic: never rewritten."""
        resolver = FollowupResolver(CorpusStats.from_texts(CORPUS))
        question = f"{opener} {' '.join(words)}?"
        if references(question) or is_follow_on(question) or any(w in ("one", "ones") for w in words):
            return
        previous, reply = "How do I rotate an API key?", "Create the new key, then revoke the old one [1]."
        assert resolver.resolve(question, previous, resolver.subject(previous, reply), reply) is None

    @given(
        name=st.from_regex(r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?", fullmatch=True).filter(
            lambda n: all(w.lower() not in STOPWORDS and w.lower() not in ("one", "ones") for w in n.split())
        )
    )
    def test_a_fragment_keeps_its_new_name(self, name: str) -> None:
        """Whatever name a fragment brings ("and on Acme?", "what about Foo Bar?") is in the rewrite, once."""
        resolver = FollowupResolver(CorpusStats.from_texts(CORPUS))
        previous = "How many API requests per minute can a key make on the Team plan?"
        for question in (f"and on {name}?", f"what about {name}?", f"and {name}?"):
            out = rewrite(resolver, question, previous)
            assert out is not None and out.count(name) == 1, (question, out)

    @given(question=st.text(max_size=80), previous=st.text(max_size=80), reply=st.text(max_size=80))
    def test_never_raises(self, question: str, previous: str, reply: str) -> None:
        """Any text in, a rewrite or ``None`` out; a rewrite is never empty."""
        resolver = FollowupResolver(CorpusStats.from_texts(CORPUS))
        followed = resolver.resolve(question, previous, lambda: resolver.subject(previous, reply), reply)
        assert followed is None or followed.standalone.strip()

    def test_without_statistics(self) -> None:
        """Without corpus statistics every content word is specific and the last name is swapped."""
        resolver = FollowupResolver()
        assert rewrite(resolver, "and Team?", "How much does the Business plan cost?") == (
            "How much does the Team plan cost"
        )
