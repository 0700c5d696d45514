"""Live sources: systems of record looked up by exact id while a turn runs (tickets, orders, modules …).

A live source is triggered by a *signal* in the query text — for the ticket source, a ticket id such as
``#1234`` — and answers with :class:`LiveRecord` s. The live node asks only the sources whose signal a short
query carries, and rejects any record whose id differs from the one requested (a search for #1234 that
returns #1233 is a mismatch, not an answer).

:class:`SQLiteTicketSource` serves the sample ticket database that ships with ragloop. Its connections are
persistent but lazy (opened on the first lookup, never at construction), pooled (one connection per worker,
at most ``max_concurrency``), invalidated and re-opened after an error, and read-only. A lookup abandoned at its
timeout still holds its place in ``max_concurrency`` until its thread really ends, so a hung database cannot
grow threads without bound. Given a :class:`~ragloop.state.Caller` with a ``tenant``, it returns only that
customer's tickets (``require_caller=True`` refuses lookups without one).

Writing your own source takes a name, a signal detector and an async lookup::

    import re

    from ragloop.retrievers.live import LiveRecord

    class OrderSource:
        name = "orders"

        def __init__(self, orders: dict[str, str]) -> None:
            self._orders = orders

        def signals(self, query: str) -> tuple[str, ...]:
            return tuple(dict.fromkeys(re.findall(r"\\bORD-(\\d{6})\\b", query)))

        async def lookup(
            self, query: str, ids: Sequence[str], *, caller: Caller | None = None
        ) -> Sequence[LiveRecord]:
            # check here that ``caller`` may see each order
            return [LiveRecord(self.name, i, f"Order ORD-{i}", self._orders[i]) for i in ids if i in self._orders]

        async def aclose(self) -> None:
            pass
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

import anyio
import anyio.to_thread
from attrs import define, field, frozen

from ragloop.errors import ConfigError, LiveSourceError
from ragloop.state import Caller, Chunk, Hit
from ragloop.text import STOPWORDS, extract_ids, id_matches, tokenize

__all__ = [
    "LiveRecord",
    "LiveSource",
    "SQLiteTicketSource",
    "default_tickets_path",
    "lookup_for",
    "parse_ticket_ids",
    "record_hit",
    "split_matches",
]

_T = TypeVar("_T")

#: Base of the (fictional) ticket URLs the sample source reports.
TICKET_URL = "https://support.lumen.example/tickets/"


def default_tickets_path() -> Path:
    """The sample ticket database that ships inside the package (``ragloop/data/tickets.sqlite``)."""
    return Path(__file__).resolve().parents[1] / "data" / "tickets.sqlite"


def _frozen_fields(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


@frozen
class LiveRecord:
    """One record a live source returned.

    Attributes:
        source: Name of the live source that produced it.
        id: The record's id in the source's normal form (tickets: the digits, ``"1234"``).
        title: A one-line title, e.g. ``"Ticket #1234: SAML sign-in fails …"``.
        text: The record as prose, ready to be shown to the answerer.
        url: Where a person can open the record, if it has an address.
        fields: The raw structured fields (status, priority, …), read-only.
    """

    source: str
    id: str
    title: str
    text: str
    url: str | None = None
    fields: Mapping[str, Any] = field(factory=dict, converter=_frozen_fields, eq=False, hash=False)


@runtime_checkable
class LiveSource(Protocol):
    """A system of record the live node can consult by exact id."""

    #: Short stable name, recorded in the decision record (``"tickets"``).
    name: str

    def signals(self, query: str) -> tuple[str, ...]:
        """The ids this source can look up that ``query`` carries, in order; empty means "not triggered"."""
        ...

    async def lookup(self, query: str, ids: Sequence[str], *, caller: Caller | None = None) -> Sequence[LiveRecord]:
        """Records for ``ids`` (and possibly related ones; the caller checks ids) that ``caller`` may see.

        ``caller`` is who asks (tenant, user), as given to ``ChatRAG.ask(caller=...)``; the live node passes it
        only when the application gave one. Raises LiveSourceError.
        """
        ...

    async def aclose(self) -> None:
        """Release connections. Safe to call twice."""
        ...


async def lookup_for(source: LiveSource, query: str, ids: Sequence[str], caller: Caller | None) -> Sequence[LiveRecord]:
    """``source.lookup`` on behalf of ``caller``, passed only when there is one, so that sources written before
    callers existed (``lookup(query, ids)``) keep working without one."""
    if caller:
        return await source.lookup(query, ids, caller=caller)
    return await source.lookup(query, ids)


def record_hit(record: LiveRecord, query: str) -> Hit:
    """A live record as a hit with full confidence, so the answer can cite it like any chunk."""
    ref = f"{record.source}:{record.id}"
    chunk = Chunk(id=ref, text=record.text, source=record.url or ref, title=record.title, doc_id=ref)
    return Hit(chunk, score=1.0, confidence=1.0, queries=(query,), best_query=query)


def split_matches(requested: Sequence[str], records: Sequence[LiveRecord]) -> tuple[list[LiveRecord], list[LiveRecord]]:
    """Split records into those whose id exactly matches a requested id and the mismatches (#1233 for #1234)."""
    accepted: list[LiveRecord] = []
    rejected: list[LiveRecord] = []
    for record in records:
        (accepted if any(id_matches(r, record.id) for r in requested) else rejected).append(record)
    return accepted, rejected


def parse_ticket_ids(text: str) -> tuple[str, ...]:
    """The ticket ids ``text`` names, as bare digits, unique, in order of first appearance.

    Recognises ``#1234``, "ticket 1234", "ticket #1234", "issue 1234" (the grammar of
    :func:`ragloop.text.extract_ids`, shared with the grader). ``#12345`` is ``12345``, never
    ``1234``.

    >>> parse_ticket_ids("Is #1234 related to ticket 1233 or #1234?")
    ('1234', '1233')
    """
    found = extract_ids(text).get("ticket", frozenset())
    if not found:
        return ()
    digits = [value.lstrip("#") for value in found]

    def first_position(value: str) -> int:
        match = re.search(rf"(?<!\d){value}(?!\d)", text)
        return match.start() if match else len(text)

    return tuple(sorted(digits, key=lambda value: (first_position(value), int(value), value)))


_SELECT = "SELECT id, status, priority, product_area, summary, body, created, updated, customer, resolution"
# Words that name the kind of record, not its topic: every ticket summary would match them.
_RECORD_WORDS = frozenset({"ticket", "tickets", "issue", "issues"})


def _terms(text: str, limit: int = 6) -> list[str]:
    """Up to ``limit`` topic words of ``text`` (4+ letters, no stopwords), unique, in order, for LIKE matching."""
    words = (t for t in tokenize(text) if len(t) >= 4 and t[0].isalpha())
    return list(dict.fromkeys(w for w in words if w not in STOPWORDS and w not in _RECORD_WORDS))[:limit]


class _Slot:
    """The connection one worker call is using, so a timeout can interrupt it from the event loop."""

    __slots__ = ("conn", "interrupted", "state")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.interrupted = False
        self.state = "pending"  # then "running" (the worker thread took it) or "abandoned" (given up first)

    def interrupt(self) -> None:
        self.interrupted = True
        conn = self.conn
        if conn is not None:
            conn.interrupt()  # thread-safe by design: aborts the statement running in the worker


@define
class SQLiteTicketSource:
    """Exact-id lookup of support tickets in a SQLite database (read-only).

    Attributes:
        path: The database file; defaults to the sample database shipped with ragloop.
        max_concurrency: At most this many lookups run at once (one pooled connection each).
        timeout_s: Per-lookup deadline; a lookup past it is interrupted and raises LiveSourceError.
        related: Also return up to ``related_limit`` tickets whose summaries resemble the requested ones (or
            the query, when an id is unknown). Their ids differ from the requested ones; the live node must
            reject them. Off by default; useful to exercise the mismatch rule.
        related_limit: How many related tickets at most.
        require_caller: Refuse lookups without a caller tenant (a multi-tenant service should set it).
        name: The source name.
        connects: Connections opened so far (tests: laziness and reconnects).
        lookups: ``lookup`` calls that reached the database.
        errors: Lookups that failed (each one invalidated the pool).
        max_in_flight: Most database calls seen running at the same time.
    """

    path: Path = field(factory=default_tickets_path, converter=Path)
    max_concurrency: int = field(default=4, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    related: bool = field(default=False, kw_only=True)
    related_limit: int = field(default=3, kw_only=True)
    require_caller: bool = field(default=False, kw_only=True)
    name: str = field(default="tickets", kw_only=True)
    connects: int = field(default=0, init=False)
    lookups: int = field(default=0, init=False)
    errors: int = field(default=0, init=False)
    max_in_flight: int = field(default=0, init=False)
    _in_flight: int = field(default=0, init=False, repr=False)
    _idle: list[sqlite3.Connection] = field(factory=list, init=False, repr=False)
    _generation: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False, repr=False)
    _limiter: anyio.CapacityLimiter = field(init=False, repr=False)
    _threads: threading.BoundedSemaphore = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {self.timeout_s}")
        self._limiter = anyio.CapacityLimiter(self.max_concurrency)
        # Held from before a worker thread starts until it ends, even when its caller gave up on it.
        self._threads = threading.BoundedSemaphore(self.max_concurrency)

    # -- LiveSource -----------------------------------------------------------------------------------------

    def signals(self, query: str) -> tuple[str, ...]:
        """Ticket ids in ``query`` (``#1234``, "ticket 1234", "issue 1234"), as digits."""
        return parse_ticket_ids(query)

    async def lookup(self, query: str, ids: Sequence[str], *, caller: Caller | None = None) -> Sequence[LiveRecord]:
        """Tickets with exactly the requested ids (unknown ids are skipped), then related ones if enabled.

        With a ``caller`` whose ``tenant`` is set, only that customer's tickets are returned (another
        customer's ticket reads as unknown).

        Raises:
            LiveSourceError: The database is missing, unreadable or corrupt, or the lookup timed out. The
                connection pool is dropped, so the next lookup reconnects.
        """
        tenant = caller.tenant if caller is not None else None
        if self.require_caller and not tenant:
            raise LiveSourceError(f"{self.name}: lookups need a caller tenant; pass caller=Caller(tenant=...) to ask")
        wanted = tuple(
            dict.fromkeys(int(i.lstrip("#")) for i in ids if i.lstrip("#").isdigit() and len(i.lstrip("#")) <= 12)
        )
        if not wanted and not self.related:
            return ()
        self.lookups += 1
        return await self._call(lambda conn: self._query(conn, query, wanted, tenant))

    async def aclose(self) -> None:
        """Close the pooled connections. The source stays usable: the next lookup reconnects."""
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
        # Connections are pooled and each is used by one thread at a time, so check_same_thread=False is safe.
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        ok = False
        conn: sqlite3.Connection | None = None
        generation = 0
        try:
            conn, generation = self._checkout()
            slot.conn = conn
            if slot.interrupted:  # timed out while waiting for a connection
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

    def _held_work(self, fn: Callable[[sqlite3.Connection], _T], slot: _Slot) -> _T:
        """:meth:`_work` in the worker thread; gives the thread's place back when the thread ends."""
        with self._lock:
            if slot.state == "abandoned":  # the caller gave up before the thread started, and let go of it
                raise sqlite3.OperationalError("interrupted")
            slot.state = "running"
        try:
            return self._work(fn, slot)
        finally:
            self._threads.release()

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        slot = _Slot()
        try:
            with anyio.fail_after(self.timeout_s):
                while not self._threads.acquire(blocking=False):  # every place held by a running thread
                    await anyio.sleep(0.005)
                try:
                    return await anyio.to_thread.run_sync(
                        self._held_work, fn, slot, limiter=self._limiter, abandon_on_cancel=True
                    )
                except anyio.get_cancelled_exc_class():
                    slot.interrupt()
                    with self._lock:
                        never_started = slot.state == "pending"
                        slot.state = "abandoned"
                    if never_started:
                        self._threads.release()
                    raise
        except TimeoutError as exc:
            self._failed()
            msg = (
                f"ticket lookup in {self.path} took longer than {self.timeout_s}s and was interrupted; "
                "raise timeout_s or check that the database is not locked by a writer"
            )
            raise LiveSourceError(msg) from exc
        except sqlite3.Error as exc:
            self._failed()
            if not self.path.is_file():
                msg = f"ticket database {self.path} does not exist; pass the path of a tickets.sqlite file"
            else:
                msg = (
                    f"ticket database {self.path} could not be read ({exc}); rebuild it with "
                    "scripts/build_sample_tickets.py or pass another path. The next lookup reconnects."
                )
            raise LiveSourceError(msg) from exc

    def _failed(self) -> None:
        self.errors += 1
        self._invalidate()
