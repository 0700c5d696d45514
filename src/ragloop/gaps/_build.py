"""From logged turns to a :class:`~ragloop.gaps.GapReport`: select, group, explain, rank. Pure and deterministic."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt
from attrs import define, field

from ragloop.gaps._cluster import (
    ATTACH_FLOOR,
    ATTACH_MARGIN,
    DENSE_WEIGHT,
    NEIGHBOUR_WEIGHT,
    NEIGHBOURS,
    cluster,
    combine,
    lexical_vectors,
    neighbourhood_vectors,
    with_neighbourhood,
)
from ragloop.gaps._report import CAUSES, Cause, GapReport, NearPage, StalePage, Topic
from ragloop.gaps._topics import MAX_QUESTIONS, MODEL_SHARE, ModelTopics, topic_vectors
from ragloop.text.terms import stem
from ragloop.turnlog import Conflict, LoggedTurn, TurnRow

__all__ = ["DEFAULT_THRESHOLD", "DENSE_THRESHOLD", "build_report", "turn_cause"]

#: Average cosine at which groups of questions merge, on term vectors alone and with embeddings joined; chosen on
#: the development topics of ``benchmarks/bench_gaps.py`` (the quality figures come from its held-out topics).
DEFAULT_THRESHOLD = 0.2
#: The merge threshold when question embeddings are joined to the term vectors: chosen with ``DENSE_WEIGHT`` on
#: heldout-1 and heldout-2 of ``benchmarks/bench_gap_topics.py`` (no planted topic mixed from 0.3 to 0.4), the
#: end-to-end scenario of ``tests/gaps`` (at 0.35 its answered, rated-down webhook question joined a planted topic;
#: 0.4 keeps it apart) and the development topics of ``benchmarks/bench_gaps.py`` (their best F1 at 0.4); reported
#: on heldout-3.
DENSE_THRESHOLD = 0.4

#: Question words the stopword list keeps (they can matter to a search) but that never name a topic.
_FILLER = frozenset(stem(w) for w in ("many", "much", "long", "often", "possible"))

Embed = Callable[[Sequence[str]], npt.NDArray[np.float32]]
#: A configured model sorting questions into topics, as a blocking call (``ragloop.gaps.sort_topics``).
SortTopics = Callable[[Sequence[str]], ModelTopics]


def turn_cause(turn: LoggedTurn) -> Cause:
    """Why one turn counts as a gap, most specific reason first (see :data:`~ragloop.gaps.CAUSES`)."""
    row = turn.row
    if row.conflicts:
        return "contradicting"
    if row.outcome == "none" and not row.abstained:
        return "no_passage" if set(row.unfound) & set(row.terms) or not row.hits else "irrelevant"
    if row.outcome in ("none", "partial"):  # an abstention: pages on the subject that do not cover this part of it
        return "partial"
    return "stale" if row.stale else "rated_down"


def is_gap(turn: LoggedTurn) -> bool:
    """A turn that ended ``none`` or ``partial``, or whose reply was rated down; never one that found nothing only
    because every search it made failed (an outage of the store, which a server refuses with a 503: not a page the
    knowledge base lacks)."""
    row = turn.row
    if row.outcome == "none" and row.queries and all(q.failed for q in row.queries):
        return False
    return row.outcome in ("none", "partial") or turn.rating == "down"


@define
class _Item:
    """Identical questions, as one item to cluster."""

    key: str
    text: str
    stems: list[str]
    turns: list[LoggedTurn] = field(factory=list)
    vector: npt.NDArray[np.float32] | None = None


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _days(since: float, until: float) -> list[dt.date]:
    first = dt.datetime.fromtimestamp(since, dt.UTC).date()
    last = dt.datetime.fromtimestamp(max(since, until - 1e-6), dt.UTC).date()
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


@define
class _Vocabulary:
    """Stems and the surface form each was most often written as."""

    surfaces: defaultdict[str, Counter[str]] = field(factory=lambda: defaultdict(Counter))

    def stems(self, row: TurnRow) -> list[str]:
        out = []
        for surface in row.terms:
            s = stem(surface)
            self.surfaces[s][surface] += 1
            out.append(s)
        return out

    def surface(self, s: str) -> str:
        counts = self.surfaces.get(s)
        return min(counts, key=lambda w: (-counts[w], w)) if counts else s


def build_report(  # noqa: PLR0913 — the report's inputs and knobs, by keyword
    turns: Iterable[LoggedTurn],
    *,
    since: float,
    until: float,
    embed: Embed | None = None,
    embedder: str | None = None,
    threshold: float | None = None,
    min_turns: int = 2,
    max_topics: int = 20,
    sort: SortTopics | None = None,
) -> GapReport:
    """The content-gap report of the turns with ``since <= at < until``.

    Args:
        turns: Logged turns (any order: they are sorted by time and turn id).
        since: Start of the period (seconds since the epoch).
        until: Its end (exclusive).
        embed: The index's embedder as a blocking call (``None``: term vectors only).
        embedder: Its name: stored embeddings made by it are used instead of embedding again.
        threshold: Average cosine at which groups merge (default :data:`DEFAULT_THRESHOLD`, or
            :data:`DENSE_THRESHOLD` with ``embed``).
        min_turns: Smallest topic listed.
        max_topics: Most topics listed.
        sort: A configured model sorting the distinct gap questions into topics, as a blocking call (the most
            asked first, at most 150): a hint that brings two questions it puts together ``MODEL_SHARE`` (0.75)
            times the lowest cut that joins two questions closer (``None``: no model).
    """
    period = sorted((t for t in turns if since <= t.row.at < until), key=lambda t: (t.row.at, t.row.turn_id))
    days = _days(since, until)
    vocab = _Vocabulary()
    df: Counter[str] = Counter()
    chunk_df: Counter[str] = Counter()
    for t in period:
        df.update(set(vocab.stems(t.row)))
        chunk_df.update(_neighbours(t.row).keys())
    items: dict[str, _Item] = {}
    for t in period:
        if not is_gap(t):
            continue
        row = t.row
        item = items.get(row.question_hash)
        if item is None:
            text = row.question if row.question is not None else " ".join(row.terms)
            stems = [stem(s) for s in row.terms]
            unfound = {stem(s) for s in row.unfound}
            item = items[row.question_hash] = _Item(row.question_hash, text, stems + [s for s in stems if s in unfound])
        item.turns.append(t)
    listed = list(items.values())
    cut = DEFAULT_THRESHOLD if embed is None else DENSE_THRESHOLD
    hits: list[dict[str, float]] = []
    for item in listed:
        best: dict[str, float] = {}
        for t in item.turns:
            for chunk, confidence in _neighbours(t.row).items():
                best[chunk] = max(best.get(chunk, 0.0), confidence)
        hits.append(best)
    vectors = with_neighbourhood(
        _vectors(listed, df, len(period), embed, embedder), neighbourhood_vectors(hits, chunk_df, len(period))
    )
    used = cut if threshold is None else threshold
    attach = None if embed is None else (ATTACH_FLOOR, ATTACH_MARGIN)
    # The model's hint stays under the lowest cut that joins two questions (a merge, or a lone one's attachment).
    lowest = used if attach is None else min(used, ATTACH_FLOOR)
    hint = _model_hint(listed, sort)
    if hint is not None:
        vectors = np.hstack([vectors, topic_vectors(hint[0], MODEL_SHARE * lowest)])
    labels = cluster(vectors, [len(i.turns) for i in listed], used, attach=attach)
    groups: dict[int, list[int]] = defaultdict(list)
    for k, label in enumerate(labels):
        groups[label].append(k)
    topics = [
        _topic(listed, members, vectors, vocab, df, len(period), days)
        for members in groups.values()
        if sum(len(listed[k].turns) for k in members) >= min_turns
    ]
    topics.sort(key=lambda t: (-t.users, -t.turns, t.label))
    shown = tuple(_ranked(t, r) for r, t in enumerate(topics[:max_topics], 1))
    gap_turns = sum(len(i.turns) for i in listed)
    vectors_used = (
        "TF-IDF term vectors (terms no hit mentions count twice)"
        + ("" if embed is None else f" joined with {embedder or 'the'} embeddings at {DENSE_WEIGHT:g}")
        + f", plus {NEIGHBOUR_WEIGHT:g} x the retrieval-neighbourhood cosine (top {NEIGHBOURS} chunks per turn)"
    )
    method = f"average-linkage clustering on cosine, threshold {used:g}, {vectors_used}" + (
        ""
        if attach is None
        else f"; a lone question joins its nearest topic at {ATTACH_FLOOR:g} (by {ATTACH_MARGIN:g})"
    )
    if hint is not None:
        method += (
            f"; plus {MODEL_SHARE * lowest:g} ({MODEL_SHARE:g} x the lowest cut) where the model puts two questions "
            f"in one topic: {hint[1]}"
        )
    return GapReport(
        since=_iso(since),
        until=_iso(until),
        days=tuple(d.isoformat() for d in days),
        turns=len(period),
        users=len({t.row.user for t in period}),
        gap_turns=gap_turns,
        topics=shown,
        unclustered=gap_turns - sum(t.turns for t in shown),
        stale=_stale_pages(period),
        daily_gaps=tuple(_daily((t for i in listed for t in i.turns), days)),
        method=method,
    )


def _model_hint(items: Sequence[_Item], sort: SortTopics | None) -> tuple[list[int], str] | None:
    """Each item's model topic (``-1``: none) and the model's note, or ``None`` without a model (or questions)."""
    if sort is None or not items:
        return None
    order = sorted(range(len(items)), key=lambda k: (-len(items[k].turns), k))[:MAX_QUESTIONS]
    sorted_ = sort([items[k].text for k in order])
    topic_of = [-1] * len(items)
    for j, k in enumerate(order):
        topic_of[k] = sorted_.topic_of[j] if j < len(sorted_.topic_of) else -1
    return topic_of, sorted_.note


def _neighbours(row: TurnRow) -> dict[str, float]:
    """The turn's retrieval neighbourhood: its ``NEIGHBOURS`` most confident hit chunks and their confidence."""
    top = sorted(row.hits, key=lambda h: (-h.confidence, h.chunk_id))[:NEIGHBOURS]
    out: dict[str, float] = {}
    for h in top:
        out[h.chunk_id] = max(out.get(h.chunk_id, 0.0), max(h.confidence, 0.0))
    return out


