"""Tests for ragloop.llm.offline.decide: small talk, splitting, pronouns, abbreviations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.llm.offline.decide import (
    OfflineDecider,
    comparison_parts,
    page_subject,
    small_talk_kind,
    split_topics,
)
from ragloop.state import Message, PageContext
from ragloop.text.novelty import normalised_terms
from ragloop.text.terms import CorpusStats
from ragloop.usage import UsageMeter, metering
from tests.strategies import OFFLINE_CORPUS, topics

GLOSSARY = {"SSO": "single sign-on", "SCIM": "System for Cross-domain Identity Management"}
NO_PAGE = PageContext()


def queries(question: str, *, history: tuple[Message, ...] = (), page: PageContext = NO_PAGE) -> tuple[str, ...]:
    decision = OfflineDecider(glossary=GLOSSARY).decide_sync(question, history, page)
    assert decision.reply is None, decision
    return decision.queries


class TestSmallTalk:
    @pytest.mark.parametrize(
        ("question", "kind"),
        [
            ("hi", "greeting"),
            ("Hello there!", "greeting"),
            ("Good morning", "greeting"),
            ("thanks!", "thanks"),
            ("Thank you so much for the help", "thanks"),
            ("got it, thanks", "thanks"),
            ("bye", "bye"),
            ("How are you?", "wellbeing"),
            ("who are you?", "identity"),
            ("What can you do?", "identity"),
            ("ok", "ack"),
            ("sounds good", "ack"),
        ],
    )
    def test_direct_reply(self, question: str, kind: str) -> None:
        """Greetings, thanks, goodbyes, 'how are you', 'who are you' and acknowledgements get a reply, no search."""
        decision = OfflineDecider().decide_sync(question, (), NO_PAGE)
        assert decision.direct and decision.queries == ()
        assert decision.reason == f"small talk: {kind}"

    def test_greeting_with_a_question_searches(self) -> None:
        """'hi, how do I reset my password?' searches for the password question."""
        decision = OfflineDecider().decide_sync("hi, how do I reset my password?", (), NO_PAGE)
        assert not decision.direct
        assert decision.queries == ("how do I reset my password",)

    def test_nothing_to_search(self) -> None:
        """A question with no content words asks for more detail instead of searching."""
        decision = OfflineDecider().decide_sync("???", (), NO_PAGE)
        assert decision.direct and "more" in (decision.reply or "")

    def test_request_is_not_small_talk(self) -> None:
        """A segment with a request is not small talk."""
        assert small_talk_kind("thanks for the export feature") is None
        assert small_talk_kind("hello world example") is None


class TestSplitting:
    def test_compare_a_and_b(self) -> None:
        """'Compare plan pricing and SSO setup' becomes one query per topic, abbreviation expanded."""
        assert queries("Compare plan pricing and SSO setup") == ("plan pricing", "SSO (single sign-on) setup")

    def test_shared_plural_head(self) -> None:
        """'the pro and enterprise plans' shares 'plans' with 'pro'."""
        assert queries("What is the difference between the pro and enterprise plans?") == (
            "pro plans",
            "enterprise plans",
        )

    def test_shared_leading_head(self) -> None:
        """'the pricing of pro and enterprise' shares 'pricing of' with 'enterprise'."""
        assert queries("compare the pricing of pro and enterprise") == ("pricing of pro", "pricing of enterprise")

    def test_shared_trailing_context(self) -> None:
        """A trailing 'in the admin console' belongs to every compared topic."""
        got = queries("Compare SSO and SCIM in the admin console")
        assert len(got) == 2 and all(q.endswith("in the admin console") for q in got)

    def test_versus_and_lists(self) -> None:
        """'A vs B' and 'A, B and C' split into one query per item."""
        assert queries("REST vs GraphQL APIs") == ("REST APIs", "GraphQL APIs")
        assert queries("Can you compare REST, GraphQL and gRPC?") == ("REST", "GraphQL", "gRPC")

    def test_what_the_sides_are_compared_on_goes_to_each(self) -> None:
        """'… when it comes to X', 'in terms of X' and 'A vs B: X' give every side the aspect X."""
        assert queries("What's the difference between SAML and OIDC when it comes to certificate rotation?") == (
            "SAML certificate rotation",
            "OIDC certificate rotation",
        )
        assert split_topics("Team vs Business: how many API requests per minute?") == [
            "Team how many API requests per minute",
            "Business how many API requests per minute",
        ]
        assert split_topics("compare REST and GraphQL in terms of caching") == ["REST caching", "GraphQL caching"]

    def test_with_joins_two_sides_and_keeps_their_ands(self) -> None:
        """'Compare A with B and C': two sides, the 'and' stays inside the second."""
        assert split_topics("Compare the lifespan parameter with the startup and shutdown event handlers") == [
            "lifespan parameter",
            "startup and shutdown event handlers",
        ]

    def test_an_aspect_alone_is_not_a_side(self) -> None:
        """A colon with nothing compared before it splits nothing."""
        assert split_topics("Note: how do webhooks retry?") == ["Note: how do webhooks retry"]

    def test_coordinated_questions(self) -> None:
        """'How do I X and how do I Y?', several question marks and 'and also' split."""
        assert len(queries("How do I configure SSO and how do I set up SCIM?")) == 2
        assert queries("What are webhooks? How are API keys rotated?") == (
            "What are webhooks",
            "How are API keys rotated",
        )
        assert queries("How do I reset my password and also change my email?") == (
            "How do I reset my password",
            "change my email",
        )

    def test_plain_and_is_not_split(self) -> None:
        """An 'and' inside one topic ('terms and conditions') keeps one query."""
        assert queries("Where are the terms and conditions?") == ("Where are the terms and conditions",)

    def test_cap_and_dedup(self) -> None:
        """Repeated topics collapse and the number of queries is capped."""
        decider = OfflineDecider(max_queries=2)
        decision = decider.decide_sync("compare sso, saml, okta, scim and sso", (), NO_PAGE)
        assert decision.queries == ("sso", "saml")
        assert "max_queries=2" in decision.reason

    @given(
        topics,
        topics,
        st.sampled_from(
            [
                "compare {a} and {b}",
                "{a} vs {b}",
                "what is {a}? what is {b}?",
                "difference between {a} and {b}",
                "how do i {a} and how do i {b}",
                "{a} and also {b}",
            ]
        ),
    )
    def test_never_loses_a_topics_terms(self, a: str, b: str, template: str) -> None:
        """Every key term of each topic appears in some query, and no query mixes in terms from nowhere."""
        question = template.format(a=a, b=b)
        got = OfflineDecider().decide_sync(question, (), NO_PAGE).queries
        found = frozenset().union(*(normalised_terms(q) for q in got))
        assert normalised_terms(a) <= found
        assert normalised_terms(b) <= found
        assert found <= normalised_terms(a) | normalised_terms(b) | normalised_terms(question)

    @given(st.text(max_size=80), st.lists(st.text(max_size=30), max_size=2), st.text(max_size=40))
    def test_decide_never_crashes(self, question: str, turns: list[str], url: str) -> None:
        """Any unicode question, history and URL give exactly one of a reply or queries within the cap."""
        history = tuple(Message("user", t) for t in turns)
        decision = OfflineDecider(glossary=GLOSSARY).decide_sync(question, history, PageContext(url=url))
        assert (decision.reply is None) == bool(decision.queries)
        assert len(decision.queries) <= 4

    @given(st.text(max_size=80))
    def test_split_never_crashes(self, text: str) -> None:
        """Any text splits into a list of strings."""
        assert all(isinstance(t, str) for t in split_topics(text))


class TestComparisons:
    @pytest.mark.parametrize(
        ("question", "parts"),
        [
            ("Who is older, Annie Morton or Terry Richardson?", ["Annie Morton", "Terry Richardson"]),
            ("who is younger Keith Bostic or Jerry Glanville ?", ["Keith Bostic", "Jerry Glanville"]),
            (
                "Which battle occurred first, the Battle of Hastings or the Battle of Agincourt?",
                ["Battle of Hastings battle", "Battle of Agincourt battle"],
            ),
            (
                "Were Scott Derrickson and Ed Wood of the same nationality?",
                ["Scott Derrickson nationality", "Ed Wood nationality"],
            ),
            (
                "Are Giuseppe Verdi and Ambroise Thomas both Opera composers?",
                ["Giuseppe Verdi Opera composers", "Ambroise Thomas Opera composers"],
            ),
            (
                "Both Truth in Science and Discovery embrace what campaign?",
                ["Truth in Science embrace campaign", "Discovery embrace campaign"],
            ),
            (
                "What nationality were social anthropologists Alfred Gell and Edmund Leach?",
                ["Alfred Gell nationality social anthropologists", "Edmund Leach nationality social anthropologists"],
            ),
            ("Is SSO or SAML cheaper?", ["SSO cheaper", "SAML cheaper"]),
        ],
    )
    def test_compared_names_become_queries(self, question: str, parts: list[str]) -> None:
        """Alternatives ("A or B"), "are A and B both", "the same", "both A and B" and two full names split
        into one query per name, each keeping what is asked about it."""
        assert comparison_parts(question.rstrip("?")) == parts
        assert split_topics(question) == parts

    @pytest.mark.parametrize(
        "question",
        [
            "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
            "Is the bowler who joined Kent in 2011 a left-hand or right-hand batsman?",
            "How do I reset my password or change my email?",
            "Does the pro plan include SSO and SCIM?",
        ],
    )
    def test_titles_and_lower_case_alternatives_stay_whole(self, question: str) -> None:
        """One-word sides of a title ("Kiss and Tell") and lower-case alternatives are not comparisons."""
        assert comparison_parts(question) is None

    def test_decider_searches_each_side(self) -> None:
        """The offline decider starts one query per compared name (two topics)."""
        decision = OfflineDecider().decide_sync("Who was born first, Pablo Picasso or Claude Monet?", (), NO_PAGE)
        assert decision.queries == ("Pablo Picasso", "Claude Monet")
        assert decision.reason.startswith("2 topics")

    def test_several_questions_still_split(self) -> None:
        """Several questions in one message still give one query each, comparisons inside them too."""
        qs = queries("How do I enable SSO? Who is older, Annie Morton or Terry Richardson?")
        assert qs[0].startswith("How do I enable SSO")
        assert qs[1:] == ("Annie Morton", "Terry Richardson")


class TestPronouns:
    def test_this_project_from_url_slug(self) -> None:
        """'this project' becomes the meaningful tail of the page URL."""
        page = PageContext(url="https://docs.example.com/products/widgets/sso")
        assert page_subject(page) == "widgets sso"
        assert queries("How do I install this project?", page=page) == ("How do I install widgets sso",)

    def test_malformed_url_still_gives_a_subject(self) -> None:
        """A URL urllib cannot parse still yields its path tail, never an error."""
        assert page_subject(PageContext(url="http://[bad/products/audit-logs")) == "audit logs"

    def test_backslashes_in_the_page_are_text(self) -> None:
        """A backslash in the page URL is substituted literally (found by the fuzz test)."""
        page = PageContext(url="https://x.io/docs/paths\\1")
        assert queries("How do I use this page?", page=page) == ("How do I use paths\\1",)

    def test_page_title_wins_over_url(self) -> None:
        """A page title (without its site suffix) describes the page better than the URL."""
        assert page_subject(PageContext(url="https://x.io/a/b", title="Audit logs | Widgets Help")) == "Audit logs"

    def test_it_from_history(self) -> None:
        """A bare 'it' takes the last user turn's key terms."""
        history = (Message("user", "Tell me about webhooks"), Message("assistant", "Webhooks send events."))
        assert queries("How do I secure it?", history=history) == ("How do I secure webhooks",)

    def test_it_from_the_previous_topic(self) -> None:
        """'What is SSO? How do I enable it?' resolves 'it' to SSO, then expands it."""
        assert queries("What is SSO? How do I enable it?") == (
            "What is SSO (single sign-on)",
            "How do I enable SSO (single sign-on)",
        )

    def test_third_turn_it_is_the_topic_not_the_follow_ups_verb(self) -> None:
        """Three turns: a follow-up that only refers back ("How do I change it?") keeps the topic, so the third
        turn's "it" is still the first turn's subject."""
        history = (
            Message("user", "What is the default pickle protocol?"),
            Message("assistant", "Protocol 4 [1]."),
            Message("user", "How do I change it?"),
            Message("assistant", "Pass protocol= to dump [1]."),
        )
        assert queries("Is it faster than json?", history=history) == ("Is default pickle protocol faster than json",)

    def test_a_new_subject_replaces_the_topic(self) -> None:
        """Three turns: a turn that names a subject of its own becomes the topic for the next "it"."""
        history = (
            Message("user", "Tell me about webhooks"),
            Message("user", "What about audit logs retention?"),
        )
        assert queries("How do I export them?", history=history) == ("How do I export audit logs retention",)

    def test_page_then_two_follow_ups(self) -> None:
        """Three turns on a page: "this page", then "it" twice, all mean the page's subject."""
        page = PageContext(title="Webhooks | Widgets Docs")
        history = (Message("user", "How do I set up this page?"), Message("user", "Does it retry?"))
        assert queries("How do I sign it?", history=history, page=page) == ("How do I sign Webhooks",)

    def test_topic_with_corpus_statistics(self) -> None:
        """With corpus statistics a follow-up made only of common words still refers back."""
        stats = CorpusStats.from_texts(OFFLINE_CORPUS)
        decider = OfflineDecider(stats)
        history = (Message("user", "How do I rotate an API key?"), Message("user", "Can I do it now?"))
        assert decider.topic(history, NO_PAGE) == decider.topic(history[:1], NO_PAGE)

    def test_expletive_it_is_left(self) -> None:
        """'Is it possible …' does not refer to anything."""
        history = (Message("user", "webhooks"),)
        assert queries("Is it possible to export data?", history=history) == ("Is it possible to export data",)


