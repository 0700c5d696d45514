"""answer through the Ranker seam: its order is the order the reply cites; a failing or late ranker fails open."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.nodes.answer import Answer, build_blocks, question_cosines
from ragloop.retrievers.ranking import Candidates, FusionRanker
from ragloop.state import Chunk, Decision, Graded, Hit, QueryState, TurnState, Verdict
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit
from ragloop.turn import Judges, Turn, TurnSettings

pytestmark = pytest.mark.anyio

PAGES = ("alpha.md", "bravo.md", "charlie.md", "delta.md")


def _hits(query: str) -> list[Hit]:
    return [make_hit(f"{query}: passage of {p}", source=p, chunk_id=p, confidence=0.3) for p in PAGES]


def _turn(ranker: Any = None, **settings: Any) -> Turn:
    judges = Judges(decider=FakeDecider(), grader=FakeGrader(), rewriter=FakeRewriter(), answerer=FakeAnswerer())
    turn = Turn(FakeRetriever(_hits), judges, settings=TurnSettings(**settings))
    return turn.ranker(ranker) if ranker is not None else turn


class Reversed:
    """The default ranking, reversed."""

    async def rank(self, candidates: Candidates) -> list[Hit]:
        return list(reversed(await FusionRanker().rank(candidates)))


class Fixed:
    """Ranks by a fixed order of chunk ids (the rest left out)."""

    def __init__(self, order: Sequence[str]) -> None:
        self.order = list(order)

    async def rank(self, candidates: Candidates) -> list[Hit]:
        by_id = {h.id: h for h in candidates.hits()}
        return [by_id[c] for c in self.order if c in by_id]


class TestRankerOrderIsCited:
    async def test_reversing_the_ranking_reverses_the_citations(self) -> None:
        """A ranker that reverses the default order reverses the blocks and the reply's citations."""
        default = await ChatRAG(_turn()).ask("which page?")
        reversed_ = await ChatRAG(_turn(Reversed())).ask("which page?")
        first = [c.source for c in default.citations]
        assert len(first) == len(PAGES)
        assert [c.source for c in reversed_.citations] == first[::-1]
        assert [b.source for b in reversed_.blocks] == [b.source for b in default.blocks][::-1]

    @settings(max_examples=25, deadline=None)
    @given(order=st.permutations(PAGES), keep=st.integers(min_value=1, max_value=len(PAGES)))
    def test_any_order_is_the_cited_order(self, order: list[str], keep: int) -> None:
        """Whatever order a ranker returns (and whatever it leaves out), the blocks and citations follow it."""
        reply = anyio.run(ChatRAG(_turn(Fixed(order[:keep]))).ask, "which page?")
        assert [c.source for c in reply.citations] == list(order[:keep])

    async def test_a_ranker_given_to_the_constructors(self) -> None:
        """Turn.from_retriever(…, ranker=…) is the same seam."""
        texts = [h.text for h in _hits("x")]
        turn = Turn.from_retriever(FakeRetriever(_hits), texts, ranker=Fixed(["delta.md", "alpha.md"]))
        built = turn.build()
        assert isinstance(built.nodes["answer"], Answer)
        assert isinstance(built.nodes["answer"].ranker, Fixed)


class Failing:
    async def rank(self, candidates: Candidates) -> list[Hit]:
        raise RuntimeError("reranker down")


class Slow:
    async def rank(self, candidates: Candidates) -> list[Hit]:
        await anyio.sleep(30)
        raise AssertionError("never")


class Junk:
    async def rank(self, candidates: Candidates) -> Any:
        return ["alpha.md"]


class Generated:
    """Ranks by yielding (an iterator, not a list)."""

    async def rank(self, candidates: Candidates) -> Any:
        return (h for h in reversed(candidates.hits()))


