"""Hybrid search as one prepared statement: pgvector k-NN, ragloop's BM25 from the postings, fusion, top-k rows.

One statement does everything a search needs, so a search is one round trip and one plan per connection
(prepared, generic): the query terms' statistics, the lexical candidates, the k-NN candidates, reciprocal-rank
fusion, and the top ``k`` rows with their text, metadata, exact BM25 score and cosine. Python only builds the
:class:`~ragloop.state.Hit` objects and their confidences (:func:`~ragloop.retrievers.hybrid.hybrid_confidence`).

**Lexical candidates within a budget.** The query's terms are read rarest first while their postings add up
to at most ``lexical_budget`` rows (the rarest term always); the chunks they score best (twice ``depth``) are
then rescored exactly with every query term, one index probe per dropped term and chunk, and the best
``depth`` of those are the BM25 list. While every term fits the budget (any query on a small collection) the
list is exactly the local index's; past it, the common words' long posting lists are never read, which is where
exact BM25 in SQL spent its time (``benchmarks/README.md`` has the measured cost and the nDCG@10 on SciFact).

**Filters** (metadata containment, GIN-indexed) apply to both lists. When at most ``exact_knn_max`` chunks match
(raised to ``2k·N/1000`` on a collection of ``N`` chunks), the k-NN is exact over those chunks and the BM25
candidates are taken among them: a narrow tenant still gets its ``depth`` nearest neighbours. When more match,
the HNSW index is searched with ``hnsw.ef_search`` raised for this statement (pgvector before 0.8 has no
iterative scans and filters an HNSW scan's rows after the fact, so the beam must hold enough matching rows: at
the lowest share that takes this path, pgvector's largest beam of 1,000 still holds ``2k`` of them), and the
BM25 candidates are taken eight times as wide and then filtered. The exact k-NN costs in proportion to the
matches and the beam costs about the same whatever the filter; ``benchmarks/bench_store.py`` times both on one
tenant (1 %) and on a quarter of the collection.

**A filter's own statistics** (issue 30). A filtered search scores BM25 with the chunk count, mean length,
document frequencies and highest term weights of the chunks its filters match (:mod:`._scope` reads them once
per scope, version and term), so that one tenant's scores, ranks and confidences are those of a collection of
its own; the collection's document frequencies still order the lexical budget (how much a search reads). Should
reading them run past the statement timeout (a very broad filter on a very large collection), that search is
scored with the collection's statistics instead, and ``PostgresStore.scope_stats_fallbacks`` counts it.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from ragloop.errors import RetrievalError
from ragloop.retrievers.filters import Filters, check_filter_keys
from ragloop.retrievers.hybrid import hybrid_confidence
from ragloop.retrievers.postgres import _scope
from ragloop.retrievers.postgres._common import Store, psycopg_module
from ragloop.state import Chunk, Hit

if TYPE_CHECKING:
    from psycopg import AsyncConnection

#: pgvector's largest ``hnsw.ef_search``.
MAX_EF_SEARCH = 1000

#: BM25 candidates rescored with every query term, as a multiple of ``depth``.
_RESCORE = 2
#: A broad filter's BM25 candidates: this many times as many are scored before the filter is checked.
_WIDEN = 8

_BM25 = "{q}.cnt * {q}.idf * {p}.tf / ({p}.tf + %(k1)s * (1 - %(b)s + %(b)s * {p}.dl / {q}.avgdl))"


def filter_sql(filters: Filters | None, alias: str) -> tuple[str, dict[str, str]]:
    """``(where-clause, named params)``: each key's values OR-ed as jsonb containment (GIN-indexed)."""
    if not filters:
        return "true", {}
    clauses: list[str] = []
    params: dict[str, str] = {}
    for key, values in sorted(filters.items()):
        ors = []
        for v in values:
            name = f"f{len(params)}"
            ors.append(f"{alias}.metadata @> %({name})s::jsonb")
            params[name] = json.dumps({key: v})
        clauses.append("(" + " or ".join(ors) + ")")
    return " and ".join(clauses), params


