"""Several retrievers as one: :class:`JoinedRetriever`, the public joiner over the existing rank fusion.

A second index (the product manuals beside the docs, a Postgres collection beside the local index) joins the
turn's own search: every query of the turn searches all of them at once and gets one list back::

    joined = JoinedRetriever({"docs": index.retriever(), "manuals": other}, weights={"manuals": 0.5})
    Turn(joined, judges)                            # or: Turn(docs, judges).add_retriever("manuals", other)

Modes (``mode=``):

- ``"rrf"`` (default): weighted reciprocal-rank fusion (:func:`ragloop.retrievers.hybrid.rrf_fuse`): a
  chunk scores ``Σ weight / (k + rank)`` over the retrievers that returned it. Ranks only, so retrievers whose
  scores mean different things (BM25, cosines, a remote API) join fairly.
- ``"confidence"``: by ``weight × confidence`` (the best over the retrievers that returned the chunk).
- ``"concatenate"``: each retriever's list in turn (in the order of the mapping), a chunk at its first place.

Each hit keeps where it came from: ``Hit.ranks[name]`` / ``Hit.scores[name]`` is its rank (1-based) and score
in retriever ``name``'s list, and the inner retriever's own ranks stay under ``"name.inner"`` (``"docs.bm25"``).
A hit's ``confidence`` is the highest any retriever that returned it gave (a chunk only one index holds is not
penalised for the other's silence). Chunk ids must be unique across the retrievers: an id two of them return
is one chunk (the first retriever's copy is kept).

A retriever that fails fails the search (the retrieve node records it for that query), unless it is named in
``optional``: then its share is left out and the rest is returned. Filters go to every retriever that knows
their keys; one whose chunks lack a filter's key cannot match it and contributes nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal

import anyio
import attrs

from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers.base import Retriever
from ragloop.retrievers.filters import Filters
from ragloop.retrievers.hybrid import rrf_fuse
from ragloop.state import Hit

__all__ = ["JOIN_MODES", "JoinMode", "JoinedRetriever", "join_hits"]

#: How a :class:`JoinedRetriever` merges its members' hits (see :data:`JOIN_MODES`).
JoinMode = Literal["rrf", "confidence", "concatenate"]
#: The modes :class:`JoinedRetriever` knows.
JOIN_MODES: tuple[JoinMode, ...] = ("rrf", "confidence", "concatenate")


class JoinedRetriever:
    """Searches several named retrievers at once and joins their lists into one (see the module docstring).

    Args:
        retrievers: Name → retriever, at least one; the names key ``Hit.ranks``.
        weights: Name → weight (>= 0; default 1.0 each).
        mode: ``"rrf"``, ``"confidence"`` or ``"concatenate"``.
        k: The RRF constant (``mode="rrf"``).
        depth: Hits asked of each retriever (at least the ``k`` of the search).
        optional: Names whose failure leaves their share out instead of failing the search.

    Raises:
        ConfigError: No retrievers, an object without ``search``, an unknown mode, a negative weight, or a
            weight or optional name that names no retriever.
    """

    def __init__(
        self,
        retrievers: Mapping[str, Retriever],
        *,
        weights: Mapping[str, float] | None = None,
        mode: JoinMode = "rrf",
        k: int = 60,
        depth: int = 0,
        optional: Collection[str] = (),
    ) -> None:
        if not retrievers:
            raise ConfigError("JoinedRetriever needs at least one retriever: pass {'name': retriever, …}")
        bad = [n for n, r in retrievers.items() if not isinstance(r, Retriever)]
        if bad:
            raise ConfigError(f"not a retriever (no async search(query, k, filters)): {', '.join(bad)}")
        if mode not in JOIN_MODES:
            raise ConfigError(f"unknown join mode {mode!r}; use one of {', '.join(JOIN_MODES)}")
        weights = dict(weights or {})
        unknown = sorted({*weights, *optional} - set(retrievers))
        if unknown:
            raise ConfigError(f"{', '.join(unknown)}: no retriever of that name; known: {', '.join(retrievers)}")
        negative = {n: w for n, w in weights.items() if not w >= 0}
        if negative or k < 0:
            raise ConfigError(f"join weights and k must be >= 0, got weights {weights} and k={k}")
        self.retrievers = dict(retrievers)
        self.weights = {n: float(weights.get(n, 1.0)) for n in retrievers}
        self.mode, self.k, self.depth, self.optional = mode, k, depth, frozenset(optional)

    @property
    def version(self) -> str:
        """The joined retrievers' versions (what cached searches are keyed on); changes when any of theirs does."""
        return "+".join(f"{n}={getattr(r, 'version', '')}" for n, r in self.retrievers.items())

    def metadata_keys(self) -> frozenset[str] | None:
        """Every metadata key some joined retriever knows; ``None`` when one of them cannot say."""
        keys: set[str] = set()
        for retriever in self.retrievers.values():
            known = _keys_of(retriever)
            if known is None:
                return None
            keys |= known
        return frozenset(keys)

    async def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """At most ``k`` joined hits, best first (see the module docstring).

        Raises:
            RetrievalError: A retriever not named in ``optional`` failed (its name and error in the message).
        """
        depth = max(k, self.depth)
        lists: dict[str, Sequence[Hit]] = {}
        failures: dict[str, Exception] = {}

        async def one(name: str, retriever: Retriever) -> None:
            known = _keys_of(retriever)
            if filters and known is not None and not set(filters) <= known:
                lists[name] = []  # its chunks lack a filter's key: none can match
                return
            try:
                lists[name] = list(await retriever.search(query, depth, filters))
            except Exception as exc:  # noqa: BLE001 — each retriever's failure is its own; decided below
                failures[name] = exc

        async with anyio.create_task_group() as tg:
            for name, retriever in self.retrievers.items():
                tg.start_soon(one, name, retriever)
        fatal = {n: e for n, e in failures.items() if n not in self.optional}
        if fatal:
            what = "; ".join(f"{n}: {type(e).__name__}: {e}" for n, e in fatal.items())
            raise RetrievalError(f"joined search failed in {what}") from next(iter(fatal.values()))
        return join_hits({n: lists[n] for n in self.retrievers if n in lists}, self.weights, self.mode, self.k)[:k]


