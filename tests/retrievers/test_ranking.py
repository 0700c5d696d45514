"""Tests for ragloop.retrievers.ranking: the Ranker seam, Candidates and the default FusionRanker."""

from __future__ import annotations

import anyio
import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.retrievers.fusion import FusionSettings, fuse_searches
from ragloop.retrievers.ranking import (
    Candidates,
    FusionRanker,
    Ranker,
    candidates_of,
    document_of,
    keep_lead,
    keep_lead_documents,
)
from ragloop.retrievers.rerank import RerankSettings, rerank
from ragloop.state import Chunk, Decision, Graded, Hit, Verdict
from tests.strategies import with_queries

ids = st.sampled_from([f"c{i}" for i in range(30)])
lists = st.lists(ids, unique=True, max_size=15)


def _hit(cid: str, title: str = "", *, doc: str = "", text: str = "") -> Hit:
    chunk = Chunk(id=cid, text=text or f"text of {cid}", title=title or cid, doc_id=doc)
    return Hit(chunk=chunk, score=1.0)


class TestCandidates:
    def test_hits_lists_every_chunk_once_anchor_first(self) -> None:
        """hits(): the anchor's list first, then the others in turn order, each chunk once."""
        c = Candidates("q", {"part": [_hit("b"), _hit("c")], "q": [_hit("a"), _hit("b")]}, anchor="q")
        assert [h.id for h in c.hits()] == ["a", "b", "c"]

    def test_values_are_frozen_copies(self) -> None:
        """The lists are copied into tuples: a ranker cannot change the turn's recorded searches through them."""
        searched = [_hit("a")]
        c = Candidates("q", {"q": searched}, {"a": ["relevant"]})
        searched.append(_hit("b"))
        assert c.searches["q"] == (_hit("a"),) and c.grades["a"] == ("relevant",)

    def test_of_a_state(self) -> None:
        """candidates_of: the recorded searches, every grade per chunk, the question's own list as anchor."""
        state = with_queries("Annie Morton", question="Who is Annie Morton?")
        state.decision = Decision(queries=("Annie Morton",))
        state.searches = {"Who is Annie Morton?": [_hit("a")], "Annie Morton": [_hit("a"), _hit("b")]}
        state.graded = [Graded("Annie Morton", _hit("a"), Verdict("relevant"))]
        c = candidates_of(state)
        assert c.anchor == "Who is Annie Morton?" and c.grades == {"a": ("relevant",)}
        assert set(c.searches) == set(state.searches)


class TestFusionRanker:
    def test_is_a_ranker(self) -> None:
        """The default satisfies the seam it sits behind."""
        assert isinstance(FusionRanker(), Ranker)

    @settings(max_examples=60, deadline=None)
    @given(anchor=lists, a=lists, b=lists, bad=st.sets(ids))
    def test_order_is_fusion_then_feature_rerank(
        self, anchor: list[str], a: list[str], b: list[str], bad: set[str]
    ) -> None:
        """The default ranking is fuse_searches followed by rerank with the anchor's top protected (what the
        answer node computed before the seam), then the anchor's first two documents kept in the first two
        places (lead=2; the other lists are rewrites here, with no evidence of their own to lead; a passage graded
        irrelevant leads nothing), and a permutation of every chunk found."""
        hit = {c: _hit(c) for c in {*anchor, *a, *b}}
        searches = {"q": [hit[c] for c in anchor], "p1": [hit[c] for c in a], "p2": [hit[c] for c in b]}
        grades = {c: ["irrelevant"] for c in bad & set(hit)}
        candidates = Candidates("q", searches, grades, anchor="q")  # type: ignore[arg-type]
        fused = fuse_searches(searches, anchor="q", grades=grades)  # type: ignore[arg-type]
        leads = [hit[c] for c in anchor[:2] if c not in bad]  # a passage graded irrelevant is no lead
        first = bool(leads) and leads[0].id == anchor[0]  # and the first leads only if it is the search's first
        expected = keep_lead_documents(rerank("q", fused, protected=anchor[:5]), leads, 2, first=first)
        out = FusionRanker().order(candidates)
        assert [h.id for h in out] == [h.id for h in expected]
        assert sorted(h.id for h in out) == sorted(hit)
        assert [h.id for h in anyio.run(FusionRanker().rank, candidates)] == [h.id for h in out]

    def test_settings_reach_the_ranking(self) -> None:
        """The fusion weights and the feature weights are the ranker's: zero feature weights keep the fused order,
        a heavy title weight moves the page named in the question to the top."""
        searches = {"When was Annie Morton born?": [_hit("x", "Other"), _hit("y", "Annie Morton")]}
        c = Candidates("When was Annie Morton born?", searches, anchor=None)
        off = RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0)
        assert [h.id for h in FusionRanker(features=off).order(c)] == ["x", "y"]
        assert [h.id for h in FusionRanker(FusionSettings(), RerankSettings(title_weight=5)).order(c)] == ["y", "x"]

    def test_no_searches_no_hits(self) -> None:
        """Nothing searched: an empty ranking."""
        assert FusionRanker().order(Candidates("q")) == []


