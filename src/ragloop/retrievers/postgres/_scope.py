"""A filtered search's BM25 statistics: those of the chunks its filters find, not the collection's (issue 30).

The collection's statistics row (chunk count, total length) and terms table (document frequency, highest
term weight) are every tenant's together: scored with them, a tenant's ranking among its own chunks moved with
other tenants' word counts. For a search with filters, :func:`scope_stats` reads, in one statement, the number
and mean length of the chunks the filters match and, for each query term, its document frequency and highest
weight among them; the search statement then scores with those (``search_sql(..., scoped=True)``), so a
tenant's scores, ranks and confidences are those of a collection of its own, as in the local index.

What was read is kept per collection version and filters (:data:`MAX_SCOPES` scopes, :data:`MAX_TERMS` terms
each, least recently used first out): a scope's next searches read only the terms not seen yet, and any write
(a new version) starts afresh. The read costs one probe per (matching chunk, new term).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import define, field

from ragloop.retrievers.filters import FilterKey, Filters, filter_key

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ragloop.retrievers.postgres._common import Store

__all__ = ["MAX_SCOPES", "MAX_TERMS", "ScopeStats", "scope_stats"]

#: Scopes whose statistics a store keeps, and terms kept per scope.
MAX_SCOPES, MAX_TERMS = 32, 4096


@define
class ScopeStats:
    """The BM25 statistics of the chunks one filter finds, in one collection version.

    Attributes:
        n: Matching chunks.
        avgdl: Their mean length (terms), at least 1e-9.
        terms: Term → (document frequency, highest ``tf / (tf + k1·(1 − b + b·dl/avgdl))``) among them.
    """

    n: int
    avgdl: float
    terms: OrderedDict[str, tuple[int, float]] = field(factory=OrderedDict)


@define
class ScopeStatsCache:
    """Per ``(collection version, filters)``: the :class:`ScopeStats` read so far (thread-safe, bounded)."""

    entries: OrderedDict[tuple[str, FilterKey], ScopeStats] = field(factory=OrderedDict)
    lock: threading.Lock = field(factory=threading.Lock)

    def get(self, key: tuple[str, FilterKey]) -> ScopeStats | None:
        with self.lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
            return found

    def put(self, key: tuple[str, FilterKey], stats: ScopeStats) -> None:
        with self.lock:
            self.entries[key] = stats
            self.entries.move_to_end(key)
            while len(self.entries) > MAX_SCOPES:
                self.entries.popitem(last=False)


def _sql(t: dict[str, str], fsql: str) -> str:
    return f"""
    with f as materialized (
        select c.doc_id, c.chunk_id, c.n_terms from {t["chunks"]} c where {fsql}
    ),
    st as materialized (
        select count(*)::bigint as n,
            greatest(coalesce(sum(n_terms), 0)::float8 / nullif(count(*), 0), 1e-9) as avgdl
        from f
    )
    select st.n, st.avgdl, q.term, count(p.tf)::int as df,
        coalesce(max(p.tf::float8 / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.dl / st.avgdl))), 0) as max_w
    from st cross join unnest(%(terms)s::text[]) as q(term)
    left join lateral (
        select p0.tf, p0.dl from f join {t["postings"]} p0
            on p0.term = q.term and p0.doc_id = f.doc_id and p0.chunk_id = f.chunk_id
    ) p on true
    group by st.n, st.avgdl, q.term
    """


async def scope_stats(
    store: Store, filters: Filters, terms: Sequence[str], where: tuple[str, Mapping[str, str]]
) -> ScopeStats:
    """The statistics of the chunks ``filters`` match, with every one of ``terms`` (at least one) known;
    ``where`` is the filters' SQL condition on chunks ``c`` and its parameters (``_search.filter_sql``).

    Raises:
        RetrievalError: As a search raises it (the store's connection handling retries and wraps it).
    """
    cache: ScopeStatsCache = store._scope_stats
    key = (store.version, filter_key(filters))
    kept = cache.get(key)
    wanted = list(dict.fromkeys(terms))
    if kept is not None:
        with cache.lock:
            for t in wanted:
                if t in kept.terms:
                    kept.terms.move_to_end(t)  # the terms this search needs are the last ones dropped
    missing = [t for t in wanted if kept is None or t not in kept.terms]
    if kept is not None and not missing:
        return kept
    fsql, fparams = where
    params: dict[str, Any] = {"terms": missing, "k1": store.k1, "b": store.b, **fparams}
    sql = _sql(store._t, fsql)

    async def go(conn: AsyncConnection[Any]) -> list[Any]:
        return await (await conn.execute(sql, params)).fetchall()

    rows: list[Any] = await store._run(go)
    if kept is None:
        kept = ScopeStats(int(rows[0][0]), float(rows[0][1])) if rows else ScopeStats(0, 1e-9)
    with cache.lock:
        for row in rows:
            kept.terms[str(row[2])] = (int(row[3]), float(row[4]))
        while len(kept.terms) > MAX_TERMS:
            kept.terms.popitem(last=False)
    cache.put(key, kept)
    return kept
