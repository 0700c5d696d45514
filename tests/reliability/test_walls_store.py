"""The store repairs itself and says what is wrong (issue 20, item 7, and the store outage of item 5).

Against a real PostgreSQL 16 + pgvector (``pgserver``):

- a bulk load killed (SIGKILL) after it dropped the HNSW index left the collection without it for good (every
  search a sequential scan); a re-run of the same ``ragloop index`` recreates it, and a dropped GIN index too;
- ``ragloop doctor --store URL [--collection C]`` reports the schema version, the embedder, row counts per
  scope and missing indexes, and exits 1 when something needs doing;
- a schema row missing with a different embedder was a raw ``psycopg`` traceback; every schema or embedder
  mismatch is now one line that says what to do;
- with the database down, a search raised a generic error after 60 s (two 30 s pool waits), longer than any
  turn's deadline, so the turn said "I couldn't find anything"; now it fails within seconds with
  :class:`~ragloop.errors.StoreUnavailable` (a ``RetrievalError``), which the turn records, and works again
  once the database is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from ragloop.cli import main
from ragloop.errors import IndexError_, RetrievalError
from ragloop.retrievers.embed import HashEmbedder
from ragloop.state import Chunk
from tests.reliability._pg import tenant_folders

psycopg = pytest.importorskip("psycopg")
pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[2]


def _indexes(url: str, collection: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("select indexname from pg_indexes where tablename like %s", (f"{collection}\\_%",))
        return {r[0] for r in rows.fetchall()}


def _big_folder(root: Path, files: int = 400) -> Path:
    root.mkdir()
    for i in range(files):
        sections = "\n\n".join(
            f"## Part {j}\n\nDocument {i} part {j} talks about topic{i % 37} and item{j}." for j in range(4)
        )
        (root / f"doc{i:04}.md").write_text(f"# Document {i}\n\n{sections}\n")
    return root


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line on stderr (besides progress bars and notes), with no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


class TestSelfRepair:
    def test_a_killed_bulk_load_gets_its_hnsw_index_back_on_the_next_run(
        self, tmp_path: Path, pg_url: str, collection: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """SIGKILL `ragloop index` once it has dropped the HNSW index for a bulk load; the re-run recreates it."""
        folder = _big_folder(tmp_path / "docs")
        emb = f"{collection}_chunks_emb"
        argv = ["index", str(folder), "--store", pg_url, "--collection", collection, "--embedder", "hash"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        proc = subprocess.Popen([sys.executable, "-m", "ragloop.cli", *argv], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            seen = False
            while time.monotonic() < deadline and proc.poll() is None:
                names = _indexes(pg_url, collection)
                seen = seen or emb in names
                if seen and emb not in names:  # dropped for the bulk load: kill it now
                    break
                time.sleep(0.01)
            assert proc.poll() is None, "the load finished before it could be killed; make the folder larger"
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert emb not in _indexes(pg_url, collection)
        assert main(["doctor", "--store", pg_url, "--collection", collection]) == 1
        report = capsys.readouterr().out
        assert "missing index" in report and emb in report, report
        assert main(argv) == 0
        assert emb in _indexes(pg_url, collection)
        assert "recreated" in capsys.readouterr().out

    def test_a_dropped_gin_index_is_recreated_and_search_still_works_meanwhile(
        self, pg_url: str, collection: str
    ) -> None:
        """Without its tsv and metadata GIN indexes a collection still answers; the next writer recreates both."""
        from ragloop.retrievers.postgres import PostgresStore

        chunks = [Chunk(id=f"c{i}", text=f"page {i} about webhooks {i}", doc_id=f"d{i}.md") for i in range(5)]

        async def go() -> None:
            async with PostgresStore(pg_url, HashEmbedder(32), collection=collection) as store:
                await store.sync(chunks)
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(f"drop index {collection}_chunks_tsv")
                conn.execute(f"drop index {collection}_chunks_meta")
            async with PostgresStore(pg_url, collection=collection, create=False) as reader:
                assert await reader.search("webhooks", 3)
                assert set(reader.missing_indexes) == {f"{collection}_chunks_tsv", f"{collection}_chunks_meta"}
            async with PostgresStore(pg_url, HashEmbedder(32), collection=collection) as writer:
                assert set(writer.repaired) == {
                    f"recreated index {collection}_chunks_tsv",
                    f"recreated index {collection}_chunks_meta",
                }

        anyio.run(go)
        assert {f"{collection}_chunks_tsv", f"{collection}_chunks_meta"} <= _indexes(pg_url, collection)


class TestDoctor:
    def test_a_healthy_collection_reports_version_embedder_and_counts_per_scope(
        self, tmp_path: Path, pg_url: str, collection: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Two tenants indexed: doctor prints schema version, embedder, 34 documents, 17 per scope; exit 0."""
        from ragloop.retrievers.postgres import SCHEMA_VERSION

        acme, globex = tenant_folders(tmp_path)
        for folder, tenant in ((acme, "acme"), (globex, "globex")):
            argv = ["index", str(folder), "--store", pg_url, "--collection", collection, "--embedder", "hash",
                    "--meta", f"tenant={tenant}"]  # fmt: skip
            assert main(argv) == 0
        capsys.readouterr()
        assert main(["doctor", "--store", pg_url, "--collection", collection, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        (found,) = report["collections"]
        assert found["name"] == collection and found["schema_version"] == SCHEMA_VERSION
        assert found["embedder"] == HashEmbedder().name and found["documents"] == 34 and found["missing_indexes"] == []
        assert {s["scope"]: s["documents"] for s in found["scopes"]} == {"tenant=acme": 17, "tenant=globex": 17}
        assert found["heading_vectors"] == 0  # the hash embedder has no meaning: none kept, the table exists
        assert main(["doctor", "--store", pg_url, "--collection", collection]) == 0
        text = capsys.readouterr().out
        assert HashEmbedder().name in text and "tenant=acme: 17 documents" in text, text

    def test_doctor_on_an_unknown_collection_or_a_dead_server_is_one_line(
        self, pg_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An unknown collection names the fix; a server that is not there is one line, exit 2."""
        assert main(["doctor", "--store", pg_url, "--collection", "nosuchcollection"]) == 1
        assert "no collection 'nosuchcollection'" in capsys.readouterr().out
        assert main(["doctor", "--store", "postgresql://u:hunter2@127.0.0.1:1/db"]) == 2
        err = _err_line(capsys)
        assert "cannot connect" in err and "hunter2" not in err


class TestSchemaMismatch:
    def test_a_missing_schema_row_with_another_embedder_is_one_line(
        self, tmp_path: Path, pg_url: str, collection: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """ragloop_schema's row deleted, then `index --embedder` of another dimension: one line naming the fix."""
        acme, _ = tenant_folders(tmp_path)
        base = ["index", str(acme), "--store", pg_url, "--collection", collection]
        assert main([*base, "--embedder", "hash"]) == 0
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("delete from ragloop_schema where collection = %s", (collection,))

        async def go() -> None:
            from ragloop.retrievers.postgres import PostgresStore

            with pytest.raises(IndexError_, match=r"vector\(512\).*ragloop_schema"):
                async with PostgresStore(pg_url, HashEmbedder(128), collection=collection) as store:
                    await store.sync([Chunk(id="x", text="x", doc_id="x.md")])
            with pytest.raises(IndexError_, match="no row in ragloop_schema"):
                async with PostgresStore(pg_url, collection=collection, create=False):
                    pass

        anyio.run(go)
        capsys.readouterr()
        assert main(["search", "--store", pg_url, "--collection", collection, "api key"]) == 2
        assert "ragloop_schema" in _err_line(capsys)
        assert main([*base, "--embedder", "hash"]) == 0  # the same embedder records the row again
        assert "0 added" in capsys.readouterr().out

    async def test_a_newer_schema_version_is_one_line(self, pg_url: str, collection: str) -> None:
        """A collection written by a newer ragloop: refused, naming both versions and the fix."""
        from ragloop.retrievers.postgres import PostgresStore

        async with PostgresStore(pg_url, HashEmbedder(32), collection=collection):
            pass
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("update ragloop_schema set version = 99 where collection = %s", (collection,))
        with pytest.raises(IndexError_, match=r"schema version 99.*upgrade ragloop"):
            async with PostgresStore(pg_url, HashEmbedder(32), collection=collection):
                pass

    async def test_a_version_2_collection_is_upgraded_in_place_by_a_writer(self, pg_url: str, collection: str) -> None:
        """A collection in the version-2 layout keeps its documents: a reader asks for the upgrade, a writer does it."""
        from ragloop.retrievers.postgres import SCHEMA_VERSION, PostgresStore

        chunks = [Chunk(id=f"c{i}", text=f"page {i} about invoices {i}", doc_id=f"d{i}.md") for i in range(4)]
        async with PostgresStore(pg_url, HashEmbedder(32), collection=collection) as store:
            await store.sync(chunks)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:  # back to version 2
            t = collection
            await conn.execute(f"drop table {t}_keys")
            await conn.execute(f"alter table {t}_docs drop constraint {t}_docs_pkey")
            await conn.execute(f"alter table {t}_docs drop column scope")
            await conn.execute(f"alter table {t}_docs add primary key (doc_id)")
            await conn.execute(f"alter table {t}_chunks drop column scope")
            await conn.execute("update ragloop_schema set version = 2 where collection = %s", (collection,))
        with pytest.raises(IndexError_, match=r"schema version 2.*ragloop index"):
            async with PostgresStore(pg_url, collection=collection, create=False):
                pass
        from ragloop.retrievers.postgres import diagnose_store

        (old,) = (await diagnose_store(pg_url, collection)).collections
        assert old.schema_version == 2 and old.documents == 4 and "upgrade it in place" in old.problems[0]
        async with PostgresStore(pg_url, HashEmbedder(32), collection=collection) as store:
            summary = await store.sync(chunks)
            assert (summary.added, summary.unchanged) == (0, 4)
            assert [h.chunk.doc_id for h in await store.search("invoices 2", 1)] == ["d2.md"]
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            row = await (
                await conn.execute("select version from ragloop_schema where collection = %s", (collection,))
            ).fetchone()
        assert row == (SCHEMA_VERSION,)

    def test_an_upgraded_tenant_collection_is_taken_over_by_its_tenant_not_copied(
        self, tmp_path: Path, pg_url: str, collection: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """acme indexed with --meta tenant=acme before scopes (version 2, so no scope): the next acme run moves
        its 17 documents into scope tenant=acme instead of storing a second copy; nothing else moves."""
        acme, _ = tenant_folders(tmp_path)
        argv = ["index", str(acme), "--store", pg_url, "--collection", collection, "--embedder", "hash"]
        assert main([*argv, "--meta", "tenant=acme"]) == 0
        shared = tmp_path / "shared"
        shared.mkdir()
        (shared / "shared.md").write_text("# Shared\n\nFor every tenant.\n")
        assert main(["index", str(shared), *argv[2:]]) == 0
        with psycopg.connect(pg_url, autocommit=True) as conn:  # what a version-2 collection upgraded looks like
            for table in ("chunks", "docs"):
                conn.execute(f"update {collection}_{table} set scope = ''")
            for table in ("chunks", "postings"):
                conn.execute(f"update {collection}_{table} set chunk_id = split_part(chunk_id, '~', 1)")
        capsys.readouterr()
        assert main([*argv, "--meta", "tenant=acme", "--dry-run"]) == 0
        assert "17 of them indexed before scopes" in capsys.readouterr().out
        assert main([*argv, "--meta", "tenant=acme", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (summary["added"], summary["adopted"], summary["embedded"]) == (17, 17, 0)
        with psycopg.connect(pg_url) as conn:
            per_scope = dict(conn.execute(f"select scope, count(*) from {collection}_docs group by 1").fetchall())
        assert per_scope == {"": 1, '{"tenant":"acme"}': 17}


class TestStoreDown:
    def test_a_search_with_the_database_down_fails_fast_with_a_store_error(
        self, pg_server: Any, pg_url: str, collection: str
    ) -> None:
        """Server stopped: search raises StoreUnavailable within seconds (was 60 s); a turn records it; once the
        server is back, the same store searches again."""
        import pgserver

        from ragloop.chat import ChatRAG
        from ragloop.errors import StoreUnavailable
        from ragloop.retrievers.postgres import PostgresStore

        chunks = [Chunk(id=f"c{i}", text=f"how to rotate api key {i}", doc_id=f"d{i}.md") for i in range(5)]

        def pg_ctl(*args: str) -> None:
            pgserver.pg_ctl(["-w", *args], pgdata=pg_server.pgdata, user=pg_server.system_user)

        async def go() -> None:
            async with PostgresStore(pg_url, HashEmbedder(32), collection=collection) as store:
                await store.sync(chunks)
            rag = await anyio.to_thread.run_sync(lambda: ChatRAG.from_store(pg_url, collection=collection))
            store = rag.store
            assert store is not None
            try:
                assert await store.search("rotate api key", 3)
                await anyio.to_thread.run_sync(lambda: pg_ctl("-m", "fast", "stop"))
                try:
                    for _ in range(2):  # the first failure and the ones after it: all fast
                        started = time.perf_counter()
                        with pytest.raises(StoreUnavailable, match="unreachable") as caught:
                            await store.search("rotate api key", 3)
                        assert time.perf_counter() - started < 4.0
                        assert isinstance(caught.value, RetrievalError)
                    with pytest.raises(StoreUnavailable):
                        await store.ping()  # what /readyz asks
                    reply = await rag.ask("How do I rotate an API key?")
                    assert "unreachable" in json.dumps(reply.record.as_dict())
                finally:
                    await anyio.to_thread.run_sync(pg_server.ensure_postgres_running)
                with anyio.fail_after(30):
                    while True:
                        try:
                            assert await store.search("rotate api key", 3)
                            await store.ping()
                            break
                        except StoreUnavailable:
                            await anyio.sleep(0.2)
            finally:
                await rag.aclose()

        anyio.run(go)

    async def test_a_busy_pool_is_not_an_outage(self, pg_url: str, collection: str) -> None:
        """pool_size=1 held by a 1.5 s statement: a search waits past the first second (the probe finds the
        server up) and then runs; it is never reported as StoreUnavailable."""
        from ragloop.retrievers.postgres import PostgresStore

        chunks = [Chunk(id=f"c{i}", text=f"how to rotate api key {i}", doc_id=f"d{i}.md") for i in range(3)]
        async with PostgresStore(
            pg_url, HashEmbedder(32), collection=collection, pool_size=1, statement_timeout_s=4
        ) as store:
            await store.sync(chunks)
            found: list[Any] = []

            async def hold(conn: Any) -> None:
                await conn.execute("select pg_sleep(1.5)")

            async def search() -> None:
                await anyio.sleep(0.1)  # after hold took the only connection
                found.extend(await store.search("rotate api key", 3))

            async with anyio.create_task_group() as tg:
                tg.start_soon(store._run, hold)
                tg.start_soon(search)
        assert found


_BUSY = iter(range(10_000))


class TestStoreBusy:
    """A pool that is exhausted while its server answers is *busy*: the search waits for a connection within its
    caller's deadline, then raises StoreBusy; it is never StoreUnavailable (issue 35: under a fleet's load the
    survivor's clients were told the knowledge base was unavailable)."""

    @staticmethod
    async def _store(url: str, collection: str, **kw: Any) -> Any:
        from ragloop.retrievers.postgres import PostgresStore

        store = PostgresStore(url, HashEmbedder(32), collection=collection, **kw)
        chunks = [Chunk(id=f"c{i}", text=f"how to rotate api key {i}", doc_id=f"d{i}.md") for i in range(3)]
        await store.sync(chunks)
        assert await store.search("rotate api key", 3)  # the pool is open, its one connection idle
        return store

    async def test_a_search_waits_for_a_busy_pool_up_to_its_callers_deadline(
        self, pg_url: str, collection: str
    ) -> None:
        """pool_size=1 held by the test for 2.5 s, statement_timeout_s=1, the caller's deadline 30 s: the search
        waits and is answered (before: RetrievalError 'no free connection' after the 1 s statement timeout)."""
        store = await self._store(pg_url, collection, pool_size=1, statement_timeout_s=1)
        found: list[Any] = []
        try:
            taken, release = anyio.Event(), anyio.Event()

            async def hold() -> None:
                async with store._conn.pool.connection():
                    taken.set()
                    await release.wait()

            async def search() -> None:
                with anyio.fail_after(30):
                    found.extend(await store.search("rotate api key", 3))

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await taken.wait()
                tg.start_soon(search)
                await anyio.sleep(2.5)  # past the statement timeout and the first wait
                assert not found
                release.set()
        finally:
            await store.aclose()
        assert found

    async def test_a_pool_held_past_the_deadline_is_store_busy_never_unavailable(
        self, pg_url: str, collection: str
    ) -> None:
        """The only connection held for good: a search under a 3 s deadline raises StoreBusy (a RetrievalError
        naming the pool and what to do) before the deadline cancels it; never StoreUnavailable or a timeout."""
        from ragloop.errors import StoreBusy, StoreUnavailable

        store = await self._store(pg_url, collection, pool_size=1, statement_timeout_s=10)
        try:
            taken, release = anyio.Event(), anyio.Event()

            async def hold() -> None:
                async with store._conn.pool.connection():
                    taken.set()
                    await release.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await taken.wait()
                try:
                    with anyio.fail_after(3.0), pytest.raises(StoreBusy, match="all 1 busy") as caught:
                        await store.search("rotate api key", 3)
                finally:
                    release.set()
            assert not isinstance(caught.value, StoreUnavailable)
            assert isinstance(caught.value, RetrievalError) and "pool_size" in str(caught.value)
            assert await store.search("rotate api key", 3)  # released: it searches again
        finally:
            await store.aclose()

    async def test_a_server_at_its_connection_limit_is_busy_not_down(self, pg_url: str) -> None:
        """A role limited to one connection, its pool's one connection held: the pool cannot grow and the probe
        is refused 'too many connections' — the server answered, so the search waits and is answered once the
        connection is free (before: StoreUnavailable after the first second)."""
        import psycopg

        from tests.reliability.test_walls_serve import _with_database

        n = f"{os.getpid()}_{next(_BUSY)}"
        role, name = f"busy_role_{n}", f"busy_db_{n}"
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"create role {role} login")
            await conn.execute(f"create database {name} owner {role}")
        url = _with_database(pg_url, name)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("create extension if not exists vector")
        parts = urlsplit(url)  # pgserver: postgresql://postgres:@/db?host=/socket
        user_url = urlunsplit((parts.scheme, f"{role}:@{parts.netloc.rpartition('@')[2]}", *parts[2:]))
        try:
            store = await self._store(user_url, "kb", pool_size=2, statement_timeout_s=10)
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute(f"alter role {role} connection limit 1")  # the pool's one connection is it
            found: list[Any] = []
            try:
                taken, release = anyio.Event(), anyio.Event()

                async def hold() -> None:
                    async with store._conn.pool.connection():
                        taken.set()
                        await release.wait()

                async def search() -> None:
                    with anyio.fail_after(30):
                        found.extend(await store.search("rotate api key", 3))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(hold)
                    await taken.wait()
                    tg.start_soon(search)
                    await anyio.sleep(2.5)  # past the first wait: the probe was refused at the limit
                    assert not found
                    release.set()
            finally:
                await store.aclose()
            assert found
        finally:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute(f"drop database if exists {name} with (force)")
                await conn.execute(f"drop role if exists {role}")
