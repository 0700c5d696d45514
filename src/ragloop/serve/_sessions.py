"""Server-side conversation memory: a small store protocol and three stores.

A chat client that sends a ``session_id`` (instead of the whole conversation) gets its earlier turns from
a :class:`SessionStore`. The history kept per session is capped by message count and by characters
(:class:`SessionLimits`), oldest messages dropped first, so a long conversation never grows a prompt
without bound.

- :class:`MemorySessionStore`: in-process, least-recently-used eviction; the default (one replica).
- :class:`SQLiteSessionStore`: a file on disk; survives restarts, shared by processes on one host.
- :class:`PostgresSessionStore`: for replicas behind a load balancer (``psycopg``, async).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread
from attrs import define, field, frozen

from ragloop.errors import ConfigError
from ragloop.state import Message

if TYPE_CHECKING:
    import os

__all__ = ["MemorySessionStore", "PostgresSessionStore", "SQLiteSessionStore", "SessionLimits", "SessionStore"]


@frozen
class SessionLimits:
    """How much history a session keeps.

    Attributes:
        max_messages: Most messages kept (user and assistant together), newest first.
        max_chars: Most characters kept over those messages.
    """

    max_messages: int = 20
    max_chars: int = 16_000

    def cap(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The newest messages that fit both caps, oldest first."""
        kept: list[Message] = []
        chars = 0
        for message in reversed(messages[-self.max_messages :] if self.max_messages > 0 else ()):
            chars += len(message.content)
            if chars > self.max_chars:
                break
            kept.append(message)
        return tuple(reversed(kept))


@runtime_checkable
class SessionStore(Protocol):
    """Where conversations live between requests."""

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's history, oldest first (empty for an unknown session)."""
        ...

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add messages to the session (creating it), keeping only what the limits allow."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def _encode(messages: Sequence[Message]) -> str:
    return json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)


def _decode(raw: str) -> tuple[Message, ...]:
    return tuple(Message(role, content) for role, content in json.loads(raw))


@define
class MemorySessionStore:
    """Sessions in this process's memory, least recently used evicted first.

    Attributes:
        limits: History caps per session.
        max_sessions: Sessions kept before the least recently used one is dropped.
    """

    limits: SessionLimits = SessionLimits()
    max_sessions: int = 10_000
    _data: OrderedDict[str, tuple[Message, ...]] = field(factory=OrderedDict, init=False)

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's history (and mark it recently used)."""
        history = self._data.get(session_id, ())
        if history:
            self._data.move_to_end(session_id)
        return history

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add messages, cap the history, evict the least recently used sessions over ``max_sessions``."""
        self._data[session_id] = self.limits.cap((*self._data.get(session_id, ()), *messages))
        self._data.move_to_end(session_id)
        while len(self._data) > self.max_sessions:
            self._data.popitem(last=False)

    async def aclose(self) -> None:
        """Nothing to release."""

    def __len__(self) -> int:
        return len(self._data)


class SQLiteSessionStore:
    """Sessions in a SQLite file (one row per session); calls run in a worker thread.

    Args:
        path: The database file (created with its table when missing).
        limits: History caps per session.
    """

    def __init__(self, path: str | os.PathLike[str], *, limits: SessionLimits = SessionLimits()) -> None:
        self.path = Path(path)
        self.limits = limits
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._conn.execute("pragma journal_mode=wal")
            self._conn.execute(
                "create table if not exists ragloop_sessions "
                "(id text primary key, messages text not null, updated real not null)"
            )
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the session database {self.path}: {exc}") from exc

    def _load(self, session_id: str) -> tuple[Message, ...]:
        with self._lock:
            row = self._conn.execute("select messages from ragloop_sessions where id = ?", (session_id,)).fetchone()
        return _decode(row[0]) if row else ()

    def _append(self, session_id: str, messages: Sequence[Message]) -> None:
        with self._lock:
            self._conn.execute("begin immediate")
            try:
                row = self._conn.execute("select messages from ragloop_sessions where id = ?", (session_id,)).fetchone()
                history = self.limits.cap((*(_decode(row[0]) if row else ()), *messages))
                self._conn.execute(
                    "insert into ragloop_sessions (id, messages, updated) values (?, ?, ?) "
                    "on conflict (id) do update set messages = excluded.messages, updated = excluded.updated",
                    (session_id, _encode(history), time.time()),
                )
            except BaseException:
                self._conn.execute("rollback")
                raise
            self._conn.execute("commit")

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's history."""
        return await anyio.to_thread.run_sync(self._load, session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add messages and cap the history, in one transaction."""
        await anyio.to_thread.run_sync(self._append, session_id, messages)

    async def aclose(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class PostgresSessionStore:
    """Sessions in PostgreSQL (table ``ragloop_sessions``), for several replicas behind one load balancer.

    Needs ``psycopg`` (and ``psycopg-pool``). The table is created on first use.

    Args:
        conninfo: A ``postgresql://`` URI or libpq connection string.
        limits: History caps per session.
        max_connections: Size of the connection pool.
        wait_s: Longest wait for a connection; a store that is down then fails the load or save quickly
            (the turn answers without history) instead of holding the turn to its deadline.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        limits: SessionLimits = SessionLimits(),
        max_connections: int = 10,
        wait_s: float = 5.0,
    ) -> None:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:
            raise ConfigError("PostgresSessionStore needs psycopg: pip install 'ragloop[serve,postgres]'") from exc
        self.limits = limits
        self._pool: Any = AsyncConnectionPool(
            conninfo, min_size=1, max_size=max_connections, open=False, timeout=wait_s
        )
        self._ready = False
        self._setup = anyio.Lock()

    async def _connection(self) -> Any:
        async with self._setup:
            if not self._ready:
                await self._pool.open()
                async with self._pool.connection() as conn:
                    await conn.execute(
                        "create table if not exists ragloop_sessions "
                        "(id text primary key, messages jsonb not null, updated timestamptz not null default now())"
                    )
                self._ready = True
        return self._pool.connection()

    async def load(self, session_id: str) -> tuple[Message, ...]:
        """The session's history."""
        async with await self._connection() as conn:
            cur = await conn.execute("select messages::text from ragloop_sessions where id = %s", (session_id,))
            row = await cur.fetchone()
        return _decode(row[0]) if row else ()

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        """Add messages and cap the history; the row is locked, so concurrent appends do not lose messages."""
        async with await self._connection() as conn, conn.transaction():
            await conn.execute(
                "insert into ragloop_sessions (id, messages) values (%s, '[]'::jsonb) on conflict (id) do nothing",
                (session_id,),
            )
            cur = await conn.execute(
                "select messages::text from ragloop_sessions where id = %s for update", (session_id,)
            )
            row = await cur.fetchone()
            history = self.limits.cap((*_decode(row[0]), *messages))
            await conn.execute(
                "update ragloop_sessions set messages = %s::jsonb, updated = now() where id = %s",
                (_encode(history), session_id),
            )

    async def aclose(self) -> None:
        """Close the pool (also one that never reached its server: its reconnect attempts stop)."""
        await self._pool.close()
