"""Hybrid search in one round trip: pgvector k-NN and ragloop's BM25 from the postings, fused in Python."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragloop.retrievers.filters import Filters, check_filter_keys
from ragloop.retrievers.hybrid import hybrid_confidence, rrf_rank
from ragloop.retrievers.postgres._common import Store
from ragloop.state import Chunk, Hit

if TYPE_CHECKING:
    from psycopg import AsyncConnection


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


async def search(store: Store, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
    """Return at most ``k`` fused hits, best first, among chunks whose metadata matches ``filters``.

    ``Hit.ranks``/``Hit.scores`` carry ``bm25`` and ``dense`` as in the local hybrid retriever.

    Raises:
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
    tokens = store.tokenizer(query)
    counts = Counter(tokens)
    vec = np.asarray((await store.embedder.embed([query]))[0], dtype=np.float32)
    t = store._t
    fsql, fparams = filter_sql(filters, "c")
    # Exact k-NN under filters: an HNSW scan filters after the fact and can return too few rows.
    exact = bool(filters)
    lexfilter = "true"
    if filters:
        inner = fsql.replace("c.metadata", "f.metadata")
        lexfilter = (
            f"exists (select 1 from {t['chunks']} f where f.doc_id = p.doc_id and f.chunk_id = p.chunk_id and {inner})"
        )
    sql = f"""
    with st as (select n, greatest(total_len::float8 / nullif(n, 0), 1e-9) as avgdl from {t["stats"]}),
    qt as materialized (
        select q.term, q.cnt::float8 as cnt, ln(1 + (st.n - tm.df + 0.5) / (tm.df + 0.5))::float8 as idf,
            tm.max_w, st.avgdl
        from unnest(%(terms)s::text[], %(cnts)s::int[]) as q(term, cnt)
        join {t["terms"]} tm on tm.term = q.term and tm.df > 0, st
    ),
    knn as materialized (
        select c.doc_id, c.chunk_id from {t["chunks"]} c where {fsql}
        order by c.embedding <=> %(vec)s limit %(depth)s
    ),
    lexall as (
        select p.doc_id, p.chunk_id,
            sum(qt.cnt * qt.idf * p.tf / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.dl / qt.avgdl))) as bm25
        from qt cross join lateral (
            -- one index range scan per query term (a plain join lets the planner scan every posting)
            select p0.doc_id, p0.chunk_id, p0.tf, p0.dl from {t["postings"]} p0 where p0.term = qt.term
            offset 0
        ) p
        where {lexfilter}
        group by p.doc_id, p.chunk_id
    ),
    lex as materialized (select * from lexall order by bm25 desc, chunk_id limit %(depth)s),
    knnlex as materialized (
        select p.doc_id, p.chunk_id,
            sum(qt.cnt * qt.idf * p.tf / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.dl / qt.avgdl))) as bm25
        from knn cross join qt cross join lateral (
            select p0.doc_id, p0.chunk_id, p0.tf, p0.dl from {t["postings"]} p0
            where p0.term = qt.term and p0.doc_id = knn.doc_id and p0.chunk_id = knn.chunk_id
            offset 0
        ) p
        group by p.doc_id, p.chunk_id
    ),
    cand as (select doc_id, chunk_id from knn union select doc_id, chunk_id from lex)
    select c.doc_id, c.chunk_id, c.text, c.source, c.title, c.title_path, c.url, c.metadata,
        coalesce(l.bm25, kl.bm25, 0) as bm25, 1 - (c.embedding <=> %(vec)s) as cos,
        (select coalesce(sum(qt.idf * qt.max_w * qt.cnt), 0) from qt) as best,
        (select coalesce(sum(qt.cnt), 0) from qt) as known,
        exists (select 1 from knn where knn.doc_id = c.doc_id and knn.chunk_id = c.chunk_id) as in_knn,
        exists (select 1 from lex where lex.doc_id = c.doc_id and lex.chunk_id = c.chunk_id) as in_lex,
        (select array_agg(key) from {t["keys"]}) as keys
    from cand cross join lateral (
        select * from {t["chunks"]} c0 where c0.doc_id = cand.doc_id and c0.chunk_id = cand.chunk_id
    ) c
    left join lex l on l.doc_id = c.doc_id and l.chunk_id = c.chunk_id
    left join knnlex kl on kl.doc_id = c.doc_id and kl.chunk_id = c.chunk_id
    """
    # Filter placeholders are positional inside a named query: name them instead.
    named: dict[str, Any] = {
        "terms": list(counts),
        "cnts": list(counts.values()),
        "vec": vec,
        "depth": depth,
        "k1": store.k1,
        "b": store.b,
    }
    named.update(fparams)

    wider = depth > max(store.ef_search, store.depth)  # HNSW returns at most ef_search rows

    async def go(conn: AsyncConnection[Any]) -> list[Any]:
        if exact or wider:
            async with conn.transaction():
                if exact:
                    await conn.execute("set local enable_indexscan = off")
                if wider:
                    await conn.execute(f"set local hnsw.ef_search = {int(depth)}")
                return await (await conn.execute(sql, named)).fetchall()
        return await (await conn.execute(sql, named)).fetchall()

    rows: list[Any] = await store._run(go)
    if rows:  # every search refreshes the metadata keys (writes of other processes add some)
        store._keys = frozenset(rows[0][14] or ())
    return fuse(store, rows, k, sum(counts.values()))


def fuse(store: Store, rows: Sequence[Any], k: int, n_tokens: int) -> list[Hit]:
    if not rows:
        return []
    best = float(rows[0][10])
    known = int(rows[0][11])
    if known:
        best *= n_tokens / known  # unknown query words count as unmatched, as in the local index
    by_id: dict[str, Any] = {}
    for row in rows:
        by_id.setdefault(row[1], row)  # one copy of a text stored under two documents
    lexical = sorted((r for r in by_id.values() if r[13] and r[8] > 0), key=lambda r: (-r[8], r[1]))
    dense = sorted((r for r in by_id.values() if r[12]), key=lambda r: (-r[9], r[1]))
    rankings = {
        "bm25": [(r[1], float(r[8]), 0.0) for r in lexical],
        "dense": [(r[1], float(r[9]), 0.0) for r in dense],
    }
    wb = store.weights.get("bm25", 1.0)
    wd = store.weights.get("dense", 1.0)
    hits = []
    for cid, score, ranks, scores, _ in rrf_rank(rankings, store.weights, store.rrf_k)[:k]:
        r = by_id[cid]
        conf = hybrid_confidence(float(r[8]), best, float(r[9]), w_bm25=wb, w_dense=wd, low=store.low, high=store.high)
        chunk = Chunk(
            id=cid,
            text=r[2],
            source=r[3],
            title=r[4],
            title_path=tuple(r[5] or ()),
            doc_id=r[0],
            url=r[6],
            metadata={str(key): str(v) for key, v in (r[7] or {}).items()},
        )
        hits.append(Hit(chunk=chunk, score=score, confidence=conf, ranks=ranks, scores=scores))
    return hits


async def read_keys(conn: AsyncConnection[Any], t: dict[str, str]) -> frozenset[str] | None:
    """The metadata keys of the collection's chunks, read now; ``None`` when it holds no chunk."""
    row = await (await conn.execute(f"select n from {t['stats']}")).fetchone()
    if not row or not row[0]:
        return None
    return frozenset(r[0] for r in await (await conn.execute(f"select key from {t['keys']}")).fetchall())
