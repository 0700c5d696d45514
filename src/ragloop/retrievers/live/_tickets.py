"""The sample ticket source: exact-id lookups in a read-only SQLite database, per caller, behind a breaker."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
from attrs import define, field

from ragloop.errors import ConfigError, LiveSourceError
from ragloop.retrievers._threads import run_in_daemon_thread
from ragloop.retrievers.live._base import TICKET_URL, LiveRecord, default_tickets_path, parse_ticket_ids
from ragloop.retrievers.live._breaker import CircuitBreaker, CircuitOpen
from ragloop.state import Caller
from ragloop.text import STOPWORDS, tokenize

_T = TypeVar("_T")
_SELECT = "SELECT id, status, priority, product_area, summary, body, created, updated, customer, resolution"
# Words that name the kind of record, not its topic: every ticket summary would match them.
_RECORD_WORDS = frozenset({"ticket", "tickets", "issue", "issues"})


def _terms(text: str, limit: int = 6) -> list[str]:
    """Up to ``limit`` topic words of ``text`` (4+ letters, no stopwords), unique, in order, for LIKE matching."""
    words = (t for t in tokenize(text) if len(t) >= 4 and t[0].isalpha())
    return list(dict.fromkeys(w for w in words if w not in STOPWORDS and w not in _RECORD_WORDS))[:limit]


class _Slot:
    """One database call: its connection (so a timeout can interrupt it) and whether its caller gave up on it."""

    __slots__ = ("abandoned", "conn", "done")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.abandoned = False
        self.done = False

    def interrupt(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.interrupt()  # thread-safe by design: aborts the statement running in the worker


@define
class SQLiteTicketSource:
    """Exact-id lookup of support tickets in a SQLite database (read-only), for one organisation at a time.

    Each ticket belongs to a customer organisation; a lookup returns only the tickets of the caller's
    ``tenant`` (another organisation's ticket reads as unknown). A lookup without a caller tenant is refused
    (``require_caller``, on by default): pass ``caller=Caller(tenant=...)`` to ``ChatRAG.ask``, or set
    ``require_caller=False`` for a database that holds one organisation's tickets only.

    Every database call runs in a daemon thread of its own, at most ``max_concurrency`` at once; a call past
    ``timeout_s`` is interrupted and abandoned (it can never keep the process from exiting, and ``aclose`` does
    not wait for it). At most ``max_stuck`` abandoned calls may still be stuck in the database; past that, and
    while the breaker is open (``failure_threshold`` failures in a row), lookups fail at once with an error
    that says so. After ``cooldown_s`` the next lookup is the probe: if it works the source is back.

    Attributes:
        path: The database file; defaults to the sample database shipped with ragloop.
        max_concurrency: At most this many lookups run at once (one pooled connection each).
        timeout_s: Per-lookup deadline; a lookup past it is interrupted and raises LiveSourceError.
        related: Also return up to ``related_limit`` tickets whose summaries resemble the requested ones (or
            the query, when an id is unknown). Their ids differ from the requested ones; the live node must
            reject them. Off by default; useful to exercise the mismatch rule.
        related_limit: How many related tickets at most.
        require_caller: Refuse lookups without a caller tenant (the default); ``False``: a lookup without one
            sees every ticket (a database of one organisation only).
        failure_threshold: Failures in a row that open the breaker.
        cooldown_s: How long the breaker stays open before the next lookup probes (doubling, at most 30 s).
        max_stuck: Abandoned calls that may still be stuck in the database before no new one starts (default:
            the larger of ``max_concurrency`` and ``failure_threshold``, plus 3 probes). At most
            ``max_concurrency + max_stuck`` threads are ever alive.
        name: The source name.
        connects: Connections opened so far (tests: laziness and reconnects).
        lookups: ``lookup`` calls that reached the database.
        errors: Lookups that failed (each one invalidated the pool).
        max_in_flight: Most database calls seen running at the same time.
        breaker: The circuit breaker (its state and how often it opened).
    """

    path: Path = field(factory=default_tickets_path, converter=Path)
    max_concurrency: int = field(default=4, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    related: bool = field(default=False, kw_only=True)
    related_limit: int = field(default=3, kw_only=True)
    require_caller: bool = field(default=True, kw_only=True)
    failure_threshold: int = field(default=3, kw_only=True)
    cooldown_s: float = field(default=1.0, kw_only=True)
    max_stuck: int = field(default=0, kw_only=True)
    name: str = field(default="tickets", kw_only=True)
    connects: int = field(default=0, init=False)
    lookups: int = field(default=0, init=False)
    errors: int = field(default=0, init=False)
    max_in_flight: int = field(default=0, init=False)
    breaker: CircuitBreaker = field(init=False)
    _in_flight: int = field(default=0, init=False, repr=False)
    _stuck: int = field(default=0, init=False, repr=False)
    _idle: list[sqlite3.Connection] = field(factory=list, init=False, repr=False)
    _generation: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False, repr=False)
    _limiter: anyio.CapacityLimiter = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.max_stuck < 0:
            raise ConfigError(f"max_stuck must be at least 0, got {self.max_stuck}")
        # Room for a few probes beyond the calls that hung before the breaker opened, so a source whose every
        # call hung can still come back when its database does.
        self.max_stuck = self.max_stuck or max(self.max_concurrency, self.failure_threshold) + 3
        self.breaker = CircuitBreaker(self.failure_threshold, self.cooldown_s, max(30.0, self.cooldown_s))
        self._limiter = anyio.CapacityLimiter(self.max_concurrency)

    # -- LiveSource -----------------------------------------------------------------------------------------

    def signals(self, query: str) -> tuple[str, ...]:
        """Ticket ids in ``query`` (``#1234``, "ticket 1234", "issue 1234"), as digits."""
        return parse_ticket_ids(query)

    async def lookup(self, query: str, ids: Sequence[str], *, caller: Caller | None = None) -> Sequence[LiveRecord]:
        """Tickets of the caller's organisation with exactly the requested ids (others read as unknown), then
        related ones if enabled.

        Raises:
            LiveSourceError: No caller tenant (with ``require_caller``); the database is missing, unreadable,
                corrupt or stuck; the lookup timed out; or the breaker is open. A failed lookup drops the
                connection pool, so the next one reconnects.
        """
        tenant = caller.tenant.strip() if caller is not None and caller.tenant else None
        if self.require_caller and not tenant:
            raise LiveSourceError(
                f"{self.name}: tickets are shown only to their organisation and this lookup names none (no caller "
                "tenant); pass caller=Caller(tenant=...) (or require_caller=False for a database of one organisation)"
            )
        wanted = tuple(
            dict.fromkeys(int(i.lstrip("#")) for i in ids if i.lstrip("#").isdigit() and len(i.lstrip("#")) <= 12)
        )
        if not wanted and not self.related:
            return ()
        self.lookups += 1
        return await self._call(lambda conn: self._query(conn, query, wanted, tenant))

    async def aclose(self) -> None:
        """Close the pooled connections (never waits for a stuck call). The next lookup reconnects."""
        self._invalidate()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- database work (runs in worker threads) ---------------------------------------------------------------

    def _query(
        self, conn: sqlite3.Connection, query: str, wanted: tuple[int, ...], tenant: str | None
    ) -> list[LiveRecord]:
        rows: list[tuple[Any, ...]] = []
        scope, scope_args = ("customer = ? AND ", [tenant]) if tenant else ("", [])
        if wanted:
            marks = ",".join("?" * len(wanted))
            found = conn.execute(f"{_SELECT} FROM tickets WHERE {scope}id IN ({marks})", [*scope_args, *wanted])
            by_id = {row[0]: row for row in found}
            rows = [by_id[i] for i in wanted if i in by_id]
        if self.related:
            basis = " ".join(row[4] for row in rows) or re.sub(r"#?\d+", " ", query)
            terms = _terms(basis)
            if terms:
                score = " + ".join("(lower(summary) LIKE ?)" for _ in terms)
                exclude = ",".join("?" * len(wanted)) if wanted else "NULL"
                anchor = wanted[0] if wanted else 0
                sql = (
                    f"{_SELECT}, ({score}) AS score FROM tickets WHERE {scope}id NOT IN ({exclude}) AND score > 0 "
                    "ORDER BY score DESC, abs(id - ?) ASC, id ASC LIMIT ?"
                )
                params = [f"%{t}%" for t in terms] + scope_args + list(wanted) + [anchor, self.related_limit]
                rows += [row[:-1] for row in conn.execute(sql, params)]
        return [self._record(row) for row in rows]

    def _record(self, row: tuple[Any, ...]) -> LiveRecord:
        tid, status, priority, area, summary, body, created, updated, customer, resolution = row
        lines = [
            f"Ticket #{tid}: {summary}",
            f"Status: {status}. Priority: {priority}. Area: {area}. Customer: {customer}.",
            f"Opened {created}, last updated {updated}.",
            body,
        ]
        if resolution:
            lines.append(f"Resolution: {resolution}")
        return LiveRecord(
            source=self.name,
            id=str(tid),
            title=f"Ticket #{tid}: {summary}",
            text="\n".join(lines),
            url=f"{TICKET_URL}{tid}",
            fields={
                "status": status,
                "priority": priority,
                "product_area": area,
                "summary": summary,
                "created": created,
                "updated": updated,
                "customer": customer,
                "resolution": resolution,
            },
        )

    def _connect(self) -> sqlite3.Connection:
        # Read-only URI: the sample database is package data and must never be written.
        uri = self.path.resolve().as_uri() + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=self.timeout_s)
        with self._lock:
            self.connects += 1
        return conn

    def _checkout(self) -> tuple[sqlite3.Connection, int]:
        with self._lock:
            generation = self._generation
            conn = self._idle.pop() if self._idle else None
        return (conn or self._connect()), generation

    def _checkin(self, conn: sqlite3.Connection, generation: int, ok: bool) -> None:
        with self._lock:
            if ok and generation == self._generation and len(self._idle) < self.max_concurrency:
                self._idle.append(conn)
                return
        conn.close()

    def _invalidate(self) -> None:
        with self._lock:
            self._generation += 1
            stale, self._idle = self._idle, []
        for conn in stale:
            conn.close()

    def _work(self, fn: Callable[[sqlite3.Connection], _T], slot: _Slot) -> _T:
        """One database call, in its own daemon thread; a call its caller abandoned counts as stuck until here."""
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        ok = False
        conn: sqlite3.Connection | None = None
        generation = 0
        try:
            if slot.abandoned:  # given up before the thread even ran
                raise sqlite3.OperationalError("interrupted")
            conn, generation = self._checkout()
            slot.conn = conn
            if slot.abandoned:  # timed out while the connection opened
                raise sqlite3.OperationalError("interrupted")
            result = fn(conn)
            ok = True
            return result
        finally:
            slot.conn = None
            if conn is not None:
                self._checkin(conn, generation, ok)
            with self._lock:
                self._in_flight -= 1
                slot.done = True
                if slot.abandoned:
                    self._stuck -= 1

    def _abandon(self, slot: _Slot) -> None:
        slot.interrupt()
        with self._lock:
            if not slot.done and not slot.abandoned:
                slot.abandoned = True
                self._stuck += 1

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            probe = self.breaker.admit()
        except CircuitOpen as exc:
            raise LiveSourceError(f"{self.name}: the ticket database {exc}") from None
        slot = _Slot()
        try:
            with anyio.fail_after(self.timeout_s):
                async with self._limiter:
                    self._may_start(probe)
                    try:
                        result = await run_in_daemon_thread(lambda: self._work(fn, slot), name=f"ragloop {self.name}")
                    except BaseException:
                        self._abandon(slot)
                        raise
        except TimeoutError as exc:
            self._failed(probe)
            msg = (
                f"ticket lookup in {self.path} took longer than {self.timeout_s}s and was interrupted; "
                "raise timeout_s or check that the database is not locked by a writer"
            )
            raise LiveSourceError(msg) from exc
        except sqlite3.Error as exc:
            self._failed(probe)
            if not self.path.is_file():
                msg = f"ticket database {self.path} does not exist; pass the path of a tickets.sqlite file"
            else:
                msg = (
                    f"ticket database {self.path} could not be read ({exc}); rebuild it with "
                    "scripts/build_sample_tickets.py or pass another path. The next lookup reconnects."
                )
            raise LiveSourceError(msg) from exc
        except LiveSourceError:
            self._failed(probe)
            raise
        except BaseException:
            self.breaker.cancelled(probe)  # cancelled by the caller: a cancelled probe lets the next lookup probe
            raise
        self.breaker.succeeded(probe)
        return result

    def _may_start(self, probe: bool) -> None:
        """Refuse to start a thread while the breaker opened during the wait, or too many calls are stuck."""
        if not probe and self.breaker.is_open:
            raise LiveSourceError(f"{self.name}: the ticket database failed while this lookup waited; not asked")
        with self._lock:
            stuck = self._stuck
        if stuck >= self.max_stuck:
            raise LiveSourceError(
                f"{self.name}: {stuck} earlier lookups are still stuck in {self.path}; no new one starts until one of "
                "them returns (check the disk or mount the database is on)"
            )

    def _failed(self, probe: bool) -> None:
        self.errors += 1
        self.breaker.failed(probe)
        self._invalidate()
