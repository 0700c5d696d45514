"""The turn log: what users asked and what became of it, for content-gap reports and feedback (opt-in).

Nothing is stored unless a chat is given a log::

    log = TurnLog.open("sqlite:turns.db", retention_days=90)          # or postgresql://…
    rag = ChatRAG(Turn.from_index("kb-index/"), turn_log=log)
    reply = await rag.ask("How do I connect Zapier?")
    await rag.feedback(reply.turn_id, "down", comment="nothing about Zapier")

Each finished turn becomes one row (:class:`TurnRow`): when, who (principal, user and tenant, hashed unless
:class:`LogPolicy` says otherwise), the question (after credential and PII redaction; or, with
``capture_questions=False``, only its hash, key terms and embedding), the outcome, what was missing, the queries and
rewrites tried, the best hits with scores and grades, the citations, stale pages, latency and model calls.
A turn only queues its row (:meth:`TurnLog.record` never blocks and never raises); a writer thread stores it. A
full queue drops the row and an unreachable database loses it, both counted in :meth:`TurnLog.stats` (the
server's ``/metrics``), never costing the answer. The tables carry a schema version (``ragloop_turnlog_schema``),
as the Postgres store's do. ``ragloop gaps`` reads the log back (:meth:`TurnLog.turns`).
"""

from __future__ import annotations

from ragloop.turnlog._backends import PostgresBackend, SQLiteBackend, backend_for
from ragloop.turnlog._facts import conflicts, facts, unfound_terms
from ragloop.turnlog._log import MAX_COMMENT_CHARS, TurnLog, TurnLogStats
from ragloop.turnlog._prepare import LogPolicy, clean, hash_identity, prepare, question_hash
from ragloop.turnlog._row import (
    Conflict,
    LoggedCitation,
    LoggedHit,
    LoggedQuery,
    LoggedRewrite,
    LoggedTurn,
    PendingTurn,
    Rating,
    TurnRow,
    pending_turn,
)
from ragloop.turnlog._sql import SCHEMA_VERSION, FeedbackItem, SQLBackend, StoredRow
from ragloop.turnlog._sql_lifecycle import GapBook, GapRecord, ParkedDelivery

__all__ = [
    "MAX_COMMENT_CHARS",
    "SCHEMA_VERSION",
    "Conflict",
    "FeedbackItem",
    "GapBook",
    "GapRecord",
    "LogPolicy",
    "LoggedCitation",
    "LoggedHit",
    "LoggedQuery",
    "LoggedRewrite",
    "LoggedTurn",
    "ParkedDelivery",
    "PendingTurn",
    "PostgresBackend",
    "Rating",
    "SQLBackend",
    "SQLiteBackend",
    "StoredRow",
    "TurnLog",
    "TurnLogStats",
    "TurnRow",
    "backend_for",
    "clean",
    "conflicts",
    "facts",
    "hash_identity",
    "pending_turn",
    "prepare",
    "question_hash",
    "unfound_terms",
]