class TestAbbreviations:
    def test_long_form_gains_abbreviation(self) -> None:
        """A long form in the question gets its abbreviation added."""
        assert queries("how do I set up single sign-on") == ("how do I set up single sign-on (SSO)",)

    def test_mined_from_corpus(self) -> None:
        """With corpus statistics, abbreviations the corpus defines are expanded without configuration."""
        decider = OfflineDecider(stats=CorpusStats.from_texts(OFFLINE_CORPUS))
        decision = decider.decide_sync("Is SCIM supported?", (), NO_PAGE)
        assert decision.queries == ("Is SCIM (system for cross-domain identity management) supported",)


@pytest.mark.anyio
async def test_decide_records_an_offline_call() -> None:
    """decide() returns the decision and records one offline 'decide' call on the turn's meter."""
    with metering(UsageMeter()) as meter:
        decision = await OfflineDecider().decide("thanks", (), NO_PAGE)
    assert decision.direct
    assert [(c.judge, c.model) for c in meter.calls] == [("decide", "offline")]


def test_thanks_with_trailing_praise_is_small_talk() -> None:
    """ "Thanks, that helped a lot." is answered directly, not searched."""
    from ragloop.llm.offline import OfflineDecider
    from ragloop.state import PageContext

    decision = OfflineDecider().decide_sync("Thanks, that helped a lot.", (), PageContext())
    assert decision.reply is not None and not decision.queries


