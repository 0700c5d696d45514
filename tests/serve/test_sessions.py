"""Session stores: the history caps, per-owner quotas and idle expiry, and the SQLite and Postgres stores."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.serve import (
    MemorySessionStore,
    PostgresSessionStore,
    SessionLimits,
    SessionQuota,
    SessionsFull,
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
    async def test_over_its_cap_an_owner_loses_its_own_least_recently_used_session(self) -> None:
        """Over quota.per_owner, the owner's session used longest ago goes first; reading one renews it."""
        store = MemorySessionStore(quota=SessionQuota(per_owner=2))
        for sid in ("a", "b"):
            await store.create("u", sid)
            await store.append("u", sid, [Message("user", sid)])
        await store.load("u", "a")
        await store.create("u", "c")
        assert await store.load("u", "b") is None
        assert await store.load("u", "a") == (Message("user", "a"),)
        assert len(store) == 2 and store.counts.get("sessions", "evicted") == 1

    async def test_one_owner_flooding_the_default_store_never_evicts_another_owners_session(self) -> None:
        """With the default settings, 10,001 sessions of one key (past the old global cap) leave another key's
        conversation intact; the flooder keeps only its own newest 1,000."""
        store = MemorySessionStore()
        await store.create("bob", "mine")
        await store.append("bob", "mine", [Message("user", "bob's question")])
        for i in range(10_001):
            await store.create("mallory", f"s{i}")
        assert await store.load("bob", "mine") == (Message("user", "bob's question"),)
        assert store.sessions_of("mallory") == 1_000 and await store.load("mallory", "s10000") == ()
        assert await store.load("mallory", "s0") is None

    async def test_a_full_store_refuses_a_new_session_and_drops_no_one(self) -> None:
        """At quota.total, create raises SessionsFull (the API's 429); every kept session stays readable."""
        store = MemorySessionStore(quota=SessionQuota(per_owner=5, total=3))
        for owner in ("a", "b", "c"):
            await store.create(owner, "s")
        with pytest.raises(SessionsFull, match="3 conversations"):
            await store.create("d", "s")
        assert [await store.load(o, "s") for o in "abc"] == [(), (), ()]
        assert store.counts.get("sessions", "refused") == 1

    async def test_an_idle_session_is_gone_and_frees_its_room(self) -> None:
        """A session unused for idle_s reads as unknown, cannot be appended to, and no longer counts."""
        now = [0.0]
        store = MemorySessionStore(quota=SessionQuota(per_owner=2, idle_s=60, total=2), clock=lambda: now[0])
        await store.create("a", "old")
        now[0] = 30.0
        await store.create("b", "fresh")
        now[0] = 61.0
        assert await store.load("a", "old") is None
        assert await store.append("a", "old", [Message("user", "x")]) is False
        assert await store.create("c", "new") is True  # the idle one's room, not b's
        assert await store.load("b", "fresh") == () and len(store) == 2
        assert store.counts.get("sessions", "expired") == 1

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 6), st.booleans()), max_size=60))
    def test_a_create_never_takes_another_owners_session(self, ops: list[tuple[str, int, bool]]) -> None:
        """Any sequence of creates and loads: each owner within its cap, the store within its total, and a
        session disappears only by its own owner's create (or the store refuses)."""
        quota = SessionQuota(per_owner=3, total=7)

        async def run() -> None:
            store = MemorySessionStore(quota=quota)
            held: dict[str, set[str]] = {o: set() for o in "abc"}
            for owner, n, create in ops:
                sid = f"s{n}"
                if create:
                    try:
                        await store.create(owner, sid)
                    except SessionsFull:
                        assert len(store) == quota.total
                        continue
                    held[owner].add(sid)
                elif await store.load(owner, sid) is None:
                    held[owner].discard(sid)
                for other, sids in held.items():
                    alive = {x for x in sids if await store.load(other, x) is not None}
                    if other != owner or not create:
                        assert alive == sids, "a session vanished without its owner starting one"
                    held[other] = alive
                    assert store.sessions_of(other) <= quota.per_owner
                assert len(store) <= quota.total

        anyio.run(run)

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


_QUOTA = SessionQuota(per_owner=3, idle_s=3_600, total=6)


