"""The Postgres store's dense threshold per scope (``retrievers/postgres/_meaning.py``) against a real server.

The same scale as the local index of the same chunks, a tenant's from its own rows only (the same with or
without another tenant's documents in the collection), none for a hash embedder, and fail-open: a database
error while measuring leaves that scope's judges without a threshold, never a failed turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from ragloop.chat import ChatRAG
from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from ragloop.retrievers.meaning import MeaningScale
from ragloop.retrievers.postgres import PostgresStore
from ragloop.retrievers.scope import Corpus, Scope
from ragloop.state import Chunk
from ragloop.turn import Turn
from tests.e2e.test_meaning_kb import OUTSIDE, PARAPHRASES, assert_answered_from

pytest.importorskip("psycopg")
pytestmark = pytest.mark.anyio

TASKER_KB = Path(__file__).parents[1] / "e2e" / "fixtures" / "tasker_kb"
SAMPLE_KB = Path(__file__).parents[2] / "src" / "ragloop" / "data" / "sample_kb"
ACME, GLOBEX = {"tenant": "acme"}, {"tenant": "globex"}


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def tasker() -> list[Chunk]:
    """The 24-page manual of tests/e2e/test_meaning_kb.py, chunked."""
    return ingest_path(TASKER_KB).chunks


@pytest.fixture(scope="module")
def stores(pg_server: Any, minilm: MiniLMEmbedder, tasker: list[Chunk]) -> Iterator[str]:
    """Three MiniLM collections on one server: ``tasker`` (the manual, no scope), ``acme`` (the manual as
    tenant acme's) and ``both`` (the same, and the sample knowledge base as tenant globex's)."""
    url: str = pg_server.get_uri()
    sample = ingest_path(SAMPLE_KB).chunks

    async def load() -> None:
        for collection, parts in (
            ("meaning_tasker", [(tasker, None)]),
            ("meaning_acme", [(tasker, ACME)]),
            ("meaning_both", [(tasker, ACME), (sample, GLOBEX)]),
        ):
            async with PostgresStore(url, minilm, collection=collection) as store:
                for chunks, scope in parts:
                    await store.sync(chunks, scope=scope)

    anyio.run(load)
    yield url


async def _corpus(url: str, collection: str) -> Corpus:
    store = PostgresStore(url, collection=collection, create=False)
    try:
        return await store.prepare_corpus()
    finally:
        await store.aclose()


def _measure(corpus: Corpus, filters: dict[str, tuple[str, ...]] | None = None) -> MeaningScale | None:
    assert corpus.meaning is not None
    return corpus.meaning(corpus.visible(filters) if filters else None)


def _close(got: MeaningScale | None, want: MeaningScale | None) -> None:
    assert got is not None and want is not None
    assert got.questions == want.questions
    assert abs(got.threshold - want.threshold) < 1e-3 and abs(got.null_median - want.null_median) < 1e-3


class TestScale:
    async def test_the_store_measures_what_the_local_index_measures(
        self, stores: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """The manual's 48 headings give the store the local index's threshold and null median (within 1e-3)."""
        local = KnowledgeIndex.build(tasker, minilm).meaning_scales()
        assert local is not None
        want = local(None)
        got = _measure(await _corpus(stores, "meaning_tasker"))
        _close(got, want)
        assert got is not None and got.questions == 48

    async def test_a_tenants_scale_is_the_same_with_or_without_another_tenant(
        self, stores: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """acme's scale, measured on the positions its filter finds, is the one it has in a collection of its own
        and the local index's over its chunks: globex's pages are neither its questions nor its null."""
        both = await _corpus(stores, "meaning_both")
        alone = await _corpus(stores, "meaning_acme")
        acme = _measure(both, {"tenant": ("acme",)})
        _close(acme, _measure(alone, {"tenant": ("acme",)}))
        local = KnowledgeIndex.build(Scope.of(ACME).apply(tasker), minilm).meaning_scales()
        assert local is not None
        _close(acme, local(None))
        # the whole collection's scale is another one: globex's pages add questions and nulls
        whole = _measure(both)
        assert whole is not None and acme is not None and whole.questions > acme.questions

    async def test_a_hash_embedder_measures_none(self, pg_url: str, collection: str, tasker: list[Chunk]) -> None:
        """A hash embedder's cosines restate the term overlap: its collection's corpus has no meaning."""
        async with PostgresStore(pg_url, HashEmbedder(64), collection=collection) as store:
            await store.sync(tasker)
        corpus = await _corpus(pg_url, collection)
        assert corpus.meaning is None and len(corpus) == len(tasker)


class TestScopedTurn:
    async def test_a_scoped_turns_judges_take_their_tenants_threshold(self, stores: str) -> None:
        """``Turn.from_store``: the judges of a turn filtered to acme use acme's threshold (grader, abstention,
        answerer); the judges built at start-up use the whole collection's."""
        acme = _measure(await _corpus(stores, "meaning_acme"))
        whole = _measure(await _corpus(stores, "meaning_both"))
        assert acme is not None and whole is not None
        turn = await anyio.to_thread.run_sync(lambda: Turn.from_store(stores, collection="meaning_both"))
        rag = ChatRAG(turn)
        try:
            assert turn.judges.knowledge is not None
            judges = turn.judges.knowledge.for_filters({"tenant": ("acme",)})
            assert judges.grader.dense_at == acme.threshold  # type: ignore[attr-defined]
            assert judges.answerer.meaning_at == acme.threshold  # type: ignore[attr-defined]
            assert judges.answerer.abstain_rule.dense_at == acme.threshold  # type: ignore[attr-defined]
            assert turn.judges.knowledge.base.grader.dense_at == whole.threshold  # type: ignore[attr-defined]
        finally:
            await rag.aclose()

    async def test_a_database_error_while_measuring_leaves_the_judges_without_a_threshold(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """The chunks table gone when acme's first turn measures its scale (a real error from the server): the
        failure is logged without the URL, acme's judges go by terms (no ``dense_at``), and with the table back
        acme's turns are answered, without an error."""
        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker, scope=ACME)
            await store.sync(tasker[:10], scope=GLOBEX)  # (their stored vectors are reused)
        table = f"{collection}_chunks"
        turn = await anyio.to_thread.run_sync(lambda: Turn.from_store(pg_url, collection=collection))
        rag = ChatRAG(turn)
        try:
            import psycopg

            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f"alter table {table} rename to {table}_away")
            try:
                with capture_logs() as logs:
                    assert turn.judges.knowledge is not None
                    judges = turn.judges.knowledge.for_filters({"tenant": ("acme",)})
            finally:
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute(f"alter table {table}_away rename to {table}")
            assert judges.grader.dense_at is None  # type: ignore[attr-defined]
            assert judges.answerer.meaning_at is None  # type: ignore[attr-defined]
            failed = [e for e in logs if e["event"] == "meaning_scale_failed"]
            assert len(failed) == 1 and table in failed[0]["error"] and pg_url not in failed[0]["error"]
            reply = await rag.ask("How do I run steps in parallel?", filters=ACME)
            assert reply.outcome in ("context", "partial") and not reply.record.errors
        finally:
            await rag.aclose()


