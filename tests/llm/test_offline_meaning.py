"""The offline judges with a corpus' own dense threshold (``dense_at``): evidence by meaning that transfers.

The threshold comes from :mod:`ragloop.retrievers.meaning`; here it is given, and each judge's use of it is
checked: the grader keeps a hit that close, the abstention accepts a kept passage the question's *own* search
found that close (never a name the corpus never mentions), and ``Judges.offline`` wires one scale per scope.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from ragloop.llm.offline.answer import AbstainRule, OfflineAnswerer
from ragloop.llm.offline.grade import OfflineGrader
from ragloop.llm.scoped import ScopedKnowledge
from ragloop.retrievers.meaning import MeaningScale
from ragloop.retrievers.scope import Corpus, turn_scope
from ragloop.state import Chunk, ContextBlock, Hit
from ragloop.text.terms import CorpusStats
from ragloop.turn import Judges
from tests.strategies import OFFLINE_CORPUS

pytestmark = pytest.mark.anyio

STATS = CorpusStats.from_texts(OFFLINE_CORPUS)


def _hit(text: str, dense: float | None) -> Hit:
    return Hit(Chunk("c", text), score=1.0, scores={} if dense is None else {"dense": dense})


class TestGraderByMeaning:
    def test_a_hit_that_close_is_relevant_whatever_its_words(self) -> None:
        """A paraphrase sharing no word with the page, at the corpus' threshold: relevant, and the reason says
        why; a hair under it, the term verdict stands."""
        grader = OfflineGrader(STATS, dense_at=0.5)
        text = "Store tokens in the keychain; they are handed to steps and never written to disk."
        at = grader.judge("where should my password go", _hit(text, 0.5))
        assert at.label == "relevant" and "means the query (cosine 0.50" in at.reason
        under = grader.judge("where should my password go", _hit(text, 0.4999))
        assert under.label == "irrelevant"

    def test_without_a_threshold_or_a_dense_score_nothing_changes(self) -> None:
        """No ``dense_at`` (a corpus without a scale) or a hit without a dense score (BM25 alone found it)."""
        text = "Store tokens in the keychain."
        # (0.6: under the retrieval signal's own promotion, which is older and applies to every corpus)
        assert OfflineGrader(STATS).judge("where should my password go", _hit(text, 0.6)).label == "irrelevant"
        assert OfflineGrader(STATS, dense_at=0.5).judge("where should my password go", _hit(text, None)).label == (
            "irrelevant"
        )

    def test_the_identifier_rules_still_win(self) -> None:
        """A chunk naming another ticket is irrelevant, and one not naming the asked ticket at most partial,
        however close by meaning."""
        grader = OfflineGrader(STATS, dense_at=0.5)
        assert grader.judge("status of ticket #1234", _hit("Ticket #999 is closed.", 0.95)).label == "irrelevant"
        assert grader.judge("status of ticket #1234", _hit("Tickets are closed after a week.", 0.95)).label == (
            "partial"
        )


def _block(n: int, text: str, cosine: float | None) -> ContextBlock:
    return ContextBlock(n, text, source=f"p{n}.md", chunk_id=f"c{n}", cosine=cosine)


class TestAbstentionByMeaning:
    def test_a_kept_passage_the_question_found_that_close_supports_an_answer(self) -> None:
        """Low term evidence, but a block whose cosine with the question reaches ``dense_at``: no abstention;
        under it, or found only by another query (``cosine`` None), the answerer abstains."""
        answerer = OfflineAnswerer(STATS, abstain_rule=AbstainRule(dense_at=0.5))
        question = "where should my password go"
        text = "Store tokens in the keychain; they are handed to steps and never written to disk."
        assert answerer.abstain(question, [_block(1, text, 0.55)], []) is None
        assert answerer.abstain(question, [_block(1, text, 0.45)], []) is not None
        assert answerer.abstain(question, [_block(1, text, None)], []) is not None

    def test_a_name_the_corpus_never_mentions_is_still_refused(self) -> None:
        """On a calibrated corpus meaning never covers a name: the nearest page to "Salesforce" names others."""
        answerer = OfflineAnswerer(STATS, abstain_rule=AbstainRule(dense_at=0.5))
        found = answerer.abstain("Does Widgets integrate with Salesforce?", [_block(1, "Okta for SSO", 0.9)], [])
        assert found is not None and found.unknown == ("Salesforce",)

    @given(score=st.floats(0, 2), meaning=st.floats(-1, 1), cosine=st.none() | st.floats(-1, 1))
    def test_a_closer_question_never_turns_support_into_abstention(
        self, score: float, meaning: float, cosine: float | None
    ) -> None:
        """Support only grows with the question's cosine, and without ``dense_at`` the cosine counts for nothing."""
        rule = AbstainRule(dense_at=0.5)
        if rule.supported(score, meaning, cosine):
            assert rule.supported(score, meaning, 1.0 if cosine is None else min(1.0, cosine + 0.1))
        assert AbstainRule().supported(score, meaning, cosine) == AbstainRule().supported(score, meaning)


