"""The turn's one ranked list: the :class:`Ranker` seam and the default ranker behind it.

A turn searches several queries (the question, decide's parts, rewrites, a hop) and grades what they found.
A :class:`Ranker` turns those searches and grades (:class:`Candidates`) into one list, best first; the answer
node numbers and cites the graded passages **in that order** and orders nothing itself. The default is
:class:`FusionRanker`: every search's list fused by rank with the grades as a factor
(:func:`ragloop.retrievers.fusion.fuse_searches`, the question's own best protected), its head reordered by the
passage features of :func:`ragloop.retrievers.rerank.rerank`, then the question's own first two documents kept
in the first two places unless a document with evidence of its own takes the second (:func:`keep_lead_documents`:
the first document of a part's or a hop's search, or a page the first passage names). A ranker of your own is
one object with an async ``rank``::

    class Reversed:
        async def rank(self, candidates: Candidates) -> list[Hit]:
            return list(reversed(await FusionRanker().rank(candidates)))

    Turn(retriever, judges).ranker(Reversed())

A ranker that fails or overruns its time limit is replaced, for that turn, by the default ranking, and the
fault is recorded (the answer node does this: ``ragloop.nodes.answer``); cross-encoders sit behind the same seam
(:mod:`ragloop.retrievers.cross_encoder`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from attrs import field, frozen

from ragloop.retrievers.fusion import FusionSettings, anchor_query, fuse_searches, rejected
from ragloop.retrievers.rerank import RerankSettings, rerank
from ragloop.state import Hit, Label, TurnState

__all__ = ["Candidates", "FusionRanker", "Ranker", "candidates_of", "document_of", "keep_lead", "keep_lead_documents"]


def _frozen_lists(value: Mapping[str, Sequence[Hit]]) -> Mapping[str, tuple[Hit, ...]]:
    return {key: tuple(hits) for key, hits in value.items()}


def _frozen_labels(value: Mapping[str, Sequence[Label]]) -> Mapping[str, tuple[Label, ...]]:
    return {key: tuple(labels) for key, labels in value.items()}


def _queries(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _query_set(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


@frozen
class Candidates:
    """What a ranker ranks: every search the turn made and every grade it gave.

    Attributes:
        question: The user's question, as asked.
        searches: Query → the hits its search returned, best first (several queries may find one chunk).
        grades: Chunk id → every label a grader gave it (for any query); absent: never graded.
        anchor: The query whose list is the question's own search (what single-shot retrieval would have
            returned), or ``None`` when the question was not searched as such.
        parts: Decide's queries when it split the question into several (each part of the question asked on its
            own); empty for a question searched as one.
        hops: The queries a second hop searched (a follow-up for what the first passages named).
    """

    question: str
    searches: Mapping[str, tuple[Hit, ...]] = field(factory=dict, converter=_frozen_lists, hash=False)
    grades: Mapping[str, tuple[Label, ...]] = field(factory=dict, converter=_frozen_labels, hash=False)
    anchor: str | None = None
    parts: tuple[str, ...] = field(default=(), converter=_queries)
    hops: frozenset[str] = field(default=frozenset(), converter=_query_set)

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
    parts = tuple(q for q in decided if q != anchor) if len(decided) > 1 else ()
    hops = frozenset(q.text for q in state.queries.values() if q.hop)
    return Candidates(state.question, state.searches, grades, anchor, parts, hops)


def document_of(hit: Hit) -> str:
    """The document a hit belongs to: its chunk's ``doc_id``, else its source, else the chunk itself."""
    return hit.chunk.doc_id or hit.chunk.source or hit.id


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


