"""What every live source shares: the record, the protocol, the caller hand-off, hits and the id rules."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from ragloop.state import Caller, Chunk, Hit
from ragloop.text import extract_ids, id_matches

#: Base of the (fictional) ticket URLs the sample source reports.
TICKET_URL = "https://support.lumen.example/tickets/"


def default_tickets_path() -> Path:
    """The sample ticket database that ships inside the package (``ragloop/data/tickets.sqlite``)."""
    return Path(__file__).resolve().parents[2] / "data" / "tickets.sqlite"


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
