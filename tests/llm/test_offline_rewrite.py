"""Tests for ragloop.llm.offline.rewrite: different-angle queries, never a repeat."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import JudgeError
from ragloop.llm.offline.rewrite import OfflineRewriter
from ragloop.text.novelty import is_near_duplicate, normalised_terms
from ragloop.text.terms import CorpusStats, stem
from ragloop.usage import UsageMeter, metering
from tests.strategies import OFFLINE_CORPUS, topic_words

STATS = CorpusStats.from_texts(OFFLINE_CORPUS)
CORPUS_WORDS = sorted({w.lower() for text in OFFLINE_CORPUS for w in text.replace("\n", " ").split() if w.isalpha()})


class TestOfflineRewriter:
    def test_new_angle_from_the_corpus(self) -> None:
        """After the question failed, the rewrite keeps its rarest corpus term and adds associated ones."""
        question = "Okta problems"  # "problems" is not in the corpus, so "okta" anchors the new angle
        rewrite = OfflineRewriter(STATS).rewrite_sync(question, question, [question])
        terms = normalised_terms(rewrite)
        assert stem("okta") in terms
        assert terms & {stem("saml"), stem("sso"), stem("metadata"), stem("claims")}
        assert not is_near_duplicate(rewrite, [question])

    def test_untried_question_terms_come_first(self) -> None:
        """Question terms the failed query did not use lead the rewrite; tried terms are dropped."""
        question = "okta webhook signature"
        rewrite = OfflineRewriter(STATS).rewrite_sync(question, "okta", ["okta"])
        assert set(rewrite.split()[:2]) == {"webhook", "signature"}
        assert "okta" not in rewrite.split()

    def test_successive_rewrites_differ(self) -> None:
        """Feeding each rewrite back as tried gives a fresh query every time, until it gives up."""
        rewriter = OfflineRewriter(STATS)
        question = "Why is my SSO login failing?"
        tried = [question]
        for _ in range(3):
            try:
                new = rewriter.rewrite_sync(question, tried[-1], tried)
            except JudgeError:
                break
            assert not is_near_duplicate(new, tried)
            tried.append(new)
        assert len(tried) >= 3

    def test_gives_up_instead_of_repeating(self) -> None:
        """With no associated terms and every question term tried, it raises JudgeError."""
        stats = CorpusStats.from_texts(["alpha", "beta"])
        with pytest.raises(JudgeError, match="no new angle"):
            OfflineRewriter(stats).rewrite_sync("alpha beta", "alpha beta", [])

    @given(
        st.lists(st.sampled_from(CORPUS_WORDS), min_size=1, max_size=5).map(" ".join),
        st.lists(
            st.lists(st.one_of(st.sampled_from(CORPUS_WORDS), topic_words), min_size=1, max_size=5).map(" ".join),
            max_size=4,
        ),
    )
    def test_never_returns_a_tried_or_near_duplicate_query(self, question: str, tried: list[str]) -> None:
        """For any question and tried queries: a query that is new against all of them, or JudgeError."""
        rewriter = OfflineRewriter(STATS)
        failed = tried[-1] if tried else question
        try:
            new = rewriter.rewrite_sync(question, failed, tried)
        except JudgeError:
            return
        assert new not in tried and new != failed
        assert not is_near_duplicate(new, [failed, *tried], threshold=rewriter.threshold)

    @pytest.mark.anyio
    async def test_rewrite_records_calls_and_errors(self) -> None:
        """rewrite() records an offline call, with the error when it gives up."""
        stats = CorpusStats.from_texts(["alpha", "beta"])
        with metering(UsageMeter()) as meter:
            assert await OfflineRewriter(STATS).rewrite("configure okta", "configure okta", [])
            with pytest.raises(JudgeError):
                await OfflineRewriter(stats).rewrite("alpha", "alpha", [])
        assert [c.judge for c in meter.calls] == ["rewrite", "rewrite"]
        assert meter.calls[0].error is None
        assert meter.calls[1].error is not None and "no new angle" in meter.calls[1].error


def test_unknown_name_or_id_gives_up_instead_of_drifting() -> None:
    """A name or id the index never mentions cannot be found by rewriting: say so, don't drift."""
    rewriter = OfflineRewriter(STATS)
    for question in ("Does it integrate with Salesforce?", "What is the status of ticket #987654?"):
        with pytest.raises(JudgeError, match="occur nowhere in the index"):
            rewriter.rewrite_sync(question, question, [question])
