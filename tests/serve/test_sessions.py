"""Session stores: the history caps, LRU eviction, and the SQLite and Postgres stores behind the same protocol."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.serve import (
    MemorySessionStore,
    PostgresSessionStore,
    SessionLimits,
    SessionStore,
    SQLiteSessionStore,
)
from ragloop.state import Message

pytestmark = pytest.mark.anyio

messages = st.lists(st.builds(Message, st.sampled_from(["user", "assistant"]), st.text(max_size=30)), max_size=30)


class TestSessionLimits:
    @given(messages, st.integers(0, 12), st.integers(0, 200))
    def test_cap_keeps_the_newest_suffix_within_both_limits(
        self, history: list[Message], max_messages: int, max_chars: int
    ) -> None:
        """The capped history is a suffix of the input, within both caps, and as long as the caps allow."""
        kept = SessionLimits(max_messages=max_messages, max_chars=max_chars).cap(history)
        assert len(kept) <= max_messages
        assert sum(len(m.content) for m in kept) <= max_chars
        assert tuple(history[len(history) - len(kept) :]) == kept
        if len(kept) < min(len(history), max_messages):  # stopped early: the next older one would not fit
            older = history[len(history) - len(kept) - 1]
            assert sum(len(m.content) for m in kept) + len(older.content) > max_chars


class TestMemoryStore:
    async def test_least_recently_used_session_is_evicted(self) -> None:
        """Over max_sessions, the session used longest ago goes first; reading a session renews it."""
        store = MemorySessionStore(max_sessions=2)
        for sid in ("a", "b"):
            await store.create("u", sid)
            await store.append("u", sid, [Message("user", sid)])
        await store.load("u", "a")
        await store.create("u", "c")
        assert await store.load("u", "b") is None
        assert await store.load("u", "a") == (Message("user", "a"),)
        assert len(store) == 2

    async def test_owners_and_ids_together_find_a_session(self) -> None:
        """Memory: the owner isolation every store shares."""
        await _isolation(MemorySessionStore())


async def _isolation(store: SessionStore) -> None:
    """One owner's id is another owner's unknown id: no read, no append, no create clash; append never creates."""
    assert await store.create("alice", "s1") is True
    assert await store.create("alice", "s1") is False
    assert await store.append("alice", "s1", [Message("user", "alice's secret")]) is True
    assert await store.load("bob", "s1") is None
    assert await store.append("bob", "s1", [Message("user", "injected")]) is False
    assert await store.load("alice", "s1") == (Message("user", "alice's secret"),)
    assert await store.create("bob", "s1") is True  # bob's own session of that name: a different one
    assert await store.load("bob", "s1") == ()
    assert await store.load("alice", "s1") == (Message("user", "alice's secret"),)
    assert await store.append("alice", "never-made", [Message("user", "x")]) is False
    assert await store.load("alice", "never-made") is None
    await store.ping()


async def _sqlite(tmp_path: Path) -> AsyncIterator[SessionStore]:
    store = SQLiteSessionStore(tmp_path / "sessions.sqlite", limits=SessionLimits(max_messages=4, max_chars=1000))
    yield store
    await store.aclose()


async def _postgres(url: str) -> AsyncIterator[SessionStore]:
    store = PostgresSessionStore(url, limits=SessionLimits(max_messages=4, max_chars=1000))
    yield store
    await store.aclose()


class _Shared:
    """The behaviour every store shares (run against SQLite and Postgres)."""

    async def check(self, open_store: Callable[[], AsyncIterator[SessionStore]], sid: str) -> None:
        async for store in open_store():
            assert isinstance(store, SessionStore)
            assert await store.load("u", sid) is None
            assert await store.create("u", sid)
            assert await store.load("u", sid) == ()
            for i in range(3):
                await store.append("u", sid, [Message("user", f"q{i} ü\n"), Message("assistant", f"a{i}")])
            kept = await store.load("u", sid)
            assert kept is not None and [m.content for m in kept] == ["q1 ü\n", "a1", "q2 ü\n", "a2"]

            async def add(target: SessionStore, i: int) -> None:
                await target.append("u", sid + "-c", [Message("user", str(i))])

            await store.create("u", sid + "-c")
            async with anyio.create_task_group() as tg:  # concurrent appends lose nothing
                for i in range(4):
                    tg.start_soon(add, store, i)
            many = await store.load("u", sid + "-c")
            assert many is not None and sorted(m.content for m in many) == ["0", "1", "2", "3"]
            await _isolation(store)
        async for store in open_store():  # a new connection sees what the old one wrote
            again = await store.load("u", sid)
            assert again is not None and len(again) == 4


class TestSQLiteStore(_Shared):
    async def test_sqlite_store(self, tmp_path: Path) -> None:
        """SQLite: capped history, concurrent appends, owner isolation, persistence across reopen."""
        await self.check(lambda: _sqlite(tmp_path), "s1")

    def test_an_empty_table_of_an_older_ragloop_is_migrated(self, tmp_path: Path) -> None:
        """The old ragloop_sessions (id the only key, no owner) with no rows becomes the owned table."""
        path = tmp_path / "old.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute(_OLD_SQLITE)
        store = SQLiteSessionStore(path)
        try:
            assert anyio.run(store.create, "alice", "s1") is True
        finally:
            anyio.run(store.aclose)

    def test_an_older_table_with_sessions_is_refused_and_left_as_it_was(self, tmp_path: Path) -> None:
        """Sessions without owners: one line that says what to do; the table and its rows are untouched."""
        path = tmp_path / "old.sqlite"
        with sqlite3.connect(path) as conn:
            conn.execute(_OLD_SQLITE)
            conn.execute("insert into ragloop_sessions values ('s1', '[[\"user\", \"hi\"]]', 0)")
        with pytest.raises(ConfigError, match=r"1 session\(s\) have no owner.*Nothing was changed.*rename to"):
            SQLiteSessionStore(path)
        with sqlite3.connect(path) as conn:
            assert conn.execute("select id, messages from ragloop_sessions").fetchall() == [("s1", '[["user", "hi"]]')]


_OLD_SQLITE = "create table ragloop_sessions (id text primary key, messages text not null, updated real not null)"
_OLD_PG = (
    "create table ragloop_sessions "
    "(id text primary key, messages jsonb not null, updated timestamptz not null default now())"
)


class TestPostgresStore(_Shared):
    async def test_postgres_store(self, pg_url: str) -> None:
        """Postgres (a real server): capped history, concurrent appends, owner isolation, persistence."""
        await _pg_drop(pg_url)
        await self.check(lambda: _postgres(pg_url), "s1")

    async def test_an_older_table_is_migrated_when_empty_and_refused_with_sessions(self, pg_url: str) -> None:
        """Old table with a row: refused (ConfigError, row kept); emptied: migrated to the owned table."""
        import psycopg

        await _pg_drop(pg_url)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(_OLD_PG)
            await conn.execute("""insert into ragloop_sessions (id, messages) values ('s1', '[["user", "hi"]]')""")
        store = PostgresSessionStore(pg_url, wait_s=5)
        try:
            with pytest.raises(ConfigError, match=r"1 session\(s\) have no owner.*Nothing was changed"):
                await store.ping()
        finally:
            await store.aclose()
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            rows = await (await conn.execute("select id from ragloop_sessions")).fetchall()
            assert rows == [("s1",)]
            await conn.execute("delete from ragloop_sessions")
        store = PostgresSessionStore(pg_url, wait_s=5)
        try:
            assert await store.create("alice", "s1") is True
            assert await store.load("bob", "s1") is None
        finally:
            await store.aclose()
        await _pg_drop(pg_url)


async def _pg_drop(url: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("drop table if exists ragloop_sessions")


async def test_a_postgres_session_store_that_is_down_fails_fast() -> None:
    """No server behind the URL: load raises within wait_s (the app then answers without history), not 30 s."""
    pytest.importorskip("psycopg_pool")
    store = PostgresSessionStore("postgresql://u:hunter2@127.0.0.1:1/db", wait_s=0.5)
    try:
        with anyio.fail_after(10):
            with pytest.raises(Exception, match=r"0\.50 sec"):
                await store.load("u", "s1")
    finally:
        await store.aclose()