def _vectors(
    items: Sequence[_Item], df: Counter[str], total: int, embed: Embed | None, embedder: str | None
) -> npt.NDArray[np.float32]:
    lexical = lexical_vectors([i.stems for i in items], df, total)
    if embed is None or not items:
        return lexical
    stored: dict[int, npt.NDArray[np.float32]] = {}
    for k, item in enumerate(items):
        found = next((t.embedding for t in item.turns if t.embedding is not None and t.embedder == embedder), None)
        if embedder is not None and found is not None:
            stored[k] = found
    todo = [k for k in range(len(items)) if k not in stored]
    fresh = np.asarray(embed([items[k].text for k in todo]), dtype=np.float32) if todo else None
    sizes = {len(v) for v in stored.values()} | ({fresh.shape[1]} if fresh is not None else set())
    if len(sizes) != 1:  # stored vectors of another size than the embedder's: embed everything afresh
        return combine(lexical, np.asarray(embed([i.text for i in items]), dtype=np.float32))
    dense = np.zeros((len(items), sizes.pop()), dtype=np.float32)
    for k, v in stored.items():
        dense[k] = v
    if fresh is not None:
        dense[todo] = fresh
    return combine(lexical, dense)


def _daily(turns: Iterable[LoggedTurn], days: Sequence[dt.date]) -> list[int]:
    index = {d: i for i, d in enumerate(days)}
    out = [0] * len(days)
    for t in turns:
        i = index.get(dt.datetime.fromtimestamp(t.row.at, dt.UTC).date())
        if i is not None:
            out[i] += 1
    return out