def test_phrasal_verb_pronoun_resolved_from_page() -> None:
    """ "set this up" / "turn this off" take their subject from the page URL."""
    from ragloop.llm.offline import OfflineDecider
    from ragloop.state import PageContext

    page = PageContext(url="https://help.lumen.example/scim-provisioning")
    decision = OfflineDecider().decide_sync("How do I set this up?", (), page)
    assert decision.queries == ("How do I set scim provisioning up",)


def test_elliptical_second_clause_takes_the_first_subject() -> None:
    """ "…, and which plan do I need?" names no subject of its own: it continues the first clause's."""
    from ragloop.llm.offline import OfflineDecider
    from ragloop.state import PageContext
    from ragloop.text.terms import CorpusStats

    texts = [f"Page {i} about plans, prices and what you need to get started." for i in range(20)]
    texts += ["Set up SAML single sign-on under Settings.", "Webhooks send events to your server."]
    decider = OfflineDecider(CorpusStats.from_texts(texts))
    queries = decider.decide_sync("How do I set up SAML single sign-on, and which plan do I need?", (), PageContext())
    assert len(queries.queries) == 2
    assert "SAML" in queries.queries[1] and queries.queries[1].startswith("which plan do I need for")
    separate = decider.decide_sync("How do I set up SAML, and how do webhooks work?", (), PageContext())
    assert "SAML" not in separate.queries[1]


