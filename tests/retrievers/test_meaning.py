"""The corpus' own dense threshold: pseudo-questions from headings, the leave-one-document-out null, per scope."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.meaning import (
    CEILING,
    FLOOR,
    MIN_QUESTIONS,
    MeaningScales,
    calibrate_meaning,
    pseudo_questions,
)
from ragloop.state import Chunk
from tests.retrievers._corpus import headed_chunks


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _chunk(i: int, doc: str, title: str, *path: str) -> Chunk:
    return Chunk(f"c{i}", f"text {i}", source=doc, title=title, title_path=path, doc_id=doc)


class TestPseudoQuestions:
    def test_titles_and_headings_of_one_document_only(self) -> None:
        """Page titles and section headings are questions; a heading two documents share ("Examples") is not,
        nor one too short to ask anything."""
        chunks = [
            _chunk(1, "a.md", "API keys", "API keys", "Rotate a key"),
            _chunk(2, "a.md", "API keys", "API keys", "Examples"),
            _chunk(3, "b.md", "Webhooks", "Webhooks", "Examples"),
            _chunk(4, "b.md", "Webhooks", "Webhooks", "Go"),
        ]
        assert sorted(pseudo_questions(chunks)) == [
            ("API keys", "a.md"),
            ("Rotate a key", "a.md"),
            ("Webhooks", "b.md"),
        ]

    def test_a_hostile_heading_is_no_question(self) -> None:
        """A heading of 100,000 characters (or one of two) asks nothing: only sane headings are embedded."""
        chunks = [_chunk(1, "a.md", "x" * 100_000, "y" * 121), _chunk(2, "b.md", "Rotate a key", "ok")]
        assert pseudo_questions(chunks) == [("Rotate a key", "b.md")]

    def test_the_sample_is_bounded_and_the_same_for_the_same_chunks(self) -> None:
        """At most ``limit`` headings, chosen by their text's hash: chunk order does not change the choice."""
        chunks = [_chunk(i, f"d{i}.md", f"Title number {i}") for i in range(50)]
        first = pseudo_questions(chunks, limit=10)
        assert len(first) == 10
        assert sorted(pseudo_questions(list(reversed(chunks)), limit=10)) == sorted(first)


class TestCalibrateMeaning:
    def test_the_null_leaves_the_questions_own_document_out(self) -> None:
        """Each question's null is its best cosine with another document's chunk, never its own; the threshold
        is their 90th percentile."""
        rng = np.random.default_rng(0)
        n = 40
        questions = _unit(rng.normal(size=(n, 16)))
        # Each document holds an exact copy of its question (cosine 1, to be ignored) and a chunk at a known
        # cosine with the *next* question.
        cos = np.linspace(0.3, 0.7, n)
        vectors, docs = [], []
        for i in range(n):
            vectors.append(questions[i])
            docs.append(f"d{i}")
            q = questions[(i + 1) % n]
            other = _unit(rng.normal(size=(1, 16)))[0]
            other = _unit((other - (other @ q) * q)[None, :])[0]
            vectors.append(cos[(i + 1) % n] * q + np.sqrt(1 - cos[(i + 1) % n] ** 2) * other)
            docs.append(f"d{i}")
        scale = calibrate_meaning(questions, [f"d{i}" for i in range(n)], np.array(vectors), docs)
        assert scale is not None and scale.questions == n
        # the oracle: every question against every chunk of another document, one pair at a time
        v = np.array(vectors)
        nulls = np.array(
            [max(float(questions[i] @ v[j]) for j in range(len(docs)) if docs[j] != f"d{i}") for i in range(n)]
        )
        assert all(nulls[i] >= cos[i] - 1e-6 for i in range(n))  # the planted chunk is among them
        assert scale.threshold == pytest.approx(min(CEILING, max(FLOOR, np.percentile(nulls, 90))), abs=1e-3)

    def test_a_corpus_of_copies_gives_the_ceiling(self) -> None:
        """Every document a copy of the others: every null is 1.0, and the threshold stops at CEILING (meaning
        then counts only for passages as close as copies are), never above."""
        v = _unit(np.ones((1, 8)))
        docs = [f"d{i}" for i in range(MIN_QUESTIONS)]
        scale = calibrate_meaning(np.repeat(v, MIN_QUESTIONS, 0), docs, np.repeat(v, MIN_QUESTIONS, 0), docs)
        assert scale is not None and scale.threshold == CEILING and scale.null_median == pytest.approx(1.0)

    def test_too_few_questions_give_no_scale(self) -> None:
        """A handful of headings (a user's first four pages) measure nothing: ``None``."""
        q = _unit(np.eye(4, 8) + 0.1)
        assert calibrate_meaning(q, ["a", "b", "c", "d"], q, ["a", "b", "c", "d"]) is None

    def test_a_corpus_of_one_document_gives_no_scale(self) -> None:
        """With no other document to be measured against, there is no null."""
        q = _unit(np.random.default_rng(1).normal(size=(MIN_QUESTIONS, 8)))
        assert calibrate_meaning(q, ["a"] * MIN_QUESTIONS, q, ["a"] * MIN_QUESTIONS) is None

    @settings(max_examples=60, deadline=None)
    @given(
        seed=st.integers(0, 2**32 - 1),
        n_docs=st.integers(2, 8),
        per_doc=st.integers(3, 6),
        extra=st.integers(1, 5),
    )
    def test_more_chunks_of_other_documents_never_lower_the_threshold(
        self, seed: int, n_docs: int, per_doc: int, extra: int
    ) -> None:
        """Adding chunks can only raise a null (a max over more chunks), so the threshold never drops; it stays
        within [FLOOR, CEILING]; the chunks' order does not matter; and chunks added to the questions' own
        document change nothing."""
        rng = np.random.default_rng(seed)
        docs = [f"d{i}" for i in range(n_docs) for _ in range(per_doc)]
        q_docs = [f"d{i}" for i in range(n_docs) for _ in range(per_doc)]
        q = _unit(rng.normal(size=(len(q_docs), 6)))
        v = _unit(rng.normal(size=(len(docs), 6)))
        base = calibrate_meaning(q, q_docs, v, docs, min_questions=2)
        assert base is not None and FLOOR <= base.threshold <= CEILING
        more_v = np.vstack([v, _unit(rng.normal(size=(extra, 6)))])
        more = calibrate_meaning(q, q_docs, more_v, [*docs, *(f"new{i}" for i in range(extra))], min_questions=2)
        assert more is not None and more.threshold >= base.threshold - 1e-6
        order = rng.permutation(len(docs))
        shuffled = calibrate_meaning(q, q_docs, v[order], [docs[i] for i in order], min_questions=2)
        assert shuffled is not None and shuffled.threshold == pytest.approx(base.threshold, abs=1e-6)
        # the questions of d0 alone, then with copies of themselves added to d0: nothing of d0 counts for them
        mine = [i for i, d in enumerate(q_docs) if d == "d0"]
        alone = calibrate_meaning(q[mine], ["d0"] * len(mine), v, docs, min_questions=2)
        own = calibrate_meaning(
            q[mine], ["d0"] * len(mine), np.vstack([v, q[mine]]), [*docs, *["d0"] * len(mine)], min_questions=2
        )
        assert alone is not None and own is not None and own.threshold == pytest.approx(alone.threshold, abs=1e-6)