@functools.lru_cache(maxsize=256)
def search_sql(collection: str, shape: tuple[int, ...], wider: bool = False, scoped: bool = False) -> str:
    """The search statement of ``collection`` for filters of ``shape`` (values per key; ``()``: no filter);
    ``wider``: the search is deeper than the session's HNSW beam; ``scoped``: BM25 scores with the filtered
    chunks' statistics, passed as parameters (``sn``, ``savgdl``, ``sdf``, ``smax``: see :mod:`._scope`).

    The text depends only on these, so each connection prepares it once per shape.
    """
    t = {name: f"{collection}_{name}" for name in ("chunks", "postings", "terms", "stats", "keys")}
    fsql = " and ".join(
        "(" + " or ".join(f"c.metadata @> %(f{sum(shape[:i]) + j})s::jsonb" for j in range(n)) + ")"
        for i, n in enumerate(shape)
    )
    if shape:
        # At most exact_max + 1 matching chunks (a GIN bitmap scan that stops there) tell a narrow filter from a
        # broad one. Narrow: exact k-NN over the matching chunks, BM25 candidates among them. Broad: the HNSW
        # index with its beam raised for this statement, BM25 candidates taken wider and then filtered.
        filtered = f"""
    -- the exact limit grows with the collection so that pgvector's largest beam still holds 2k matches
    thr as materialized (
        select greatest(%(exact_max)s, ceil(2 * %(k)s * total_n::float8 / {MAX_EF_SEARCH}))::int as rows from st
    ),
    fkeys as materialized (
        select c.doc_id, c.chunk_id, c.embedding <=> %(vec)s as dist from {t["chunks"]} c where {fsql}
        limit (select rows + 1 from thr)
    ),
    small as materialized (select count(*) <= (select rows from thr) as yes from fkeys),
    beam as materialized (
        select least({MAX_EF_SEARCH}, greatest(%(ef_min)s, ceil(2 * %(depth)s * total_n::float8 / (thr.rows + 1))))::int
            as ef from st, thr
    ),"""
        knn = f"""
    knn as materialized (
        select * from (
            select f.doc_id, f.chunk_id, f.dist from fkeys f where (select yes from small)
            order by f.dist, f.chunk_id collate "C" limit %(depth)s -- ties at the cut by id, as the local index
        ) exact
        union all
        select * from (
            -- the beam's rows nearest first (the index scan), then the filter: a plan that cannot turn into a
            -- sort of every matching chunk
            select c.doc_id, c.chunk_id, c.dist from (
                select c.doc_id, c.chunk_id, c.metadata, c.embedding <=> %(vec)s as dist from {t["chunks"]} c
                order by c.embedding <=> %(vec)s limit (select ef from beam)
            ) c where {fsql} order by c.dist limit %(depth)s
        ) approx
        where not (select yes from small)
            and (select set_config('hnsw.ef_search', ef::text, true) from beam) is not null
    ),"""
        among = "not (select yes from small) or (p.doc_id, p.chunk_id) in (select doc_id, chunk_id from fkeys)"
        wide = "%(cands)s * %(widen)s"
        matching = (
            f"(select yes from small) or exists (select 1 from {t['chunks']} c "
            f"where c.doc_id = l.doc_id and c.chunk_id = l.chunk_id and {fsql})"
        )
    else:
        filtered = ""
        # A search deeper than the session's beam raises it for this statement (HNSW returns at most ef rows).
        widened = (
            "\n        where (select set_config('hnsw.ef_search', %(ef_min)s::text, true)) is not null" if wider else ""
        )
        knn = f"""
    knn as materialized (
        select * from (
            select c.doc_id, c.chunk_id, c.embedding <=> %(vec)s as dist from {t["chunks"]} c
            order by c.embedding <=> %(vec)s limit %(depth)s
        ) nearest{widened}
    ),"""
        among, wide, matching = "true", "%(cands)s", "true"
    # One primary-key probe per (term, chunk): a plain join lets the planner read the chunk's every posting.
    probe = f"""(
            select sum({_BM25.format(q="d", p="p")}) from {{terms}} d cross join lateral (
                select p0.tf, p0.dl from {t["postings"]} p0
                where p0.term = d.term and p0.doc_id = {{doc}} and p0.chunk_id = {{chunk}} offset 0
            ) p
        )"""
    if scoped:  # n, avgdl, df and max_w of the filtered chunks; the collection's df still orders the budget
        stats = f"""
    with st as materialized (
        select %(sn)s::bigint as n, %(savgdl)s::float8 as avgdl, xmin::text as version, n as total_n
        from {t["stats"]}
    ),
    qt as materialized (
        select q.term, q.cnt::float8 as cnt, ln(1 + (st.n - q.sdf + 0.5) / (q.sdf + 0.5))::float8 as idf,
            q.smax as max_w, st.avgdl, tm.df,
            coalesce(sum(tm.df) over (order by tm.df, q.term rows between unbounded preceding and 1 preceding), 0)
                as before
        from unnest(%(terms)s::text[], %(cnts)s::int[], %(sdf)s::int[], %(smax)s::float8[]) as q(term, cnt, sdf, smax)
        join {t["terms"]} tm on tm.term = q.term and tm.df > 0 cross join st
        where q.sdf > 0
    ),"""
    else:
        stats = f"""
    with st as materialized (
        select n, greatest(total_len::float8 / nullif(n, 0), 1e-9) as avgdl, xmin::text as version, n as total_n
        from {t["stats"]}
    ),
    qt as materialized (
        select q.term, q.cnt::float8 as cnt, ln(1 + (st.n - tm.df + 0.5) / (tm.df + 0.5))::float8 as idf,
            tm.max_w, st.avgdl, tm.df,
            coalesce(sum(tm.df) over (order by tm.df, q.term rows between unbounded preceding and 1 preceding), 0)
                as before
        from unnest(%(terms)s::text[], %(cnts)s::int[]) as q(term, cnt)
        join {t["terms"]} tm on tm.term = q.term and tm.df > 0 cross join st
    ),"""
    return f"""{stats}
    budget as materialized (select greatest(%(budget)s, %(budget_share)s * st.total_n) as rows from st),
    kept as materialized (select qt.* from qt, budget where before = 0 or before + df <= budget.rows),
    dropped as materialized (
        select qt.* from qt, budget where not (before = 0 or before + df <= budget.rows)
    ),{filtered}
    lexall as materialized (
        select p.doc_id, p.chunk_id, sum({_BM25.format(q="kept", p="p")}) as part
        from kept cross join lateral (
            -- one index range scan per kept term (a plain join lets the planner scan every posting)
            select p0.doc_id, p0.chunk_id, p0.tf, p0.dl from {t["postings"]} p0 where p0.term = kept.term offset 0
        ) p
        where {among}
        group by p.doc_id, p.chunk_id
        order by part desc, p.chunk_id collate "C" limit {wide}
    ),
    lexk as materialized (
        select * from lexall l where {matching} order by part desc, chunk_id collate "C" limit %(cands)s
    ),
    lexr as materialized (
        select l.chunk_id, min(l.doc_id) as doc_id,
            max(l.part + coalesce({probe.format(terms="dropped", doc="l.doc_id", chunk="l.chunk_id")}, 0)) as bm25
        from lexk l group by l.chunk_id
    ),
    lex as materialized (
        select chunk_id, doc_id, bm25, row_number() over (order by bm25 desc, chunk_id collate "C") as rk
        from lexr where bm25 > 0 order by bm25 desc, chunk_id collate "C" limit %(depth)s
    ),{knn}
    dense as materialized (
        select chunk_id, min(doc_id) as doc_id, 1 - min(dist) as cos,
            row_number() over (order by 1 - min(dist) desc, chunk_id collate "C") as rk
        from knn group by chunk_id
    ),
    fused as materialized (
        select coalesce(l.chunk_id, d.chunk_id) as chunk_id, least(l.doc_id, d.doc_id) as doc_id,
            l.rk as rank_bm25, d.rk as rank_dense, l.bm25, d.cos,
            (0::float8 + coalesce(%(wb)s::float8 / (%(rrf)s + l.rk), 0))
                + coalesce(%(wd)s::float8 / (%(rrf)s + d.rk), 0) as score
        from lex l full join dense d on d.chunk_id = l.chunk_id
        order by score desc, coalesce(l.chunk_id, d.chunk_id) collate "C" limit %(k)s
    )
    select c.doc_id, c.chunk_id, c.text, c.source, c.title, c.title_path, c.url, c.metadata,
        f.score, f.rank_bm25, f.rank_dense, f.bm25 as list_bm25, f.cos as list_cos,
        coalesce(f.bm25, {probe.format(terms="qt", doc="c.doc_id", chunk="c.chunk_id")}, 0) as bm25,
        coalesce(f.cos, 1 - (c.embedding <=> %(vec)s)) as cos,
        (select coalesce(sum(qt.idf * qt.max_w * qt.cnt), 0) from qt) as best,
        (select coalesce(sum(qt.cnt), 0) from qt) as known,
        (select array_agg(key) from {t["keys"]}) as keys,
        (select version from st) as version
    from fused f join {t["chunks"]} c on c.doc_id = f.doc_id and c.chunk_id = f.chunk_id
    order by f.score desc, f.chunk_id collate "C"
    """


