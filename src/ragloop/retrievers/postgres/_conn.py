"""The store's connections: one pool per event loop, session settings, retries, and fast outage detection.

A pooled connection is handed out as it is: no health query on each checkout (that was one round trip per
search). A connection that turns out broken fails its statement with an ``OperationalError``; the pool drops
it and the statement runs once more on another. When that fails too, or no connection comes within about a
second, one direct connection attempt tells a busy pool from a database that is down:

- **down** (:class:`~ragloop.errors.StoreUnavailable`, fast): the attempt is refused or fails (no server, no
  such host or socket, the database closed to connections), or it gets no answer while no pooled statement
  has been answered for :data:`ANSWERED_WINDOW_S`;
- **busy**: the server answers (the attempt connects, or is refused at the connection limit), or a pooled
  statement was answered within :data:`ANSWERED_WINDOW_S` (a probe that times out on a loaded machine proves
  nothing). The call goes on waiting for a pooled connection, up to its caller's deadline (the enclosing
  cancel scope's: a turn's retrieval timeout), or ``statement_timeout_s`` where it has none, and then raises
  :class:`~ragloop.errors.StoreBusy`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from ragloop._redact import hide_credentials, hide_password
from ragloop.errors import RetrievalError, StoreBusy, StoreUnavailable
from ragloop.retrievers.postgres._common import _APP, probe, psycopg_module

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

#: How long a search waits for a pooled connection before it checks whether the server is reachable at all.
FIRST_WAIT_S = 1.0
#: A probe that gets no answer counts as "busy", not "down", while a pooled statement was answered this recently.
ANSWERED_WINDOW_S = 10.0
#: How long before its caller's deadline a call stops waiting for a connection, to raise StoreBusy itself.
DEADLINE_MARGIN_S = 0.1


def wait_until(now: float, deadline: float, statement_timeout_s: float) -> float:
    """When a call that starts at ``now`` stops waiting for a pooled connection (``time.monotonic`` clock).

    ``deadline`` is the caller's (``anyio.current_effective_deadline()``, ``inf`` when it has none): the call
    waits until just before it (:data:`DEADLINE_MARGIN_S`, or a tenth of the time left when that is shorter),
    however short ``statement_timeout_s`` is. A caller without one waits ``statement_timeout_s``.
    """
    if math.isinf(deadline):
        return now + statement_timeout_s
    return max(now, deadline - min(DEADLINE_MARGIN_S, max(0.0, deadline - now) / 10))


class Connections:
    """The connection pool of one store and how its statements run.

    Args:
        url: The connection URL.
        pool_size: Most connections this process opens.
        statement_timeout_s: Server-side limit on each statement (and, less a second, on waiting for a
            connection).
        ef_search: The session's ``hnsw.ef_search``.
        opened: Awaited once before the first pool opens (the store checks its schema there).
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int,
        statement_timeout_s: float,
        ef_search: int,
        opened: Callable[[], Awaitable[None]],
    ) -> None:
        self.url = url
        self.pool_size = pool_size
        self.statement_timeout_s = statement_timeout_s
        self.ef_search = ef_search
        self._opened = opened
        self.pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None
        self._lock: anyio.Lock | None = None
        self._down_at: float | None = None
        self._probe_lock: anyio.Lock | None = None
        self._probed: tuple[float, str] | None = None  # when the last probe ran, and its error ("" when fine)
        self._answered_at = -math.inf  # when a pooled statement last completed

    def redacted(self) -> str:
        """The URL without its password."""
        return hide_password(self.url)

    def hidden(self, message: str) -> str:
        """A driver's message on one line, without the URL's password."""
        return hide_credentials(message, self.url)

    async def pool_for_this_loop(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """The pool, opened on first use (after ``opened``) in the event loop that uses it."""
        if self.pool is not None:
            return self.pool
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self.pool is not None:
                return self.pool
            await self._opened()
            # A server that cannot be reached fails here in one connection attempt (and that answer stands for
            # a second), not after the pool's 10 s open: calls queued on this lock during an outage fail at once.
            await self.probe()
            self.pool = await self._new_pool()
        return self.pool

    async def _new_pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        psycopg_module()
        from pgvector.psycopg import register_vector_async
        from psycopg_pool import AsyncConnectionPool

        timeout_ms = max(1, round(self.statement_timeout_s * 1000))

        async def configure(c: AsyncConnection[Any]) -> None:
            await register_vector_async(c)
            await c.execute(f"set statement_timeout = {timeout_ms}")
            await c.execute(f"set hnsw.ef_search = {int(self.ef_search)}")
            # A search is a short query; parallel workers cost more to start than they save.
            await c.execute("set max_parallel_workers_per_gather = 0")
            # The search statement's shape is fixed (materialized steps, one range scan per term): planning it
            # once per connection is enough, where custom plans would re-plan every search.
            await c.execute("set plan_cache_mode = force_generic_plan")

        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            kwargs={"fallback_application_name": _APP, "autocommit": True},
            configure=configure,
            open=False,
            reconnect_timeout=30.0,
        )
        try:
            await pool.open(wait=True, timeout=10.0)
        except Exception as exc:
            await pool.close()
            raise StoreUnavailable(
                f"cannot open a connection pool to {self.redacted()}: {self.hidden(str(exc))}"
            ) from exc
        return pool

    async def aclose(self) -> None:
        """Close the pool."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            await pool.close()

    async def run(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any:
        """Run ``fn(conn)`` with a pooled connection; retry once on a connection lost (a restart, a kill).

        With the server down, a call fails fast (about :data:`FIRST_WAIT_S`, then at once while it stays
        down) with :class:`StoreUnavailable` instead of waiting on the pool. With the server up and every
        connection busy, it waits until just before its caller's deadline (``statement_timeout_s`` without
        one), then raises :class:`StoreBusy`.
        """
        import psycopg
        from psycopg_pool import PoolTimeout

        if self._down_at is not None:
            await self.probe()  # the last call found the server unreachable: ask it directly, do not queue
        pool = await self.pool_for_this_loop()
        now = time.monotonic()
        until = wait_until(now, anyio.current_effective_deadline(), self.statement_timeout_s)
        wait = min(FIRST_WAIT_S, until - now)
        attempt = 0
        while True:
            try:
                async with pool.connection(timeout=max(wait, 0.001)) as conn:
                    result = await fn(conn)
                self._answered_at = time.monotonic()
                return result
            except PoolTimeout as exc:
                await self.probe()  # raises StoreUnavailable when the server cannot be reached
                wait = until - time.monotonic()
                if wait <= 0:
                    raise StoreBusy(
                        f"no free connection to the Postgres store within {until - now:.1f}s (all "
                        f"{self.pool_size} busy, the server answering); raise pool_size or check the server's load"
                    ) from exc
            except psycopg.errors.QueryCanceled as exc:
                raise StoreBusy(
                    f"the Postgres statement ran past statement_timeout_s={self.statement_timeout_s}s ({exc}); "
                    "raise the retrieval timeout or check the server's load",
                    queued=False,
                ) from exc
            except psycopg.OperationalError as exc:
                # Checked on error, not on checkout: the pool drops the broken connection, and the second
                # attempt gets another (or a fresh one).
                attempt += 1
                if attempt == 2:
                    await self.probe()
                    raise RetrievalError(f"Postgres connection failed twice: {self.hidden(str(exc))}") from exc
                await anyio.sleep(0.05)
            except psycopg.Error as exc:
                raise RetrievalError(f"the Postgres store failed: {self.hidden(str(exc))}") from exc

    async def probe(self) -> None:
        """Connect once, outside the pool: raise :class:`StoreUnavailable` (and remember it) when the server is down.

        One probe at a time, and its answer stands for a second: calls queued on a busy pool, or failing
        during an outage, do not each open a connection of their own. A server refusing the connection at its
        connection limit is up (busy), and so is one that does not answer in time while pooled statements
        were answered within :data:`ANSWERED_WINDOW_S` (a loaded machine, not an outage).
        """
        if self._probe_lock is None:
            self._probe_lock = anyio.Lock()
        async with self._probe_lock:
            if self._probed is not None and time.monotonic() - self._probed[0] < 1.0:
                if self._probed[1]:
                    raise StoreUnavailable(self._probed[1])
                return
            try:
                await probe(self.url, max(1.0, min(3.0, self.statement_timeout_s)))
            except StoreBusy:
                pass  # it answered: up, at its connection limit
            except StoreUnavailable as exc:
                no_answer = isinstance(exc.__cause__, TimeoutError)
                if not (no_answer and time.monotonic() - self._answered_at < ANSWERED_WINDOW_S):
                    self._down_at = time.monotonic()
                    self._probed = (self._down_at, str(exc))
                    raise
            self._probed = (time.monotonic(), "")
        if self._down_at is not None:
            self._down_at = None
            if self.pool is not None:
                await self.pool.check()  # replace the pooled connections the outage broke
