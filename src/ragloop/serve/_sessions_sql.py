"""Session stores in SQL: a SQLite file and a PostgreSQL table, one row per ``(owner, id)``.

Both keep the table ``ragloop_sessions (owner, id, messages, updated)`` with the primary key ``(owner, id)``: a
session is found by its owner and its id together, never by the id alone. A table written by an older ragloop
(``id`` alone the key, no ``owner``) is migrated when it is empty and refused, with nothing changed, when it
holds sessions: their owners are unknown, and guessing would hand one user's conversation to another.

Both enforce a :class:`~ragloop.serve.SessionQuota` when a session starts, in one transaction (Postgres: under a
per-owner advisory lock, so replicas agree): rows idle past ``idle_s`` are deleted, the owner's own least
recently used rows go when it is at ``per_owner``, and a table at ``total`` refuses the new one
(:class:`~ragloop.serve.SessionsFull`). A read never returns a session idle past ``idle_s``, deleted yet or not.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from ragloop.errors import ConfigError
from ragloop.serve._quota import QuotaCounts, SessionQuota, SessionsFull
from ragloop.serve._sessions import SessionLimits, decode, encode
from ragloop.state import Message

if TYPE_CHECKING:
    import os

__all__ = ["PostgresSessionStore", "SQLiteSessionStore"]

_COLUMNS = frozenset({"owner", "id", "messages", "updated"})
_LIMITS = SessionLimits()
_QUOTA = SessionQuota()


def _unowned(where: str, rows: int, fix: str) -> ConfigError:
    return ConfigError(
        f"the session table ragloop_sessions in {where} was written by an older ragloop: its {rows:,} session(s) "
        "have no owner, and ragloop will not guess whose they are (that would show one user's conversation to "
        f"another). Nothing was changed. Move the table aside ({fix}) or use another session store."
    )


def _wrong_shape(where: str, columns: set[str]) -> ConfigError:
    return ConfigError(
        f"the table ragloop_sessions in {where} has columns {sorted(columns)}, not a ragloop session table "
        f"({', '.join(sorted(_COLUMNS))}); rename it or use another session store"
    )


class SQLiteSessionStore:
    """Sessions in a SQLite file (one row per owner and session); calls run in a worker thread.

    Args:
        path: The database file (created with its table when missing).
        limits: History caps per session.
        quota: Sessions per principal and in all, and the idle time after which a session is deleted.
        clock: Seconds since the epoch (a test can drive it).

    Raises:
        ConfigError: The file cannot be opened, or holds an older table with sessions that have no owner.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        limits: SessionLimits = _LIMITS,
        quota: SessionQuota = _QUOTA,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.limits = limits
        self.quota = quota
        self.clock = clock
        #: Sessions evicted, expired and refused, for ``/metrics``.
        self.counts = QuotaCounts()
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._conn.execute("pragma journal_mode=wal")
            self._set_up()
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the session database {self.path}: {exc}") from exc
        except ConfigError:
            self._conn.close()
            raise

    def _set_up(self) -> None:
        self._conn.execute("begin immediate")
        try:
            columns = {row[1] for row in self._conn.execute("pragma table_info(ragloop_sessions)")}
            if columns and not columns >= _COLUMNS:
                rows = self._conn.execute("select count(*) from ragloop_sessions").fetchone()[0]
                if "owner" not in columns and {"id", "messages"} <= columns and rows == 0:
                    self._conn.execute("drop table ragloop_sessions")  # an empty table of the old shape: migrate
                elif "owner" not in columns and {"id", "messages"} <= columns:
                    fix = f"sqlite3 {self.path} 'alter table ragloop_sessions rename to ragloop_sessions_unowned'"
                    raise _unowned(str(self.path), rows, fix)
                else:
                    raise _wrong_shape(str(self.path), columns)
            self._conn.execute(
                "create table if not exists ragloop_sessions (owner text not null, id text not null, "
                "messages text not null, updated real not null, primary key (owner, id))"
            )
            self._conn.execute("create index if not exists ragloop_sessions_idle on ragloop_sessions (updated)")
            self._conn.execute(
                "create index if not exists ragloop_sessions_owner_idle on ragloop_sessions (owner, updated)"
            )
        except BaseException:
            self._conn.execute("rollback")
            raise
        self._conn.execute("commit")

    def _create(self, owner: str, session_id: str) -> bool:
        q, now = self.quota, self.clock()
        with self._lock:
            self._conn.execute("begin immediate")
            try:
                expired = self._conn.execute(
                    "delete from ragloop_sessions where updated <= ?", (now - q.idle_s,)
                ).rowcount
                self.counts.add("sessions", "expired", expired)
                if self._conn.execute(
                    "select 1 from ragloop_sessions where owner = ? and id = ?", (owner, session_id)
                ).fetchone():
                    self._conn.execute("commit")
                    return False
                held = self._conn.execute("select count(*) from ragloop_sessions where owner = ?", (owner,))
                over = held.fetchone()[0] - q.per_owner + 1
                if over > 0:  # the owner's own least recently used sessions make room, never another's
                    self._conn.execute(
                        "delete from ragloop_sessions where owner = ? and id in (select id from ragloop_sessions "
                        "where owner = ? order by updated, id limit ?)",
                        (owner, owner, over),
                    )
                    self.counts.add("sessions", "evicted", over)
                full = self._conn.execute("select count(*) from ragloop_sessions").fetchone()[0] >= q.total
                if not full:
                    self._conn.execute(
                        "insert into ragloop_sessions (owner, id, messages, updated) values (?, ?, '[]', ?)",
                        (owner, session_id, now),
                    )
            except BaseException:
                self._conn.execute("rollback")
                raise
            self._conn.execute("commit")
        if full:
            self.counts.add("sessions", "refused")
            raise SessionsFull(q.full_message())
        return True

    def _load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        with self._lock:
            row = self._conn.execute(
                "select messages from ragloop_sessions where owner = ? and id = ? and updated > ?",
                (owner, session_id, self.clock() - self.quota.idle_s),
            ).fetchone()
        return decode(row[0]) if row else None

    def _append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        with self._lock:
            self._conn.execute("begin immediate")
            try:
                now = self.clock()
                row = self._conn.execute(
                    "select messages from ragloop_sessions where owner = ? and id = ? and updated > ?",
                    (owner, session_id, now - self.quota.idle_s),
                ).fetchone()
                if row is not None:
                    history = self.limits.cap((*decode(row[0]), *messages))
                    self._conn.execute(
                        "update ragloop_sessions set messages = ?, updated = ? where owner = ? and id = ?",
                        (encode(history), now, owner, session_id),
                    )
            except BaseException:
                self._conn.execute("rollback")
                raise
            self._conn.execute("commit")
        return row is not None

    def _ping(self) -> None:
        with self._lock:
            self._conn.execute("select 1 from ragloop_sessions limit 1").fetchall()

    async def create(self, owner: str, session_id: str) -> bool:
        """Start an empty session; ``False`` when ``owner`` has one by that id."""
        return await anyio.to_thread.run_sync(self._create, owner, session_id)

    async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        """The session's history; ``None`` when ``owner`` has no session by that id."""
        return await anyio.to_thread.run_sync(self._load, owner, session_id)

    async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Add messages and cap the history, in one transaction; ``False`` when there is no such session."""
        return await anyio.to_thread.run_sync(self._append, owner, session_id, messages)

    async def ping(self) -> None:
        """Read the table (raises when the file is gone or broken)."""
        await anyio.to_thread.run_sync(self._ping)

    async def aclose(self) -> None:
        """Close the database."""
        with self._lock:
            self._conn.close()


class PostgresSessionStore:
    """Sessions in PostgreSQL (table ``ragloop_sessions``), for several replicas behind one load balancer.

    Needs ``psycopg`` (and ``psycopg-pool``). The table is created on first use (an empty table of an older
    ragloop is migrated; one holding sessions without owners is refused with :class:`ConfigError`).

    Args:
        conninfo: A ``postgresql://`` URI or libpq connection string.
        limits: History caps per session.
        quota: Sessions per principal and in all, and the idle time after which a session is deleted.
        max_connections: Size of the connection pool.
        wait_s: How long a load or save waits for a pooled connection before it asks the server directly
            whether it is up: one that is down (refused, gone) then fails quickly (the turn answers without
            history) instead of holding the turn to its deadline; one that answers (every connection merely
            in use) is waited for until just before the caller's deadline (the turn's: an acknowledged turn
            is saved, not dropped, when the pool is busy), or fails after ``wait_s`` where there is none.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        limits: SessionLimits = _LIMITS,
        quota: SessionQuota = _QUOTA,
        max_connections: int = 10,
        wait_s: float = 5.0,
    ) -> None:
        try:
            from psycopg_pool import AsyncConnectionPool
        except ImportError as exc:
            raise ConfigError("PostgresSessionStore needs psycopg: pip install 'ragloop[serve,postgres]'") from exc
        self.limits = limits
        self.quota = quota
        #: Sessions evicted, expired and refused (by this replica), for ``/metrics``.
        self.counts = QuotaCounts()
        self._pool: Any = AsyncConnectionPool(
            conninfo, min_size=1, max_size=max_connections, open=False, timeout=wait_s
        )
        self._ready = False
        self._setup = anyio.Lock()
        self._conninfo = conninfo
        self._wait_s = wait_s
        self._answered_at = -math.inf  # when a pooled connection was last handed out
        self._probe_lock = anyio.Lock()
        self._probed: tuple[float, str | None] | None = None  # when the last probe ran, and why it failed

    async def _connection(self) -> Any:
        async with self._setup:
            if not self._ready:
                await self._pool.open()
                async with self._pool.connection() as conn, conn.transaction():
                    await self._set_up(conn)
                self._ready = True
        return self._patient()

    @asynccontextmanager
    async def _patient(self) -> AsyncIterator[Any]:
        """A pooled connection: ``wait_s``, then — the server up, every connection busy — until just before the
        caller's deadline (see the class's ``wait_s``); a server that is down raises ``StoreUnavailable``."""
        from psycopg_pool import PoolTimeout

        from ragloop.errors import StoreBusy, StoreUnavailable
        from ragloop.retrievers.postgres._common import probe
        from ragloop.retrievers.postgres._conn import ANSWERED_WINDOW_S, wait_until

        started = time.monotonic()
        try:
            conn = await self._pool.getconn(timeout=self._wait_s)
        except PoolTimeout:
            until = wait_until(started, anyio.current_effective_deadline(), self._wait_s)
            if until - time.monotonic() <= 0:
                raise
            # One probe at a time, its answer standing for a second: the calls queued on a busy pool must not
            # each open a connection of their own (one connection past the pool, at most).
            async with self._probe_lock:
                if self._probed is None or time.monotonic() - self._probed[0] >= 1.0:
                    try:
                        await probe(self._conninfo, 3.0)
                        self._probed = (time.monotonic(), None)
                    except StoreBusy:
                        self._probed = (time.monotonic(), None)  # refused at the connection limit: up
                    except StoreUnavailable as exc:
                        no_answer = isinstance(exc.__cause__, TimeoutError)
                        up = no_answer and time.monotonic() - self._answered_at < ANSWERED_WINDOW_S
                        self._probed = (time.monotonic(), None if up else str(exc))
                if self._probed[1] is not None:
                    raise StoreUnavailable(self._probed[1]) from None
            conn = await self._pool.getconn(timeout=max(0.001, until - time.monotonic()))
        self._answered_at = time.monotonic()
        try:
            yield conn
        finally:
            await self._pool.putconn(conn)

    async def _set_up(self, conn: Any) -> None:
        # One server-wide advisory lock: replicas starting together do not race each other's create or migration.
        await conn.execute("select pg_advisory_xact_lock(hashtext('ragloop_sessions'))")
        cur = await conn.execute(
            "select column_name from information_schema.columns "
            "where table_schema = current_schema() and table_name = 'ragloop_sessions'"
        )
        columns = {row[0] for row in await cur.fetchall()}
        if columns and not columns >= _COLUMNS:
            rows = (await (await conn.execute("select count(*) from ragloop_sessions")).fetchone())[0]
            if "owner" in columns or not {"id", "messages"} <= columns:
                raise _wrong_shape("the Postgres database", columns)
            if rows:
                raise _unowned(
                    "the Postgres database", rows, "ALTER TABLE ragloop_sessions RENAME TO ragloop_sessions_unowned"
                )
            await conn.execute("drop table ragloop_sessions")  # an empty table of the old shape: migrate
        await conn.execute(
            "create table if not exists ragloop_sessions (owner text not null, id text not null, "
            "messages jsonb not null, updated timestamptz not null default now(), primary key (owner, id))"
        )
        await conn.execute("create index if not exists ragloop_sessions_idle on ragloop_sessions (updated)")
        await conn.execute(
            "create index if not exists ragloop_sessions_owner_idle on ragloop_sessions (owner, updated)"
        )

    async def create(self, owner: str, session_id: str) -> bool:
        """Start an empty session; ``False`` when ``owner`` has one by that id.

        Over ``quota.per_owner`` the owner's own least recently used sessions are deleted; a table holding
        ``quota.total`` raises :class:`SessionsFull` (replicas starting sessions at the same moment may pass
        the total by one each: the per-owner count is exact, under the owner's lock).
        """
        q = self.quota
        async with await self._connection() as conn, conn.transaction():
            await conn.execute("select pg_advisory_xact_lock(hashtext(%s))", ("ragloop_sessions:" + owner,))
            cur = await conn.execute(
                "delete from ragloop_sessions where updated <= now() - make_interval(secs => %s)", (q.idle_s,)
            )
            self.counts.add("sessions", "expired", cur.rowcount)
            cur = await conn.execute("select 1 from ragloop_sessions where owner = %s and id = %s", (owner, session_id))
            if await cur.fetchone() is not None:
                return False
            cur = await conn.execute("select count(*) from ragloop_sessions where owner = %s", (owner,))
            over = (await cur.fetchone())[0] - q.per_owner + 1
            if over > 0:  # the owner's own least recently used sessions make room, never another's
                await conn.execute(
                    "delete from ragloop_sessions where owner = %s and id in (select id from ragloop_sessions "
                    "where owner = %s order by updated, id limit %s)",
                    (owner, owner, over),
                )
                self.counts.add("sessions", "evicted", over)
            full = (await (await conn.execute("select count(*) from ragloop_sessions")).fetchone())[0] >= q.total
            if not full:
                await conn.execute(
                    "insert into ragloop_sessions (owner, id, messages) values (%s, %s, '[]'::jsonb)",
                    (owner, session_id),
                )
        if full:
            self.counts.add("sessions", "refused")
            raise SessionsFull(q.full_message())
        return True

    async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        """The session's history; ``None`` when ``owner`` has no session by that id."""
        async with await self._connection() as conn:
            cur = await conn.execute(
                "select messages::text from ragloop_sessions where owner = %s and id = %s "
                "and updated > now() - make_interval(secs => %s)",
                (owner, session_id, self.quota.idle_s),
            )
            row = await cur.fetchone()
        return decode(row[0]) if row else None

    async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Add messages and cap the history; the row is locked, so concurrent appends do not lose messages.

        ``False`` (nothing written) when ``owner`` has no session by that id.
        """
        async with await self._connection() as conn, conn.transaction():
            cur = await conn.execute(
                "select messages::text from ragloop_sessions where owner = %s and id = %s "
                "and updated > now() - make_interval(secs => %s) for update",
                (owner, session_id, self.quota.idle_s),
            )
            row = await cur.fetchone()
            if row is None:
                return False
            history = self.limits.cap((*decode(row[0]), *messages))
            await conn.execute(
                "update ragloop_sessions set messages = %s::jsonb, updated = now() where owner = %s and id = %s",
                (encode(history), owner, session_id),
            )
        return True

    async def ping(self) -> None:
        """One cheap query (raises when the server is down or the table is refused)."""
        async with await self._connection() as conn:
            await conn.execute("select 1 from ragloop_sessions limit 1")

    async def aclose(self) -> None:
        """Close the pool (also one that never reached its server: its reconnect attempts stop)."""
        await self._pool.close()