class _Embed:
    """A deterministic 'embedder' for headings: a unit vector from the text's hash (calls counted)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return _unit(np.array([np.random.default_rng(abs(hash(t)) % 2**32).normal(size=8) for t in texts]))


class TestMeaningScales:
    def _chunks(self, tenant: str, n: int) -> list[Chunk]:
        return headed_chunks(tenant, n)

    def test_a_scope_is_measured_on_its_own_chunks_only(self) -> None:
        """A tenant's scale is the same whether or not another tenant's documents share the index (the scale
        is a corpus statistic: it is per scope, like the others)."""
        acme, globex = self._chunks("acme", 15), self._chunks("globex", 15)
        rng = np.random.default_rng(3)
        vectors = {c.id: _unit(rng.normal(size=(1, 8)))[0] for c in acme + globex}

        def lookup(ids: list[str]) -> np.ndarray:
            return np.array([vectors[i] for i in ids], dtype=np.float32)

        alone = MeaningScales(acme, lookup, _Embed())(None)
        shared = MeaningScales(acme + globex, lookup, _Embed())(list(range(len(acme))))
        assert alone is not None and alone == shared

    def test_headings_are_embedded_once_a_few_at_a_time(self) -> None:
        """A second scope embeds only headings the first did not have, in calls of at most four texts (an
        embedder's query-sized path)."""
        chunks = self._chunks("acme", 15) + self._chunks("globex", 15)
        embed = _Embed()
        rng = np.random.default_rng(4)
        scales = MeaningScales(chunks, lambda ids: _unit(rng.normal(size=(len(ids), 8))), embed)
        scales(list(range(15)))
        first = sum(len(c) for c in embed.calls)
        scales(None)
        assert sum(len(c) for c in embed.calls) - first == 30  # globex's 30 headings, acme's were kept
        assert max(len(c) for c in embed.calls) <= 4

    def test_too_few_headings_give_none(self) -> None:
        """Four pages: no scale, and nothing is embedded."""
        embed = _Embed()
        assert MeaningScales(self._chunks("acme", 4), lambda ids: np.zeros((len(ids), 8)), embed)(None) is None
        assert embed.calls == []

    def test_a_hash_embedder_index_has_no_scale(self, tmp_path: Path) -> None:
        """The lexical hash embedder's cosines restate term overlap: its index measures no meaning scale."""
        chunks = [Chunk(f"c{i}", f"page {i} text", title=f"Page {i}", doc_id=f"{i}.md") for i in range(30)]
        assert KnowledgeIndex.build(chunks, HashEmbedder(dim=64)).meaning_scales() is None
