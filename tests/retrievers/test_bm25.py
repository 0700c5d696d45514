"""Tests for ragloop.retrievers.bm25."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.errors import IndexError_
from ragloop.retrievers.bm25 import MAX_SCOPES, BM25Index, BM25Retriever, Tokenizer
from ragloop.state import Chunk
from tests.retrievers._corpus import CHUNKS, TEXTS


def _index(**kw: object) -> BM25Index:
    idx = BM25Index(**kw)  # type: ignore[arg-type]
    idx.build([c.id for c in CHUNKS], [c.text for c in CHUNKS])
    return idx


class TestTokenizer:
    def test_stopwords_and_stemming(self) -> None:
        """Stopwords are dropped and words are stemmed to a shared root."""
        assert Tokenizer()("The runner is running") == ["runner", "run"]

    def test_without_stemming(self) -> None:
        """With stem=False words are kept as they are (lower-cased)."""
        assert Tokenizer(stem=False)("Running DOGS") == ["running", "dogs"]


class TestBM25Index:
    def test_best_match_first_with_full_confidence(self) -> None:
        """The chunk matching every query term best ranks first with normalised score 1."""
        top = _index().search_sync("sorted set members", 3)
        assert top[0][0] == "c3" and top[0][2] == pytest.approx(1.0)
        assert all(0 < conf <= 1 for _, _, conf in top)

    def test_stemming_matches_inflections(self) -> None:
        """'invoicing' finds the chunk about 'invoices' only when stemming is on."""
        assert _index().search_sync("invoicing", 1)[0][0] == "c1"
        assert _index(stem=False).search_sync("invoicing", 1) == []

    def test_stopword_only_query_finds_nothing(self) -> None:
        """A query of stopwords has no terms and returns no hits."""
        assert _index().search_sync("the and of", 5) == []

    def test_unknown_words_lower_confidence(self) -> None:
        """Query words the corpus never saw pull the confidence down."""
        plain = _index().search_sync("vitamin bone", 1)[0][2]
        diluted = _index().search_sync("vitamin bone zzyzx qwop", 1)[0][2]
        assert diluted == pytest.approx(plain / 2)

    def test_save_load_round_trip(self, tmp_path: Path) -> None:
        """A loaded index gives the same results and keeps its tokenizer settings."""
        idx = _index(stem=False)
        idx.save(tmp_path)
        again = BM25Index.load(tmp_path)
        assert again.tokenizer.stem is False
        for q in ("password reset", "shipping europe days", "cat"):
            assert again.search_sync(q, 4) == idx.search_sync(q, 4)

    def test_load_missing_is_index_error(self, tmp_path: Path) -> None:
        """A missing BM25 folder is an IndexError_ that says to rebuild."""
        with pytest.raises(IndexError_, match="ragloop index"):
            BM25Index.load(tmp_path)

    def test_empty_corpus(self) -> None:
        """An empty index answers with no hits."""
        idx = BM25Index()
        idx.build([], [])
        assert idx.search_sync("anything", 3) == []


@pytest.mark.anyio
async def test_retriever_hits_carry_rank_and_score() -> None:
    """BM25Retriever returns Hits ranked 1.. with the raw score under 'bm25'."""
    r = BM25Retriever(_index(), {c.id: c for c in CHUNKS})
    hits = await r.search("two-factor login code", 2)
    assert hits[0].id == "c6" and hits[0].ranks == {"bm25": 1}
    assert hits[0].scores == {"bm25": hits[0].score}


class TestScopeStatistics:
    """A filtered search scores with the statistics of the chunks its filters find (issue 30)."""

    @staticmethod
    def _tenants() -> tuple[list[Chunk], list[Chunk]]:
        a = [Chunk(id=f"a{i}", text=t, metadata={"tenant": "a"}) for i, t in enumerate(TEXTS[:5])]
        b = [Chunk(id=f"b{i}", text=t, metadata={"tenant": "b"}) for i, t in enumerate(TEXTS[1:])]
        return a, b

    @staticmethod
    def _retriever(chunks: list[Chunk], *, scoped: bool = True) -> BM25Retriever:
        index = BM25Index()
        index.build([c.id for c in chunks], [c.text for c in chunks])
        return BM25Retriever(index, {c.id: c for c in chunks}, text_of=(lambda c: c.text) if scoped else None)

    def test_another_tenants_chunks_change_nothing(self) -> None:
        """b's hits, scores and confidences are those of an index of b's chunks alone (before: a's chunks moved
        b's IDF and best possible scores)."""
        a, b = self._tenants()
        both, alone = self._retriever([*a, *b]), self._retriever(b)
        for query in ("download past invoices billing", "redis sorted set scores", "login code"):
            got = both.search_sync(query, 5, {"tenant": ("b",)})
            want = alone.search_sync(query, 5, {"tenant": ("b",)})
            assert [(h.id, h.score, h.confidence) for h in got] == [(h.id, h.score, h.confidence) for h in want]
            assert got, query

    def test_without_the_indexed_texts_the_whole_index_statistics_serve(self) -> None:
        """A retriever not told how chunks were indexed masks the whole index's scores, as before."""
        a, b = self._tenants()
        plain = self._retriever([*a, *b], scoped=False)
        scores, _ = plain.index.scores("login code")
        hits = plain.search_sync("login code", 5, {"tenant": ("b",)})
        assert hits and all(h.id.startswith("b") for h in hits)
        assert hits[0].score == pytest.approx(float(scores[plain.index.chunk_ids.index(hits[0].id)]))

    def test_a_scope_index_is_built_once_and_kept_within_bounds(self) -> None:
        """The second search of a scope reuses its index; at most MAX_SCOPES are kept."""
        chunks = [Chunk(id=f"c{i}", text=f"word{i} common text", metadata={"t": str(i)}) for i in range(40)]
        r = self._retriever(chunks)
        r.search_sync("common", 3, {"t": ("1",)})
        first = r.scope_index(r.mask({"t": ("1",)}))[1]
        r.search_sync("common", 3, {"t": ("1",)})
        assert r.scope_index(r.mask({"t": ("1",)}))[1] is first
        for i in range(40):
            r.search_sync("common", 3, {"t": (str(i),)})
        assert len(r._scoped) == MAX_SCOPES