@pytest.mark.anyio
class TestRankerProtocol:
    async def test_a_plain_class_with_rank_is_a_ranker(self) -> None:
        """Nothing to inherit: an object with an async rank is a Ranker; one without is not."""

        class Reversed:
            async def rank(self, candidates: Candidates) -> list[Hit]:
                return list(reversed(await FusionRanker().rank(candidates)))

        assert isinstance(Reversed(), Ranker) and not isinstance(object(), Ranker)
        c = Candidates("q", {"q": [_hit("a"), _hit("b")]}, anchor="q")
        assert [h.id for h in await Reversed().rank(c)] == ["b", "a"]


class TestKeepLead:
    @settings(max_examples=100, deadline=None)
    @given(ranked=st.lists(ids, unique=True, min_size=1, max_size=20), anchor=lists, n=st.integers(0, 4))
    def test_the_anchors_first_stay_first_and_nothing_else_moves(
        self, ranked: list[str], anchor: list[str], n: int
    ) -> None:
        """The anchor's first n ids (those ranked) end inside the first n places; the output is a permutation, and
        every other id keeps its order relative to the others."""
        anchor = [c for c in anchor if c in ranked]
        out = [h.id for h in keep_lead([_hit(c) for c in ranked], anchor, n)]
        assert sorted(out) == sorted(ranked)
        assert set(anchor[:n]) <= set(out[:n])
        rest = [c for c in out if c not in anchor[:n]]
        assert rest == [c for c in ranked if c not in anchor[:n]]

    def test_in_the_default_ranker(self) -> None:
        """The default: the question's own first hit leads even when the parts all agree on another; lead=0 lets
        the fusion put the parts' favourite first."""
        searches = {"q": [_hit("a"), _hit("b")], "p1": [_hit("b")], "p2": [_hit("b")]}
        c = Candidates("q", searches, anchor="q", parts=("p1", "p2"))
        assert [h.id for h in FusionRanker(FusionSettings(lead=0)).order(c)] == ["b", "a"]
        assert [h.id for h in FusionRanker().order(c)] == ["a", "b"]


def _docs(hits: list[Hit]) -> list[str]:
    return list(dict.fromkeys(document_of(h) for h in hits))