class _Embedder:
    name, dim = "fake", 4

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.ones((len(texts), 4), dtype=np.float32) / 2


#: Enough texts that a scope of half of them is still calibrated (not a small knowledge base).
_TEXTS = tuple(f"{t}\nVariant {v} of page {i}." for v in range(4) for i, t in enumerate(OFFLINE_CORPUS))


class TestJudgesWiring:
    def _corpus(self, meaning: object, metadata: tuple[dict[str, str], ...] | None = None) -> Corpus:
        return Corpus(_TEXTS, metadata or tuple({} for _ in _TEXTS), meaning)  # type: ignore[arg-type]

    def test_a_measured_scale_reaches_grader_abstention_and_answerer(self) -> None:
        """The corpus' threshold is the grader's ``dense_at``, the abstention's ``dense_at`` and the answerer's
        ``meaning_at`` (with the embedder, to score its sentences)."""
        asked: list[object] = []

        def meaning(positions: Sequence[int] | None) -> MeaningScale:
            asked.append(positions)
            return MeaningScale(0.47, 30, 0.3)

        judges = Judges.offline(self._corpus(meaning), embedder=_Embedder())
        grader, answerer = judges.grader, judges.answerer
        assert isinstance(grader, OfflineGrader) and isinstance(answerer, OfflineAnswerer)
        assert not grader.small_corpus and grader.dense_at == 0.47
        assert answerer.abstain_rule.dense_at == 0.47 and answerer.meaning_at == 0.47
        assert answerer.embedder is not None and asked == [None]

    def test_no_embedder_or_no_scale_leaves_the_terms_alone(self) -> None:
        """Without an embedder nothing is measured; a corpus that measures none gives no threshold."""
        calls: list[object] = []
        plain = Judges.offline(self._corpus(lambda p: calls.append(p)))
        assert isinstance(plain.grader, OfflineGrader) and plain.grader.dense_at is None and calls == []
        none = Judges.offline(self._corpus(lambda p: None), embedder=_Embedder())
        assert isinstance(none.answerer, OfflineAnswerer) and none.answerer.meaning_at is None

    def test_a_failing_measurement_is_logged_and_the_terms_decide(self) -> None:
        """Measuring the scale raises: the judges are built without it (fail-open) and one event says why."""

        def broken(positions: Sequence[int] | None) -> MeaningScale:
            raise RuntimeError("embedder gone")

        with capture_logs() as logs:
            judges = Judges.offline(self._corpus(broken), embedder=_Embedder())
        assert isinstance(judges.grader, OfflineGrader) and judges.grader.dense_at is None
        assert [e["event"] for e in logs] == ["meaning_scale_failed"] and "embedder gone" in logs[0]["error"]

    async def test_a_tenants_scale_is_measured_on_its_own_chunks(self) -> None:
        """A scoped turn's judges measure the scale over the positions its filters let it find."""
        asked: list[tuple[int, ...] | None] = []

        def meaning(positions: Sequence[int] | None) -> MeaningScale:
            asked.append(None if positions is None else tuple(positions))
            return MeaningScale(0.5 if positions is None else 0.6, 30, 0.3)

        tenants = tuple({"tenant": "acme" if i % 2 else "globex"} for i in range(len(_TEXTS)))
        judges = Judges.offline(self._corpus(meaning, tenants), embedder=_Embedder())
        assert judges.knowledge is not None
        with turn_scope({"tenant": ("acme",)}):
            scoped = await judges.knowledge.acurrent()
        assert isinstance(scoped.grader, OfflineGrader) and scoped.grader.dense_at == 0.6
        assert asked == [None, tuple(i for i in range(len(_TEXTS)) if i % 2)]