class TestRankerFailsOpen:
    async def test_an_iterator_is_read_once(self) -> None:
        """A ranker that returns a generator: its order is used (read once), nothing is lost."""
        reply = await ChatRAG(_turn(Generated())).ask("which page?")
        assert [c.source for c in reply.citations] == list(PAGES)[::-1] and not reply.record.errors

    @pytest.mark.parametrize(
        ("ranker", "fault"),
        [
            (Failing(), "RuntimeError: reranker down"),
            (Slow(), "TimeoutError: no ranking within 0.05 s"),
            (Junk(), "TypeError: rank\\(\\) must return a sequence of Hit"),
        ],
    )
    async def test_the_default_ranking_is_used_and_the_fault_recorded(self, ranker: Any, fault: str) -> None:
        """A ranker that raises, overruns rank_timeout_s or returns something else: the reply is written in the
        default order and the fault is in the turn's errors."""
        default = await ChatRAG(_turn()).ask("which page?")
        with anyio.fail_after(10):
            reply = await ChatRAG(_turn(ranker, rank_timeout_s=0.05)).ask("which page?")
        assert [c.source for c in reply.citations] == [c.source for c in default.citations]
        errors = " | ".join(reply.record.errors)
        assert f"answer: ranker {type(ranker).__name__}" in errors
        assert re.search(fault, errors), errors

    async def test_the_time_limit_is_capped_by_the_turn_deadline(self) -> None:
        """A slow ranker gets at most half of what is left of the turn, however long rank_timeout_s is, so the
        reply still comes in time (and in the default order)."""
        started = anyio.current_time()
        reply = await ChatRAG(_turn(Slow(), rank_timeout_s=60.0, deadline_s=2.0)).ask("which page?")
        assert anyio.current_time() - started < 30  # far below the ranker's 30 s sleep and its 60 s limit
        assert reply.citations and "no ranking within" in " ".join(reply.record.errors)

    def test_a_non_ranker_is_refused_by_the_builder(self) -> None:
        """Turn.ranker(obj) with no rank() is one line saying what a ranker is."""
        from ragloop.errors import ConfigError

        with pytest.raises(ConfigError, match=r"object, which has no rank\(\) method.*async def rank"):
            _turn().ranker(object())  # type: ignore[arg-type]


class TestStateRanked:
    async def test_the_node_writes_the_ranking_and_the_blocks_follow_it(self) -> None:
        """answer writes state.ranked (the ranker's order) and numbers the kept hits in it, live records first."""
        state = TurnState(question="q")
        state.decision = Decision(queries=("q",))
        hits = [make_hit(f"t{i}", chunk_id=f"c{i}") for i in range(3)]
        state.searches = {"q": hits}
        state.graded = [Graded("q", h, Verdict("relevant")) for h in hits[:2]]
        node = Answer(FakeAnswerer(), max_blocks=8, rank_timeout_s=10.0, ranker=Fixed(["c2", "c1", "c0"]))
        await node(state)
        assert [h.id for h in state.ranked or ()] == ["c2", "c1", "c0"]
        assert [b.chunk_id for b in state.blocks] == ["c1", "c0"]  # c2 was never graded: not handed on

    async def test_salvage_before_the_ranker_answered_uses_the_default(self) -> None:
        """Cut before anything was chosen (the ranker never answered): salvage ranks with the default, no I/O."""
        state = TurnState(question="q")
        state.decision = Decision(queries=("q",))
        hits = [make_hit(f"t{i}", chunk_id=f"c{i}") for i in range(2)]
        state.searches = {"q": hits}
        state.graded = [Graded("q", h, Verdict("relevant")) for h in hits]
        node = Answer(FakeAnswerer(), max_blocks=8, rank_timeout_s=10.0, ranker=Slow())
        await node.salvage(state)
        assert [h.id for h in state.ranked or ()] == ["c0", "c1"]


def _dense(chunk_id: str, cosine: float) -> Hit:
    return Hit(Chunk(chunk_id, f"text of {chunk_id}", source=f"{chunk_id}.md"), 1.0, 0.5, scores={"dense": cosine})


class TestQuestionCosines:
    def test_only_the_questions_own_searches_count(self) -> None:
        """A block's cosine is what decide's own query gave it; a rewrite's or a hop's search (another text,
        often one that drifted) is not counted, and a chunk only they found has none."""
        state = TurnState(question="q")
        state.queries = {
            "q": QueryState("q", "q"),
            "q again": QueryState("q again", "q", attempt=1),
            "bridge": QueryState("bridge", "q", hop=True),
        }
        state.searches = {
            "q": [_dense("a", 0.31), _dense("b", 0.2)],
            "q again": [_dense("a", 0.9), _dense("c", 0.8)],
            "bridge": [_dense("b", 0.7)],
        }
        assert question_cosines(state) == {"a": 0.31, "b": 0.2}
        state.graded = [Graded("q", h, Verdict("relevant")) for h in state.searches["q again"]]
        blocks = {b.chunk_id: b.cosine for b in build_blocks(state, 8)}
        assert blocks == {"a": 0.31, "c": None}
