"""Tests for ragloop.retrievers.fusion: the turn's final ranking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.retrievers.fusion import FusionSettings, fuse_ids, fuse_searches
from ragloop.state import Chunk, Hit, Label

ids = st.sampled_from([f"c{i}" for i in range(40)])
ranked = st.lists(ids, min_size=0, max_size=30, unique=True)
labels = st.sampled_from(["relevant", "partial", "irrelevant"])


def _hit(cid: str) -> Hit:
    return Hit(chunk=Chunk(id=cid, text=cid), score=1.0)


class TestFuseIds:
    def test_rrf_example(self) -> None:
        """A chunk two lists found beats the top of one list."""
        out = fuse_ids({"q": ["a", "b"], "p": ["c", "b"]}, anchor="q")
        assert out[0] == "b"
        assert set(out) == {"a", "b", "c"}

    def test_relevant_grade_moves_up(self) -> None:
        """A relevant grade lifts a chunk over an ungraded one of the same fused score."""
        out = fuse_ids({"q": ["a"], "p": ["b"]}, anchor=None, grades={"b": ["relevant"]})
        assert out == ["b", "a"]

    def test_irrelevant_grade_moves_down_not_out(self) -> None:
        """An irrelevant chunk sinks but stays in the ranking (a signal, not a cut)."""
        out = fuse_ids({"q": ["a", "b"]}, anchor=None, grades={"a": ["irrelevant"]})
        assert out == ["b", "a"]

    def test_one_relevant_grade_outweighs_irrelevant_ones(self) -> None:
        """Relevant for one query and irrelevant for another counts as relevant."""
        out = fuse_ids({"q": ["a", "b"]}, anchor=None, grades={"b": ["irrelevant", "relevant"], "a": ["partial"]})
        assert out == ["b", "a"]

    def test_protected_anchor_hit_stays_in_head(self) -> None:
        """The anchor's top hits stay within the first ``depth`` places even when every other list disagrees."""
        others = {f"p{i}": [f"x{j}" for j in range(6)] for i in range(3)}
        out = fuse_ids({"q": ["a", "b", "c"], **others}, anchor="q", depth=5, settings=FusionSettings(protect=3))
        assert {"a", "b", "c"} <= set(out[:5])
        assert [c for c in out if c in "abc"] == ["a", "b", "c"]

    def test_negative_depth_is_refused(self) -> None:
        """A negative depth is a configuration error naming the value."""
        with pytest.raises(ConfigError, match="-1"):
            fuse_ids({"q": ["a"]}, anchor="q", depth=-1)

    @given(
        anchor=ranked,
        others=st.dictionaries(st.sampled_from(["p1", "p2", "p3", "p4"]), ranked, max_size=4),
        grades=st.dictionaries(ids, st.lists(labels, min_size=1, max_size=3)),
        depth=st.integers(5, 30),
    )
    def test_never_loses_single_shot_top5(
        self, anchor: list[str], others: dict[str, list[str]], grades: dict[str, list[Label]], depth: int
    ) -> None:
        """Whenever the question is among the queries, the fused pool's first ``depth`` places hold every chunk
        the question's own search ranks in its top 5, whatever the other lists and the grades."""
        out = fuse_ids({"question": anchor, **others}, anchor="question", grades=grades, depth=depth)
        assert set(anchor[:5]) <= set(out[:depth])

    @given(lists=st.dictionaries(st.sampled_from(["q", "p1", "p2"]), ranked, max_size=3))
    def test_pool_is_the_union_once_each(self, lists: dict[str, list[str]]) -> None:
        """The fused ranking holds every chunk of every list exactly once."""
        out = fuse_ids(lists, anchor="q")
        assert sorted(out) == sorted({c for v in lists.values() for c in v})

    @given(lists=st.dictionaries(st.sampled_from(["q", "p1", "p2"]), ranked, max_size=3))
    def test_order_of_lists_does_not_matter(self, lists: dict[str, list[str]]) -> None:
        """The ranking depends on the lists, not on the order the mapping holds them in."""
        backwards = dict(reversed(list(lists.items())))
        assert fuse_ids(lists, anchor="q") == fuse_ids(backwards, anchor="q")


class TestFuseSearches:
    def test_hits_once_each_best_first(self) -> None:
        """Hits come back once per chunk, in the fused order."""
        out = fuse_searches({"q": [_hit("a"), _hit("b")], "p": [_hit("b")]}, anchor="q")
        assert [h.id for h in out] == ["b", "a"]
