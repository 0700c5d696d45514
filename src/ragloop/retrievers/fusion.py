"""The turn's final ranking: every search's list fused by rank, graded relevance as a signal.

A turn may search several queries: the question itself, decide's parts of it, rewrites and a second hop.
:func:`fuse_searches` merges their ranked lists with weighted reciprocal-rank fusion (RRF, Cormack et al.
2009): a chunk scores ``sum(weight / (k + rank))`` over the lists that hold it, then that score is multiplied
by its grade's factor (``relevant`` up, ``irrelevant`` down, ungraded and ``partial`` unchanged). A grade
moves a chunk, it never removes one.

**What one search had is never lost.** The candidate pool is the whole union of the lists (as deep as the
deepest search), and the ``protect`` best chunks of the *anchor* list (the question searched as it was
asked) are kept inside the first ``depth`` places of the fused order whatever the other lists and the
grades say: a turn's ranking contains every passage single-shot retrieval ranks in its top ``protect``.

``k=10`` (sharper than the usual 60: a part's or a hop's first hit should count nearly as much as the
question's own first hit), ``anchor_weight=1.5`` and the grade factors were chosen on the tuning halves of
HotpotQA dev200 and SciFact train (``benchmarks/bench_quality.py --half tuning``). ``lead=2`` (the question's
own first two *documents* lead the final ranking, after the feature rerank too, unless a document with evidence
of its own holds the second place: :func:`ragloop.retrievers.ranking.keep_lead_documents`) was chosen there with
``benchmarks/tune_ranking.py`` (``results/tune-ranking-*.json``): SciFact recall@2 0.670 → 0.695 (= its
single-shot), HotpotQA 0.665 → 0.650 (single-shot 0.530).

Pure and deterministic: ties break by chunk id; no sets are iterated in an order that depends on hashing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from attrs import field, frozen, validators

from ragloop.errors import ConfigError
from ragloop.state import Hit, Label

__all__ = ["FusionSettings", "anchor_query", "fuse_ids", "fuse_searches", "rejected"]


@frozen
class FusionSettings:
    """How the final ranking weighs lists and grades.

    Attributes:
        k: The RRF constant; larger values flatten the rank curve.
        anchor_weight: Weight of the anchor list (the question as asked).
        other_weight: Weight of every other list (parts, rewrites, hops).
        relevant_boost: Factor on a chunk graded ``relevant`` for some query.
        irrelevant_factor: Factor on a chunk graded ``irrelevant`` for every query that graded it.
        protect: The anchor's best chunks that always stay in the first ``depth`` places.
        lead: The anchor's first ``lead`` documents that hold the first ``lead`` document places of the final
            ranking, after the feature rerank too (:class:`~ragloop.retrievers.ranking.FusionRanker`): the
            question's own best document first; its next ones unless a document with evidence of its own (the
            first document of one of decide's parts or of a hop, or a page the first passage names) holds
            the place. What single-shot retrieval ranks in its top ``lead`` is not pushed out by a rewrite's
            or a feature's guess.
    """

    k: float = field(default=10.0, validator=validators.ge(0))
    anchor_weight: float = field(default=1.5, validator=validators.ge(0))
    other_weight: float = field(default=1.0, validator=validators.ge(0))
    relevant_boost: float = field(default=1.25, validator=validators.ge(0))
    irrelevant_factor: float = field(default=0.6, validator=validators.ge(0))
    protect: int = field(default=5, validator=validators.ge(0))
    lead: int = field(default=2, validator=validators.ge(0))


def anchor_query(question: str, decide_queries: Sequence[str], searched: Collection[str]) -> str | None:
    """The list to protect: the question itself when it was searched (beside decide's parts or rewording),
    else decide's only query (the question made standalone: pronouns resolved); ``None`` otherwise."""
    if question in searched:
        return question
    if len(decide_queries) == 1 and decide_queries[0] in searched:
        return decide_queries[0]
    return None


def rejected(labels: Sequence[Label]) -> bool:
    """Whether a chunk was graded and every grade called it ``irrelevant``."""
    return bool(labels) and all(label == "irrelevant" for label in labels)


def _label_factor(labels: Sequence[Label], settings: FusionSettings) -> float:
    if "relevant" in labels:
        return settings.relevant_boost
    if rejected(labels):
        return settings.irrelevant_factor
    return 1.0


def fuse_ids(
    lists: Mapping[str, Sequence[str]],
    *,
    anchor: str | None,
    grades: Mapping[str, Sequence[Label]] | None = None,
    depth: int = 10,
    settings: FusionSettings = FusionSettings(),
) -> list[str]:
    """The fused order of every id in ``lists`` (the id-level core of :func:`fuse_searches`).

    Args:
        lists: Query → its ranked ids, best first (an id repeated in one list counts at its best rank).
        anchor: The query whose list is protected (the question as asked); ``None`` or absent: none is.
        grades: Id → every label a grader gave it (any query).
        depth: The anchor's best ``settings.protect`` ids stay within the first ``depth`` places.
        settings: Weights, grade factors and the protected count.

    Returns:
        Every id of every list, best first; ties broken by id.
    """
    if depth < 0:
        raise ConfigError(f"the fusion depth must be >= 0, got {depth}")
    grades = grades or {}
    scores: dict[str, float] = {}
    for query in sorted(lists):
        weight = settings.anchor_weight if query == anchor else settings.other_weight
        seen: set[str] = set()
        for rank, cid in enumerate(lists[query], start=1):
            if cid in seen:
                continue
            seen.add(cid)
            scores[cid] = scores.get(cid, 0.0) + weight / (settings.k + rank)
    fused = sorted(scores, key=lambda c: (-scores[c] * _label_factor(grades.get(c, ()), settings), c))
    if anchor is None or anchor not in lists or settings.protect == 0:
        return fused
    protected = list(dict.fromkeys(lists[anchor]))[: settings.protect]
    head = fused[: max(depth, len(protected))]
    missing = [c for c in protected if c not in head]
    if not missing:
        return fused
    # Make room at the bottom of the head for the protected ids it lost, keeping everyone's relative order.
    keep = set(protected)
    droppable = [c for c in reversed(head) if c not in keep][: len(missing)]
    position = {c: i for i, c in enumerate(fused)}
    new_head = sorted([*(c for c in head if c not in droppable), *missing], key=position.__getitem__)
    taken = set(new_head)
    return new_head + [c for c in fused if c not in taken]


def fuse_searches(
    searches: Mapping[str, Sequence[Hit]],
    *,
    anchor: str | None,
    grades: Mapping[str, Sequence[Label]] | None = None,
    depth: int = 10,
    settings: FusionSettings = FusionSettings(),
) -> list[Hit]:
    """Every hit of every search, fused by rank into the turn's final ranking (see the module docstring).

    Args:
        searches: Query → the hits its search returned, best first.
        anchor: The question as asked (its list is protected); ``None`` when it was not searched.
        grades: Chunk id → every label a grader gave it.
        depth: Protected hits stay within the first ``depth`` places.
        settings: Weights, grade factors and the protected count.

    Returns:
        One hit per chunk id (the copy from the best-ranked list position), best first.
    """
    best: dict[str, tuple[int, str, Hit]] = {}
    for query in sorted(searches):
        for rank, hit in enumerate(searches[query]):
            current = best.get(hit.id)
            if current is None or (rank, query) < current[:2]:
                best[hit.id] = (rank, query, hit)
    order = fuse_ids(
        {q: [h.id for h in hits] for q, hits in searches.items()},
        anchor=anchor,
        grades=grades,
        depth=depth,
        settings=settings,
    )
    return [best[c][2] for c in order]
