"""Tests for ragloop.retrievers.evaluate."""

from __future__ import annotations

from pathlib import Path

import ir_measures
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_measures import MRR, R, nDCG

from ragloop.errors import InputError
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.evaluate import (
    METRIC_KEYS,
    evaluate_beir,
    evaluate_run,
    percentile,
    rank_docs,
)
from tests.strategies import tiny_beir

DOCS = [f"d{i}" for i in range(30)]


@st.composite
def run_and_qrels(draw: st.DrawFn) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    """Random runs (scores may tie) and graded qrels over a small doc pool; every query has a result."""
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, int]] = {}
    for q in range(draw(st.integers(1, 5))):
        qid = f"q{q}"
        docs = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=25, unique=True))
        run[qid] = {d: float(draw(st.integers(0, 8))) for d in docs}
        rel = draw(st.lists(st.sampled_from(DOCS), min_size=1, max_size=6, unique=True))
        qrels[qid] = {d: draw(st.integers(0, 3)) for d in rel}
        if not any(qrels[qid].values()):
            qrels[qid][rel[0]] = 1
    return run, qrels


class TestMetrics:
    @settings(max_examples=40)
    @given(run_and_qrels())
    def test_agrees_with_pytrec_eval(self, data: tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]) -> None:
        """nDCG@10, Recall@k and MRR@10 equal ir-measures' pytrec_eval results, ties included."""
        run, qrels = data
        ours = evaluate_run(run, qrels)
        measures = [nDCG @ 10, R @ 2, R @ 5, R @ 10, R @ 100]
        theirs = ir_measures.pytrec_eval.calc_aggregate(measures, qrels, run)
        assert ours["ndcg@10"] == pytest.approx(theirs[nDCG @ 10], abs=1e-6)
        for k in (2, 5, 10, 100):
            assert ours[f"recall@{k}"] == pytest.approx(theirs[R @ k], abs=1e-6)
        # pytrec_eval's recip_rank has no cutoff: give it the top 10 (trec_eval order) to get RR@10.
        top10 = {q: {d: docs[d] for d in rank_docs(docs)[:10]} for q, docs in run.items()}
        rr10 = ir_measures.pytrec_eval.calc_aggregate([MRR], qrels, top10)[MRR]
        assert ours["mrr@10"] == pytest.approx(rr10, abs=1e-6)

    def test_hand_computed(self) -> None:
        """A worked example: relevant docs at ranks 2 and 4 of 2 relevant."""
        run = {"q": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}}
        qrels = {"q": {"b": 1, "d": 1}}
        got = evaluate_run(run, qrels)
        idcg = 1 + 1 / 1.584962500721156
        assert got["ndcg@10"] == pytest.approx((1 / 1.584962500721156 + 1 / 2.321928094887362) / idcg)
        assert got["recall@2"] == 0.5 and got["recall@5"] == 1.0 and got["mrr@10"] == 0.5

    def test_missing_query_scores_zero(self) -> None:
        """A judged query without results counts as 0, not as absent."""
        got = evaluate_run({"q1": {"a": 1.0}}, {"q1": {"a": 1}, "q2": {"b": 1}})
        assert got["mrr@10"] == 0.5

    def test_ties_break_by_descending_id(self) -> None:
        """Equal scores are ordered by document id, descending, as trec_eval does."""
        assert rank_docs({"a": 1.0, "c": 1.0, "b": 2.0}) == ["b", "c", "a"]

    def test_percentile_interpolates(self) -> None:
        """Percentiles interpolate linearly between ranks (numpy's default)."""
        assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([], 95) == 0.0


class TestEvaluateBeir:
    @pytest.mark.parametrize("mode", ["bm25", "hybrid"])
    def test_tiny_beir_folder(self, tmp_path: Path, mode: str) -> None:
        """An easy BEIR folder is solved perfectly and reports every key."""
        got = evaluate_beir(tiny_beir(tmp_path), mode=mode, embedder=HashEmbedder(64))  # type: ignore[arg-type]
        assert tuple(got) == METRIC_KEYS
        assert got["ndcg@10"] == 1.0 and got["recall@2"] == 1.0 and got["queries"] == 3
        assert got["latency_ms_p95"] >= got["latency_ms_p50"] > 0

    def test_index_cache_is_reused(self, tmp_path: Path) -> None:
        """With index_dir the built index is written once and reused."""
        folder, cache = tiny_beir(tmp_path), tmp_path / "cache"
        evaluate_beir(folder, embedder=HashEmbedder(64), index_dir=cache)
        stamp = (cache / "manifest.json").stat().st_mtime_ns
        evaluate_beir(folder, embedder=HashEmbedder(64), index_dir=cache, mode="bm25")
        assert (cache / "manifest.json").stat().st_mtime_ns == stamp

    def test_unknown_split(self, tmp_path: Path) -> None:
        """Asking for a split that is not there names the available ones."""
        with pytest.raises(InputError, match="available: test"):
            evaluate_beir(tiny_beir(tmp_path), split="dev", embedder=HashEmbedder(64))