async def search(store: Store, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
    """Return at most ``k`` fused hits, best first, among chunks whose metadata matches ``filters``.

    ``Hit.ranks``/``Hit.scores`` carry ``bm25`` and ``dense`` as in the local hybrid retriever.

    Raises:
        UnknownFilterKey: a filter key that no chunk of the collection has.
        RetrievalError: the server failed twice or a statement ran past the timeout.
    """
    if filters:
        known = store.metadata_keys()
        if known is None or any(key not in known for key in filters):
            known = await store.read_metadata_keys()  # a key another process wrote since this one read them?
        check_filter_keys(filters, known)
    if k < 1:
        return []
    depth = max(k, store.depth)
    counts = Counter(store.tokenizer(query))
    vec = np.asarray((await store.embedder.embed([query]))[0], dtype=np.float32)
    _, fparams = filter_sql(filters, "c")
    shape = tuple(len(v) for _, v in sorted((filters or {}).items()))
    params: dict[str, Any] = {
        "terms": list(counts),
        "cnts": list(counts.values()),
        "vec": vec,
        "depth": depth,
        "cands": _RESCORE * depth,
        "k": k,
        "k1": store.k1,
        "b": store.b,
        "budget": store.lexical_budget,
        "budget_share": store.lexical_share,
        "wb": store.weights.get("bm25", 1.0),
        "wd": store.weights.get("dense", 1.0),
        "rrf": store.rrf_k,
        **fparams,
    }
    wider = depth > max(store.ef_search, store.depth)  # the session's beam
    if shape or wider:
        params["ef_min"] = max(store.ef_search, depth)
    if shape:
        params["exact_max"] = store.exact_knn_max
        params["widen"] = _WIDEN
    scoped = bool(shape) and bool(counts) and store.scope_statistics
    if scoped:
        assert filters is not None
        try:
            seen = await _scope.scope_stats(store, filters, list(counts), filter_sql(filters, "c"))
        except RetrievalError as exc:
            if not isinstance(exc.__cause__, psycopg_module().errors.QueryCanceled):
                raise
            # A very broad filter on a very large collection: score this search with the collection's
            # statistics (ranking only; the filter still holds) rather than fail it, and count it.
            store.scope_stats_fallbacks += 1
            scoped = False
        else:
            params["sn"], params["savgdl"] = seen.n, seen.avgdl
            params["sdf"] = [seen.terms.get(t, (0, 0.0))[0] for t in counts]
            params["smax"] = [seen.terms.get(t, (0, 0.0))[1] for t in counts]
    sql = search_sql(store.collection, shape, wider and not shape, scoped)

    async def go(conn: AsyncConnection[Any]) -> list[Any]:
        return await (await conn.execute(sql, params, prepare=True)).fetchall()

    rows: list[Any] = await store._run(go)
    if not rows:
        return []
    store._keys = frozenset(rows[0][17] or ())  # every search refreshes the keys (other processes add some)
    store._saw_version(rows[0][18])
    return hits_of(store, rows, sum(counts.values()))


def hits_of(store: Store, rows: list[Any], n_tokens: int) -> list[Hit]:
    """The statement's rows as hits, with :func:`hybrid_confidence` as the local index computes it."""
    best = float(rows[0][15])
    known = int(rows[0][16])
    if known:
        best *= n_tokens / known  # unknown query words count as unmatched, as in the local index
    wb = store.weights.get("bm25", 1.0)
    wd = store.weights.get("dense", 1.0)
    hits = []
    for r in rows:
        ranks: dict[str, int] = {}
        scores: dict[str, float] = {}
        if r[9] is not None:
            ranks["bm25"], scores["bm25"] = int(r[9]), float(r[11])
        if r[10] is not None:
            ranks["dense"], scores["dense"] = int(r[10]), float(r[12])
        bm25, cos = float(r[13]), float(r[14])
        conf = hybrid_confidence(bm25, best, cos, w_bm25=wb, w_dense=wd, low=store.low, high=store.high)
        chunk = Chunk(
            id=r[1],
            text=r[2],
            source=r[3],
            title=r[4],
            title_path=tuple(r[5] or ()),
            doc_id=r[0],
            url=r[6],
            metadata={str(key): str(v) for key, v in (r[7] or {}).items()},
        )
        hits.append(Hit(chunk=chunk, score=float(r[8]), confidence=conf, ranks=ranks, scores=scores))
    return hits


async def read_keys(conn: AsyncConnection[Any], t: dict[str, str]) -> frozenset[str] | None:
    """The metadata keys of the collection's chunks, read now; ``None`` when it holds no chunk."""
    row = await (await conn.execute(f"select n from {t['stats']}")).fetchone()
    if not row or not row[0]:
        return None
    return frozenset(r[0] for r in await (await conn.execute(f"select key from {t['keys']}")).fetchall())
