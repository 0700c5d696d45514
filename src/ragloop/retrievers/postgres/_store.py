"""The store itself: configuration, the connection pool (one per event loop), retries, and what it holds."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ragloop._log import get_logger
from ragloop.errors import ConfigError, RetrievalError, StoreBusy, StoreUnavailable
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.bm25 import Tokenizer
from ragloop.retrievers.filters import Filters
from ragloop.retrievers.postgres import _meaning, _schema, _search, _sync
from ragloop.retrievers.postgres._common import _APP, StoreInfo, at_connection_limit, psycopg_module
from ragloop.retrievers.postgres._conn import Connections
from ragloop.retrievers.postgres._scope import ScopeStatsCache
from ragloop.retrievers.scope import Corpus, Scope
from ragloop.retrievers.update import MAX_REMOVED_SHARE, SyncSummary
from ragloop.state import Chunk, Hit

if TYPE_CHECKING:
    from psycopg import AsyncConnection

log = get_logger("ragloop.retrievers.postgres")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class PostgresStore:
    """Chunks, BM25 statistics and vectors of one collection in PostgreSQL; a hybrid retriever.

    Use as ``async with PostgresStore(url, embedder) as store:`` (or :meth:`open` / :meth:`aclose`).

    Args:
        url: A ``postgresql://`` connection URL (libpq syntax, so ``?host=/socket/dir`` works).
        embedder: Embeds queries and new chunks; its name and dim are recorded with the collection. ``None``:
            the one the collection was built with (MiniLM or the hash embedder), found when opening.
        collection: Collection (table prefix) name: lower-case letters, digits and ``_``.
        pool_size: Most connections this process opens.
        statement_timeout_s: Server-side limit on each statement of a search; tie it to the turn's
            retrieval timeout (``ChatRAG.from_store`` does).
        depth: Candidates taken from each of k-NN and BM25 before fusion.
        weights: Fusion weights keyed ``"bm25"`` / ``"dense"`` (also weight the confidence).
        rrf_k: The RRF constant.
        low: Cosine at which the dense confidence is 0.
        high: Cosine at which the dense confidence is 1.
        ef_search: HNSW search beam (``hnsw.ef_search``), raised to ``depth`` when smaller (and, for a
            filtered search that many chunks match, to what fills ``depth`` after the filter).
        lexical_budget: Postings a search reads for its BM25 candidates, at least (the rarest query terms
            first; a term past the budget only rescores the candidates): see :mod:`ragloop.retrievers.postgres`.
        lexical_share: The same budget as a share of the collection's chunks, when that is larger.
        exact_knn_max: A filtered search that at most this many chunks match (or ``2k·N/1000`` of a
            collection of ``N``, when more) takes the exact k-NN over them; more take the HNSW index.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
        stem: Stem words (Snowball English), as the local index does by default.
        create: Create the tables (and the ``vector`` extension, when allowed) if missing.
        scope_statistics: A filtered search scores BM25 with the statistics of the chunks its filters match
            (their count, mean length, document frequencies), read once per scope and collection version, so
            one tenant's scores and ranks do not move with another's word counts; ``False``: the collection's.
    """

    def __init__(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        self,
        url: str,
        embedder: Embedder | None = None,
        *,
        collection: str = "ragloop",
        pool_size: int = 10,
        statement_timeout_s: float = 5.0,
        depth: int = 50,
        weights: Mapping[str, float] | None = None,
        rrf_k: int = 60,
        low: float = 0.25,
        high: float = 0.65,
        ef_search: int = 100,
        lexical_budget: int = 2000,
        lexical_share: float = 0.05,
        exact_knn_max: int = 2000,
        k1: float = 1.2,
        b: float = 0.75,
        stem: bool = True,
        create: bool = True,
        scope_statistics: bool = True,
    ) -> None:
        if not _NAME.match(collection):
            raise ConfigError(
                f"collection name {collection!r} must be lower-case letters, digits and _ (at most 41), "
                "starting with a letter or _"
            )
        if pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {pool_size}")
        if not statement_timeout_s > 0:
            raise ConfigError(f"statement_timeout_s must be positive, got {statement_timeout_s}")
        if lexical_budget < 0 or not 0 <= lexical_share <= 1 or exact_knn_max < 0:
            raise ConfigError(
                "lexical_budget and exact_knn_max must be >= 0 and lexical_share within 0..1, got "
                f"{lexical_budget}, {exact_knn_max}, {lexical_share}"
            )
        self.url = url
        self._embedder = embedder
        self.collection = collection
        self.pool_size = pool_size
        self.statement_timeout_s = statement_timeout_s
        self.depth = depth
        self.weights = dict(weights) if weights is not None else {"bm25": 1.0, "dense": 1.0}
        self.rrf_k = rrf_k
        self.low = low
        self.high = high
        self.ef_search = ef_search
        self.lexical_budget = lexical_budget
        self.lexical_share = lexical_share
        self.exact_knn_max = exact_knn_max
        self.k1 = k1
        self.b = b
        self.tokenizer = Tokenizer(stem=stem)
        self.create = create
        self.scope_statistics = scope_statistics
        #: Filtered searches scored with the collection's statistics because reading their scope's ran past
        #: the statement timeout (see ``scope_statistics``).
        self.scope_stats_fallbacks = 0
        self._scope_stats = ScopeStatsCache()
        self._conn = Connections(
            url,
            pool_size=pool_size,
            statement_timeout_s=statement_timeout_s,
            ef_search=max(ef_search, depth),
            opened=self._check_once,
        )
        self._checked = False
        self._db_version = "?"
        self._keys: frozenset[str] | None = None
        #: Secondary indexes found missing when a reader (``create=False``) opened the collection.
        self.missing_indexes: tuple[str, ...] = ()
        #: What opening the collection repaired (indexes recreated, a lost schema row recorded, an upgrade).
        self.repaired: tuple[str, ...] = ()
        t = collection
        self._t = {
            "chunks": f"{t}_chunks",
            "postings": f"{t}_postings",
            "docs": f"{t}_docs",
            "terms": f"{t}_terms",
            "stats": f"{t}_stats",
            "keys": f"{t}_keys",
            "headings": f"{t}_headings",
        }

    @property
    def embedder(self) -> Embedder:
        """The embedder (known once :meth:`open` has read the collection, when none was given)."""
        if self._embedder is None:
            raise ConfigError("the store's embedder is read from the collection: `await store.open()` first")
        return self._embedder

    # --- connections ------------------------------------------------------------------------------------

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Check (or create) the schema, then open the connection pool (searches also open it on first use).

        A writer (``create=True``) creates a missing collection, upgrades a version-2 one in place and
        recreates missing indexes (a killed bulk load leaves the HNSW index dropped); :attr:`repaired` says
        what it did. A reader lists missing indexes in :attr:`missing_indexes`.

        Raises:
            StoreUnavailable: the server cannot be reached.
            ConfigError: the server lacks the ``vector`` extension (the message says how to add it).
            IndexError_: the collection is missing, or was written with another embedder or schema version;
                the message says what to do.
        """
        await self._conn.pool_for_this_loop()

    async def prepare(self, *, texts: bool = True) -> list[str]:
        """Check (or create) the schema on a connection of its own (not the pool) and read every chunk text.

        This is all a process needs before serving; the pool opens on the first search, inside the event loop
        that serves (a pool belongs to the loop that opened it).

        Raises:
            StoreUnavailable: As :meth:`open` raises it (the server cannot be reached).
            ConfigError: As :meth:`open` raises it (no ``vector`` extension).
            IndexError_: As :meth:`open` raises it (a missing collection, another embedder or schema version).
        """
        rows = await self._prepare("text" if texts else None)
        return [r[0] for r in rows]

    async def prepare_corpus(self) -> Corpus:
        """:meth:`prepare`, reading every chunk's text with its metadata: the offline judges' corpus, which they
        know per caller scope (a tenant's judges learn nothing from another tenant's chunks).

        The corpus measures its dense threshold per scope (:attr:`Corpus.meaning
        <ragloop.retrievers.scope.Corpus.meaning>`, as a local index's does) when the embedder has meaning (not a
        hash embedder): each chunk's document id and headings are kept from this read, and a scope's vectors are
        read when its scale is measured (:mod:`ragloop.retrievers.postgres._meaning`).

        Raises:
            StoreUnavailable: As :meth:`open` raises it (the server cannot be reached).
            ConfigError: As :meth:`open` raises it (no ``vector`` extension).
            IndexError_: As :meth:`open` raises it (a missing collection, another embedder or schema version).
        """
        rows = await self._prepare(f"text, metadata, {_meaning.COLUMNS}")
        meaning = _meaning.StoreMeaning.of(
            self.url, self._t["chunks"], [r[2:] for r in rows], self.embedder, self._conn.hidden, self._t["headings"]
        )
        return Corpus(
            tuple(r[0] for r in rows),
            tuple({str(k): str(v) for k, v in (r[1] or {}).items()} for r in rows),
            meaning,
        )

    async def _prepare(self, columns: str | None) -> list[Any]:
        """Check the schema and read ``columns`` of every chunk, in corpus order (``doc_id, seq``; none: no read)."""
        psycopg = psycopg_module()
        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, fallback_application_name=_APP)
        except psycopg.Error as exc:
            why = f"cannot connect to {self._conn.redacted()}: {self._conn.hidden(str(exc))}"
            if at_connection_limit(exc):
                raise StoreBusy(f"{why}; raise the server's max_connections or lower pool sizes") from exc
            raise StoreUnavailable(why) from exc
        async with conn:
            try:
                await self._ensure_schema(conn)
                self._keys = await _search.read_keys(conn, self._t)
            except psycopg.OperationalError as exc:
                where = self._conn.redacted()
                raise StoreUnavailable(f"lost the connection to {where}: {self._conn.hidden(str(exc))}") from exc
            except psycopg.Error as exc:
                raise RetrievalError(f"the Postgres store failed: {self._conn.hidden(str(exc))}") from exc
            self._checked = True
            if columns is None:
                return []
            sql = f"select {columns} from {self._t['chunks']} order by doc_id, seq"
            return list(await (await conn.execute(sql)).fetchall())

    async def _check_once(self) -> None:
        if not self._checked:
            await self.prepare(texts=False)

    @property
    def _pool(self) -> Any:
        """The connection pool of this event loop (``None`` before the first search); for statistics."""
        return self._conn.pool

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._conn.aclose()

    async def _ensure_schema(self, conn: AsyncConnection[Any]) -> None:
        await _schema.ensure_schema(self, conn)

    async def _run(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        """Run ``fn(conn)`` with a pooled connection (see :class:`~ragloop.retrievers.postgres._conn.Connections`)."""
        return await self._conn.run(fn)

    def metadata_keys(self) -> frozenset[str] | None:
        """The metadata keys the collection's chunks have, as last read (opening, a sync, a search); ``None``
        before the store has opened."""
        return self._keys

    async def read_metadata_keys(self) -> frozenset[str] | None:
        """The metadata keys of the collection's chunks, read now (``None``: it holds no chunk)."""
        self._keys = await self._run(lambda conn: _search.read_keys(conn, self._t))
        return self._keys

    # --- search -----------------------------------------------------------------------------------------

    async def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """Return at most ``k`` fused hits, best first, among chunks whose metadata matches ``filters``.

        ``Hit.ranks``/``Hit.scores`` carry ``bm25`` and ``dense`` as in the local hybrid retriever.

        Raises:
            UnknownFilterKey: a filter key that no chunk of the collection has (the message lists them).
            StoreUnavailable: the server cannot be reached.
            RetrievalError: the server failed twice or a statement ran past the timeout.
        """
        return await _search.search(self, query, k, filters)

    # --- reading ----------------------------------------------------------------------------------------

    async def info(self) -> StoreInfo:
        """Counts and embedder of the collection."""
        t = self._t

        async def go(conn: AsyncConnection[Any]) -> StoreInfo:
            n = (await (await conn.execute(f"select n from {t['stats']}")).fetchone() or (0,))[0]
            d = (await (await conn.execute(f"select count(*) from {t['docs']}")).fetchone() or (0,))[0]
            return StoreInfo(self.collection, int(n), int(d), self.embedder.name, self.embedder.dim)

        result: StoreInfo = await self._run(go)
        return result

    async def texts(self) -> list[str]:
        """Every chunk's text (for corpus statistics, e.g. the offline judges)."""
        t = self._t

        async def go(conn: AsyncConnection[Any]) -> list[str]:
            rows = await (await conn.execute(f"select text from {t['chunks']} order by doc_id, seq")).fetchall()
            return [r[0] for r in rows]

        result: list[str] = await self._run(go)
        return result

    async def document_hashes(self, scope: Scope | Mapping[str, str] | None = None) -> dict[str, str]:
        """Document id → document hash, for the documents stored under ``scope`` (``None``: the empty scope)."""
        return await _sync.document_hashes(self, Scope.of(scope))

    async def ping(self) -> None:
        """One trivial statement on a pooled connection (what a readiness probe asks).

        Raises:
            StoreUnavailable: the server cannot be reached (within about a second).
        """
        await self._run(lambda conn: conn.execute("select 1"))

    async def scopes(self) -> dict[Scope, tuple[int, int]]:
        """Documents and chunks stored per scope."""
        return await _sync.scope_counts(self)

    # --- writing ----------------------------------------------------------------------------------------

    async def sync(
        self,
        chunks: Iterable[Chunk],
        *,
        scope: Scope | Mapping[str, str] | None = None,
        delete_missing: bool = True,
        prune: bool = False,
        max_removed: float = MAX_REMOVED_SHARE,
        dry_run: bool = False,
        progress: Callable[[int, int], None] | None = None,
        bulk_threshold: int = 1000,
    ) -> SyncSummary:
        """Make ``scope``'s documents in the collection exactly these chunks' documents, in place.

        Only documents of ``scope`` are added, changed or removed; every other scope's rows are left as they are (a
        document is identified by its scope and id: ``guide.md`` of two tenants is two documents). Documents are
        compared by a hash of their chunks, URL and metadata; a changed document's rows are replaced in one
        transaction; chunks whose embedded text is already stored (same content hash) reuse that embedding. Once the
        rows land, the vectors of the headings the offline judges' meaning scales ask are kept for readers (skipped
        when nothing changed and some are kept); failing that is logged (``heading_vectors_not_kept``), never
        raised. Runs of one scope wait for each other (an advisory lock); runs of different scopes go on at once.

        Args:
            chunks: The chunks of every document (grouped by ``Chunk.doc_id``); stored as
                :meth:`Scope.apply` makes them (the scope's pairs in their metadata, ids qualified).
            scope: The scope this sync owns (``None``: the documents stored without one).
            delete_missing: Delete the scope's stored documents that are not among ``chunks``.
            prune: Allow removing more than ``max_removed`` of the scope's documents.
            max_removed: The share of the scope's documents one sync may remove without ``prune``.
            dry_run: Write nothing; the summary says what the sync would do (``dry_run=True``, the ids).
            progress: ``progress(done, total)`` while embedding.
            bulk_threshold: Loading at least this many chunks into an empty collection batches documents
                200 per transaction and builds the HNSW index once at the end.

        Returns:
            Counts of documents added/changed/removed/unchanged and chunks embedded/reused.

        Raises:
            PruneRefused: more than ``max_removed`` of the scope would be removed and ``prune`` is off;
                nothing was written.
            StoreUnavailable: the server cannot be reached.
        """
        scoped = Scope.of(scope)
        summary = await _sync.sync(
            self,
            chunks,
            scope=scoped,
            delete_missing=delete_missing,
            prune=prune,
            max_removed=max_removed,
            dry_run=dry_run,
            progress=progress,
            bulk_threshold=bulk_threshold,
        )
        if not dry_run:
            try:
                await _meaning.keep_headings(
                    self, scoped, changed=bool(summary.added or summary.changed or summary.removed)
                )
            except Exception as exc:  # noqa: BLE001 — a cache: the sync has landed; readers embed on use
                log.warning("heading_vectors_not_kept", collection=self.collection, error=self._conn.hidden(str(exc)))
        return summary

    @property
    def version(self) -> str:
        """What caches of this store's search results key on: the collection and the database's own version
        of it, as last seen here (every search reads it, and so does :meth:`check_version`). Every write
        transaction, from any process, rewrites the collection's statistics row; its transaction id is the
        version, so a write by another replica changes it too."""
        return f"{self.collection}:{self._db_version}"

    async def check_version(self) -> str:
        """Read the collection's version from the database now (one short statement) and return
        :attr:`version`; a cache calls this before each lookup so that another process's write shows at once."""
        t = self._t

        async def go(conn: AsyncConnection[Any]) -> Any:
            sql = f"select xmin::text from {t['stats']}"
            return await (await conn.execute(sql, prepare=True)).fetchone()

        row = await self._run(go)
        self._saw_version(row[0] if row else "?")
        return self.version

    def _saw_version(self, version: str) -> None:
        self._db_version = version

    async def refresh_stats(self) -> None:
        """Recompute the term statistics and the metadata keys exactly from the stored rows."""
        await _sync.refresh_stats(self)

    async def delete_documents(self, doc_ids: Iterable[str], scope: Scope | Mapping[str, str] | None = None) -> int:
        """Delete documents of ``scope`` by id (one transaction each); returns how many existed."""
        return await _sync.delete_documents(self, doc_ids, Scope.of(scope))