class TestChatOverTheStore:
    @pytest.mark.parametrize(("question", "page"), sorted(PARAPHRASES.items()))
    async def test_a_paraphrase_is_answered_from_its_page(self, stores: str, question: str, page: str) -> None:
        """The questions of tests/e2e/test_meaning_kb.py that share no key word with their page, over
        ``ChatRAG.from_store``: answered, first citation that page (each was refused before the store measured
        its scale)."""
        rag = await anyio.to_thread.run_sync(lambda: ChatRAG.from_store(stores, collection="meaning_tasker"))
        try:
            reply = await rag.ask(question)
        finally:
            await rag.aclose()
        assert_answered_from(reply, page)

    async def test_the_questions_the_manual_does_not_answer_are_still_refused(self, stores: str) -> None:
        """Nothing is quoted for a question the manual does not answer, over the store as over the index."""
        rag = await anyio.to_thread.run_sync(lambda: ChatRAG.from_store(stores, collection="meaning_tasker"))
        try:
            for question in OUTSIDE:
                reply = await rag.ask(question)
                assert reply.outcome == "none" and not reply.citations, (question, reply.text)
        finally:
            await rag.aclose()


class _Counting:
    """MiniLM that records every text it embeds in the calling thread (``embed_sync``: headings, the sync's
    chunks), and may refuse calls of a few texts (the headings)."""

    def __init__(self, minilm: MiniLMEmbedder, *, refuse_small: bool = False) -> None:
        self._minilm, self.refuse_small = minilm, refuse_small
        self.name, self.dim = minilm.name, minilm.dim
        self.embedded: list[str] = []

    def embed_sync(self, texts: Any, progress: Any = None) -> Any:
        if self.refuse_small and len(texts) <= 4:
            raise RuntimeError("the query session is gone")
        self.embedded.extend(texts)
        return self._minilm.embed_sync(texts, progress)

    async def embed(self, texts: Any) -> Any:
        return await self._minilm.embed(texts)


