"""Session stores: the history caps, LRU eviction, and the SQLite and Postgres stores behind the same protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
        await store.append("a", [Message("user", "1")])
        await store.append("b", [Message("user", "2")])
        await store.load("a")
        await store.append("c", [Message("user", "3")])
        assert await store.load("b") == ()
        assert await store.load("a") == (Message("user", "1"),)
        assert len(store) == 2


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
            assert await store.load(sid) == ()
            for i in range(3):
                await store.append(sid, [Message("user", f"q{i} ü\n"), Message("assistant", f"a{i}")])
            kept = await store.load(sid)
            assert [m.content for m in kept] == ["q1 ü\n", "a1", "q2 ü\n", "a2"]

            async def add(target: SessionStore, i: int) -> None:
                await target.append(sid + "-c", [Message("user", str(i))])

            async with anyio.create_task_group() as tg:  # concurrent appends lose nothing
                for i in range(4):
                    tg.start_soon(add, store, i)
            assert sorted(m.content for m in await store.load(sid + "-c")) == ["0", "1", "2", "3"]
        async for store in open_store():  # a new connection sees what the old one wrote
            assert len(await store.load(sid)) == 4


class TestSQLiteStore(_Shared):
    async def test_sqlite_store(self, tmp_path: Path) -> None:
        """SQLite: capped history, concurrent appends, persistence across reopen."""
        await self.check(lambda: _sqlite(tmp_path), "s1")


class TestPostgresStore(_Shared):
    async def test_postgres_store(self, pg_url: str) -> None:
        """Postgres (a real server): capped history, concurrent appends, persistence across pools."""
        await self.check(lambda: _postgres(pg_url), "s1")


async def test_a_postgres_session_store_that_is_down_fails_fast() -> None:
    """No server behind the URL: load raises within wait_s (the app then answers without history), not 30 s."""
    pytest.importorskip("psycopg_pool")
    store = PostgresSessionStore("postgresql://u:hunter2@127.0.0.1:1/db", wait_s=0.5)
    try:
        with anyio.fail_after(10):
            with pytest.raises(Exception, match=r"0\.50 sec"):
                await store.load("s1")
    finally:
        await store.aclose()
