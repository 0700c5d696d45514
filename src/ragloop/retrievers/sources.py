"""Plan sources: the systems a retrieval plan's sub-queries run against, behind one protocol.

A :class:`Source` has a name (what a :class:`~ragloop.plan.SubQuery` refers to), a one-line description (what a
planner reads to choose it) and an async :meth:`~Source.run` that answers one sub-query with a
:class:`SourceResult`: hits the answer can cite like passages, and rows (field → value) whose values fill the
slots of later sub-queries. Three kinds ship:

- :class:`DocumentSource`: a :class:`~ragloop.retrievers.base.Retriever` (the knowledge index), with optional
  ``mentions`` / ``source`` filters applied to its hits;
- :class:`LiveLookupSource`: a :class:`~ragloop.retrievers.live.LiveSource` looked up by the ids of an ``ids``
  filter (e.g. ticket ids found by SQL) or, without one, by the ids its signal finds in the query text;
- :class:`~ragloop.retrievers.sql.SQLiteSource`: a read-only SQL database behind an allowlist.

A source that answers on behalf of a caller (:class:`CallerScoped`: the live and SQL sources) is handed the
turn's caller by the plan node through ``for_caller``, so a plan reads only what the caller may see.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import attrs
from attrs import field, frozen

from ragloop.errors import SourceError
from ragloop.retrievers.base import Retriever, search_with_filters
from ragloop.retrievers.live import LiveSource, lookup_for, record_hit, split_matches
from ragloop.state import Caller, Hit

__all__ = ["CallerScoped", "DocumentSource", "Filters", "LiveLookupSource", "Row", "Source", "SourceResult"]

#: Filters as a source receives them: each filter's values, slots already filled.
Filters = Mapping[str, tuple[str, ...]]
#: One result's fields as text (SQL row columns, live record fields), for slot filling.
Row = Mapping[str, str]


def _hits(value: Sequence[Hit]) -> tuple[Hit, ...]:
    return tuple(value)


def _rows(value: Sequence[Mapping[str, str]]) -> tuple[Mapping[str, str], ...]:
    return tuple(MappingProxyType(dict(r)) for r in value)


@frozen
class SourceResult:
    """What a source returned for one sub-query.

    Attributes:
        hits: Citeable results (passages, rows, records), best first; each carries its provenance.
        rows: The results' fields as text, in the order of ``hits`` where they correspond; slots read these.
        detail: Source-specific detail for the record (the SQL that ran, the ids looked up).
    """

    hits: tuple[Hit, ...] = field(default=(), converter=_hits)
    rows: tuple[Row, ...] = field(default=(), converter=_rows, eq=False, hash=False)
    detail: str = ""


@runtime_checkable
class Source(Protocol):
    """Something a plan's sub-query can run against."""

    @property
    def name(self) -> str:
        """The name sub-queries use (``documents``, ``sql``, ``tickets``)."""
        ...

    @property
    def description(self) -> str:
        """One line a planner reads to decide when to use it."""
        ...

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Answer one sub-query (slots filled). Raises SourceError (QueryRefused for a refused query)."""
        ...


@runtime_checkable
class CallerScoped(Protocol):
    """A source that answers on behalf of a caller (tenant, user): the plan node asks it for the turn's caller.

    ``for_caller(None)`` is a request without a caller: a source that shows rows by tenant shows none.
    """

    def for_caller(self, caller: Caller | None) -> Source:
        """This source on behalf of ``caller``."""
        ...


def _mentions(text: str, value: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(value.casefold())}(?!\w)", text.casefold()) is not None


@frozen
class DocumentSource:
    """The knowledge index as a plan source.

    Filters (optional): ``mentions`` keeps hits whose text or title names one of the values (whole words,
    any case); ``source`` keeps hits whose source path or document id contains one of the values. With a
    filter the retriever is asked for ``k * overfetch`` hits, so filtering still leaves ``k``.

    Attributes:
        retriever: The retriever to search.
        k: Hits per sub-query.
        overfetch: Multiplier of ``k`` when filters apply.
        name: The source name.
        description: What a planner reads.
        scope: The turn's metadata filters (``tenant``, ``version``…), applied to every search like the retrieve
            node applies them; set by the plan node, never by a planner.
    """

    retriever: Retriever
    k: int = 6
    overfetch: int = 4
    name: str = "documents"
    description: str = "help-center articles: how the product works, policies, prices, limits, error codes"
    scope: Mapping[str, tuple[str, ...]] = field(factory=dict, eq=False, hash=False)

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Search, then apply the filters. Raises SourceError for an unknown filter."""
        unknown = sorted(set(filters) - {"mentions", "source"})
        if unknown:
            raise SourceError(f"{self.name}: unknown filter(s) {unknown}; this source filters by mentions, source")
        mentions = filters.get("mentions", ())
        sources = filters.get("source", ())
        want = self.k * (self.overfetch if mentions or sources else 1)
        hits = await search_with_filters(self.retriever, query, want, self.scope)
        if mentions:
            hits = [h for h in hits if any(_mentions(f"{h.chunk.title}\n{h.text}", v) for v in mentions)]
        if sources:
            hits = [h for h in hits if any(v in h.chunk.source or v in h.chunk.doc_id for v in sources)]
        hits = hits[: self.k]
        rows = [{"id": h.id, "title": h.chunk.title, "source": h.chunk.source} for h in hits]
        return SourceResult(hits=hits, rows=rows, detail=f"{len(hits)} passage(s)")


@frozen
class LiveLookupSource:
    """A live source (ticket system, …) as a plan source: exact-id lookups only.

    The ids come from the ``ids`` filter (typically slot-filled from an earlier SQL sub-query) or, without
    it, from the source's own signal in the query text. Records whose id is not one requested are dropped.

    Attributes:
        source: The live source.
        description: What a planner reads.
        caller: Who asks; handed to every lookup when set (the plan node sets the turn's caller).
    """

    source: LiveSource
    description: str = "support tickets by exact ticket id (#1234): status, priority, body, resolution"
    caller: Caller | None = None

    @property
    def name(self) -> str:
        """The live source's name."""
        return self.source.name

    def for_caller(self, caller: Caller | None) -> LiveLookupSource:
        """This source with every lookup on behalf of ``caller``."""
        return attrs.evolve(self, caller=caller)

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Look the ids up. Raises SourceError when the live source fails or no id is given."""
        unknown = sorted(set(filters) - {"ids"})
        if unknown:
            raise SourceError(f"{self.name}: unknown filter(s) {unknown}; this source filters by ids")
        ids = tuple(dict.fromkeys(i.strip().lstrip("#") for i in filters.get("ids", ()) if i.strip()))
        ids = ids or self.source.signals(query)
        if not ids:
            raise SourceError(f"{self.name}: no ids to look up; give an ids filter or name an id in the query")
        try:
            records = await lookup_for(self.source, query, ids, self.caller)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"{self.name}: lookup of {list(ids)} failed: {type(exc).__name__}: {exc}") from exc
        kept, _ = split_matches(ids, records)
        rows = [{"id": r.id, **{k: "" if v is None else str(v) for k, v in r.fields.items()}} for r in kept]
        return SourceResult(hits=[record_hit(r, query) for r in kept], rows=rows, detail=f"looked up {', '.join(ids)}")