async def _kept(url: str, collection: str) -> set[str]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return {r[0] for r in await (await conn.execute(f"select heading from {collection}_headings")).fetchall()}


class TestKeptHeadings:
    """A sync keeps the headings the scales ask (``<collection>_headings``); a reader measures without them."""

    async def test_a_reader_measures_the_same_scales_without_embedding_a_heading(
        self, stores: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """A replica's start (the whole collection's scale) and a tenant's first turn (acme's) embed nothing: the
        syncs kept both scopes' headings and the whole collection's."""
        counting = _Counting(minilm)
        store = PostgresStore(stores, counting, collection="meaning_both", create=False)  # type: ignore[arg-type]
        try:
            corpus = await store.prepare_corpus()
        finally:
            await store.aclose()
        whole, acme = _measure(corpus), _measure(corpus, {"tenant": ("acme",)})
        assert counting.embedded == []
        _close(whole, _measure(await _corpus(stores, "meaning_both")))
        local = KnowledgeIndex.build(Scope.of(ACME).apply(tasker), minilm).meaning_scales()
        assert local is not None
        _close(acme, local(None))

    async def test_a_collection_without_the_table_still_measures(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """A collection no sync of this ragloop has written since (no ``_headings`` table) embeds its headings on
        use and measures the same scale."""
        import psycopg

        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"drop table {collection}_headings")
        counting = _Counting(minilm)
        store = PostgresStore(pg_url, counting, collection=collection, create=False)  # type: ignore[arg-type]
        try:
            corpus = await store.prepare_corpus()
        finally:
            await store.aclose()
        local = KnowledgeIndex.build(tasker, minilm).meaning_scales()
        assert local is not None
        _close(_measure(corpus), local(None))
        assert len(counting.embedded) == 48

    async def test_doctor_reports_the_kept_vectors_and_a_missing_table(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """``ragloop doctor --store`` says how many heading vectors a collection keeps, and when its table is
        missing (a collection no sync of this ragloop wrote since) says the next sync creates it: not a problem."""
        import psycopg

        from ragloop.retrievers.postgres import diagnose_store

        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker)
        (report,) = (await diagnose_store(pg_url, collection)).collections
        assert report.heading_vectors == len(await _kept(pg_url, collection)) > 0
        assert f"heading vectors kept: {report.heading_vectors}" in "\n".join(
            (await diagnose_store(pg_url, collection)).lines()
        )
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"drop table {collection}_headings")
        gone = await diagnose_store(pg_url, collection)
        assert gone.collections[0].heading_vectors is None and gone.healthy
        assert f"no {collection}_headings table (the next sync creates it" in "\n".join(gone.lines())

    async def test_a_sync_keeps_a_new_title_and_drops_the_old_one(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """Retitling one page embeds its new title only and leaves no row for the old one."""
        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker)
        first = tasker[0]
        assert first.title in await _kept(pg_url, collection)
        renamed = [
            Chunk(c.id, c.text, source=c.source, title="A page renamed", title_path=("A page renamed",),
                  doc_id=c.doc_id, metadata=c.metadata) if c.doc_id == first.doc_id else c
            for c in tasker
        ]  # fmt: skip
        counting = _Counting(minilm)
        async with PostgresStore(pg_url, counting, collection=collection) as store:  # type: ignore[arg-type]
            await store.sync(renamed)
        kept = await _kept(pg_url, collection)
        assert "A page renamed" in kept and first.title not in kept
        assert [t for t in counting.embedded if "\n" not in t and len(t) < 120] == ["A page renamed"]

    async def test_failing_to_keep_them_never_fails_the_sync(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """An embedder that fails on the headings: the sync lands (every chunk stored), keeps none, and logs
        ``heading_vectors_not_kept``; a reader then embeds them on use."""
        refusing = _Counting(minilm, refuse_small=True)
        with capture_logs() as logs:
            async with PostgresStore(pg_url, refusing, collection=collection) as store:  # type: ignore[arg-type]
                summary = await store.sync(tasker)
        assert summary.added == len({c.doc_id for c in tasker})
        assert await _kept(pg_url, collection) == set()
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["heading_vectors_not_kept"]
        local = KnowledgeIndex.build(tasker, minilm).meaning_scales()
        assert local is not None
        _close(_measure(await _corpus(pg_url, collection)), local(None))

    async def test_a_lookup_reads_only_the_texts_it_is_asked(self, stores: str, tasker: list[Chunk]) -> None:
        """A replica asks for the headings of the scopes it measures, never the whole table (every tenant's)."""
        from ragloop.retrievers.postgres._meaning import StoredHeadings

        kept = await _kept(stores, "meaning_both")
        assert len(kept) > 48  # the manual's headings and the sample's, from both tenants' syncs
        lookup = StoredHeadings(stores, "meaning_both_headings", 384)
        asked = [tasker[0].title, "a heading nobody wrote"]
        got = await anyio.to_thread.run_sync(lookup, asked)
        assert set(got) == {tasker[0].title} and got[tasker[0].title].shape == (384,)

    def test_a_database_error_finds_nothing_and_logs_without_the_password(self, monkeypatch: Any) -> None:
        """Any error but a missing table is logged (the URL's password hidden) and the texts are embedded."""
        import psycopg

        from ragloop.retrievers.postgres import _meaning

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise psycopg.OperationalError("connection to postgresql://u:s3cret@db/x failed: permission denied")

        monkeypatch.setattr(psycopg, "connect", refused)
        lookup = _meaning.StoredHeadings(
            "postgresql://u:s3cret@db/x", "t_headings", 384, lambda m: m.replace("s3cret", "***")
        )
        with capture_logs() as logs:
            assert lookup(["Billing"]) == {}
        assert [e["event"] for e in logs] == ["heading_vectors_unread"]
        assert "s3cret" not in str(logs)

    async def test_two_tenants_synced_at_once_both_land_and_nothing_fails(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """Two scopes' syncs at once (each keeps headings after its rows land): both land, neither logs a failure,
        and every kept row is a heading the collection has."""
        sample = ingest_path(SAMPLE_KB).chunks
        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.open()
        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                for chunks, scope in ((tasker, ACME), (sample, GLOBEX)):

                    async def one(chunks: list[Chunk] = chunks, scope: dict[str, str] = scope) -> None:
                        async with PostgresStore(pg_url, minilm, collection=collection) as store:
                            await store.sync(chunks, scope=scope)

                    tg.start_soon(one)
        assert not [e for e in logs if e["log_level"] in ("warning", "error")]
        corpus = await _corpus(pg_url, collection)
        assert len(corpus) == len(tasker) + len(sample)
        titles = {" ".join(h.split()) for c in [*tasker, *sample] for h in (c.title, *c.title_path)}
        assert await _kept(pg_url, collection) <= titles

    async def test_a_sync_that_changes_nothing_leaves_them_unless_none_are_kept(
        self, pg_url: str, collection: str, minilm: MiniLMEmbedder, tasker: list[Chunk]
    ) -> None:
        """A repeated sync of the same pages reads no headings (a row removed by hand stays away); over a
        collection that keeps none (written before the table), the same sync keeps them."""
        import psycopg

        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker)
        full = await _kept(pg_url, collection)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"delete from {collection}_headings where heading = %s", (tasker[0].title,))
        counting = _Counting(minilm)
        async with PostgresStore(pg_url, counting, collection=collection) as store:  # type: ignore[arg-type]
            summary = await store.sync(tasker)
        assert summary.unchanged == len({c.doc_id for c in tasker}) and counting.embedded == []
        assert await _kept(pg_url, collection) == full - {tasker[0].title}
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"delete from {collection}_headings")
        async with PostgresStore(pg_url, minilm, collection=collection) as store:
            await store.sync(tasker)
        assert await _kept(pg_url, collection) == full
