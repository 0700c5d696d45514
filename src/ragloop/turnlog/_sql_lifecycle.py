"""The turn log's version 2 tables: the gaps' lifecycle and the hand-offs (mixed into :class:`SQLBackend`).

See :mod:`ragloop.turnlog._sql` for the tables; every method runs through the backend's ``_run`` (its lock, its
one connection) and opens the log for writing, which migrates a version 1 log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

__all__ = ["DELIVERED_KEPT_S", "GapBook", "GapRecord", "LifecycleTables", "ParkedDelivery"]


#: How long a delivered row stays in the hand-off outbox (a week), for whoever inspects the table.
DELIVERED_KEPT_S = 7 * 86_400.0


@frozen
class GapRecord:
    """A content gap as the log remembers it between runs of ``ragloop gaps``.

    Attributes:
        gap_id: Its stable id.
        label: Its label when last seen.
        status: ``open``, ``fixed`` or ``reopened``.
        status_at: When it took that status (seconds since the epoch).
        first_seen: Its earliest turn.
        last_seen: Its latest turn.
    """

    gap_id: str
    label: str
    status: str
    status_at: float
    first_seen: float
    last_seen: float


@frozen
class ParkedDelivery:
    """A hand-off webhook delivery kept in the outbox (``ragloop handoff list``).

    Attributes:
        handoff_id: The hand-off (also the delivery's idempotency key).
        url: Where it is to go.
        failed_at: When its first delivery gave up (seconds since the epoch).
        attempts: Deliveries tried: the first (with its retries) and each re-send.
        last_error: Why the latest failed.
        dead_at: When it was marked dead (``None``: still re-sent).
    """

    handoff_id: str
    url: str
    failed_at: float
    attempts: int
    last_error: str | None
    dead_at: float | None


@frozen
class GapBook:
    """Everything the log remembers about gaps.

    Attributes:
        gaps: Gap id → its record.
        members: Turn id → the gap it belongs to.
        replays: Turn id → ``(when, answered)`` of its latest replay marked with ``--mark-gaps``.
    """

    gaps: Mapping[str, GapRecord]
    members: Mapping[str, str]
    replays: Mapping[str, tuple[float, bool]]


#: Deletes the deliveries whose hand-off is gone.
ORPHAN_DELIVERIES = (
    "delete from ragloop_handoff_outbox where handoff_id not in (select handoff_id from ragloop_handoffs)"
)


class LifecycleTables:
    """Reading and writing the version 2 tables; needs the backend's ``_run`` and ``_sql``."""

    def _run(self, create: bool, work: Any) -> Any:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        raise NotImplementedError

    #: What a ``select`` appends to lock the rows it reads until the transaction ends (Postgres: `` for share``;
    #: SQLite holds its one write lock already).
    row_lock = ""

    def gap_book(self) -> GapBook:
        """What the log remembers about gaps (empty for a log no ``ragloop gaps`` has run on)."""

        def work(conn: Any) -> GapBook:
            cur = conn.cursor()
            cur.execute("select gap_id, label, status, status_at, first_seen, last_seen from ragloop_gaps")
            gaps = {str(r[0]): GapRecord(str(r[0]), str(r[1]), str(r[2]), *map(float, r[3:])) for r in cur.fetchall()}
            cur.execute("select turn_id, gap_id from ragloop_gap_turns")
            members = {str(t): str(g) for t, g in cur.fetchall()}
            cur.execute("select turn_id, at, answered from ragloop_replays")
            replays = {str(t): (float(at), bool(a)) for t, at, a in cur.fetchall()}
            return GapBook(gaps, members, replays)

        result: GapBook = self._run(True, work)
        return result

    def save_gaps(self, records: Sequence[GapRecord], members: Mapping[str, str]) -> None:
        """Insert or update gap records and turn memberships, in one transaction."""
        gap_sql = self._sql(
            "insert into ragloop_gaps (gap_id, label, status, status_at, first_seen, last_seen) "
            "values (?, ?, ?, ?, ?, ?) on conflict (gap_id) do update set label = excluded.label, "
            "status = excluded.status, status_at = excluded.status_at, first_seen = excluded.first_seen, "
            "last_seen = excluded.last_seen"
        )
        member_sql = self._sql(
            "insert into ragloop_gap_turns (turn_id, gap_id) values (?, ?) "
            "on conflict (turn_id) do update set gap_id = excluded.gap_id"
        )

        def work(conn: Any) -> None:
            cur = conn.cursor()
            if records:
                cur.executemany(
                    gap_sql, [(r.gap_id, r.label, r.status, r.status_at, r.first_seen, r.last_seen) for r in records]
                )
            if members:
                cur.executemany(member_sql, sorted(members.items()))

        self._run(True, work)

    def record_replays(self, replays: Sequence[tuple[str, float, bool]]) -> None:
        """Remember ``(turn id, when, answered)`` of replayed turns (a turn's latest replay replaces the last)."""
        sql = self._sql(
            "insert into ragloop_replays (turn_id, at, answered) values (?, ?, ?) "
            "on conflict (turn_id) do update set at = excluded.at, answered = excluded.answered"
        )

        def work(conn: Any) -> None:
            conn.cursor().executemany(sql, [(t, at, int(a)) for t, at, a in replays])

        self._run(True, work)

    def gap_of(self, turn_id: str) -> str | None:
        """The gap ``turn_id`` belongs to, if ``ragloop gaps`` put it in one."""

        def work(conn: Any) -> str | None:
            cur = conn.cursor()
            cur.execute(self._sql("select gap_id from ragloop_gap_turns where turn_id = ?"), (turn_id,))
            found = cur.fetchone()
            return None if found is None else str(found[0])

        result: str | None = self._run(True, work)
        return result

    def save_handoff(self, handoff_id: str, turn_id: str, principal: str, at: float, packet: str) -> None:
        """Store a new hand-off (its packet as JSON text)."""
        sql = self._sql(
            "insert into ragloop_handoffs (handoff_id, turn_id, principal, at, packet) values (?, ?, ?, ?, ?)"
        )
        self._run(True, lambda conn: conn.cursor().execute(sql, (handoff_id, turn_id, principal, at, packet)))

    def handoff(self, handoff_id: str) -> tuple[str, str, str | None] | None:
        """``(principal, packet, resolution)`` of a hand-off (``None``: no such hand-off)."""

        def work(conn: Any) -> tuple[str, str, str | None] | None:
            cur = conn.cursor()
            cur.execute(
                self._sql("select principal, packet, resolution from ragloop_handoffs where handoff_id = ?"),
                (handoff_id,),
            )
            found = cur.fetchone()
            return None if found is None else (str(found[0]), str(found[1]), found[2])

        result: tuple[str, str, str | None] | None = self._run(True, work)
        return result

    def resolve_handoff(self, handoff_id: str, resolution: str) -> bool:
        """Record the resolution of an unresolved hand-off; ``False`` when it was already resolved."""

        def work(conn: Any) -> bool:
            cur = conn.cursor()
            cur.execute(
                self._sql("update ragloop_handoffs set resolution = ? where handoff_id = ? and resolution is null"),
                (resolution, handoff_id),
            )
            return bool(cur.rowcount)

        result: bool = self._run(True, work)
        return result

    # --- the hand-off webhook's outbox ------------------------------------------------------------------------

    def park_delivery(self, handoff_id: str, url: str, body: str, at: float, error: str) -> bool:
        """Keep a delivery that exhausted its retries, its body to be re-sent as it is and signed when it is
        sent (a second park counts an attempt); ``False`` when its hand-off is gone (retention purged it while the
        delivery was in flight): nothing is kept, so no purged question lives on in the outbox."""
        # The hand-off row is locked (Postgres) until this commits: a purge deleting it either waits and then
        # deletes this row as an orphan, or commits first and this finds nothing to park.
        exists = self._sql(f"select 1 from ragloop_handoffs where handoff_id = ?{self.row_lock}")
        # ``signature`` is left empty: a re-send signs with the secret of its day (a rotated one too).
        sql = self._sql(
            "insert into ragloop_handoff_outbox (handoff_id, url, body, signature, failed_at, attempts, last_error) "
            "select cast(? as text), cast(? as text), cast(? as text), '', ?, 1, cast(? as text) "
            "where exists (select 1 from ragloop_handoffs where handoff_id = ?) on conflict (handoff_id) do update "
            "set attempts = ragloop_handoff_outbox.attempts + 1, last_error = excluded.last_error, claimed_until = null"
        )

        def work(conn: Any) -> bool:
            cur = conn.cursor()
            cur.execute(exists, (handoff_id,))
            if cur.fetchone() is None:
                return False
            cur.execute(sql, (handoff_id, url, body, at, error, handoff_id))
            return bool(cur.rowcount)

        result: bool = self._run(True, work)
        return result

    def bury_deliveries(self, now: float, max_attempts: int, max_age_s: float) -> int:
        """Mark dead the waiting deliveries tried ``max_attempts`` times or first parked ``max_age_s`` ago (kept,
        never re-sent on their own again); how many were marked now."""
        sql = self._sql(
            "update ragloop_handoff_outbox set dead_at = ? where delivered_at is null and dead_at is null "
            "and (attempts >= ? or failed_at <= ?)"
        )

        def work(conn: Any) -> int:
            cur = conn.cursor()
            cur.execute(sql, (now, max_attempts, now - max_age_s))
            return int(cur.rowcount or 0)

        result: int = self._run(True, work)
        return result

    def claim_deliveries(
        self, now: float, hold_s: float, limit: int, *, dead: bool = False
    ) -> list[tuple[str, str, str]]:
        """Up to ``limit`` undelivered ones that are not dead (``dead``: only the dead ones), oldest first, as
        ``(handoff_id, url, body)``, each claimed until ``now + hold_s`` so that no other sender (another
        replica, ``ragloop handoff resend``) takes it meanwhile."""

        def work(conn: Any) -> list[tuple[str, str, str]]:
            cur = conn.cursor()
            # A week after its delivery a row has done its work (nothing sends a delivered one again).
            cur.execute(
                self._sql("delete from ragloop_handoff_outbox where delivered_at is not null and delivered_at < ?"),
                (now - DELIVERED_KEPT_S,),
            )
            cur.execute(ORPHAN_DELIVERIES)  # kept by a version that parked after a purge: never sent
            free = (
                f"delivered_at is null and dead_at is {'not ' if dead else ''}null "
                "and (claimed_until is null or claimed_until < ?)"
            )
            cur.execute(
                self._sql(
                    f"select handoff_id, url, body from ragloop_handoff_outbox where {free} "
                    "order by failed_at, handoff_id limit ?"
                ),
                (now, limit),
            )
            out = []
            for handoff_id, url, body in cur.fetchall():
                cur.execute(
                    self._sql(f"update ragloop_handoff_outbox set claimed_until = ? where handoff_id = ? and {free}"),
                    (now + hold_s, handoff_id, now),
                )
                if cur.rowcount == 1:
                    out.append((str(handoff_id), str(url), str(body)))
            return out

        result: list[tuple[str, str, str]] = self._run(True, work)
        return result

    def settle_delivery(self, handoff_id: str, delivered: bool, at: float, error: str | None = None) -> None:
        """Record a re-send's result: delivered (never sent again), or one more failed attempt (released; a dead
        one stays dead)."""
        if delivered:
            sql = self._sql(
                "update ragloop_handoff_outbox set delivered_at = ?, dead_at = null, claimed_until = null "
                "where handoff_id = ?"
            )
            args: tuple[Any, ...] = (at, handoff_id)
        else:
            sql = self._sql(
                "update ragloop_handoff_outbox set attempts = attempts + 1, last_error = ?, claimed_until = null "
                "where handoff_id = ?"
            )
            args = (error, handoff_id)
        self._run(True, lambda conn: conn.cursor().execute(sql, args))

    def undelivered(self, *, dead: bool = False) -> int:
        """How many kept deliveries wait to be re-sent (``dead``: how many are marked dead)."""

        def work(conn: Any) -> int:
            cur = conn.cursor()
            not_ = "not " if dead else ""
            cur.execute(
                f"select count(*) from ragloop_handoff_outbox where delivered_at is null and dead_at is {not_}null"
            )
            return int(cur.fetchone()[0])

        result: int = self._run(True, work)
        return result

    def parked(self, *, dead: bool = False) -> list[ParkedDelivery]:
        """The kept deliveries still waiting (``dead``: the dead ones), oldest first."""

        def work(conn: Any) -> list[ParkedDelivery]:
            cur = conn.cursor()
            not_ = "not " if dead else ""
            cur.execute(
                "select handoff_id, url, failed_at, attempts, last_error, dead_at from ragloop_handoff_outbox "
                f"where delivered_at is null and dead_at is {not_}null order by failed_at, handoff_id"
            )
            return [
                ParkedDelivery(str(h), str(u), float(f), int(a), None if e is None else str(e), _float(d))
                for h, u, f, a, e, d in cur.fetchall()
            ]

        result: list[ParkedDelivery] = self._run(True, work)
        return result


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
