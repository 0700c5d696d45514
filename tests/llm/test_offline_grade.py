"""Tests for ragloop.llm.offline.grade: coverage, retrieval signals, the id rule, calibration."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given

from ragloop.llm.offline.grade import OfflineGrader, coverage
from ragloop.state import Chunk, Hit
from ragloop.text.terms import CorpusStats
from ragloop.usage import UsageMeter, metering
from tests.strategies import OFFLINE_CORPUS, ticket_numbers

STATS = CorpusStats.from_texts(OFFLINE_CORPUS)


def hit(text: str, *, title: str = "", confidence: float = 0.0, scores: dict[str, float] | None = None) -> Hit:
    return Hit(Chunk(id="c", text=text, title=title), score=1.0, confidence=confidence, scores=scores or {})


class TestCoverage:
    def test_idf_weighted(self) -> None:
        """Missing a rare term costs more than missing a common one."""
        assert STATS.doc_freq("okta") < STATS.doc_freq("sso")
        rare_missing = coverage("sso okta", "about sso", STATS)
        common_missing = coverage("sso okta", "about okta", STATS)
        assert 0 < rare_missing.score < 0.5 < common_missing.score < 1
        assert rare_missing.missing == ("okta",)

    def test_stemmed_and_identifiers(self) -> None:
        """Inflections match, and an id in 'ticket 1234' form matches '#1234' in the text."""
        assert coverage("configuring webhooks", "Configure a webhook", STATS).score == 1.0
        assert "#1234" in coverage("ticket 1234 status", "#1234 is closed", STATS).covered


class TestAliases:
    """A glossary expansion the decider wrote beside a term ("API (application programming interface)") names
    the same thing once: a text covering either form covers it, and the spelled-out words are never extra terms
    a text must hold (a glossary entry is not the answer to "how do I rotate an API key")."""

    def test_expansion_adds_no_terms(self) -> None:
        """The expanded query scores a text exactly as the query as asked does."""
        text = "API keys: create the new key, then revoke the old one."
        asked = coverage("How do I rotate an API key", text, STATS)
        expanded = coverage("How do I rotate an API (application programming interface) key", text, STATS)
        assert expanded == asked and "interface" not in expanded.missing

    def test_definition_does_not_outscore_the_answer(self) -> None:
        """A glossary line spelling the abbreviation out covers no more of the question than the page using it."""
        query = "How do I rotate an API (application programming interface) key"
        definition = coverage(query, "API: Application Programming Interface (API). See API keys.", STATS)
        answer = coverage(query, "To rotate an API key, create the new key and revoke the old one.", STATS)
        assert definition.score < answer.score == 1.0

    def test_either_form_covers(self) -> None:
        """The long form in the text covers the abbreviation asked for, and the other way round."""
        assert coverage("SSO (single sign-on) setup", "Single sign-on setup", STATS).score == 1.0
        assert coverage("single sign-on (SSO) setup", "SSO setup", STATS).score == 1.0
        assert coverage("single sign-on (SSO) setup", "sign-on setup", STATS).score < 1.0

    def test_other_parentheses_are_asked(self) -> None:
        """Words in parentheses that do not spell out the word before them are part of the question."""
        cov = coverage("SSO (with Okta) setup", "SSO setup", STATS)
        assert "Okta" in cov.missing or "okta" in cov.missing

    def test_glossary_pairs_without_matching_initials(self) -> None:
        """An abbreviation whose letters are not the initials (2FA) is an alias when the glossary pairs them."""
        stats = attrs.evolve(STATS, glossary={**STATS.glossary, "2FA": "two-factor authentication"})
        assert coverage("enforce 2FA (two-factor authentication)", "Enforce 2FA for members.", stats).score == 1.0


class TestOfflineGrader:
    def test_relevant_partial_irrelevant(self) -> None:
        """Full coverage is relevant, half is partial, none is irrelevant, each with a reason."""
        grader = OfflineGrader(STATS)
        full = grader.judge("okta sso configuration", hit("Configure SSO with Okta in the console."))
        half = grader.judge("okta saml metadata", hit("Okta group claims map to roles."))
        none = grader.judge("okta sso setup", hit("Invoices are emailed monthly."))
        assert (full.label, half.label, none.label) == ("relevant", "partial", "irrelevant")
        assert full.reason.startswith("covers 3/3 key terms")
        assert none.reason == "covers 0/3 key terms; missing: setup, okta, sso"

    def test_title_counts(self) -> None:
        """The chunk title and heading path count as chunk text."""
        verdict = OfflineGrader(STATS).judge("audit logs export", hit("Export as CSV.", title="Audit logs"))
        assert verdict.label == "relevant"

    def test_truncation(self) -> None:
        """Text past the budget is not seen."""
        grader = OfflineGrader(STATS, max_chars=20)
        assert grader.judge("webhook signature", hit("x" * 30 + " webhook signature")).label == "irrelevant"

    def test_strong_signal_promotes(self) -> None:
        """A very confident retrieval (or dense cosine) promotes the label one step, and says so."""
        grader = OfflineGrader(STATS)
        plain = grader.judge("log in with company account", hit("Widgets supports SAML."))
        promoted = grader.judge("log in with company account", hit("Widgets supports SAML.", confidence=0.95))
        dense = grader.judge("log in with company account", hit("Widgets supports SAML.", scores={"dense": 0.9}))
        assert plain.label == "irrelevant"
        assert promoted.label == dense.label == "partial"
        assert "promoted by retrieval signal" in promoted.reason

    def test_identifier_rule_beats_coverage_and_signal(self) -> None:
        """A chunk naming another ticket is irrelevant even with full coverage and top confidence."""
        verdict = OfflineGrader(STATS).judge(
            "ticket #1234 token expired", hit("Ticket #1233: token expired", confidence=1.0)
        )
        assert verdict.label == "irrelevant"
        assert verdict.reason == "names ticket #1233, not #1234"

    @given(ticket_numbers, ticket_numbers)
    def test_never_accepts_another_id(self, wanted: int, other: int) -> None:
        """Whatever the numbers, a chunk about a different ticket is never kept."""
        verdict = OfflineGrader(STATS).judge(
            f"status of ticket #{wanted}", hit(f"Ticket #{other} status: closed", confidence=1.0)
        )
        assert verdict.keep == (wanted == other)

    @pytest.mark.anyio
    async def test_grade_records_call(self) -> None:
        """grade() gives the same verdict as judge() and records an offline 'grade' call."""
        grader = OfflineGrader(STATS)
        h = hit("Rotate API keys every 90 days.")
        with metering(UsageMeter()) as meter:
            verdict = await grader.grade("rotate api keys", h)
        assert verdict == grader.judge("rotate api keys", h)
        assert [(c.judge, c.model) for c in meter.calls] == [("grade", "offline")]


class TestCalibrate:
    def test_thresholds_between_distributions(self) -> None:
        """Calibration separates a text's own body from random texts and keeps thresholds ordered and bounded."""
        texts = [f"{t}\nMore words about {t.split()[0].lower()} appear in the body here." for t in OFFLINE_CORPUS]
        grader = OfflineGrader.calibrate(CorpusStats.from_texts(texts), texts, sample=50)
        cal = grader.calibration
        assert cal is not None and cal.pairs >= 10
        assert cal.positive_median > cal.random_negative_median
        assert 0.15 <= grader.partial_at <= grader.relevant_at - 0.1
        assert 0.4 <= grader.relevant_at <= 0.75
        assert (grader.relevant_at, grader.partial_at) == (cal.relevant_at, cal.partial_at)

    def test_too_few_texts_keeps_defaults(self) -> None:
        """With too few usable texts calibration keeps the defaults and records nothing."""
        grader = OfflineGrader.calibrate(STATS, ["short"], max_chars=500)
        assert grader.calibration is None
        assert (grader.relevant_at, grader.partial_at, grader.max_chars) == (
            OfflineGrader(STATS).relevant_at,
            OfflineGrader(STATS).partial_at,
            500,
        )


