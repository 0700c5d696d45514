"""The Postgres store against a real PostgreSQL 16 + pgvector (pgserver): the same answers as the local index."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.filters import normalize_filters
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from ragloop.retrievers.metadata import with_metadata
from ragloop.retrievers.postgres import PostgresStore
from ragloop.state import Chunk

pytest.importorskip("psycopg")
pytestmark = pytest.mark.anyio

SAMPLE_KB = Path(__file__).parents[2] / "src" / "ragloop" / "data" / "sample_kb"
QUERIES = (
    "How do I rotate an API key?",
    "SAML single sign-on setup",
    "what happens to my data after I cancel",
    "webhook retries and signatures",
    "rate limit 429",
    "export workspace data as CSV",
    "two-factor authentication recovery codes",
    "invoice VAT number",
)


@pytest.fixture(scope="module")
def sample_chunks() -> list[Chunk]:
    """The bundled sample knowledge base, chunked, with metadata from the file path."""
    return with_metadata(ingest_path(SAMPLE_KB).chunks, SAMPLE_KB, extra={"tenant": "acme"})


def _store(url: str, collection: str, **kw: Any) -> PostgresStore:
    return PostgresStore(url, HashEmbedder(256), collection=collection, **kw)


class TestRoundTrip:
    async def test_sync_then_search_returns_the_chunks_with_metadata(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """Chunks written by sync come back from search with text, title path, URL and metadata intact."""
        async with _store(pg_url, collection) as store:
            summary = await store.sync(sample_chunks)
            assert summary.added == len({c.doc_id for c in sample_chunks})
            assert summary.embedded + summary.reused == len(sample_chunks)
            info = await store.info()
            assert info.chunks == len(sample_chunks)
            hits = await store.search("rotate an API key", k=3)
        assert hits and hits[0].chunk.doc_id == "api-keys.md"
        by_id = {c.id: c for c in sample_chunks}
        for hit in hits:
            assert hit.chunk == by_id[hit.id]
            assert hit.chunk.meta()["tenant"] == "acme"

    async def test_schema_creation_is_idempotent_and_checks_the_embedder(self, pg_url: str, collection: str) -> None:
        """Opening twice is fine; another embedder on the same collection is refused with the fix."""
        async with _store(pg_url, collection):
            pass
        async with _store(pg_url, collection):
            pass
        with pytest.raises(IndexError_, match="built with embedder 'hash-256'"):
            async with PostgresStore(pg_url, HashEmbedder(128), collection=collection):
                pass

    async def test_odd_text_round_trips(self, pg_url: str, collection: str) -> None:
        """Quotes, backslashes, non-Latin words and a 3,000-byte "word" are stored and the rest stays findable."""
        blob = "ж" * 1500
        chunk = Chunk(id="odd", text=f"It's a back\\slash 'quoted' naïve café {blob} zyxwv", doc_id="odd.md")
        async with _store(pg_url, collection) as store:
            await store.sync([chunk])
            hits = await store.search("café zyxwv", k=1)
        assert [h.chunk for h in hits] == [chunk]

    async def test_bad_collection_name_is_refused(self, pg_url: str) -> None:
        """Collection names become table names: anything but [a-z0-9_] is refused."""
        with pytest.raises(ConfigError, match="lower-case"):
            PostgresStore(pg_url, HashEmbedder(8), collection="x; drop table y")


class TestSameAsLocal:
    async def test_hybrid_top_hits_and_confidences_equal_the_local_index(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """On the same corpus and embedder, the store returns the local index's top hits and confidences.

        The collection is loaded by the bulk path (documents batched, HNSW index built at the end).
        """
        embedder = HashEmbedder(256)
        local = KnowledgeIndex.build(sample_chunks, embedder)
        async with PostgresStore(pg_url, embedder, collection=collection) as store:
            await store.sync(sample_chunks, bulk_threshold=1)
            for query in QUERIES:
                want = await local.search(query, 5)
                got = await store.search(query, 5)
                assert [h.id for h in got] == [h.id for h in want], query
                for g, w in zip(got, want, strict=True):
                    assert g.confidence == pytest.approx(w.confidence, abs=1e-4), query
                    assert dict(g.ranks) == dict(w.ranks), query
                    assert g.scores["bm25"] == pytest.approx(w.scores.get("bm25", 0.0), rel=1e-4, abs=1e-6)


class TestUpdates:
    async def test_a_changed_document_is_replaced_and_unchanged_chunks_reuse_embeddings(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """Editing one chunk of one document embeds exactly that chunk; deleting a document removes its rows."""
        async with _store(pg_url, collection) as store:
            await store.sync(sample_chunks)
            target = next(c for c in sample_chunks if c.doc_id == "webhooks.md")
            edited = [
                attrs.evolve(c, text=c.text + " Zyxwvut signing secret.", id=c.id + "x") if c is target else c
                for c in sample_chunks
                if c.doc_id != "glossary.md"
            ]
            summary = await store.sync(edited)
            assert (summary.added, summary.changed, summary.removed) == (0, 1, 1)
            assert summary.embedded == 1
            assert summary.reused == sum(1 for c in edited if c.doc_id == "webhooks.md") - 1
            hits = await store.search("zyxwvut", k=3)
            assert hits[0].id == target.id + "x"
            assert await store.search("glossary", k=50, filters={"path": ("glossary.md",)}) == []
            again = await store.sync(edited)
            assert (again.changed, again.embedded, again.unchanged) == (0, 0, len({c.doc_id for c in edited}))

    async def test_two_writers_on_one_collection(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """Two stores writing different document sets at once both land, and the statistics stay exact."""
        half = len(sample_chunks) // 2
        docs_a = [c for c in sample_chunks if c.doc_id < "m"]
        docs_b = [c for c in sample_chunks if c.doc_id >= "m"]
        assert docs_a and docs_b and half
        async with _store(pg_url, collection) as a, _store(pg_url, collection) as b:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: a.sync(docs_a, delete_missing=False))
                tg.start_soon(lambda: b.sync(docs_b, delete_missing=False))
            info = await a.info()
            assert info.chunks == len(sample_chunks)
            before = await a.search("SAML single sign-on setup", k=5)
            await a.refresh_stats()
            after = await a.search("SAML single sign-on setup", k=5)
        assert [(h.id, h.score) for h in before] == [(h.id, h.score) for h in after]


class TestFilters:
    async def test_equality_and_set_membership(self, pg_url: str, collection: str, sample_chunks: list[Chunk]) -> None:
        """Filters keep only matching chunks, in the store and in the local index alike, scored alike: with the
        statistics of the chunks the filters match (issue 30)."""
        tagged = [
            attrs.evolve(c, metadata={**c.meta(), "version": "2" if c.doc_id.startswith("s") else "1"})
            for c in sample_chunks
        ]
        embedder = HashEmbedder(256)
        local = KnowledgeIndex.build(tagged, embedder)
        async with PostgresStore(pg_url, embedder, collection=collection) as store:
            await store.sync(tagged)
            for raw in ({"version": "2"}, {"path": ["sso-saml.md", "api-keys.md"]}, {"tenant": "other"}):
                filters = normalize_filters(raw)
                got = await store.search("single sign-on API key", k=10, filters=filters)
                want = await local.search("single sign-on API key", 10, filters=filters)
                assert [h.id for h in got] == [h.id for h in want], raw
                for hit in got:
                    meta = hit.chunk.meta()
                    assert all(meta[key] in values for key, values in filters.items())
            assert await store.search("anything", k=5, filters={"tenant": ("other",)}) == []

    async def test_a_tenant_scores_as_in_a_collection_of_its_own(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """globex's hits, scores and confidences are the same whether or not acme's chunks share the collection
        (before issue 30: the collection's chunk count, mean length and document frequencies scored every
        tenant's search, so acme's word counts moved globex's ranking); its second search reads no statistics
        it already has."""
        acme = [attrs.evolve(c, metadata={**c.meta(), "tenant": "acme"}) for c in sample_chunks]
        half = sample_chunks[: len(sample_chunks) // 2]
        globex = [
            attrs.evolve(c, id=c.id + "-g", doc_id="g/" + c.doc_id, metadata={**c.meta(), "tenant": "globex"})
            for c in half
        ]
        only = {"tenant": ("globex",)}
        async with _store(pg_url, collection) as both, _store(pg_url, collection + "_alone") as alone:
            await both.sync([*acme, *globex])
            await alone.sync(globex)
            words = sorted({w for c in half for w in c.text.lower().split() if w.isalpha() and len(w) > 3})
            draw = random.Random(30)
            queries = ["single sign-on API key", "invoice billing plan seats", "audit log retention"]
            queries += [" ".join(draw.sample(words, draw.randint(1, 5))) for _ in range(20)]
            for query in queries:
                got = await both.search(query, k=8, filters=only)
                want = await alone.search(query, k=8, filters=only)
                assert got or query not in queries[:3], query
                assert [(h.id, round(h.score, 9), round(h.confidence, 6), h.ranks) for h in got] == [
                    (h.id, round(h.score, 9), round(h.confidence, 6), h.ranks) for h in want
                ], query
                assert [round(h.scores["bm25"], 6) for h in got if "bm25" in h.scores] == [
                    round(h.scores["bm25"], 6) for h in want if "bm25" in h.scores
                ]
            cached = len(both._scope_stats.entries)
            await both.search("single sign-on API key", k=8, filters=only)
            assert len(both._scope_stats.entries) == cached

    async def test_a_scope_statistics_timeout_scores_with_the_collections(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reading a scope's statistics past the statement timeout (a very broad filter on a huge collection)
        does not fail the search: it is scored with the collection's statistics and counted; any other
        failure is the search's."""
        import psycopg

        from ragloop.errors import RetrievalError
        from ragloop.retrievers.postgres import _scope

        async def timed_out(*args: Any) -> Any:
            raise RetrievalError("ran past statement_timeout_s") from psycopg.errors.QueryCanceled("timeout")

        async def broken(*args: Any) -> Any:
            raise RetrievalError("the Postgres store failed")

        only = {"tenant": ("acme",)}
        async with _store(pg_url, collection) as store, _store(pg_url, collection, scope_statistics=False) as shared:
            await store.sync(sample_chunks)
            want = await shared.search("single sign-on", k=5, filters=only)
            monkeypatch.setattr(_scope, "scope_stats", timed_out)
            got = await store.search("single sign-on", k=5, filters=only)
            assert [(h.id, h.score) for h in got] == [(h.id, h.score) for h in want] and want
            assert store.scope_stats_fallbacks == 1
            monkeypatch.setattr(_scope, "scope_stats", broken)
            with pytest.raises(RetrievalError, match="store failed"):
                await store.search("single sign-on", k=5, filters=only)

    async def test_filters_on_an_empty_or_metadata_free_collection(self, pg_url: str, collection: str) -> None:
        """An empty collection: a filter finds nothing, no error; chunks without metadata: every key is unknown."""
        from ragloop.errors import UnknownFilterKey

        async with _store(pg_url, collection) as store:
            assert await store.search("anything", 5, filters={"tenant": ("acme",)}) == []
            await store.sync([Chunk(id="a", text="plain text", doc_id="a.md")])
            with pytest.raises(UnknownFilterKey, match="known keys: none"):
                await store.search("plain", 5, filters={"tenant": ("acme",)})


class TestFailures:
    async def test_a_connection_killed_mid_query_is_retried(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """pg_terminate_backend on a search waiting for a lock: the store retries on a fresh connection."""
        import psycopg

        async with _store(pg_url, collection) as store:
            await store.sync(sample_chunks[:10])
            want = [h.id for h in await store.search("password", k=3)]
            async with await psycopg.AsyncConnection.connect(pg_url) as admin:
                await admin.execute(f"lock table {collection}_chunks in access exclusive mode")
                result: list[Any] = []

                async def search() -> None:
                    result.extend(await store.search("password", k=3))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(search)
                    with anyio.fail_after(10):
                        while True:  # the search's backend, blocked on the lock
                            row = await (
                                await admin.execute(
                                    "select pid from pg_stat_activity where application_name = 'ragloop' "
                                    "and wait_event_type = 'Lock'"
                                )
                            ).fetchone()
                            if row is not None:
                                break
                            await anyio.sleep(0.02)
                    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as killer:
                        await killer.execute("select pg_terminate_backend(%s)", (row[0],))
                    await admin.commit()  # release the lock: the retry goes through
            assert [h.id for h in result] == want

    async def test_search_works_again_after_a_server_restart(
        self, pg_server: Any, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """After `pg_ctl restart` every pooled connection is dead; the next search reconnects."""
        import pgserver

        async with _store(pg_url, collection, pool_size=2) as store:
            await store.sync(sample_chunks[:10])
            want = [h.id for h in await store.search("password", k=3)]
            await anyio.to_thread.run_sync(
                lambda: pgserver.pg_ctl(
                    ["-w", "-m", "fast", "restart"], pgdata=pg_server.pgdata, user=pg_server.system_user
                )
            )
            assert [h.id for h in await store.search("password", k=3)] == want

    async def test_a_store_down_at_first_use_fails_every_queued_call_without_opening_a_pool(self) -> None:
        """With the server unreachable before any pool exists, 8 concurrent first calls each fail with
        StoreUnavailable from one direct connection attempt (its answer shared for a second), and no pool is
        ever opened: on main each queued call waited in turn for the pool's 10-second open (about 10 s per MCP
        search during an outage). The password never reaches the message."""
        from ragloop.errors import StoreUnavailable
        from ragloop.retrievers.postgres._conn import Connections

        async def opened() -> None:
            return None

        conns = Connections(
            "postgresql://ragloop:s3cret-pw@127.0.0.1:9/nowhere",
            pool_size=2,
            statement_timeout_s=5.0,
            ef_search=40,
            opened=opened,
        )
        pools: list[int] = []

        async def new_pool() -> Any:
            pools.append(1)
            raise AssertionError("a pool was opened against a server that refuses connections")

        conns._new_pool = new_pool  # type: ignore[method-assign]
        errors: list[BaseException] = []

        async def first_use() -> None:
            try:
                await conns.pool_for_this_loop()
            except StoreUnavailable as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(first_use)
        assert len(errors) == 8 and not pools
        assert all("s3cret-pw" not in str(e) for e in errors)

    async def test_missing_extension_names_the_fix(self, pg_url: str, collection: str) -> None:
        """With create=False on a database without pgvector, the error says how to add it."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute("drop database if exists novector")
            await admin.execute("create database novector")
        url = pg_url.replace("/postgres?", "/novector?")
        assert url != pg_url
        with pytest.raises(ConfigError, match="CREATE EXTENSION vector"):
            async with _store(url, collection, create=False):
                pass

    async def test_statement_timeout_becomes_a_retrieval_error(self, pg_url: str, collection: str) -> None:
        """A statement past statement_timeout_s fails with a RetrievalError that names the setting."""
        from ragloop.errors import RetrievalError

        async with _store(pg_url, collection, statement_timeout_s=0.05) as store:

            async def slow(conn: Any) -> None:
                await conn.execute("select pg_sleep(1)")

            with pytest.raises(RetrievalError, match="statement_timeout_s"):
                await store._run(slow)


class TestCommandLineAndChat:
    def test_index_search_ask_through_the_store(
        self, pg_url: str, collection: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`index --store`, `search --store` and `ask --store --json` work end to end, filters included."""
        from ragloop.cli import main

        store = ["--store", pg_url, "--collection", collection]
        argv = ["index", str(SAMPLE_KB), *store, "--embedder", "hash", "--url-base", "https://docs.example/kb"]
        assert main(argv) == 0
        assert "34 added" in capsys.readouterr().out
        assert (
            main(
                [
                    "index",
                    str(SAMPLE_KB),
                    *store,
                    "--embedder",
                    "hash",
                    "--json",
                    "--url-base",
                    "https://docs.example/kb",
                ]
            )
            == 0
        )
        again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (again["changed"], again["embedded"], again["unchanged"]) == (0, 0, 34)
        assert main(["search", *store, "rotate an API key", "--json", "-k", "2"]) == 0
        hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert hits[0]["doc_id"] == "api-keys.md"
        assert hits[0]["url"] == "https://docs.example/kb/api-keys#api-keys"  # the section it cites
        question = "What does the audit log record?"
        assert main(["ask", question, *store, "--json", "--no-live", "--filter", "path=audit-log.md,webhooks.md"]) == 0
        reply = json.loads(capsys.readouterr().out)
        pages = {c["url"].split("#")[0] for c in reply["citations"]}  # each links its section: page#anchor
        assert pages and pages <= {"https://docs.example/kb/audit-log", "https://docs.example/kb/webhooks"}

    async def test_chat_from_store_passes_filters_down(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """ChatRAG.from_store answers from the store, with the reply the local index gives over the same chunks
        and embedder; ask(filters=…) keeps every citation inside the filter."""
        from ragloop.chat import ChatRAG

        async with _store(pg_url, collection) as store:
            await store.sync(sample_chunks)
        local = ChatRAG.from_index(KnowledgeIndex.build(sample_chunks, HashEmbedder(256)))
        rag = await anyio.to_thread.run_sync(lambda: ChatRAG.from_store(pg_url, collection=collection))
        try:
            assert rag.store is not None and rag.store.statement_timeout_s == rag.settings.retrieve_timeout_s
            for question in ("How do I rotate an API key?", "What does the audit log record?"):
                got, want = await rag.ask(question), await local.ask(question)
                assert (got.text, got.citations, got.outcome) == (want.text, want.citations, want.outcome), question
            free = await rag.ask("What does the audit log record?")
            assert "audit-log.md" in {c.source for c in free.citations}
            only = await rag.ask("How do I rotate an API key?", filters={"path": ["webhooks.md", "audit-log.md"]})
            assert {c.source for c in only.citations} <= {"webhooks.md", "audit-log.md"}
            audit = await rag.ask("What does the audit log record?", filters={"path": "audit-log.md"})
            assert audit.citations and {c.source for c in audit.citations} == {"audit-log.md"}
        finally:
            await rag.aclose()
            await local.aclose()


def _corpus(n: int, tenants: dict[str, int]) -> list[Chunk]:
    """``n`` chunks over a few shared words, each document in one tenant: ``tenants[name]`` documents of each
    named tenant, the rest in tenant ``big``."""
    names = [t for t, count in tenants.items() for _ in range(count)]
    out = []
    for i in range(n):
        tenant = names[i] if i < len(names) else "big"
        words = " ".join(f"w{(i * 7 + j) % 97}" for j in range(12))
        text = f"rotate api key {words} u{i}"  # u{i}: no two chunks share a vector
        out.append(Chunk(id=f"c{i}", text=text, doc_id=f"d{i}.md", metadata={"tenant": tenant}))
    return out


def _no_seqscan(url: str) -> str:
    """``url`` with sequential scans off for its sessions: the planner then takes the HNSW index even on a table
    small enough to sort whole (what a test of the HNSW path needs)."""
    return f"{url}{'&' if '?' in url else '?'}options=-c%20enable_seqscan%3Doff"


def _trace_round_trips(trace: Path) -> int:
    """Round trips in a libpq trace: each simple Query or extended-protocol Sync the client sent."""
    lines = trace.read_text(errors="replace").splitlines()
    return sum(1 for line in lines if line.split("\t")[:1] == ["F"] and line.split("\t")[2:3] in (["Query"], ["Sync"]))


class TestOneRoundTrip:
    async def test_a_search_is_one_round_trip_and_no_checkout_query(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk], tmp_path: Path
    ) -> None:
        """Traced on the wire: three searches are three round trips (no health query when a connection is
        checked out, no SET, no second statement), each executing the statement the connection prepared once."""
        from psycopg import pq

        async with _store(pg_url, collection, pool_size=1) as store:
            await store.sync(sample_chunks)
            await store.search("rotate an API key", 3)
            trace = tmp_path / "trace.txt"
            with trace.open("w") as out:
                async with store._pool.connection() as conn:
                    conn.pgconn.trace(out.fileno())
                    conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                for q in ("rotate an API key", "SAML single sign-on", "invoice VAT number"):
                    assert await store.search(q, 5)
                async with store._pool.connection() as conn:
                    conn.pgconn.untrace()
        assert _trace_round_trips(trace) == 3
        assert "\tParse\t" not in trace.read_text(errors="replace")  # prepared by the first search

    async def test_an_idle_pooled_connection_killed_is_replaced_on_error(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """Every pooled connection terminated while idle: the next search fails on the dead one, retries on a
        fresh one, and answers as before."""
        import psycopg

        async with _store(pg_url, collection, pool_size=2) as store:
            await store.sync(sample_chunks[:10])
            want = [h.id for h in await store.search("password", k=3)]
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
                await admin.execute(
                    "select pg_terminate_backend(pid) from pg_stat_activity "
                    "where application_name = 'ragloop' and state = 'idle'"
                )
            assert [h.id for h in await store.search("password", k=3)] == want


class TestLexicalBudget:
    async def test_a_pruned_search_still_scores_exactly(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """With a budget of one posting only the rarest query word picks candidates, yet every hit's BM25 score
        and confidence are the exact ones (the candidates are rescored with every term)."""
        async with _store(pg_url, collection) as full:
            await full.sync(sample_chunks)
        async with (
            _store(pg_url, collection, lexical_budget=1, lexical_share=0.0) as pruned,
            _store(pg_url, collection) as exact,
        ):
            for query in QUERIES:
                want = {h.id: h for h in await exact.search(query, 50)}
                got = await pruned.search(query, 10)
                assert got, query
                for hit in got:
                    ref = want.get(hit.id)
                    if ref is None or "bm25" not in hit.scores:
                        continue
                    assert hit.scores["bm25"] == pytest.approx(ref.scores.get("bm25", 0.0), rel=1e-6), query
                    assert hit.confidence == pytest.approx(ref.confidence, abs=1e-9), query

    def test_bad_budgets_are_refused(self, pg_url: str) -> None:
        """A negative budget or a share outside 0..1 is a ConfigError that names the settings."""
        for kw in ({"lexical_budget": -1}, {"lexical_share": 1.5}, {"exact_knn_max": -3}):
            with pytest.raises(ConfigError, match="lexical_budget"):
                PostgresStore(pg_url, HashEmbedder(8), **kw)  # type: ignore[arg-type]


class TestFilteredFillK:
    async def test_a_narrow_tenant_still_gets_k_hits(self, pg_url: str, collection: str) -> None:
        """12 of 800 chunks are tenant acme's: a filtered search returns 10 of them (exact k-NN over the few)."""
        async with _store(pg_url, collection) as store:
            await store.sync(_corpus(800, {"acme": 12}))
            hits = await store.search("rotate api key w3", 10, filters={"tenant": ("acme",)})
        assert len(hits) == 10 and {h.chunk.meta()["tenant"] for h in hits} == {"acme"}

    async def test_a_broad_filter_through_the_hnsw_index_still_gets_k_hits(self, pg_url: str, collection: str) -> None:
        """More chunks match than the exact limit, so the HNSW index is searched; its beam is raised for the
        statement, so the 4% that match still fill k by their vectors alone (the session's beam of 100 holds about 4
        of them)."""
        async with _store(_no_seqscan(pg_url), collection, exact_knn_max=10) as store:
            await store.sync(_corpus(1500, {"acme": 60}), bulk_threshold=1)
            hits = await store.search("qqqzz vvvxx", 10, filters={"tenant": ("acme",)})  # words no chunk has
            assert len(hits) == 10 and {h.chunk.meta()["tenant"] for h in hits} == {"acme"}
            assert all("dense" in h.ranks for h in hits)
            assert len(await store.search("rotate api key", 10)) == 10  # the raised beam was for that statement


class TestDeepSearch:
    async def test_a_search_deeper_than_the_beam_still_gets_k_neighbours(self, pg_url: str, collection: str) -> None:
        """k=60 with a session beam of 20: the HNSW beam is raised for that search (an HNSW scan returns at most
        ef_search rows), so words no chunk has still bring 60 nearest neighbours. Sequential scans are off for the
        store's sessions, so that the planner takes the HNSW index even on a small table."""
        async with _store(_no_seqscan(pg_url), collection, ef_search=20, depth=20) as store:
            await store.sync(_corpus(1500, {}), bulk_threshold=1)
            hits = await store.search("qqqzz vvvxx", 60)
        assert len(hits) == 60 and all("dense" in h.ranks for h in hits)


class TestVersion:
    async def test_every_write_changes_the_version_and_nothing_else_does(
        self, pg_url: str, collection: str, sample_chunks: list[Chunk]
    ) -> None:
        """Adding, editing, deleting documents and refreshing statistics each change the database's version; a
        sync with nothing to do and searches do not."""
        async with _store(pg_url, collection) as store:
            await store.sync(sample_chunks)
            v1 = await store.check_version()
            await store.sync(sample_chunks)
            await store.search("rotate an API key", 3)
            assert await store.check_version() == v1
            edited = [
                attrs.evolve(c, text=c.text + " zyxw", id=c.id + "z") if i == 0 else c
                for i, c in enumerate(sample_chunks)
            ]
            await store.sync(edited)
            v2 = store.version
            assert v2 != v1 and await store.check_version() == v2
            await store.delete_documents(["glossary.md"])
            v3 = store.version
            assert v3 not in (v1, v2) and await store.check_version() == v3
            await store.refresh_stats()
            assert store.version not in (v1, v2, v3) and await store.check_version() == store.version

    async def test_another_process_write_makes_the_next_cached_search_miss(self, pg_url: str, collection: str) -> None:
        """A second process edits a document: this process's cached search returns the new text on the very
        next search (was: the old hits until the cache's TTL)."""
        import sys

        from ragloop.caches import MemoryCache
        from ragloop.retrievers.cached import CachedRetriever

        before = Chunk(id="k1", text="rotate an api key: open settings", doc_id="keys.md")
        script = (
            "import sys, anyio\n"
            "from ragloop.retrievers.embed import HashEmbedder\n"
            "from ragloop.retrievers.postgres import PostgresStore\n"
            "from ragloop.state import Chunk\n"
            "async def main():\n"
            "    async with PostgresStore(sys.argv[1], HashEmbedder(256), collection=sys.argv[2]) as s:\n"
            "        await s.sync([Chunk(id='k2', text='rotate an api key: open the vault', doc_id='keys.md')])\n"
            "anyio.run(main)\n"
        )
        async with _store(pg_url, collection) as store:
            await store.sync([before])
            cached = CachedRetriever(store, MemoryCache(), lambda: store.version)
            assert [h.id for h in await cached.search("rotate api key", 3)] == ["k1"]
            assert [h.id for h in await cached.search("rotate api key", 3)] == ["k1"]  # served from the cache
            done = await anyio.run_process([sys.executable, "-c", script, pg_url, collection], check=False)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            assert [h.id for h in await cached.search("rotate api key", 3)] == ["k2"]