async def _quotas(store: SessionStore, sql: Callable[[str], Awaitable[list[tuple[Any, ...]]]]) -> None:
    """The per-owner cap, the total and idle expiry, checked against the rows of the real table (``sql``)."""
    await store.create("bob", "b1")
    await store.append("bob", "b1", [Message("user", "bob's question")])
    for i in range(5):  # alice over her cap of 3: her own two oldest go
        assert await store.create("alice", f"a{i}") is True
    assert await store.load("bob", "b1") == (Message("user", "bob's question"),)
    assert [await store.load("alice", f"a{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert await sql("select owner, count(*) from ragloop_sessions group by owner order by owner") == [
        ("alice", 3),
        ("bob", 1),
    ]
    await store.create("carol", "c0")
    await store.create("carol", "c1")  # 6 in all: the total
    with pytest.raises(SessionsFull):
        await store.create("dave", "d0")
    assert await store.load("bob", "b1") is not None and await store.load("carol", "c0") == ()
    await sql("update ragloop_sessions set updated = {two_hours_ago} where owner = 'bob'")
    assert await store.load("bob", "b1") is None  # idle past idle_s: gone before its row is
    assert await store.append("bob", "b1", [Message("user", "late")]) is False
    assert await store.create("dave", "d0") is True  # bob's idle row is deleted and makes the room
    owners = await sql("select owner from ragloop_sessions order by owner")
    assert [o for (o,) in owners] == ["alice"] * 3 + ["carol"] * 2 + ["dave"]
    counts = store.counts  # type: ignore[attr-defined]
    assert (counts.get("sessions", "evicted"), counts.get("sessions", "refused")) == (2, 1)
    assert counts.get("sessions", "expired") == 1


class TestSQLiteStore(_Shared):
    async def test_sqlite_store(self, tmp_path: Path) -> None:
        """SQLite: capped history, concurrent appends, owner isolation, persistence across reopen."""
        await self.check(lambda: _sqlite(tmp_path), "s1")

    async def test_quotas_per_owner_and_in_all_and_idle_rows_deleted(self, tmp_path: Path) -> None:
        """SQLite: an owner over its cap loses its own oldest rows, never another's; a full table refuses;
        an idle session's row is deleted."""
        path = tmp_path / "q.sqlite"
        store = SQLiteSessionStore(path, quota=_QUOTA)

        async def sql(statement: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(path) as conn:
                return conn.execute(statement.format(two_hours_ago="updated - 7200")).fetchall()

        try:
            await _quotas(store, sql)
        finally:
            await store.aclose()

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

    async def test_quotas_per_owner_and_in_all_and_idle_rows_deleted(self, pg_url: str) -> None:
        """Postgres (a real server): the same quotas as SQLite, the same rows left in the table."""
        import psycopg

        await _pg_drop(pg_url)
        store = PostgresSessionStore(pg_url, quota=_QUOTA, wait_s=5)

        async def sql(statement: str) -> list[tuple[Any, ...]]:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                cur = await conn.execute(statement.format(two_hours_ago="now() - interval '2 hours'"))  # type: ignore[arg-type]
                return await cur.fetchall() if cur.description else []

        try:
            await _quotas(store, sql)
        finally:
            await store.aclose()
            await _pg_drop(pg_url)

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


async def test_a_busy_postgres_session_store_saves_the_turn_within_the_callers_deadline(pg_url: str) -> None:
    """Every pooled connection held (the server up): an append under a deadline waits past ``wait_s`` and saves
    the turn once a connection is free (before: PoolTimeout after wait_s, and the server dropped an acknowledged
    turn); without a deadline it still fails after wait_s, as the load of a turn's history should."""
    from psycopg_pool import PoolTimeout

    from ragloop.state import Message

    store = PostgresSessionStore(pg_url, max_connections=1, wait_s=0.5)
    try:
        assert await store.create("alice", "busy-1") is True
        taken, release = anyio.Event(), anyio.Event()

        async def hold() -> None:
            async with await store._connection():
                taken.set()
                await release.wait()

        saved: list[bool] = []

        async def append() -> None:
            with anyio.fail_after(30):  # the turn's deadline
                saved.append(await store.append("alice", "busy-1", (Message("user", "q"), Message("assistant", "a"))))

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await taken.wait()
            with pytest.raises(PoolTimeout):  # no deadline: wait_s, as before
                await store.load("alice", "busy-1")
            tg.start_soon(append)
            await anyio.sleep(1.5)  # three times wait_s
            assert not saved
            release.set()
        assert saved == [True]
        history = await store.load("alice", "busy-1")
        assert history is not None and [m.content for m in history] == ["q", "a"]
    finally:
        await store.aclose()
        await _pg_drop(pg_url)


async def test_appends_queued_on_a_busy_postgres_session_store_share_one_probe(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight appends waiting on a held pool: they ask the server whether it is up one at a time, each answer
    standing for a second — not one direct connection each (the 200-client bench saw 59 connections open on a
    replica whose formula allows 23)."""
    import ragloop.retrievers.postgres._common as common
    from ragloop.state import Message

    probes: list[float] = []
    real = common.probe

    async def counting(url: str, timeout_s: float) -> None:
        probes.append(anyio.current_time())
        await real(url, timeout_s)

    monkeypatch.setattr(common, "probe", counting)
    store = PostgresSessionStore(pg_url, max_connections=1, wait_s=0.3)
    try:
        ids = [f"probe-{i}" for i in range(8)]
        for sid in ids:
            assert await store.create("alice", sid) is True
        taken, release = anyio.Event(), anyio.Event()

        async def hold() -> None:
            async with await store._connection():
                taken.set()
                await release.wait()

        async def append(sid: str) -> None:
            with anyio.fail_after(30):
                assert await store.append("alice", sid, (Message("user", "q"), Message("assistant", "a")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await taken.wait()
            started = anyio.current_time()
            for sid in ids:
                tg.start_soon(append, sid)
            await anyio.sleep(1.0)
            held_for = anyio.current_time() - started
            release.set()
        assert probes, "no append found the pool busy"
        assert len(probes) <= 1 + int(held_for), (probes, held_for)  # one per second of the hold, at most
    finally:
        await store.aclose()
        await _pg_drop(pg_url)