def test_chunk_not_naming_the_requested_id_is_at_most_partial() -> None:
    """A generic page about tickets is background for "status of ticket #1234", never a full answer."""
    from ragloop.llm.offline.grade import OfflineGrader
    from ragloop.testing import make_hit
    from ragloop.text.terms import CorpusStats

    texts = ["You can check the status of any ticket under My tickets.", "Ticket #1234 status: open, SSO error."]
    grader = OfflineGrader(CorpusStats.from_texts(texts))
    generic = grader.judge("status of ticket #1234", make_hit(texts[0], confidence=1.0))
    exact = grader.judge("status of ticket #1234", make_hit(texts[1]))
    assert generic.label == "partial" and "does not name #1234" in generic.reason
    assert exact.label == "relevant"


SHOP = [
    "Refunds\nRefunds are issued within 14 days of us receiving your return. Original shipping costs are not refunded.",
    "Shipping\nStandard delivery takes 3 to 5 working days and is free on orders over 50 euros.",
    "Returns\nYou can send an item back within 30 days of delivery. Opened earphones cannot be returned.",
    "Warranty\nEvery phone and laptop carries a two-year warranty. Accidental damage is not covered.",
]


class TestSmallKnowledgeBase:
    def test_framing_words_are_not_coverage_terms(self) -> None:
        """ "How long do refunds take?" is covered by the refunds page: "long" and "take" frame the question."""
        stats = CorpusStats.from_texts(SHOP)
        assert coverage("How long do refunds take?", SHOP[0], stats).score == 1.0
        assert coverage("How big can the file be?", "The file can be large.", stats).missing == ("big",)

    def test_a_few_pages_mark_the_grader_small(self) -> None:
        """Four pages are too few to calibrate on: the grader says so; a corpus of many pages is not small."""
        stats = CorpusStats.from_texts(SHOP)
        assert OfflineGrader.calibrate(stats, SHOP).small_corpus
        assert not OfflineGrader.calibrate(CorpusStats.from_texts(OFFLINE_CORPUS), OFFLINE_CORPUS).small_corpus

    def test_on_a_small_corpus_retriever_agreement_makes_a_hit_relevant(self) -> None:
        """ "How long is the guarantee on a laptop?" shares one word with the warranty page; on four pages a hit
        both retrievers agree on is relevant, one they do not agree on is not (and on a big corpus the rule is
        off)."""
        stats = CorpusStats.from_texts(SHOP)
        grader = OfflineGrader.calibrate(stats, SHOP)
        question = "How long is the guarantee on a laptop?"
        agreed = grader.judge(question, hit(SHOP[3], confidence=0.41))
        assert agreed.label == "relevant" and "retrievers agree" in agreed.reason
        assert grader.judge(question, hit(SHOP[3], confidence=0.2)).label != "relevant"
        big = attrs.evolve(grader, small_corpus=False)
        assert big.judge(question, hit(SHOP[3], confidence=0.41)).label != "relevant"


