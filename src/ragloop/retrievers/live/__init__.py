"""Live sources: systems of record looked up by exact id while a turn runs (tickets, orders, modules …).

A live source is triggered by a *signal* in the query text — for the ticket source, a ticket id such as
``#1234`` — and answers with :class:`LiveRecord` s. The live node asks only the sources whose signal a short
query carries, and rejects any record whose id differs from the one requested (a search for #1234 that
returns #1233 is a mismatch, not an answer).

:class:`SQLiteTicketSource` serves the sample ticket database that ships with ragloop. It shows a caller only
their own organisation's tickets (``Caller.tenant``), and a lookup that names no organisation gets none: it is
refused with an error that says what to pass (``require_caller=False`` opts out, for a database of one
organisation). Its connections are persistent but lazy (opened on the first lookup, never at construction),
pooled (one per worker, at most ``max_concurrency``), invalidated and re-opened after an error, and read-only.
Each database call runs in a daemon thread (:func:`ragloop.retrievers._threads.run_in_daemon_thread`), so a
call stuck in the database never keeps the process from exiting and ``aclose`` never waits for one; a call past
its timeout is abandoned and counted as stuck until it returns, and no new call starts while ``max_stuck`` are.
A :class:`CircuitBreaker` stops asking a database that failed ``failure_threshold`` times in a row, and lets
one probe through after ``cooldown_s``: the source comes back as soon as the database does.

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

from ragloop.retrievers.live._base import (
    TICKET_URL,
    LiveRecord,
    LiveSource,
    default_tickets_path,
    lookup_for,
    parse_ticket_ids,
    record_hit,
    split_matches,
)
from ragloop.retrievers.live._breaker import CircuitBreaker, CircuitOpen
from ragloop.retrievers.live._tickets import SQLiteTicketSource

__all__ = [
    "TICKET_URL",
    "CircuitBreaker",
    "CircuitOpen",
    "LiveRecord",
    "LiveSource",
    "SQLiteTicketSource",
    "default_tickets_path",
    "lookup_for",
    "parse_ticket_ids",
    "record_hit",
    "split_matches",
]
