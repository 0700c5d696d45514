"""Telling "the knowledge base is down" from "the knowledge base has nothing on this".

A turn whose searches all failed (the store's database is down, every query timed out) ends like a turn that
found nothing: outcome ``none``, "I couldn't find anything relevant". A client must not be told that. Both
decisions here are pure functions of what the turn streams and records, so they are tested on their own:

- :func:`search_failed`: a progress event that reports a failed document search (the retrieve node's
  ``retrieved`` event lists failed queries; the plan node's wave events carry each sub-query's fate);
- :func:`store_unavailable`: a finished reply that found nothing **and** whose document searches all failed,
  with at least one search tried. A partial outage (some searches answered) is not one: the turn answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ragloop.events import Progress

if TYPE_CHECKING:
    from ragloop.chat import Reply

__all__ = ["search_failed", "store_unavailable"]

#: The plan source name of the document search (see ``ragloop.chat._planning``).
DOCUMENTS = "documents"


def search_failed(event: Progress) -> bool:
    """True when ``event`` reports a document search that failed."""
    data: Mapping[str, Any] = event.data or {}
    if event.node == "retrieve" and event.kind == "retrieved":
        return bool(data.get("failed"))
    fates = data.get("fates")
    if event.node == "plan" and isinstance(fates, list):
        return any(
            isinstance(f, Mapping) and f.get("source") == DOCUMENTS and f.get("status") == "failed" for f in fates
        )
    return False


def store_unavailable(reply: Reply) -> bool:
    """True when the reply found nothing because every document search of the turn failed."""
    if reply.outcome != "none":
        return False
    record = reply.record
    failed = ok = 0
    for query in record.queries:
        if query.status == "failed":
            failed += 1
        elif query.error is None:
            ok += 1
    plan = record.plan
    for fate in plan.fates if plan is not None else ():
        if fate.source != DOCUMENTS:
            continue
        if fate.status == "failed":
            failed += 1
        elif fate.status in ("ok", "empty"):
            ok += 1
    return failed > 0 and ok == 0