def _conversation(*turns: str) -> tuple[Message, ...]:
    """User and assistant messages, alternating, from ``turns``."""
    return tuple(Message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns))


class TestFollowups:
    decider = OfflineDecider(CorpusStats.from_texts(OFFLINE_CORPUS))

    def test_fragment_is_the_previous_question_with_the_plan_swapped(self) -> None:
        """ "and Enterprise?" after a Pro price question searches the Enterprise price; the rewrite is recorded."""
        history = _conversation("How much does the Pro plan cost?", "Pro is 12 dollars per user per month [1].")
        decision = self.decider.decide_sync("and Enterprise?", history, NO_PAGE)
        assert decision.queries == ("How much does the Enterprise plan cost",)
        assert "follow-up (fragment) 'and Enterprise' -> 'How much does the Enterprise plan cost'" in decision.reason

    def test_a_chain_of_fragments_keeps_the_question(self) -> None:
        """Third turn: "and Enterprise?" after "and Pro?" still means the first turn's question."""
        history = _conversation(
            "How much does the Free plan cost?", "Free is free [1].", "and on Pro?", "12 dollars per user [1]."
        )
        assert self.decider.decide_sync("and Enterprise?", history, NO_PAGE).queries == (
            "How much does the Enterprise plan cost",
        )

    def test_why_not_searches_in_a_conversation_only(self) -> None:
        """ "why not?" alone asks for more detail; after a question it continues that question's subject."""
        assert self.decider.decide_sync("why not?", (), NO_PAGE).direct
        history = _conversation("Can I rotate API keys automatically?", "Rotate keys every 90 days [1].")
        decision = self.decider.decide_sync("why not?", history, NO_PAGE)
        assert not decision.direct and decision.queries[0].startswith("why not for")
        assert "rotate keys" in decision.queries[0] and "follow-up (continuation)" in decision.reason

    def test_small_talk_stays_small_talk(self) -> None:
        """ "thanks!" in a conversation is thanked, not searched."""
        history = _conversation("How do I rotate API keys?", "Rotate keys every 90 days [1].")
        assert self.decider.decide_sync("thanks!", history, NO_PAGE).reason == "small talk: thanks"

    def test_a_new_question_is_not_rewritten(self) -> None:
        """A question that names its own subject is searched as asked, whatever came before."""
        history = _conversation("How do I rotate API keys?", "Rotate keys every 90 days [1].")
        decision = self.decider.decide_sync("How do I export audit logs as CSV?", history, NO_PAGE)
        assert decision.queries == ("How do I export audit logs as CSV",)
        assert "follow-up" not in decision.reason

    def test_the_old_one(self) -> None:
        """ "and how long is the old one valid?" after rotating keys asks about the API key."""
        history = _conversation("How do I rotate an API key?", "Create a new key, then revoke the old one [1].")
        (query,) = self.decider.decide_sync("and how long is the old one valid?", history, NO_PAGE).queries
        assert query.startswith("how long is the old") and "key" in query and " one " not in query

    @given(question=topics)
    def test_without_history_nothing_is_a_follow_up(self, question: str) -> None:
        """With no conversation, no question is rewritten as a follow-up."""
        decision = self.decider.decide_sync(f"and {question}?", (), NO_PAGE)
        assert "follow-up" not in decision.reason

    def test_reads_only_the_start_of_recent_messages(self) -> None:
        """What a follow-up is read against is bounded: a megabyte question resolves as its first 2,000
        characters would, and a question more than 12 messages back is not the antecedent."""
        head = "How much does the Pro plan cost? "
        big = head + "padding words " * 80_000
        short = head + ("padding words " * 80_000)[: 2_000 - len(head)]
        for previous in (big, short):
            history = _conversation(previous, "12 dollars [1].")
            assert self.decider.decide_sync("and Enterprise?", history, NO_PAGE).queries == (
                self.decider.decide_sync("and Enterprise?", _conversation(short, "12 dollars [1]."), NO_PAGE).queries
            )
        old = _conversation("How much does the Pro plan cost?", "12 dollars [1].", *["ok", "Glad that helps."] * 6)
        assert "follow-up" not in self.decider.decide_sync("and Enterprise?", old, NO_PAGE).reason