def _trend(daily: Sequence[int]) -> str:
    half = len(daily) // 2
    if half == 0:
        return "steady"
    first, second = sum(daily[:half]), sum(daily[len(daily) - half :])
    if second >= 1.5 * first and second - first >= 2:
        return "rising"
    if first >= 1.5 * second and first - second >= 2:
        return "falling"
    return "steady"


def _topic(
    items: Sequence[_Item],
    members: Sequence[int],
    vectors: npt.NDArray[np.float32],
    vocab: _Vocabulary,
    df: Counter[str],
    total: int,
    days: Sequence[dt.date],
) -> Topic:
    turns = sorted((t for k in members for t in items[k].turns), key=lambda t: (t.row.at, t.row.turn_id))
    n = len(turns)
    tf: Counter[str] = Counter()
    for k in members:
        tf.update({s: len(items[k].turns) for s in set(items[k].stems)})
    score = {s: (c / n) * math.log(1.0 + max(total, 1) / max(df.get(s, 0), 1)) for s, c in tf.items()}
    ranked = sorted((s for s in score if s not in _FILLER), key=lambda s: (-score[s], s))
    terms = tuple(vocab.surface(s) for s in ranked[:6])
    centre = np.average(vectors[list(members)], axis=0, weights=[len(items[k].turns) for k in members])
    near = sorted(members, key=lambda k: (-float(vectors[k] @ centre), -len(items[k].turns), items[k].text))
    causes = Counter(turn_cause(t) for t in turns)
    cause = min(causes, key=lambda c: (-causes[c], CAUSES.index(c)))
    daily = _daily(turns, days)
    missing = _missing_terms(turns, cause)
    conflicts = _conflicts(turns) if cause == "contradicting" else ()
    pages = _near_pages(turns)
    return Topic(
        rank=0,
        label=" · ".join(terms[:3]) or "(no terms)",
        terms=terms,
        turns=n,
        users=len({t.row.user for t in turns}),
        trend=_trend(daily),
        daily=tuple(daily),
        examples=tuple(dict.fromkeys(items[k].text for k in near))[:3],
        questions_kept=all(items[k].turns[0].row.question is not None for k in near[:3]),
        cause=cause,
        causes={c: causes[c] for c in CAUSES if causes[c]},
        detail=_detail(cause, missing, conflicts, pages, turns),
        missing_terms=missing,
        conflicts=conflicts,
        pages=pages,
        outcomes=dict(sorted(Counter(t.row.outcome for t in turns).items())),
        down=sum(t.rating == "down" for t in turns),
        comments=tuple(dict.fromkeys(t.comment for t in turns if t.comment))[:3],
        up=sum(t.rating == "up" for t in turns),
        turn_ids=tuple(t.row.turn_id for t in turns),
        first_seen=_iso(turns[0].row.at) if turns else None,
        last_seen=_iso(turns[-1].row.at) if turns else None,
    )


