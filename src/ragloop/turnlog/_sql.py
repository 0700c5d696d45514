"""The turn log's tables, in SQLite or PostgreSQL: one schema-version row, the turns, the feedback.

::

    ragloop_turnlog_schema   one row: name 'turns', the schema version (a newer one than this ragloop knows is refused)
    ragloop_turns            one row per finished turn: columns to filter on, the rest as JSON ``data``
    ragloop_feedback         one row per rating (the latest per turn counts)
    ragloop_gaps             (v2) one row per content gap: its stable id, status and when it was first seen
    ragloop_gap_turns        (v2) which gap each gap turn belongs to (what keeps a gap's id across runs)
    ragloop_replays          (v2) per turn, the latest ``ragloop replay --mark-gaps``: when, and whether answered
    ragloop_handoffs         (v2) turns handed off to a person: who, the packet sent, the resolution
    ragloop_handoff_outbox   (v2, added with #34) webhook deliveries that exhausted their retries, kept to be re-sent
                             (the same body and idempotency key, signed when sent) until one is accepted or it is
                             marked dead (``dead_at``, a column added on the first writable open)

A log of version 1 is migrated the first time it is opened for writing (turns, or the gaps' state: the v2 tables
created, the version row raised); a reader reads its v1 tables as they are. Nothing of the log itself changes.

Every method holds the backend's lock and runs on one connection (opened on first use, dropped after an error
and opened again on the next call), so the writer thread and a feedback lookup never share a cursor.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from attrs import frozen

from ragloop.errors import ConfigError
from ragloop.turnlog._row import LoggedTurn, Rating, TurnRow, row_from_json, row_to_json
from ragloop.turnlog._sql_lifecycle import ORPHAN_DELIVERIES, LifecycleTables

__all__ = ["SCHEMA_VERSION", "FeedbackItem", "SQLBackend", "StoredRow"]

#: Version of the turn log's tables; a log written by a newer ragloop is refused, not misread.
SCHEMA_VERSION = 2

#: Rows per insert statement (12 parameters each: well under SQLite's 32,766 and Postgres's 65,535).
_ROWS_PER_STATEMENT = 200
_TURN_COLUMNS = (
    "turn_id, at, principal, user_id, tenant, outcome, question, question_hash, seconds, data, embedding, embedder"
)


@frozen
class StoredRow:
    """A prepared row and its embedding, ready to insert.

    Attributes:
        row: The row.
        embedding: Its question's embedding as float32 bytes, if the log keeps embeddings.
        embedder: The embedder's name.
    """

    row: TurnRow
    embedding: bytes | None = None
    embedder: str | None = None


@frozen
class FeedbackItem:
    """One rating of one turn.

    Attributes:
        turn_id: The turn.
        at: When (seconds since the epoch).
        rating: ``up`` or ``down``.
        comment: The user's comment, redacted.
    """

    turn_id: str
    at: float
    rating: Rating
    comment: str | None = None


class SQLBackend(LifecycleTables):
    """What both databases share; subclasses open the connection and spell the types.

    Args:
        where: The log's location, as shown in errors (no password).
    """

    #: The placeholder of the driver's parameters.
    param = "?"
    #: The JSON column's type and the cast of its parameter.
    json_type, json_cast = "text", ""
    float_type, blob_type = "real", "blob"

    def __init__(self, where: str) -> None:
        self.where = where
        self._lock = threading.Lock()
        self._conn: Any = None
        self._ready = False
        self._writable = False

    # --- subclass hooks ---------------------------------------------------------------------------------

    def _connect(self, *, create: bool) -> Any:
        raise NotImplementedError

    def _lock_schema(self, conn: Any) -> None:
        """Order concurrent creators (Postgres: an advisory lock; SQLite's write lock does it already)."""

    # --- the connection ---------------------------------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("?", self.param)

    def _conn_for(self, *, create: bool) -> Any:
        if self._conn is not None and create and not self._writable:  # a reader's connection cannot write
            self._drop()
        if self._conn is None:
            self._conn = self._connect(create=create)
            self._writable = create
            self._ready = False
        if not self._ready:
            self._ensure(self._conn, create=create)
            self._ready = True
        return self._conn

    def _drop(self) -> None:
        conn, self._conn, self._ready = self._conn, None, False
        if conn is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close; it is gone either way
                conn.close()

    def _run(self, create: bool, work: Any) -> Any:
        with self._lock:
            conn = self._conn_for(create=create)
            try:
                out = work(conn)
                conn.commit()
                return out
            except BaseException:
                self._drop()
                raise

    def _ensure(self, conn: Any, *, create: bool) -> None:
        cur = conn.cursor()
        try:
            if create:
                self._lock_schema(conn)
                for statement in self._ddl():
                    cur.execute(statement)
                self._add_column(cur, "ragloop_handoff_outbox", "dead_at", self.float_type)  # #34's outbox had none
            cur.execute(self._sql("select version from ragloop_turnlog_schema where name = ?"), ("turns",))
            found = cur.fetchone()
            if found is None:
                if not create:
                    raise ConfigError(f"{self.where} holds no ragloop turn log (`ragloop serve --turn-log` writes one)")
                cur.execute(
                    self._sql("insert into ragloop_turnlog_schema (name, version) values (?, ?)"),
                    ("turns", SCHEMA_VERSION),
                )
            elif int(found[0]) > SCHEMA_VERSION:
                raise ConfigError(
                    f"the turn log at {self.where} has schema version {found[0]}; this ragloop reads up to "
                    f"{SCHEMA_VERSION}: upgrade ragloop, or point --turn-log at a new log"
                )
            elif int(found[0]) < SCHEMA_VERSION and create:  # a reader reads the old tables as they are
                self._lock_schema(conn)
                for statement in self._ddl_v2():
                    cur.execute(statement)
                cur.execute(
                    self._sql("update ragloop_turnlog_schema set version = ? where name = ?"), (SCHEMA_VERSION, "turns")
                )
            conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def _ddl(self) -> list[str]:
        """Every table and index of the current version."""
        f, j, b = self.float_type, self.json_type, self.blob_type
        return [
            "create table if not exists ragloop_turnlog_schema (name text primary key, version integer not null)",
            f"create table if not exists ragloop_turns (turn_id text primary key, at {f} not null, "
            "principal text not null, user_id text not null, tenant text, outcome text not null, question text, "
            f"question_hash text not null, seconds {f} not null, data {j} not null, embedding {b}, embedder text)",
            "create index if not exists ragloop_turns_at on ragloop_turns (at)",
            f"create table if not exists ragloop_feedback (turn_id text not null, at {f} not null, "
            "rating text not null, comment text)",
            "create index if not exists ragloop_feedback_turn on ragloop_feedback (turn_id)",
            *self._ddl_v2(),
        ]

    def _ddl_v2(self) -> list[str]:
        """What version 2 added: the gaps' lifecycle (also what migrates a version 1 log)."""
        f = self.float_type
        return [
            f"create table if not exists ragloop_gaps (gap_id text primary key, label text not null, "
            f"status text not null, status_at {f} not null, first_seen {f} not null, last_seen {f} not null)",
            "create table if not exists ragloop_gap_turns (turn_id text primary key, gap_id text not null)",
            "create index if not exists ragloop_turns_principal_at on ragloop_turns (principal, at)",
            f"create table if not exists ragloop_replays (turn_id text primary key, at {f} not null, "
            "answered integer not null)",
            f"create table if not exists ragloop_handoffs (handoff_id text primary key, turn_id text not null, "
            f"principal text not null, at {f} not null, packet text not null, resolution text)",
            # Additive (an older ragloop of v2 ignores it), so created on every writable open without a new version.
            f"create table if not exists ragloop_handoff_outbox (handoff_id text primary key, url text not null, "
            f"body text not null, signature text not null, failed_at {f} not null, attempts integer not null, "
            f"last_error text, claimed_until {f}, delivered_at {f}, dead_at {f})",
        ]

    def _add_column(self, cur: Any, table: str, column: str, spec: str) -> None:
        """Add ``column`` to ``table`` unless it is there (an additive change of a table an older ragloop made)."""
        cur.execute(f"alter table {table} add column if not exists {column} {spec}")

    # --- operations ---------------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect and check (or create) the tables."""
        self._run(True, lambda conn: None)

    def write(
        self, rows: Sequence[StoredRow], feedback: Sequence[FeedbackItem], *, keep_per_principal: int | None = None
    ) -> int:
        """Insert rows (a turn id already there is left as it is) and feedback, in one transaction; how many
        turns went to keep each principal of ``rows`` within ``keep_per_principal`` (its oldest first, with
        their feedback). A turn keeps only its latest rating (the only one ever read)."""
        values = [
            (
                s.row.turn_id,
                s.row.at,
                s.row.principal,
                s.row.user,
                s.row.tenant,
                s.row.outcome,
                s.row.question,
                s.row.question_hash,
                s.row.seconds,
                json.dumps(row_to_json(s.row), ensure_ascii=False, allow_nan=False),
                s.embedding,
                s.embedder,
            )
            for s in rows
        ]
        rated = [(f.turn_id, f.at, f.rating, f.comment) for f in feedback]

        row_sql = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?" + self.json_cast + ", ?, ?)"

        def work(conn: Any) -> int:
            cur = conn.cursor()
            # One multi-row statement per chunk, not one per row: every statement the driver runs hands the GIL
            # over and back, and each handover can stall a turn running in the main thread.
            for start in range(0, len(values), _ROWS_PER_STATEMENT):
                chunk = values[start : start + _ROWS_PER_STATEMENT]
                statement = self._sql(
                    f"insert into ragloop_turns ({_TURN_COLUMNS}) values {', '.join([row_sql] * len(chunk))} "
                    "on conflict (turn_id) do nothing"
                )
                cur.execute(statement, [v for row in chunk for v in row])
            if rated:
                cur.executemany(self._sql("delete from ragloop_feedback where turn_id = ?"), [(r[0],) for r in rated])
                cur.executemany(
                    self._sql("insert into ragloop_feedback (turn_id, at, rating, comment) values (?, ?, ?, ?)"), rated
                )
            if keep_per_principal is None:
                return 0
            return self._trim(cur, sorted({s.row.principal for s in rows}), keep_per_principal)

        gone: int = self._run(True, work)
        return gone

    def _trim(self, cur: Any, principals: Sequence[str], keep: int) -> int:
        """Delete each principal's turns older than its ``keep``-th newest (and what points at them)."""
        gone: list[tuple[str]] = []
        for principal in principals:
            cur.execute(
                self._sql(
                    "select turn_id from ragloop_turns where principal = ? and at < (select at from ragloop_turns "
                    "where principal = ? order by at desc limit 1 offset ?)"
                ),
                (principal, principal, keep - 1),
            )
            gone += [(str(t),) for (t,) in cur.fetchall()]
        handoffs = "select handoff_id from ragloop_handoffs where turn_id = ?"
        cur.executemany(self._sql(f"delete from ragloop_handoff_outbox where handoff_id in ({handoffs})"), gone)
        for table in ("ragloop_turns", "ragloop_feedback", "ragloop_gap_turns", "ragloop_replays", "ragloop_handoffs"):
            cur.executemany(self._sql(f"delete from {table} where turn_id = ?"), gone)
        if gone:
            cur.execute(ORPHAN_DELIVERIES)
        return len(gone)

    def owner(self, turn_id: str) -> str | None:
        """The stored principal of ``turn_id`` (``None``: no such turn)."""

        def work(conn: Any) -> str | None:
            cur = conn.cursor()
            cur.execute(self._sql("select principal from ragloop_turns where turn_id = ?"), (turn_id,))
            found = cur.fetchone()
            return None if found is None else str(found[0])

        result: str | None = self._run(True, work)
        return result

    def purge(self, before: float) -> int:
        """Delete turns older than ``before`` and everything that points at them (their feedback, gap marks,
        replays, hand-offs and the hand-offs' webhook deliveries), in one transaction; how many turns went."""

        def work(conn: Any) -> int:
            cur = conn.cursor()
            cur.execute(self._sql("delete from ragloop_turns where at < ?"), (before,))
            gone = int(cur.rowcount or 0)
            # Feedback by its own time: a rating of a turn still in the writer's queue is not an orphan.
            cur.execute(self._sql("delete from ragloop_feedback where at < ?"), (before,))
            orphan = "turn_id not in (select turn_id from ragloop_turns)"
            cur.execute(
                "delete from ragloop_handoff_outbox where handoff_id in "
                f"(select handoff_id from ragloop_handoffs where {orphan})"
            )
            for table in ("ragloop_gap_turns", "ragloop_replays", "ragloop_handoffs"):
                cur.execute(f"delete from {table} where {orphan}")
            cur.execute(ORPHAN_DELIVERIES)  # one a delivery in flight parked while this waited on its hand-off
            return gone

        result: int = self._run(True, work)
        return result

    def turns(
        self, since: float, until: float, *, brief_answered: bool = False, latest: int | None = None
    ) -> list[LoggedTurn]:
        """Every turn with ``since <= at < until``, oldest first (ties by turn id), with its latest feedback; with
        ``latest``, only the latest that many of them.

        With ``brief_answered``, a turn answered in full (``context`` or ``direct``) and not rated down comes back
        without its queries, rewrites and hits (what ``ragloop gaps`` never reads of it): a report of 100k turns
        reads in a third of the time.
        """

        def work(conn: Any) -> list[LoggedTurn]:
            cur = conn.cursor()
            where = f"select {_TURN_COLUMNS} from ragloop_turns where at >= ? and at < ?"
            if latest is None:
                cur.execute(self._sql(f"{where} order by at, turn_id"), (since, until))
                rows = cur.fetchall()
            else:
                cur.execute(self._sql(f"{where} order by at desc, turn_id desc limit ?"), (since, until, latest))
                rows = cur.fetchall()[::-1]
            first = min((float(r[1]) for r in rows), default=until)
            cur.execute(
                self._sql("select turn_id, rating, comment from ragloop_feedback where at >= ? order by at"),
                (since if latest is None else first,),
            )
            rated = {str(t): (r, c) for t, r, c in cur.fetchall()}
            return [_logged(row, rated, brief_answered) for row in rows]

        result: list[LoggedTurn] = self._run(False, work)
        return result

    def turn(self, turn_id: str) -> LoggedTurn | None:
        """One stored turn with its latest feedback (``None``: no such turn)."""

        def work(conn: Any) -> LoggedTurn | None:
            cur = conn.cursor()
            cur.execute(self._sql(f"select {_TURN_COLUMNS} from ragloop_turns where turn_id = ?"), (turn_id,))
            row = cur.fetchone()
            if row is None:
                return None
            cur.execute(
                self._sql("select turn_id, rating, comment from ragloop_feedback where turn_id = ? order by at"),
                (turn_id,),
            )
            rated = {str(t): (r, c) for t, r, c in cur.fetchall()}
            return _logged(row, rated)

        result: LoggedTurn | None = self._run(False, work)
        return result

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._drop()


_DETAIL = ("queries", "rewrites", "hits")


def _logged(row: Sequence[Any], rated: dict[str, tuple[Any, Any]], brief_answered: bool = False) -> LoggedTurn:
    turn_id, at, principal, user, tenant, outcome, question, qhash, seconds, data, blob, embedder = row
    columns = {
        "turn_id": turn_id,
        "at": at,
        "principal": principal,
        "user": user,
        "tenant": tenant,
        "outcome": outcome,
        "question": question,
        "question_hash": qhash,
        "seconds": seconds,
    }
    parsed = json.loads(data) if isinstance(data, str | bytes) else data
    rating, comment = rated.get(str(turn_id), (None, None))
    if brief_answered and outcome in ("context", "direct") and rating != "down":
        parsed = {k: v for k, v in parsed.items() if k not in _DETAIL}
    vector = np.frombuffer(bytes(blob), dtype=np.float32) if blob is not None else None
    return LoggedTurn(
        row=row_from_json(columns, parsed),
        rating="up" if rating == "up" else "down" if rating == "down" else None,
        comment=comment,
        embedding=vector,
        embedder=embedder,
    )
