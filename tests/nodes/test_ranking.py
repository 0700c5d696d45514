"""The turn's final ranking: retrieve records every search (and the question's own), answer fuses them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.nodes.answer import build_blocks, ranked_hits
from ragloop.state import Decision, Graded, Message, PageContext, Verdict
from ragloop.testing import FakeRetriever, make_hit
from tests.strategies import turn_node, with_queries

pytestmark = pytest.mark.anyio

QUESTION = "Who is older, Annie Morton or Terry Richardson?"


def _lists(question_hits: list[str], parts: dict[str, list[str]]) -> FakeRetriever:
    table = {QUESTION: [make_hit(f"text {c}", chunk_id=c, score=1.0 - i / 100) for i, c in enumerate(question_hits)]}
    for q, ids in parts.items():
        table[q] = [make_hit(f"text {c}", chunk_id=c, score=1.0 - i / 100) for i, c in enumerate(ids)]
    return FakeRetriever(table)


class TestAnchorSearch:
    async def test_split_question_is_searched_as_asked_too(self) -> None:
        """When decide split the question, retrieve also searches the question itself and records every list."""
        retriever = _lists(["q1", "q2"], {"Annie Morton": ["a1"], "Terry Richardson": ["t1"]})
        state = with_queries("Annie Morton", "Terry Richardson", question=QUESTION)
        await turn_node("retrieve", retriever=retriever)(state)
        assert sorted(retriever.calls) == sorted([QUESTION, "Annie Morton", "Terry Richardson"])
        assert [h.id for h in state.searches[QUESTION]] == ["q1", "q2"]
        assert QUESTION not in state.queries  # never graded, never short

    async def test_follow_up_is_not_searched_as_asked(self) -> None:
        """With a conversation (or a page), decide's resolved query is the anchor: "it" is not searched."""
        retriever = _lists([], {"How do I rotate an API key": ["k1"]})
        state = with_queries("How do I rotate an API key", question="How do I rotate it?")
        state.history = (Message("user", "Tell me about API keys"),)
        await turn_node("retrieve", retriever=retriever)(state)
        assert retriever.calls == ["How do I rotate an API key"]
        state = with_queries("How do I rotate an API key", question="How do I rotate this page?")
        state.page = PageContext(title="API keys")
        await turn_node("retrieve", retriever=_lists([], {}))(state)
        assert list(state.searches) == ["How do I rotate an API key"]

    async def test_same_question_is_searched_once(self) -> None:
        """A question decide left as it was (punctuation aside) is searched once."""
        retriever = _lists([], {"How do I rotate an API key": ["k1"]})
        state = with_queries("How do I rotate an API key", question="How do I rotate an API key?")
        await turn_node("retrieve", retriever=retriever)(state)
        assert retriever.calls == ["How do I rotate an API key"]


class TestFinalRanking:
    @settings(max_examples=60, deadline=None)
    @given(
        anchor=st.lists(st.sampled_from([f"c{i}" for i in range(25)]), unique=True, max_size=12),
        a=st.lists(st.sampled_from([f"c{i}" for i in range(25)]), unique=True, max_size=12),
        b=st.lists(st.sampled_from([f"c{i}" for i in range(25)]), unique=True, max_size=12),
        bad=st.sets(st.sampled_from([f"c{i}" for i in range(25)])),
    )
    def test_turn_ranking_keeps_single_shot_top5(
        self, anchor: list[str], a: list[str], b: list[str], bad: set[str]
    ) -> None:
        """Whatever the parts found and the grader said, the turn's ranking holds the question's own top 5 in
        its first 10 places (the question was searched beside its parts)."""
        state = with_queries("Annie Morton", "Terry Richardson", question=QUESTION)
        state.decision = Decision(queries=("Annie Morton", "Terry Richardson"))
        hit = {c: make_hit(f"text {c}", chunk_id=c) for c in {*anchor, *a, *b}}
        state.searches = {QUESTION: [hit[c] for c in anchor], "Annie Morton": [hit[c] for c in a]}
        state.searches["Terry Richardson"] = [hit[c] for c in b]
        state.graded = [Graded("Annie Morton", hit[c], Verdict("irrelevant")) for c in sorted(bad & set(hit))]
        top10 = [h.id for h in ranked_hits(state)][:10]
        assert set(anchor[:5]) <= set(top10)

    def test_blocks_follow_the_ranking_and_skip_ungraded_and_irrelevant(self) -> None:
        """Blocks are the graded-kept chunks in fused order: each part's first hit before anyone's second."""
        state = with_queries("Annie Morton", "Terry Richardson", question=QUESTION)
        state.decision = Decision(queries=("Annie Morton", "Terry Richardson"))
        hits = {c: make_hit(f"text {c}", chunk_id=c) for c in ("a1", "a2", "t1", "t2", "x")}
        state.searches = {
            QUESTION: [hits["x"], hits["t1"]],
            "Annie Morton": [hits["a1"], hits["a2"]],
            "Terry Richardson": [hits["t1"], hits["t2"]],
        }
        state.graded = [
            Graded("Annie Morton", hits["a1"], Verdict("relevant")),
            Graded("Annie Morton", hits["a2"], Verdict("irrelevant")),
            Graded("Terry Richardson", hits["t1"], Verdict("relevant")),
            Graded("Terry Richardson", hits["t2"], Verdict("partial")),
        ]
        blocks = build_blocks(state, max_blocks=8)
        assert [b.chunk_id for b in blocks] == ["t1", "a1", "t2"]
        assert [b.query for b in blocks] == ["Terry Richardson", "Annie Morton", "Terry Richardson"]