def _keys_of(retriever: Retriever) -> frozenset[str] | None:
    keys = getattr(retriever, "metadata_keys", None)
    if not callable(keys):
        return None
    known = keys()
    return frozenset(known) if known is not None else None


def join_hits(
    lists: Mapping[str, Sequence[Hit]], weights: Mapping[str, float], mode: JoinMode = "rrf", k: int = 60
) -> list[Hit]:
    """The joined list of named retrievers' ``lists`` (pure; see the module docstring for the modes).

    Every distinct chunk once; ``ranks``/``scores`` by retriever name (the inner ones as ``name.inner``).
    """
    weights = {n: weights.get(n, 1.0) for n in lists}
    first: dict[str, tuple[int, Hit]] = {}
    ranks: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    confidence: dict[str, float] = {}
    weighted: dict[str, float] = {}  # the best weight × confidence, for mode "confidence"
    for position, name in enumerate(lists):
        for rank, hit in enumerate(lists[name], start=1):
            if name in ranks.setdefault(hit.id, {}):
                continue  # repeated within one list: its best place counts
            first.setdefault(hit.id, (position * 1_000_000 + rank, hit))
            ranks[hit.id][name] = rank
            scores.setdefault(hit.id, {})[name] = hit.score
            ranks[hit.id].update({f"{name}.{inner}": r for inner, r in hit.ranks.items()})
            scores[hit.id].update({f"{name}.{inner}": s for inner, s in hit.scores.items()})
            confidence[hit.id] = max(confidence.get(hit.id, 0.0), hit.confidence)
            weighted[hit.id] = max(weighted.get(hit.id, 0.0), weights[name] * hit.confidence)
    if mode == "rrf":
        fused = rrf_fuse(lists, weights, k)
        order = [h.id for h in fused]
        score = {h.id: h.score for h in fused}
    elif mode == "confidence":
        order = sorted(weighted, key=lambda c: (-weighted[c], first[c][0]))
        score = weighted
    else:
        order = sorted(first, key=lambda c: first[c][0])
        score = {c: first[c][1].score for c in order}
    return [
        attrs.evolve(first[cid][1], score=score[cid], confidence=confidence[cid], ranks=ranks[cid], scores=scores[cid])
        for cid in order
    ]
