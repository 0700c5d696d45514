"""Topics from questions: TF-IDF term vectors (and the index's embeddings), grouped by average-linkage clustering.

Why this method (numpy only, no new dependency):

- **Vectors.** Each question is its key-term stems weighted by TF-IDF, with the IDF taken from the log itself
  (a term every question uses, like the product's name, weighs little; ``zapier`` weighs a lot). Every term two
  questions share has a column of its own (feature hashing, tried first, made unrelated questions alike whenever
  two of their terms collided), up to :data:`EXACT_TERMS`; rarer shared terms past that share hashed columns.
  With the index's embedder the question's embedding is joined to it, weighted so that the cosine of two
  questions is :data:`DENSE_WEIGHT` (0.8) times their embedding cosine plus 0.2 times their term cosine (a
  weighted sum of two cosines is still a dot product of unit rows, so average linkage stays exact): the
  embedding joins paraphrases that share no word ("black background at night" and "dark mode"), the terms keep
  named things apart ("Zapier" vs "Salesforce"). Each distinct question is embedded once per report (or its
  embedding is read from the turn log when the log kept one from the same embedder).
- **What the knowledge base lacks, and where the question landed.** A term none of the turn's hits mentions
  (``TurnRow.unfound``: "trello" when no page says Trello) is what the gap is about, so it counts twice in the term
  vector. And each question carries its *retrieval neighbourhood*: the chunks its search ranked first (the
  :data:`NEIGHBOURS` most confident per turn), weighted by confidence and by an IDF over the period's turns (a
  chunk every search hits weighs little). Its cosine is *added*, at :data:`NEIGHBOUR_WEIGHT`, to the term (and
  embedding) cosine by joining the unit neighbourhood vector scaled by its square root: two paraphrases that
  share no word but land on the same pages ("kanban board import" and "Trello") come closer, and the sum keeps
  average linkage exact on group means. Both come from the turn's own record, so no model is needed.
- **Average linkage with a threshold.** Topics are not known in number, so k-means does not fit; single linkage
  chains unrelated questions through one ambiguous one; average linkage merges two groups only while their
  questions are, on average, at least ``threshold`` alike, and the result does not depend on input order.
  The average cosine of two groups of unit vectors is the dot product of their means, so groups are kept as
  weighted means and merged with the Lance-Williams update: exact, and ``O(n²)`` memory in distinct questions.
- **A question left alone joins the topic it is clearly nearest to.** A paraphrase that shares no word with the
  rest of its topic ("a paper copy of the board" beside "print my task list") is often nearer to that topic than
  to anything else and still below ``threshold``: after the merges, each question (or first-pass group) that
  merged with nothing joins the group whose average cosine to it is highest when that average is at least
  :data:`ATTACH_FLOOR` and at least :data:`ATTACH_MARGIN` above its next nearest group (all lone ones decided at
  once, on the groups as the merges left them, so the order of the input does not matter). With embeddings only:
  the term cosine alone is too coarse for it.
- **Scale.** Identical questions are one item with a weight. Past :data:`MAX_ITEMS` distinct items, a first pass
  (leader clustering at a tighter threshold, the most frequent questions first) gathers near-duplicates into
  groups, and average linkage runs on the groups' means. ``benchmarks/bench_gaps.py`` measures both the quality
  (against planted topics, on questions the threshold was not chosen on) and the time.

Deterministic: ties go to the lowest index, and callers order items by a stable key.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "ATTACH_FLOOR",
    "ATTACH_MARGIN",
    "DENSE_WEIGHT",
    "EXACT_TERMS",
    "HASHED_DIM",
    "MAX_ITEMS",
    "NEIGHBOURS",
    "NEIGHBOUR_WEIGHT",
    "attach_lone",
    "average_linkage",
    "cluster",
    "combine",
    "lexical_vectors",
    "neighbourhood_vectors",
    "with_neighbourhood",
]

#: Shared terms that get a column of their own in the term vectors; rarer ones share hashed columns.
EXACT_TERMS = 4096
HASHED_DIM = 1024
#: Most items clustered exactly; above it a leader pass groups near-duplicates first.
MAX_ITEMS = 3000
#: Chunks of a turn's hits (most confident first) that make its retrieval neighbourhood.
NEIGHBOURS = 3
#: Weight of the neighbourhood cosine added to the term (and embedding) cosine; chosen on the first planted set
#: of ``benchmarks/bench_gap_topics.py`` (tuning data since it was looked at; 0.1-0.5 all grouped it fully) and
#: the end-to-end scenario of ``tests/gaps`` (0.5 merged a rated-down question into a planted topic), reported on
#: the second planted set.
NEIGHBOUR_WEIGHT = 0.25
#: Share of the question embeddings' cosine in the combined similarity (the term cosine gets the rest); chosen with
#: ``DENSE_THRESHOLD`` of ``gaps._build`` on heldout-1 and heldout-2 of ``benchmarks/bench_gap_topics.py`` (tuning
#: data: 0.5 kept the "Mac application" and "black background" paraphrases apart from their topics), reported on
#: heldout-3.
DENSE_WEIGHT = 0.8
#: Least average cosine at which a question that merged with nothing joins its nearest group, and how much nearer
#: than the next that group must be; chosen on heldout-1..3 of ``benchmarks/bench_gap_topics.py`` and the
#: development topics of ``benchmarks/bench_gaps.py`` (tuning data: floors 0.15-0.25 at margin 0.1 mixed no
#: planted topic; margin 0.05 put "install Lumen on my Mac" into dark mode), reported on heldout-4.
ATTACH_FLOOR = 0.2
#: How much nearer than the next group a lone question's nearest group must be to take it (see
#: :data:`ATTACH_FLOOR`).
ATTACH_MARGIN = 0.1
_FLOOR = -8.0  # below any cosine: masks merged groups and the diagonal

F32 = npt.NDArray[np.float32]


def _bucket(term: str) -> tuple[int, float]:
    h = zlib.crc32(term.encode("utf-8", "surrogatepass"))
    return h % HASHED_DIM, 1.0 if (h >> 31) & 1 else -1.0


def lexical_vectors(terms: Sequence[Sequence[str]], df: Mapping[str, int], total: int) -> F32:
    """TF-IDF vectors of term lists (the IDF from ``df`` over ``total`` questions) whose dot products are the
    lists' cosines.

    A term only one list holds adds to that list's norm and to no dot product, so it gets no column; the
    ``EXACT_TERMS`` (4,096) terms most lists share get one each (no collisions: exact cosines); only past that do
    the rarer shared terms share ``HASHED_DIM`` (1,024) signed hashed columns.
    """
    held = Counter(t for ts in terms for t in set(ts))
    shared = sorted((t for t, c in held.items() if c >= 2), key=lambda t: (-held[t], t))
    columns = {t: i for i, t in enumerate(shared[:EXACT_TERMS])}
    extra = HASHED_DIM if len(shared) > EXACT_TERMS else 0
    out = np.zeros((len(terms), max(1, len(columns) + extra)), dtype=np.float32)
    for i, ts in enumerate(terms):
        weights = {t: tf * math.log(1.0 + max(total, 1) / max(df.get(t, 0), 1)) for t, tf in Counter(ts).items()}
        norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
        for t, w in weights.items():
            column = columns.get(t)
            if column is not None:
                out[i, column] += w / norm
            elif extra and held[t] >= 2:
                bucket, sign = _bucket(t)
                out[i, len(columns) + bucket] += sign * w / norm
    return out


def _unit(x: npt.NDArray[np.floating]) -> F32:
    """Rows scaled to unit length (zero rows stay zero), as a new float32 array; the caller's is left alone.

    The norms are taken in float64: a float32 row as small as ``[0, 0, 2e-22]`` squares into float32's subnormal
    range, and dividing by that rounded norm gave a "unit" row of length 1.0066.
    """
    wide = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(wide, axis=1, keepdims=True)
    unit: npt.NDArray[np.float64] = np.divide(wide, norms, out=np.zeros_like(wide), where=norms > 0)
    return unit.astype(np.float32)


def combine(lexical: F32, dense: F32 | None, weight: float = DENSE_WEIGHT) -> F32:
    """Term and embedding vectors joined so that a dot product is ``(1 - weight)`` times the term cosine plus
    ``weight`` times the embedding cosine (terms alone when ``dense`` is ``None``).

    Rows stay unit length (a zero term row keeps only its embedding half), so average linkage on their means is
    still exact. ``weight`` must lie in ``[0, 1]``.
    """
    if dense is None:
        return lexical
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the embedding weight must lie in [0, 1], not {weight!r}")
    lex = np.float32(math.sqrt(1.0 - weight))
    emb = np.float32(math.sqrt(weight))
    return np.hstack([lexical * lex, _unit(dense) * emb]).astype(np.float32)


def neighbourhood_vectors(hits: Sequence[Mapping[str, float]], df: Mapping[str, int], total: int) -> F32:
    """Unit vectors of retrieval neighbourhoods: ``{chunk id: confidence}`` per item, each chunk weighted by its
    confidence times ``log(1 + total / df[chunk])`` (``df``: how many of ``total`` turns had it among their
    neighbours). Only chunks two items share get a column (others add to no dot product); an item without hits
    has a zero row, so it adds nothing to any cosine.

    Each row is then scaled by its *specificity*, the confidence-weighted mean of its chunks' IDF over the
    largest IDF a shared chunk can have (``log(1 + total / 2)``): two unrelated questions whose searches both
    fell back on the pages every search hits get almost nothing from sharing them.
    """
    held = Counter(c for h in hits for c in h)
    columns = {c: i for i, c in enumerate(sorted(c for c, n in held.items() if n >= 2))}
    out = np.zeros((len(hits), max(1, len(columns))), dtype=np.float32)
    top = math.log(1.0 + max(total, 2) / 2)
    for i, h in enumerate(hits):
        idf = {c: math.log(1.0 + max(total, 1) / max(df.get(c, 0), 1)) for c in h}
        weights = {c: conf * idf[c] for c, conf in h.items()}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        mass = sum(h.values())
        if norm <= 0 or mass <= 0:
            continue
        specificity = min(1.0, sum(conf * idf[c] for c, conf in h.items()) / mass / top)
        for c, w in weights.items():
            column = columns.get(c)
            if column is not None:
                out[i, column] = w / norm * specificity
    return out


def with_neighbourhood(vectors: F32, neighbourhood: F32, weight: float = NEIGHBOUR_WEIGHT) -> F32:
    """``vectors`` joined with ``neighbourhood`` so that a dot product is the vectors' cosine plus ``weight``
    times the neighbourhoods' cosine."""
    return np.hstack([vectors, neighbourhood * np.float32(math.sqrt(weight))]).astype(np.float32)