class _Meaning:
    """An embedder that puts the texts holding one of ``words`` in one direction, every other text in another."""

    name = "meaning"
    dim = 2

    def __init__(self, *words: str) -> None:
        self.words = words
        self.calls = 0

    async def embed(self, texts: list[str]) -> Any:
        import numpy as np

        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, 0 if any(w in text.lower() for w in self.words) else 1] = 1.0
        return out


class TestSmallCorpusMeaning:
    @pytest.mark.anyio
    async def test_a_sentence_that_means_the_query_makes_a_hit_relevant(self) -> None:
        """#33: "Is a cracked screen from dropping the phone covered?" shares little with the warranty page and
        its retrievers barely agree; on four pages a sentence the embedder puts beside the query makes the hit
        relevant. Without an embedder, or on a big corpus, it is not (``with_embedder`` leaves a big one as is)."""
        stats = CorpusStats.from_texts(SHOP)
        question = "Is a cracked screen from dropping the phone covered?"
        emb = _Meaning("cracked", "accidental")
        grader = OfflineGrader.calibrate(stats, SHOP).with_embedder(emb)
        verdict = await grader.grade(question, hit(SHOP[3], confidence=0.1))
        assert verdict.label == "relevant" and "means the query" in verdict.reason
        other = await grader.grade(question, hit(SHOP[1], confidence=0.1))
        assert other.label != "relevant"
        plain = OfflineGrader.calibrate(stats, SHOP)
        assert (await plain.grade(question, hit(SHOP[3], confidence=0.1))).label != "relevant"
        big = OfflineGrader.calibrate(CorpusStats.from_texts(OFFLINE_CORPUS), OFFLINE_CORPUS).with_embedder(emb)
        assert big.embedder is None

    @pytest.mark.anyio
    async def test_meaning_never_overrides_the_id_rule_and_vectors_are_cached(self) -> None:
        """A page naming another ticket stays irrelevant however close it means; a sentence is embedded once."""
        texts = ["Ticket #1234 status: open.", "Refunds take 14 days.", "Shipping is free.", "Returns: 30 days."]
        emb = _Meaning("ticket", "support request")
        grader = OfflineGrader.calibrate(CorpusStats.from_texts(texts), texts).with_embedder(emb)
        assert grader.small_corpus
        assert (await grader.grade("status of ticket #999", hit(texts[0]))).label == "irrelevant"
        first = await grader.grade("any update on my support request", hit(texts[0]))
        assert first.label == "relevant" and "means the query" in first.reason
        calls = emb.calls
        await grader.grade("any update on my support request", hit(texts[0]))
        assert emb.calls == calls


class _Dead:
    """An embedder whose every call fails (a dead embedding service)."""

    name = "dead"
    dim = 2

    async def embed(self, texts: list[str]) -> Any:
        raise ConnectionError("embedding service unreachable")


@pytest.mark.anyio
async def test_a_failing_embedder_leaves_the_term_verdict() -> None:
    """On a small corpus, an embedder that raises neither fails the grade nor changes its label."""
    stats = CorpusStats.from_texts(SHOP)
    question = "Is a cracked screen from dropping the phone covered?"
    plain = await OfflineGrader.calibrate(stats, SHOP).grade(question, hit(SHOP[3], confidence=0.1))
    grader = OfflineGrader.calibrate(stats, SHOP).with_embedder(_Dead())
    dead = await grader.grade(question, hit(SHOP[3], confidence=0.1))
    assert dead.label == plain.label and dead.reason == plain.reason