class TestLeadDocuments:
    """lead=2 by documents: the question's own first two documents lead the final ranking unless a document with
    evidence of its own (a part's or a hop's first document, a page the first passage names) holds the place."""

    # SciFact-like: the question's own search has the answer second; a rewrite agrees on another paper and the
    # features like it; without evidence of its own, it does not take the answer's place.
    anchor = (_hit("a1", "Paper A", doc="A"), _hit("b1", "Paper B", doc="B"), _hit("x1", "X", doc="X"))
    rewrite = (_hit("x1", "X", doc="X"), _hit("a1", "Paper A", doc="A"))

    def test_a_rewrites_favourite_does_not_push_out_the_questions_second_document(self) -> None:
        """Fails on lead=1 by chunk: the rewrite's first document took the second place."""
        c = Candidates("claim", {"claim": self.anchor, "claim reworded": self.rewrite}, anchor="claim")
        assert FusionRanker(FusionSettings(lead=1)).order(c)[1].id == "x1"  # what the turn did before
        assert _docs(FusionRanker().order(c))[:2] == ["A", "B"]

    def test_a_hops_first_document_may_take_the_second_place(self) -> None:
        """The same lists, the second one searched by a hop: its first document has evidence of its own."""
        c = Candidates("claim", {"claim": self.anchor, "follow up": self.rewrite}, anchor="claim", hops={"follow up"})
        assert _docs(FusionRanker().order(c))[:2] == ["A", "X"]

    def test_a_parts_first_document_may_take_the_second_place(self) -> None:
        """A question decide split into parts: a part's first document may lead beside the question's own."""
        searches = {"q": self.anchor, "part one": self.rewrite, "part two": self.anchor[:1]}
        c = Candidates("q", searches, anchor="q", parts=("part one", "part two"))
        assert _docs(FusionRanker().order(c))[:2] == ["A", "X"]

    def test_a_page_the_first_passage_names_may_take_the_second_place(self) -> None:
        """The bridge of a two-hop question: the first passage names the page ("Gamer" for "Gamer (film)")."""
        first = _hit("a1", "Michael C. Hall", doc="A", text="Hall starred in Gamer, a 2009 film.")
        named = _hit("g1", "Gamer (film)", doc="G", text="Gamer is a 2009 science fiction film.")
        searches = {"q": [first, _hit("b1", "Dexter", doc="B"), named], "q2": [named, first]}
        c = Candidates("Who directed the 2009 film starring Hall?", searches, anchor="q")
        assert _docs(FusionRanker().order(c))[:2] == ["A", "G"]
        unnamed = attrs_evolve_text(first, "Hall is an American actor.")
        c2 = Candidates(c.question, {"q": [unnamed, *searches["q"][1:]], "q2": [named, unnamed]}, anchor="q")
        assert _docs(FusionRanker().order(c2))[:2] == ["A", "B"]

    def test_hostile_titles_are_text_not_patterns(self) -> None:
        """A huge title full of regex syntax and a 1 MB first passage: the named-page rule matches text literally
        (no pattern error, no false match) and the ranking keeps the question's own two documents."""
        title = "(.*)+[" * 20_000 + " (film)"
        first = _hit("a1", "A", doc="A", text="x " * 500_000)
        odd = _hit("z1", title, doc="Z")
        c = Candidates("q", {"q": [first, _hit("b1", doc="B")], "r": [odd, first]}, anchor="q")
        assert _docs(FusionRanker().order(c))[:2] == ["A", "B"]

    def test_the_questions_first_document_leads_whatever_the_evidence(self) -> None:
        """A hop's first document outranking everything still comes second: the first place is the question's."""
        hop = [_hit("x1", "X", doc="X"), _hit("y1", "Y", doc="Y")]
        searches = {"q": [_hit("a1", "A", doc="A")], "h": hop, "h2": hop}
        c = Candidates("q", searches, anchor="q", hops={"h", "h2"})
        assert _docs(FusionRanker().order(c))[0] == "A"

    def test_a_lead_graded_irrelevant_leads_nothing(self) -> None:
        """The question's own second paper, graded irrelevant by every grader, does not push out the rewrite's."""
        c = Candidates("claim", {"claim": self.anchor, "r": self.rewrite}, {"b1": ["irrelevant"]}, anchor="claim")
        assert _docs(FusionRanker().order(c))[:2] == ["A", "X"]

    def test_a_first_graded_irrelevant_forces_nothing_first(self) -> None:
        """The sample KB's "What does error E1002 mean?": the question's own first page graded irrelevant, its
        second is kept in the head but not forced above the rewrite's relevant page."""
        anchor = (_hit("s1", doc="S"), _hit("e1", doc="E"), _hit("t1", doc="T"))
        c = Candidates("q", {"q": anchor, "r": (_hit("x1", doc="X"),)}, {"s1": ["irrelevant"]}, anchor="q")
        out = _docs(FusionRanker(features=RerankSettings(depth=0)).order(c))
        assert "E" in out[:2] and out[0] != "S"

    def test_the_displaced_document_moves_down_one_place_only(self) -> None:
        """The sample KB's DPA question: the page the rewrite found (two chunks) gives its place to the question's
        own second document and sits right after it, above everything else, its chunks in their order."""
        ranked = [_hit("g1", doc="G"), _hit("d1", doc="D"), _hit("d2", doc="D"), _hit("r1", doc="R")]
        ranked += [_hit("p1", doc="P"), _hit("s1", doc="S")]
        out = keep_lead_documents(ranked, [_hit("g1", doc="G"), _hit("s1", doc="S")], 2)
        assert [h.id for h in out] == ["g1", "s1", "d1", "d2", "r1", "p1"]

    def test_chunks_of_one_document_count_once(self) -> None:
        """Two chunks of the question's first paper do not fill both lead places: its second paper is second."""
        anchor = [_hit("a1", doc="A"), _hit("a2", doc="A"), _hit("b1", doc="B")]
        c = Candidates("q", {"q": anchor, "r": [_hit("x1", doc="X"), _hit("a2", doc="A")]}, anchor="q")
        assert _docs(FusionRanker().order(c))[:2] == ["A", "B"]

    @settings(max_examples=150, deadline=None)
    @given(
        ranked=st.lists(ids, unique=True, min_size=1, max_size=20),
        anchor=lists,
        n=st.integers(0, 4),
        docs=st.dictionaries(ids, st.sampled_from("ABCDEFG")),
        leaders=st.sets(st.sampled_from("ABCDEFG")),
    )
    def test_lead_documents_property(
        self, ranked: list[str], anchor: list[str], n: int, docs: dict[str, str], leaders: set[str]
    ) -> None:
        """A permutation; the anchor's first document first; each of its first n documents inside the first n
        document places unless every place it could take is held by a lead document or one that may lead; only
        the hits of lead documents and of documents moved out of the head move."""
        hit = {c: _hit(c, doc=docs.get(c, "")) for c in ranked}
        anchor = [c for c in anchor if c in hit]
        out = keep_lead_documents(
            [hit[c] for c in ranked], [hit[c] for c in anchor], n, may_lead=lambda h: document_of(h) in leaders
        )
        assert sorted(h.id for h in out) == sorted(ranked)
        lead = _docs([hit[c] for c in anchor])[:n]
        got = _docs(out)
        if lead:
            assert got[0] == lead[0]
        for d in lead[1:]:
            if d not in got[:n]:
                assert all(x in lead or x in leaders for x in got[1:n])
        moved = {*lead, *(set(_docs([hit[c] for c in ranked])[:n]) - set(got[:n]))}
        still = [c for c in ranked if document_of(hit[c]) not in moved]
        assert [h.id for h in out if document_of(h) not in moved] == still

    def test_of_a_state_parts_and_hops(self) -> None:
        """candidates_of: decide's queries are parts when there are several; a hop's queries are hops."""
        state = with_queries("Who is Annie Morton?", "Annie Morton model", question="Who is Annie Morton?")
        state.decision = Decision(queries=("Who is Annie Morton?", "Annie Morton model"))
        state.searches = {"Who is Annie Morton?": [_hit("a")], "Annie Morton model": [_hit("b")]}
        c = candidates_of(state)
        assert c.anchor == "Who is Annie Morton?" and c.parts == ("Annie Morton model",) and c.hops == frozenset()
        state.queries["Annie Morton model"] = attrs.evolve(state.queries["Annie Morton model"], hop=True)
        assert candidates_of(state).hops == {"Annie Morton model"}


def attrs_evolve_text(hit: Hit, text: str) -> Hit:
    return attrs.evolve(hit, chunk=attrs.evolve(hit.chunk, text=text))