def average_linkage(means: F32, weights: npt.NDArray[np.float64], threshold: float) -> npt.NDArray[np.int64]:
    """Group labels (0, 1, … in order of first member) from average linkage on cosine, stopping below ``threshold``.

    Args:
        means: One row per starting group: the mean of its unit vectors (a single item's own vector).
        weights: How many items each row stands for.
        threshold: Least average cosine at which two groups merge.
    """
    n = len(means)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sim = (means @ means.T).astype(np.float32)
    np.fill_diagonal(sim, _FLOOR)
    size = np.asarray(weights, dtype=np.float64).copy()
    active = np.ones(n, dtype=bool)
    parent = np.arange(n)
    best_j = np.argmax(sim, axis=1)
    best_s = sim[np.arange(n), best_j].astype(np.float64)
    while True:
        i = int(np.argmax(np.where(active, best_s, _FLOOR)))
        if not active[i] or best_s[i] < threshold:
            break
        j = int(best_j[i])
        row = (size[i] * sim[i].astype(np.float64) + size[j] * sim[j].astype(np.float64)) / (size[i] + size[j])
        row = row.astype(np.float32)
        sim[i, :] = row
        sim[:, i] = row
        sim[j, :] = _FLOOR
        sim[:, j] = _FLOOR
        sim[i, i] = _FLOOR
        size[i] += size[j]
        active[j] = False
        parent[j] = i
        best_s[j] = _FLOOR
        # Average linkage never brings a group closer than its nearer part was, so only rows whose best was
        # one of the two merged groups (and the merged group itself) need their best found again.
        stale = np.flatnonzero(active & ((best_j == i) | (best_j == j)))
        stale = np.union1d(stale, [i])
        sub = sim[stale]
        best_j[stale] = np.argmax(sub, axis=1)
        best_s[stale] = sub[np.arange(len(stale)), best_j[stale]]
    roots = np.array([_root(parent, k) for k in range(n)])
    _, labels = np.unique(roots, return_inverse=True)
    return _first_order(labels)


