"""The turn's one ranked list: the :class:`Ranker` seam and the default ranker behind it.

A turn searches several queries (the question, decide's parts, rewrites, a hop) and grades what they found.
A :class:`Ranker` turns those searches and grades (:class:`Candidates`) into one list, best first; the answer
node numbers and cites the graded passages **in that order** and orders nothing itself. The default is
:class:`FusionRanker`: every search's list fused by rank with the grades as a factor
(:func:`ragloop.retrievers.fusion.fuse_searches`, the question's own best protected), its head reordered by the
passage features of :func:`ragloop.retrievers.rerank.rerank`. A ranker of your own is one object with an async
``rank``::

    class Reversed:
        async def rank(self, candidates: Candidates) -> list[Hit]:
            return list(reversed(await FusionRanker().rank(candidates)))

    Turn(retriever, judges).ranker(Reversed())

A ranker that fails or overruns its time limit is replaced, for that turn, by the default ranking, and the
fault is recorded (the answer node does this: ``ragloop.nodes.answer``); cross-encoders sit behind the same seam
(:mod:`ragloop.retrievers.cross_encoder`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from attrs import field, frozen

from ragloop.retrievers.fusion import FusionSettings, anchor_query, fuse_searches
from ragloop.retrievers.rerank import RerankSettings, rerank
from ragloop.state import Hit, Label, TurnState

__all__ = ["Candidates", "FusionRanker", "Ranker", "candidates_of", "keep_lead"]


def _frozen_lists(value: Mapping[str, Sequence[Hit]]) -> Mapping[str, tuple[Hit, ...]]:
    return {key: tuple(hits) for key, hits in value.items()}


def _frozen_labels(value: Mapping[str, Sequence[Label]]) -> Mapping[str, tuple[Label, ...]]:
    return {key: tuple(labels) for key, labels in value.items()}


@frozen
class Candidates:
    """What a ranker ranks: every search the turn made and every grade it gave.

    Attributes:
        question: The user's question, as asked.
        searches: Query → the hits its search returned, best first (several queries may find one chunk).
        grades: Chunk id → every label a grader gave it (for any query); absent: never graded.
        anchor: The query whose list is the question's own search (what single-shot retrieval would have
            returned), or ``None`` when the question was not searched as such.
    """

    question: str
    searches: Mapping[str, tuple[Hit, ...]] = field(factory=dict, converter=_frozen_lists, hash=False)
    grades: Mapping[str, tuple[Label, ...]] = field(factory=dict, converter=_frozen_labels, hash=False)
    anchor: str | None = None

    def hits(self) -> list[Hit]:
        """Every distinct chunk found, once: the anchor's list first, then the other queries' in turn order."""
        anchor = [self.anchor] if self.anchor is not None and self.anchor in self.searches else []
        order = anchor + [q for q in self.searches if q != self.anchor]
        seen: dict[str, Hit] = {}
        for query in order:
            for hit in self.searches[query]:
                seen.setdefault(hit.id, hit)
        return list(seen.values())


def candidates_of(state: TurnState) -> Candidates:
    """The :class:`Candidates` of a turn: its recorded searches, its grades, the question's own list as anchor."""
    grades: dict[str, list[Label]] = {}
    for g in state.graded:
        grades.setdefault(g.hit.id, []).append(g.verdict.label)
    decided = state.decision.queries if state.decision is not None else ()
    anchor = anchor_query(state.question, decided, state.searches)
    return Candidates(state.question, state.searches, grades, anchor)


def keep_lead(ranked: Sequence[Hit], anchor: Sequence[str], n: int) -> list[Hit]:
    """``ranked`` with the first ``n`` distinct ids of ``anchor`` inside its first ``n`` places: those missing
    there take the last places of the head (the rest keep their relative order); nothing else moves."""
    lead = list(dict.fromkeys(anchor))[:n]
    head = [h.id for h in ranked[:n]]
    missing = [c for c in lead if c not in head]
    if not missing:
        return list(ranked)
    by_id = {h.id: h for h in ranked}
    kept = [c for c in head if c in lead] + [c for c in head if c not in lead][: n - len(lead)]
    position = {h.id: i for i, h in enumerate(ranked)}
    front = sorted({*kept, *(c for c in missing if c in by_id)}, key=position.__getitem__)
    placed = set(front)  # once, not once per hit
    return [by_id[c] for c in front] + [h for h in ranked if h.id not in placed]


@runtime_checkable
class Ranker(Protocol):
    """Orders the turn's passages: the answer numbers and cites the graded ones in this order.

    ``rank`` may drop hits (they are not cited) and may return hits in any order; hits it invents (ids no search
    found) are not cited either, since only graded passages reach the answer. Raise to fail: the turn then
    uses the default ranking and records the fault. It runs once per turn, inside the turn's deadline.
    """

    async def rank(self, candidates: Candidates) -> Sequence[Hit]:
        """The turn's passages, best first."""
        ...


@frozen
class FusionRanker:
    """The default ranker: rank fusion of every search with the grades as a factor, then the feature rerank.

    Attributes:
        fusion: Weights and grade factors of the fusion (:class:`~ragloop.retrievers.fusion.FusionSettings`).
        features: The feature rerank of the fused head (:class:`~ragloop.retrievers.rerank.RerankSettings`;
            zero weights keep the fused order).
    """

    fusion: FusionSettings = field(factory=FusionSettings)
    features: RerankSettings = field(factory=RerankSettings)

    def order(self, candidates: Candidates) -> list[Hit]:
        """The ranking, computed in the calling thread (pure, fast, no I/O: what a deadline's salvage uses)."""
        fused = fuse_searches(
            candidates.searches, anchor=candidates.anchor, grades=candidates.grades, settings=self.fusion
        )
        anchored = candidates.searches.get(candidates.anchor, ()) if candidates.anchor is not None else ()
        protected = [h.id for h in anchored[: self.fusion.protect]]
        ranked = rerank(candidates.question, fused, protected=protected, settings=self.features)
        return keep_lead(ranked, [h.id for h in anchored], self.fusion.lead)

    async def rank(self, candidates: Candidates) -> list[Hit]:
        """See :meth:`order`."""
        return self.order(candidates)