class TestPositionedBuild:
    def test_a_positioned_build_gets_the_scopes_positions(self) -> None:
        """With ``positioned``, the base is built with ``None`` and a scope with its chunks' positions."""
        corpus = Corpus(("a1", "b1", "a2"), ({"t": "a"}, {"t": "b"}, {"t": "a"}))
        built: list[tuple[tuple[str, ...], object]] = []

        def build(texts: Sequence[str], positions: Sequence[int] | None) -> int:
            built.append((tuple(texts), None if positions is None else tuple(positions)))
            return len(built)

        known = ScopedKnowledge(corpus, build, positioned=True)
        known.for_filters({"t": ("a",)})
        assert built == [(("a1", "b1", "a2"), None), (("a1", "a2"), (0, 2))]


class _Counting:
    """A deterministic embedder that records every call (a vector from each text's hash)."""

    name, dim = "counting", 8

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        rows = np.array([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


class TestSentenceVectors:
    A = ContextBlock(1, "Steps run in parallel on four workers. Dependent steps wait.", chunk_id="a", cosine=0.6)
    B = ContextBlock(2, "Logs go to the logs folder. Pass --verbose to print commands.", chunk_id="b", cosine=0.5)
    C = ContextBlock(3, "Plugins register step types.", chunk_id="c", cosine=0.2)

    async def test_the_two_nearest_blocks_are_scored_and_kept(self) -> None:
        """Only the sentences of the two blocks the question's own search found closest are embedded, in one
        call, and the question alone; the same two blocks again embed only the question."""
        embedder = _Counting()
        answerer = OfflineAnswerer(STATS, embedder=embedder, meaning_at=0.5)
        first = await answerer.dense_scores("how do I run steps at once", [self.C, self.B, self.A])
        sentences = [
            "Dependent steps wait.",
            "Logs go to the logs folder.",
            "Pass --verbose to print commands.",
            "Steps run in parallel on four workers.",
        ]
        assert first is not None and sorted(first) == sentences
        assert embedder.calls == [sentences, ["how do I run steps at once"]]
        again = await answerer.dense_scores("how do I run steps at once", [self.A, self.B])
        assert again == first and embedder.calls[2:] == [["how do I run steps at once"]]

    async def test_a_sentences_score_does_not_depend_on_what_was_asked_before(self) -> None:
        """The same question over the same blocks scores its sentences the same, whether the blocks were seen
        before (kept vectors) or not (a fresh answerer): a reply never depends on earlier turns."""
        warm = OfflineAnswerer(STATS, embedder=_Counting(), meaning_at=0.5)
        await warm.dense_scores("where do logs go", [self.B, self.C])
        kept = await warm.dense_scores("how do I run steps at once", [self.A, self.B])
        fresh = await OfflineAnswerer(STATS, embedder=_Counting(), meaning_at=0.5).dense_scores(
            "how do I run steps at once", [self.A, self.B]
        )
        assert kept == fresh

    async def test_the_kept_vectors_are_bounded(self) -> None:
        """However many distinct pages a scope's questions reach, the answerer keeps at most a bounded number of
        sentence vectors (it starts afresh past the bound; the replies do not change, see above)."""
        from ragloop.llm.offline.answer import _MAX_CACHED_VECTORS

        answerer = OfflineAnswerer(STATS, embedder=_Counting(), meaning_at=0.5)
        for i in range(_MAX_CACHED_VECTORS // 4 + 50):
            blocks = [
                ContextBlock(1, f"Page {i} says one thing. It says a second thing.", cosine=0.6),
                ContextBlock(2, f"Other {i} says more. And even more here.", cosine=0.5),
            ]
            await answerer.dense_scores("what does it say", blocks)
            assert sum(map(len, answerer._vectors.values())) <= _MAX_CACHED_VECTORS