def keep_lead_documents(
    ranked: Sequence[Hit],
    anchor: Sequence[Hit],
    n: int,
    *,
    may_lead: Callable[[Hit], bool] = lambda hit: False,
    first: bool = True,
) -> list[Hit]:
    """``ranked`` with the first ``n`` documents of ``anchor`` (:func:`document_of`) in its first ``n`` document
    places: the first one first (unless ``first`` is false), the others unless documents ``may_lead`` accepts
    hold those places.

    A document's place is its best-ranked hit's; a lead document is placed by the anchor's own hit of it (moved
    up to its best-ranked chunk's place when another chunk ranks higher). A lead document missing from the head
    takes the place of the lowest head document that is neither a lead document nor one ``may_lead`` accepts:
    its hit moves up to the end of the head, and the displaced document's hits in the head follow right after
    it (one place down). No other hit moves, and nothing is dropped.
    """
    out = list(ranked)
    ranked_ids = {h.id for h in out}
    own = _first_documents([h for h in anchor if h.id in ranked_ids], n)  # lead document → the anchor's hit of it
    lead = list(own)
    if not lead:
        return out
    for doc, hit in own.items():  # a lead document is placed by the anchor's own hit, not another chunk of it
        best = _places(out)[doc]
        if out[best].id != hit.id:
            out.insert(best, out.pop(next(i for i, h in enumerate(out) if h.id == hit.id)))
    places = _places(out)
    if first and places[lead[0]] != 0:  # the question's own best document is first whatever leads
        out.insert(0, out.pop(places[lead[0]]))
        places = _places(out)
    docs = list(places)  # in place order: a dict keeps the order documents were first seen
    head = docs[:n]
    fixed = 1 if first else 0
    missing = [d for d in lead[fixed:] if d not in head]
    droppable = [d for d in reversed(head[fixed:]) if d not in lead and not may_lead(out[places[d]])]
    taken, dropped = missing[: len(droppable)], set(droppable[: len(missing)])
    if not taken:
        return out
    end = places[docs[n]] if len(docs) > n else len(out)  # where the head's hits end
    moved = [out[places[d]] for d in taken]
    moved_ids = {h.id for h in moved}
    return [
        *(h for h in out[:end] if document_of(h) not in dropped),
        *moved,
        *(h for h in out[:end] if document_of(h) in dropped),
        *(h for h in out[end:] if h.id not in moved_ids),
    ]


def _first_documents(hits: Sequence[Hit], n: int) -> dict[str, Hit]:
    """The first ``n`` documents of ``hits``, each with its first hit there, in order."""
    firsts: dict[str, Hit] = {}
    for hit in hits:
        if len(firsts) == n:
            break
        firsts.setdefault(document_of(hit), hit)
    return firsts


def _places(hits: Sequence[Hit]) -> dict[str, int]:
    """Document → the position of its best-ranked hit, in place order."""
    places: dict[str, int] = {}
    for i, hit in enumerate(hits):
        places.setdefault(document_of(hit), i)
    return places


def _named_title(title: str) -> str:
    """A page title without its trailing disambiguation ("Gamer (film)" → "gamer"), lower-cased."""
    return re.sub(r"\s*\([^()]*\)\s*$", "", title).strip().lower()


def _has_evidence(candidates: Candidates, first: Hit | None) -> Callable[[Hit], bool]:
    """Whether a hit's document has evidence of its own to lead: it heads the search of one of decide's parts
    or of a second hop, or its page's title is named by ``first`` (the question's own best passage: a bridge
    entity) and is not in the question."""
    heads = {
        document_of(hits[0])
        for query, hits in candidates.searches.items()
        if hits and (query in candidates.hops or query in candidates.parts)
    }
    text = first.chunk.text.lower() if first is not None else ""
    asked = candidates.question.lower()

    def may_lead(hit: Hit) -> bool:
        if document_of(hit) in heads:
            return True
        name = _named_title(hit.chunk.title)
        return len(name) > 3 and name not in asked and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None

    return may_lead


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
        # The question's own first documents, less those every grader called irrelevant (its search guessed
        # wrong there): the rest keep their places, and the first is first only if it is the search's first.
        firsts = list(_first_documents(anchored, self.fusion.lead).values())
        leads = [h for h in firsts if not rejected(candidates.grades.get(h.id, ()))]
        head = bool(leads) and leads[0] is firsts[0]
        may_lead = _has_evidence(candidates, leads[0] if head else None)
        return keep_lead_documents(ranked, leads, self.fusion.lead, may_lead=may_lead, first=head)

    async def rank(self, candidates: Candidates) -> list[Hit]:
        """See :meth:`order`."""
        return self.order(candidates)
