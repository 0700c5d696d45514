"""Telling "the knowledge base is down" from "the knowledge base has nothing on this".

A turn whose searches all failed (the store's database is down, every query timed out) ends like a turn that
found nothing: outcome ``none``, "I couldn't find anything relevant". A client must not be told that. The
decision is made from what the turn streams, with pure functions tested on their own:

- :func:`searches`: how many document searches a progress event reports failed and how many answered (the
  retrieve node's ``retrieved`` event lists its failed queries beside its hit counts; the plan node's wave
  events carry each sub-query's fate, the ``documents`` source's among them);
- :func:`store_unavailable`: a turn that found nothing (outcome ``none``) after at least one document search,
  all of which failed. A partial outage (some searches answered) is not one: the turn answers;
- :func:`store_busy`: such a turn whose every failed search ran out of time waiting (a busy store: every pooled
  connection in use, a statement or query timeout) rather than finding the store down. Its client is told the
  knowledge base is busy and to retry shortly (``store_busy``), not that it is unavailable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragloop.events import Progress
from ragloop.serve._stream import Rejected

__all__ = ["STORE_BUSY", "STORE_DOWN", "busy_reason", "refusal", "searches", "store_busy", "store_unavailable"]

#: The refusal of a turn whose every document search failed: it would otherwise answer "found nothing".
STORE_DOWN = "the knowledge base is unavailable (every search of this turn failed); retry in a moment"
#: The refusal of a turn whose every document search ran out of time waiting on a store that answers (busy).
STORE_BUSY = (
    "the knowledge base is busy (every search of this turn ran out of time waiting for it); retry in a few seconds"
)

#: The plan source name of the document search (see ``ragloop.chat._planning``).
DOCUMENTS = "documents"


def busy_reason(reason: str) -> bool:
    """Whether a failed plan sub-query's reason is a wait that ran out, not a store that is down."""
    return reason.startswith(("StoreBusy:", "timed out after"))


def searches(event: Progress) -> tuple[int, int, int]:
    """``(failed, answered, busy)`` document searches reported by ``event`` (zeros for any other event); ``busy``
    counts the failed searches that ran out of time waiting (see :func:`store_busy`)."""
    data: Mapping[str, Any] = event.data or {}
    if event.node == "retrieve" and event.kind == "retrieved":
        failed = data.get("failed") or []
        hits = data.get("hits") or {}
        busy = data.get("busy") or []
        n_failed = len(failed) if isinstance(failed, list) else 0
        n_busy = len(busy) if isinstance(busy, list) else 0
        n_all = len(hits) if isinstance(hits, Mapping) else n_failed
        return n_failed, max(n_all - n_failed, 0), min(n_busy, n_failed)
    fates = data.get("fates")
    if event.node == "plan" and isinstance(fates, list):
        mine = [f for f in fates if isinstance(f, Mapping) and f.get("source") == DOCUMENTS]
        lost = [f for f in mine if f.get("status") == "failed"]
        answered = sum(1 for f in mine if f.get("status") in ("ok", "empty"))
        busy = sum(1 for f in lost if busy_reason(str(f.get("reason") or "")))
        return len(lost), answered, busy
    return 0, 0, 0


def store_unavailable(outcome: str, failed: int, answered: int) -> bool:
    """True when a turn found nothing because every document search it made failed."""
    return outcome == "none" and failed > 0 and answered == 0


def store_busy(outcome: str, failed: int, answered: int, busy: int) -> bool:
    """True when :func:`store_unavailable` holds and every failed search ran out of time waiting (none found the
    store down or failed otherwise): the store is busy, not unavailable."""
    return store_unavailable(outcome, failed, answered) and busy >= failed


def refusal(outcome: str, failed: int, answered: int, busy: int, retry_after_s: int) -> Rejected | None:
    """The 503 a turn ends with instead of "found nothing": ``store_busy`` (with ``Retry-After``) when
    :func:`store_busy`, ``store_unavailable`` when :func:`store_unavailable`; ``None`` when the turn answers."""
    if store_busy(outcome, failed, answered, busy):
        retry = {"retry-after": str(max(1, retry_after_s))}
        return Rejected(503, STORE_BUSY, kind="server_error", code="store_busy", headers=retry)
    if store_unavailable(outcome, failed, answered):
        return Rejected(503, STORE_DOWN, kind="server_error", code="store_unavailable")
    return None