def _ranked(topic: Topic, rank: int) -> Topic:
    import attrs

    return attrs.evolve(topic, rank=rank)


def _missing_terms(turns: Sequence[LoggedTurn], cause: Cause) -> tuple[str, ...]:
    if cause not in ("no_passage", "partial"):
        return ()
    counts: Counter[str] = Counter()
    surfaces: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for t in turns:
        row = t.row
        found = set(row.unfound) | set(row.uncovered)
        if not found:  # the unanswered queries' own terms, when no term check says more
            found = {w for m in row.missing for w in m.lower().split() if w in row.terms}
        counts.update({stem(w) for w in found})
        for w in found:
            surfaces[stem(w)][w] += 1
    top = sorted(counts, key=lambda s: (-counts[s], s))[:4]
    return tuple(min(surfaces[s], key=lambda w: (-surfaces[s][w], w)) for s in top)


def _conflicts(turns: Sequence[LoggedTurn]) -> tuple[Conflict, ...]:
    counts = Counter(c for t in turns for c in t.row.conflicts)
    return tuple(sorted(counts, key=lambda c: (-counts[c], c.term, c.values))[:3])


def _near_pages(turns: Sequence[LoggedTurn]) -> tuple[NearPage, ...]:
    hits: Counter[str] = Counter()
    confidence: defaultdict[str, float] = defaultdict(float)
    titles: dict[str, str] = {}
    for t in turns:
        for source in {h.source for h in t.row.hits}:
            hits[source] += 1
        for h in t.row.hits:
            titles.setdefault(h.source, h.title)
        best: dict[str, float] = {}
        for h in t.row.hits:
            best[h.source] = max(best.get(h.source, 0.0), h.confidence)
        for source, c in best.items():
            confidence[source] += c
    order = sorted(hits, key=lambda s: (-confidence[s], s))[:3]
    return tuple(NearPage(s, titles[s], hits[s], round(confidence[s] / hits[s], 3)) for s in order)


def _quoted(words: Sequence[str]) -> str:
    return ", ".join(f"“{w}”" for w in words)


def _detail(
    cause: Cause,
    missing: Sequence[str],
    conflicts: Sequence[Conflict],
    pages: Sequence[NearPage],
    turns: Sequence[LoggedTurn],
) -> str:
    nearest = ", ".join(p.source for p in pages) or "none"
    if cause == "no_passage":
        terms = _quoted(missing) or "these terms"
        return f"No passage in the knowledge base mentions {terms}; nearest pages: {nearest}."
    if cause == "irrelevant":
        return f"Passages were found ({nearest}) but graded irrelevant: none answers the question."
    if cause == "partial":
        return f"Partly covered: nothing on {_quoted(missing) or 'part of the question'} (found: {nearest})."
    if cause == "contradicting":
        c = conflicts[0]
        said = "; ".join(f"{source} says {' or '.join(values)}" for source, values in c.values)
        return f"Cited pages disagree on “{c.term}”: {said}."
    if cause == "stale":
        stale = sorted({(s.source, s.owner or "no owner") for t in turns for s in t.row.stale})
        return "Answers rest on stale pages: " + ", ".join(f"{s} ({o})" for s, o in stale[:3]) + "."
    down = sum(t.rating == "down" for t in turns)
    return f"Answered from the knowledge base ({nearest}) but rated down {down} time{'s' if down != 1 else ''}."


def _stale_pages(turns: Sequence[LoggedTurn]) -> tuple[StalePage, ...]:
    cited: defaultdict[str, set[str]] = defaultdict(set)
    users: defaultdict[str, set[str]] = defaultdict(set)
    latest: dict[str, tuple[str, str | None, str, str | None, str | None]] = {}
    for t in turns:
        for s in t.row.stale:
            cited[s.source].add(t.row.turn_id)
            users[s.source].add(t.row.user)
            latest[s.source] = (s.title, s.owner, s.reason, s.valid_until, s.updated)
    order = sorted(cited, key=lambda s: (-len(cited[s]), s))
    return tuple(StalePage(s, *latest[s], citations=len(cited[s]), users=len(users[s])) for s in order)