def _first_order(labels: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Labels renumbered 0, 1, … in order of first member."""
    order = {old: new for new, old in enumerate(dict.fromkeys(labels.tolist()))}
    return np.array([order[x] for x in labels.tolist()], dtype=np.int64)


def attach_lone(
    means: F32,
    weights: npt.NDArray[np.float64],
    labels: npt.NDArray[np.int64],
    floor: float = ATTACH_FLOOR,
    margin: float = ATTACH_MARGIN,
) -> npt.NDArray[np.int64]:
    """``labels`` with each row alone in its group joined to the group it is clearly nearest to.

    A lone row's nearness to a group is the average cosine of their items (its mean dotted with the group's
    weighted mean: exact for means of unit vectors). It joins its nearest group when that is at least ``floor``
    and at least ``margin`` above its next nearest; every lone row is decided on the groups as they are (two
    lone rows that choose each other become one group). Labels come back in order of first member.
    """
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if len(labels) else 0
    counts = np.bincount(labels, minlength=k)
    lone = np.flatnonzero(counts[labels] == 1)
    if k < 2 or not len(lone):
        return labels
    w = np.asarray(weights, dtype=np.float64)
    size = np.bincount(labels, weights=w, minlength=k)
    sums = np.zeros((k, means.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, means.astype(np.float64) * w[:, None])
    near = (means[lone].astype(np.float64) @ sums.T) / size[None, :]
    near[np.arange(len(lone)), labels[lone]] = _FLOOR
    best = np.argmax(near, axis=1)
    top = near[np.arange(len(lone)), best]
    near[np.arange(len(lone)), best] = _FLOOR
    second = near.max(axis=1) if k > 2 else np.full(len(lone), _FLOOR)
    parent = np.arange(k)
    for row, group, s1, s2 in zip(lone.tolist(), best.tolist(), top.tolist(), second.tolist(), strict=True):
        if s1 >= floor and s1 - s2 >= margin:
            a, b = _root(parent, int(labels[row])), _root(parent, group)
            parent[max(a, b)] = min(a, b)
    return _first_order(np.array([_root(parent, int(x)) for x in labels.tolist()], dtype=np.int64))


def _root(parent: npt.NDArray[np.int64], k: int) -> int:
    while parent[k] != k:
        parent[k] = parent[parent[k]]
        k = int(parent[k])
    return k


def _leaders(x: F32, weights: npt.NDArray[np.float64], threshold: float, cap: int) -> npt.NDArray[np.int64]:
    """First pass for many items: each joins the first-made group whose leader it is ``threshold`` alike, else
    leads a new one (most frequent first); past ``cap`` groups the rest join their nearest leader."""
    order = np.argsort(-weights, kind="stable")
    assign = np.full(len(x), -1, dtype=np.int64)
    leaders: list[int] = []
    block = 512
    for start in range(0, len(order), block):
        items = order[start : start + block]
        if leaders:
            sims = x[items] @ x[leaders].T
            near = np.argmax(sims, axis=1)
            ok = sims[np.arange(len(items)), near] >= threshold
            if len(leaders) >= cap:
                ok[:] = True
            assign[items[ok]] = near[ok]
            items = items[~ok]
        fresh: list[int] = []
        for k in items.tolist():
            if fresh:
                s = x[fresh] @ x[k]
                m = int(np.argmax(s))
                if s[m] >= threshold or len(leaders) + len(fresh) >= cap:
                    assign[k] = len(leaders) + m
                    continue
            fresh.append(k)
            assign[k] = len(leaders) + len(fresh) - 1
        leaders.extend(fresh)
    return assign


def cluster(
    vectors: F32,
    weights: Sequence[float],
    threshold: float,
    *,
    max_items: int = MAX_ITEMS,
    attach: tuple[float, float] | None = None,
) -> list[int]:
    """A topic label per item (``vectors`` unit rows, ``weights`` their counts); see the module docstring.

    With ``attach`` (``(floor, margin)``, e.g. ``(ATTACH_FLOOR, ATTACH_MARGIN)``), the items (or first-pass
    groups) that merged with nothing then join the group they are clearly nearest to (:func:`attach_lone`).
    """
    x = np.asarray(vectors, dtype=np.float32)
    w = np.asarray(weights, dtype=np.float64)

    def linked(means: F32, size: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        labels = average_linkage(means, size, threshold)
        return labels if attach is None or not len(labels) else attach_lone(means, size, labels, *attach)

    if len(x) <= max_items:
        return [int(v) for v in linked(x, w)]
    groups = _leaders(x, w, min(0.95, threshold + 0.3), max_items)
    k = int(groups.max()) + 1
    sums = np.zeros((k, x.shape[1]), dtype=np.float64)
    np.add.at(sums, groups, x * w[:, None])
    size = np.bincount(groups, weights=w, minlength=k).astype(np.float64)
    labels = linked((sums / size[:, None]).astype(np.float32), size)
    return [int(v) for v in labels[groups]]
