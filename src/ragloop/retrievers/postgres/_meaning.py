"""A collection's dense threshold per scope (:mod:`ragloop.retrievers.meaning`), from the scope's own rows.

The local index keeps every vector in memory and measures a scope's scale on them
(``KnowledgeIndex.meaning_scales``). A store measures the same thing with the same code
(:class:`~ragloop.retrievers.meaning.MeaningScales`: the same headings, the same null, the same threshold), but
does not keep its vectors:

- **Kept, from start-up**: what picks a scope's pseudo-questions. ``PostgresStore.prepare_corpus`` reads every
  chunk's text and metadata (the offline judges' corpus) and, in the same statement and order, its scope,
  document, ``seq``, title and heading path, kept as three integers a chunk plus each document and each distinct
  heading path once (:class:`StoredChunks`).
- **Read when a scale is measured**: the scope's vectors. A scope's scale is measured once per scope build of
  the offline judges (in their worker thread, off the event loop, at most two at once; the whole collection's
  at start-up), on a short-lived connection of its own (a sync one: it works whatever event loop the caller has
  or lacks, and never waits on the search pool), and dropped after. Kept, the vectors would cost 1.5 KB a chunk
  (384 float32) for the life of the process, for a figure measured once per scope.
- **Per scope**: a scope's judges are built on the positions its filters find, so only those rows are read
  and only their headings asked: a tenant's scale is the same with or without another tenant's documents in
  the collection.
- **Fail-open**: a database error while measuring (the server down, the statement timeout) logs
  ``meaning_scale_failed`` (the message without credentials) and gives ``None``: that scope's judges go by
  terms alone, as on a store before scales. A chunk rewritten since the corpus was read (another process's
  sync) is no longer found by its key and counts as far from every question (cosine 0); the texts the judges
  hold are those read at start-up too.

- **Heading vectors kept in the store**: a writer's sync embeds the headings the whole collection's scale and
  the synced scope's ask and keeps them in the collection's ``_headings`` table (:func:`keep_headings`; a
  heading's vector depends on its text alone), dropping those no chunk has any more; a reader looks up the
  texts a scale asks there before embedding them (:class:`StoredHeadings`), so a replica's start and a
  tenant's first turn embed only headings no sync kept. A collection written before the table, or a failure
  to keep or read them, only means embedding them on use.

Figures (``benchmarks/bench_store_meaning.py``, MiniLM, FastAPI's and Redis's docs as two tenants, 5,400 chunks,
2 CPUs): the meaning keeps 1.3 MB (253 bytes a chunk; the corpus' texts and metadata with it 7.5 MB) where the
vectors would be 7.9 MB. The whole collection's scale took 2.2 s the first time (embedding 256 headings) and
0.25 s again (the read 0.15 s), holding 17 MB at most while it ran; a 2,371-chunk tenant's 0.84 s, then 0.10 s.
With the heading vectors its syncs kept (``bench_store_meaning-kept.json``): the whole collection's first
measurement 0.19 s where the same run took 1.51 s without them, a tenant's 0.085 s against 0.61 s.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ragloop._log import get_logger
from ragloop._redact import hide_credentials
from ragloop.retrievers.meaning import MeaningScale, MeaningScales, heading_texts, meaning_embed
from ragloop.retrievers.postgres._common import _APP, Store, psycopg_module
from ragloop.retrievers.scope import Scope
from ragloop.state import Chunk

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = [
    "COLUMNS",
    "READ_TIMEOUT_S",
    "StoreMeaning",
    "StoredChunks",
    "StoredHeadings",
    "StoredVectors",
    "keep_headings",
    "read_headings",
]

log = get_logger("ragloop.retrievers.postgres")

#: Server-side limit on each statement that reads a scope's vectors: a read of thousands of rows, once per scope,
#: is given longer than a search's ``statement_timeout_s``.
READ_TIMEOUT_S = 30.0
#: Keys sent per statement.
_BATCH = 5000
#: The columns of a chunk the meaning keeps, as :class:`StoredChunks` takes them.
COLUMNS = "scope, doc_id, seq, title, title_path"


class StoredChunks(Sequence[Chunk]):
    """Every chunk of a collection as :class:`~ragloop.retrievers.meaning.MeaningScales` reads it (position as
    id, document, title, heading path), kept in columns and built when asked.

    A chunk is three integers: its document (its ``(scope, doc_id)``, each kept once), its ``seq`` in it (the
    key its vector is read by) and its headings (each distinct ``(title, title_path)`` kept once).

    Args:
        rows: ``(scope, doc_id, seq, title, title_path)`` of every chunk (:data:`COLUMNS`), in corpus order.
    """

    def __init__(self, rows: Sequence[tuple[str, str, int, str, Sequence[str] | None]]) -> None:
        docs: dict[tuple[str, str], int] = {}
        headings: dict[tuple[str, tuple[str, ...]], int] = {}
        self._doc, self._seq, self._heading = array("l"), array("l"), array("l")
        for scope, doc_id, seq, title, path in rows:
            self._doc.append(docs.setdefault((scope, doc_id), len(docs)))
            self._seq.append(seq)
            self._heading.append(headings.setdefault((title, tuple(path or ())), len(headings)))
        self._docs, self._headings = list(docs), list(headings)

    def __len__(self) -> int:
        return len(self._doc)

    @overload
    def __getitem__(self, i: int) -> Chunk: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Chunk]: ...
    def __getitem__(self, i: int | slice) -> Chunk | Sequence[Chunk]:
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]
        title, path = self._headings[self._heading[i]]
        return Chunk(str(i), "", title=title, title_path=path, doc_id=self._docs[self._doc[i]][1])

    def key(self, i: int) -> tuple[str, str, int]:
        """``(scope, doc_id, seq)`` of the chunk at position ``i``: the row its vector is read from."""
        scope, doc_id = self._docs[self._doc[i]]
        return scope, doc_id, self._seq[i]


class StoredVectors:
    """The stored vectors of chunks named by their position in the corpus (``MeaningScales``' ``vectors``).

    Each call opens one connection of its own, reads the rows by ``(scope, doc_id, seq)`` in batches of 5,000
    keys and closes it; a key no longer stored gives a zero row. The keys go in binary (escaping 5,400 of them as
    text took 0.17 s), and a vector comes back as pgvector's binary form (``vector_send``: a 2-byte dimension,
    2 unused bytes, big-endian float32s) read straight into the array, in half the time the adapter's objects
    take (5,400 rows fetched: 0.07 s against 0.13 s).

    Args:
        url: The store's connection URL.
        table: The collection's chunks table.
        chunks: The corpus' chunks (their keys).
        dim: The vectors' dimension.
        timeout_s: Server-side limit on each statement.
    """

    def __init__(self, url: str, table: str, chunks: StoredChunks, dim: int, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.url, self.table, self.chunks, self.dim, self.timeout_s = url, table, chunks, dim, timeout_s

    def __call__(self, ids: Sequence[str]) -> npt.NDArray[np.float32]:
        """The vectors of the chunks at positions ``ids`` (decimal strings), one row each, in that order."""
        psycopg = psycopg_module()
        keys = [self.chunks.key(int(i)) for i in ids]
        out = np.zeros((len(keys), self.dim), dtype=np.float32)
        sql = (
            "select k.i, vector_send(c.embedding) from unnest(%b::text[], %b::text[], %b::int[]) with ordinality "
            f"as k(scope, doc_id, seq, i) join {self.table} c "
            "on c.doc_id = k.doc_id and c.scope = k.scope and c.seq = k.seq"
        )
        with psycopg.connect(self.url, autocommit=True, fallback_application_name=_APP, connect_timeout=5) as conn:
            conn.execute(f"set statement_timeout = {max(1, round(self.timeout_s * 1000))}")
            with conn.cursor(binary=True) as cur:
                for start in range(0, len(keys), _BATCH):
                    part = keys[start : start + _BATCH]
                    cur.execute(sql, ([k[0] for k in part], [k[1] for k in part], [k[2] for k in part]))
                    for i, sent in cur.fetchall():
                        out[start + int(i) - 1] = np.frombuffer(sent, dtype=">f4", count=self.dim, offset=4)
        return out


class StoreMeaning:
    """A collection's :attr:`Corpus.meaning <ragloop.retrievers.scope.Corpus.meaning>`: the scale of the chunks
    at some positions of the corpus (``None``: all of them), measured on their stored vectors (see the module
    docstring); ``None`` when they hold too few headings, or when the database fails (logged).

    Args:
        chunks: The corpus' chunks, as the meaning keeps them.
        vectors: Reads the stored vectors by position (a :class:`StoredVectors`).
        embed: Embeds headings in the calling thread (the store's embedder's ``embed_sync``).
        hidden: A driver's message without the URL's credentials.
    """

    def __init__(
        self,
        chunks: StoredChunks,
        vectors: Callable[[Sequence[str]], npt.NDArray[np.float32]],
        embed: Callable[[Sequence[str]], npt.NDArray[np.float32]],
        hidden: Callable[[str], str] = str,
        lookup: Callable[[Sequence[str]], Mapping[str, npt.NDArray[np.float32]]] | None = None,
    ) -> None:
        self._scales = MeaningScales(chunks, vectors, embed, lookup=lookup)
        self._hidden = hidden

    @classmethod
    def of(
        cls,
        url: str,
        table: str,
        rows: Sequence[tuple[str, str, int, str, Sequence[str] | None]],
        embedder: object,
        hidden: Callable[[str], str],
        headings: str | None = None,
    ) -> StoreMeaning | None:
        """The meaning of a collection whose chunks are ``rows`` (:data:`COLUMNS`, in ``table`` at ``url``), or
        ``None`` when its embedder measures none (:func:`~ragloop.retrievers.meaning.meaning_embed`: a hash
        embedder); ``headings``: the table its syncs keep heading vectors in (:class:`StoredHeadings`)."""
        embed = meaning_embed(embedder)
        if embed is None:
            return None
        chunks = StoredChunks(rows)
        dim = int(getattr(embedder, "dim", 0))
        lookup = None if headings is None else StoredHeadings(url, headings, dim, hidden)
        return cls(chunks, StoredVectors(url, table, chunks, dim), embed, hidden, lookup)

    def __call__(self, positions: Sequence[int] | None = None) -> MeaningScale | None:
        """The scale of the chunks at ``positions`` (every chunk: ``None``)."""
        psycopg = psycopg_module()
        try:
            return self._scales(positions)
        except psycopg.Error as exc:
            log.warning("meaning_scale_failed", error=self._hidden(str(exc)))
            return None


class StoredHeadings:
    """Kept heading vectors of some texts (``MeaningScales``' ``lookup``), read from a collection's
    ``_headings`` table on a short-lived connection of its own: only the texts a scale asks, so a replica holds
    the headings of the scopes it serves, never every tenant's.

    Fail-open: a missing table (a collection no sync of this ragloop has written since), a role that may not
    read it, or any database error finds nothing (logged ``heading_vectors_unread``, the URL's credentials
    hidden, unless the table is just missing), and the texts are embedded as before.

    Args:
        url: The store's connection URL.
        table: The collection's headings table.
        dim: The vectors' dimension.
        hidden: A driver's message without the URL's credentials.
        timeout_s: Server-side limit on each statement.
    """

    def __init__(
        self, url: str, table: str, dim: int, hidden: Callable[[str], str] = str, timeout_s: float = READ_TIMEOUT_S
    ) -> None:
        self.url, self.table, self.dim, self.hidden, self.timeout_s = url, table, dim, hidden, timeout_s

    def __call__(self, texts: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
        """The kept vectors of those of ``texts`` a sync kept."""
        psycopg = psycopg_module()
        try:
            with psycopg.connect(self.url, autocommit=True, fallback_application_name=_APP, connect_timeout=5) as conn:
                conn.execute(f"set statement_timeout = {max(1, round(self.timeout_s * 1000))}")
                return read_headings(conn, self.table, self.dim, texts)
        except psycopg.errors.UndefinedTable:
            return {}
        except psycopg.Error as exc:
            log.warning("heading_vectors_unread", table=self.table, error=self.hidden(str(exc)))
            return {}


def read_headings(conn: Any, table: str, dim: int, texts: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
    """The vectors kept in ``table`` for those of ``texts`` it holds, on a sync connection (rows of another width
    are left out: they are not this embedder's)."""
    out: dict[str, npt.NDArray[np.float32]] = {}
    with conn.cursor(binary=True) as cur:
        for start in range(0, len(texts), _BATCH):
            part = list(texts[start : start + _BATCH])
            cur.execute(f"select heading, vector_send(embedding) from {table} where heading = any(%s)", (part,))
            for heading, sent in cur.fetchall():
                if len(sent) == 4 + 4 * dim:
                    out[heading] = np.frombuffer(sent, dtype=">f4", count=dim, offset=4).astype(np.float32)
    return out


async def keep_headings(store: Store, scope: Scope, *, changed: bool = True) -> int:
    """After a sync (``changed``: it added, changed or removed documents; one that did not, over a collection that
    keeps some already, does nothing): keep the vectors of the headings that the whole collection's scale and
    ``scope``'s ask in the collection's ``_headings`` table (embedding those no sync kept yet), and drop kept ones
    no chunk has any more; how many were embedded (none for an embedder without meaning). A heading's vector depends
    on its text alone, so a row is never stale; syncs write one at a time (an advisory lock), and one that read its
    chunks before another's landed can at worst drop a row the other kept (it is embedded again on use). Reads only
    the texts it asks, never the whole table. Failures are the caller's to log, never the sync's (the vectors are a
    cache)."""
    embed = meaning_embed(store.embedder)
    if embed is None:
        return 0
    t, dim = store._t, store.embedder.dim

    async def read(conn: AsyncConnection[Any]) -> list[Any] | None:
        if not changed and await (await conn.execute(f"select 1 from {t['headings']} limit 1")).fetchone():
            return None  # a sync that changed nothing, over a collection whose headings are kept: nothing to do
        return list(await (await conn.execute(f"select {COLUMNS} from {t['chunks']} order by doc_id, seq")).fetchall())

    rows = await store._run(read)
    if rows is None:
        return 0
    chunks = StoredChunks(rows)
    lookup = StoredHeadings(store.url, t["headings"], dim, lambda message: hide_credentials(message, store.url))
    scales = MeaningScales(chunks, lambda ids: np.zeros((len(ids), dim), dtype=np.float32), embed, lookup=lookup)
    mine = [i for i, r in enumerate(rows) if r[0] == scope.label]

    def measure() -> dict[str, npt.NDArray[np.float32]]:
        scales.measure_headings()
        if mine:
            scales.measure_headings(mine)
        return scales.headings()

    kept = await anyio.to_thread.run_sync(measure)
    new = [(h, v) for h, v in kept.items() if h in scales.embedded]
    present = sorted({text for chunk in chunks for text in heading_texts(chunk)})

    async def write(conn: AsyncConnection[Any]) -> None:
        async with conn.transaction():
            # syncs of two scopes at once write one after the other (no deadlock between their rows)
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", (f"ragloop:{store.collection}:headings",))
            await conn.execute(f"delete from {t['headings']} where not (heading = any(%s))", (present,))
            if new:
                async with conn.cursor() as cur:
                    await cur.executemany(
                        f"insert into {t['headings']} (heading, embedding) values (%s, %s) "
                        "on conflict (heading) do nothing",
                        new,
                    )

    await store._run(write)
    return len(new)
