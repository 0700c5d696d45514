"""The gaps' state in the turn log's database (schema v2) on SQLite and PostgreSQL: round trip, upserts, the
migration of a v1 log, a reader that never writes, retention that takes the state of purged turns with it."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragloop.turnlog import SCHEMA_VERSION, GapRecord, SQLBackend, SQLiteBackend, StoredRow, TurnRow, backend_for
from tests.retrievers.conftest import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]

_dbs = itertools.count()


def _row(n: int, at: float) -> StoredRow:
    return StoredRow(TurnRow(f"t{n}", at, "p", "u", None, f"q{n}?", "h", (), "none"))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLBackend]:
    """A fresh turn-log database of each kind, holding three turns."""
    if request.param == "sqlite":
        b: SQLBackend = SQLiteBackend(tmp_path / "turns.db")
    else:
        import psycopg

        url = request.getfixturevalue("pg_url")
        name = f"gapstate{next(_dbs)}"
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"drop database if exists {name}")
            admin.execute(f"create database {name}")
        b = backend_for(url.replace("/postgres?", f"/{name}?"))
    b.write([_row(1, 10.0), _row(2, 20.0), _row(3, 30.0)], ())
    yield b
    b.close()


class TestGapState:
    def test_round_trip_and_upsert(self, backend: SQLBackend) -> None:
        """Records, memberships and replays come back as saved; saving again updates in place."""
        assert backend.gap_book().gaps == {}
        rec = GapRecord("g-1", "zapier", "open", 10.0, 10.0, 20.0)
        backend.save_gaps([rec], {"t1": "g-1", "t2": "g-1"})
        backend.record_replays([("t1", 40.0, True), ("t2", 40.0, False)])
        book = backend.gap_book()
        assert book.gaps == {"g-1": rec} and book.members == {"t1": "g-1", "t2": "g-1"}
        assert book.replays == {"t1": (40.0, True), "t2": (40.0, False)}
        fixed = GapRecord("g-1", "zapier · zaps", "fixed", 50.0, 10.0, 30.0)
        backend.save_gaps([fixed], {"t2": "g-2", "t3": "g-1"})
        backend.record_replays([("t2", 60.0, True)])
        book = backend.gap_book()
        assert book.gaps == {"g-1": fixed} and book.members == {"t1": "g-1", "t2": "g-2", "t3": "g-1"}
        assert book.replays["t2"] == (60.0, True)

    def test_purge_takes_the_state_of_purged_turns(self, backend: SQLBackend) -> None:
        """Retention deletes the memberships and replays of the turns it deletes, and only those."""
        backend.save_gaps([GapRecord("g-1", "z", "open", 10.0, 10.0, 30.0)], {"t1": "g-1", "t3": "g-1"})
        backend.record_replays([("t1", 40.0, True), ("t3", 40.0, True)])
        assert backend.purge(15.0) == 1
        book = backend.gap_book()
        assert book.members == {"t3": "g-1"} and set(book.replays) == {"t3"}

    def test_purge_takes_the_handoffs_and_deliveries_of_purged_turns(self, backend: SQLBackend) -> None:
        """Retention deletes the hand-offs of the turns it deletes and their parked webhook deliveries, in the
        same transaction, and nothing of a kept turn's (on main both stayed: a purged question lived on in the
        hand-off's packet and the outbox's body, and a dead URL's row was re-sent forever)."""
        _handed_off(backend, "t1", "h-1")
        _handed_off(backend, "t3", "h-3")
        assert backend.purge(15.0) == 1
        assert backend.handoff("h-1") is None and backend.handoff("h-3") is not None
        assert _outbox_ids(backend) == ["h-3"]

    def test_a_delivery_in_flight_when_its_handoff_is_purged_is_not_kept(self, backend: SQLBackend) -> None:
        """A delivery that gives up after retention purged its hand-off parks nothing (on e4077ec it parked an
        orphan row: the purged question lived on in the outbox and was re-sent); a kept turn's still parks."""
        backend.save_handoff("h-1", "t1", "p", 1.0, '{"question": "secret t1?"}')
        backend.save_handoff("h-3", "t3", "p", 1.0, "{}")
        assert backend.purge(15.0) == 1  # the delivery of h-1 is in flight meanwhile
        assert backend.park_delivery("h-1", "http://x/hook", '{"question": "secret t1?"}', 2.0, "ConnectError") is False
        assert backend.park_delivery("h-3", "http://x/hook", "{}", 2.0, "ConnectError") is True
        assert _outbox_ids(backend) == ["h-3"]

    def test_an_orphan_delivery_is_never_sent_and_goes(self, backend: SQLBackend) -> None:
        """A delivery row whose hand-off is gone (parked by an earlier version after a purge) is never claimed for
        a re-send; the claim, and the next purge, delete it."""
        _handed_off(backend, "t3", "h-3")
        _orphan(backend, "h-gone")
        assert [c[0] for c in backend.claim_deliveries(100.0, 10.0, 10)] == ["h-3"]
        assert _outbox_ids(backend) == ["h-3"]
        _orphan(backend, "h-gone")
        assert backend.purge(15.0) == 1 and _outbox_ids(backend) == ["h-3"]


class TestPurgeRace:
    def test_a_park_holding_its_handoff_makes_a_purge_wait_and_take_its_row(self, pg_url: str) -> None:
        """Postgres, two sessions: a park that has locked its hand-off row (as ``park_delivery`` does) and inserted
        its delivery holds back a purge of that hand-off until it commits; the purge then deletes the new row
        too, so no orphan is left whichever commits first."""
        import threading

        import psycopg

        from ragloop.turnlog import backend_for

        name = f"race{next(_dbs)}"
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"drop database if exists {name}")
            admin.execute(f"create database {name}")
        url = pg_url.replace("/postgres?", f"/{name}?")
        backend = backend_for(url)
        backend.write([_row(1, 10.0), _row(3, 30.0)], ())
        backend.save_handoff("h-1", "t1", "p", 1.0, "{}")
        done = threading.Event()
        with psycopg.connect(url) as park:
            park.execute("select 1 from ragloop_handoffs where handoff_id = 'h-1' for share")
            park.execute(
                "insert into ragloop_handoff_outbox (handoff_id, url, body, signature, failed_at, attempts) "
                "values ('h-1', 'http://x/hook', '{}', '', 2.0, 1)"
            )
            purge = threading.Thread(target=lambda: (backend.purge(15.0), done.set()))
            purge.start()
            assert not done.wait(1.0)  # waits on the locked hand-off row
            park.commit()
        purge.join(30)
        assert done.is_set() and backend.handoff("h-1") is None and _outbox_ids(backend) == []
        backend.close()


def _orphan(backend: SQLBackend, handoff_id: str) -> None:
    def work(conn: Any) -> None:
        conn.cursor().execute(
            backend._sql(
                "insert into ragloop_handoff_outbox (handoff_id, url, body, signature, failed_at, attempts) "
                "values (?, 'http://x/hook', '{\"question\": \"purged\"}', '', 1.0, 1)"
            ),
            (handoff_id,),
        )

    backend._run(True, work)


def _handed_off(backend: SQLBackend, turn_id: str, handoff_id: str) -> None:
    """A hand-off of ``turn_id`` whose webhook delivery was parked."""
    packet = f'{{"handoff_id": "{handoff_id}", "question": "secret {turn_id}?"}}'
    backend.save_handoff(handoff_id, turn_id, "p", 1.0, packet)
    backend.park_delivery(handoff_id, "http://x/hook", packet, 1.0, "ConnectError")


def _outbox_ids(backend: SQLBackend) -> list[str]:
    def work(conn: Any) -> list[str]:
        cur = conn.cursor()
        cur.execute("select handoff_id from ragloop_handoff_outbox order by handoff_id")
        return [str(r[0]) for r in cur.fetchall()]

    result: list[str] = backend._run(False, work)
    return result


def _v1_log(path: Path) -> None:
    """A turn log as ragloop wrote it before schema version 2."""
    backend = SQLiteBackend(path)
    ddl = [s for s in backend._ddl() if s not in backend._ddl_v2()]
    conn = sqlite3.connect(path)
    for statement in ddl:
        conn.execute(statement)
    conn.execute("insert into ragloop_turnlog_schema (name, version) values ('turns', 1)")
    conn.commit()
    conn.close()


def _tables(path: Path) -> set[Any]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
    finally:
        conn.close()


class TestMigration:
    def test_v1_log_read_as_is_then_migrated_on_first_write(self, tmp_path: Path) -> None:
        """A reader of a v1 log changes nothing; the first write adds the v2 tables and raises the version."""
        path = tmp_path / "v1.db"
        _v1_log(path)
        reader = SQLiteBackend(path)
        assert reader.turns(0.0, 1e12) == []
        reader.close()
        assert "ragloop_gaps" not in _tables(path)
        writer = SQLiteBackend(path)
        assert writer.gap_book().gaps == {}
        writer.save_gaps([GapRecord("g-1", "z", "open", 1.0, 1.0, 1.0)], {})
        writer.close()
        assert {"ragloop_gaps", "ragloop_gap_turns", "ragloop_replays"} <= _tables(path)
        conn = sqlite3.connect(path)
        assert conn.execute("select version from ragloop_turnlog_schema").fetchall() == [(SCHEMA_VERSION,)]
        conn.close()

    def test_reader_connection_upgraded_for_a_write(self, tmp_path: Path) -> None:
        """One backend that read first (read-only connection) can then write the gaps' state."""
        backend = SQLiteBackend(tmp_path / "turns.db")
        backend.write([_row(1, 1.0)], ())
        backend.close()
        backend = SQLiteBackend(tmp_path / "turns.db")
        assert len(backend.turns(0.0, 1e12)) == 1
        backend.record_replays([("t1", 2.0, True)])
        assert backend.gap_book().replays == {"t1": (2.0, True)}
        backend.close()


class TestLatest:
    def test_latest_turns_only_oldest_first_with_feedback(self, backend: SQLBackend) -> None:
        """`latest=N` reads the N latest turns of the period, oldest first, with their feedback (what
        `ragloop replay --limit N` reads; the rest of the period is never loaded)."""
        from ragloop.turnlog import FeedbackItem

        backend.write((), [FeedbackItem("t3", 35.0, "down", "no"), FeedbackItem("t1", 15.0, "up")])
        latest = backend.turns(0.0, 1e12, latest=2)
        assert [t.row.turn_id for t in latest] == ["t2", "t3"] and latest[1].rating == "down"
        assert [t.row.turn_id for t in backend.turns(0.0, 25.0, latest=5)] == ["t1", "t2"]
        assert backend.turns(0.0, 1e12)[0].rating == "up"


def _owned(n: int, at: float, principal: str) -> StoredRow:
    return StoredRow(TurnRow(f"k{n}", at, principal, "u", None, f"q{n}?", "h", (), "none"))


def _ids_of(backend: SQLBackend, principal: str) -> list[str]:
    return [t.row.turn_id for t in backend.turns(0.0, 1e12) if t.row.principal == principal]


class TestPerPrincipalCap:
    def test_a_key_over_its_cap_loses_its_own_oldest_turns_never_anothers(self, backend: SQLBackend) -> None:
        """With ``keep_per_principal=3`` a flood of one key's turns keeps that key's 3 newest (its ratings and
        gap marks go with the rest) and leaves every other key's turns as they were (on main the log had no
        per-key bound: one key could fill it without limit)."""
        from ragloop.turnlog import FeedbackItem

        backend.write([_owned(0, 5.0, "victim"), _owned(1, 6.0, "victim")], ())
        backend.write((), [FeedbackItem("k2", 7.5, "down")])
        flood = [_owned(n, 10.0 + n, "flooder") for n in range(2, 12)]
        backend.save_gaps([GapRecord("g-1", "x", "open", 0.0, 0.0, 0.0)], {"k2": "g-1"})
        backend.record_replays([("k2", 9.0, True)])
        trimmed = backend.write(flood[:5], (), keep_per_principal=3)
        trimmed += backend.write(flood[5:], (), keep_per_principal=3)
        assert _ids_of(backend, "flooder") == ["k9", "k10", "k11"] and trimmed == 7
        assert _ids_of(backend, "victim") == ["k0", "k1"] and _ids_of(backend, "p") == ["t1", "t2", "t3"]
        book = backend.gap_book()
        assert "k2" not in book.members and "k2" not in book.replays  # its gap and replay marks went with it

    def test_the_trim_takes_the_handoffs_and_deliveries_of_trimmed_turns(self, backend: SQLBackend) -> None:
        """The per-key trim deletes a trimmed turn's hand-off and its parked delivery with it (on main both
        stayed), and leaves those of the turns it keeps and of other keys."""
        backend.write([_owned(n, 10.0 + n, "flooder") for n in range(3)], ())
        _handed_off(backend, "k0", "h-0")
        _handed_off(backend, "k2", "h-2")
        _handed_off(backend, "t1", "h-t1")
        assert backend.write([_owned(3, 20.0, "flooder")], (), keep_per_principal=2) == 2
        assert backend.handoff("h-0") is None and backend.handoff("h-2") is not None
        assert _outbox_ids(backend) == ["h-2", "h-t1"]

    def test_a_turn_keeps_only_its_latest_rating(self, backend: SQLBackend) -> None:
        """Rating one turn again replaces its rating (the only one ever read), so a key's feedback rows never
        outnumber its turns."""
        from ragloop.turnlog import FeedbackItem

        for n in range(5):
            backend.write((), [FeedbackItem("t1", 40.0 + n, "up" if n % 2 else "down", f"c{n}")])
        logged = backend.turn("t1")
        assert logged is not None and (logged.rating, logged.comment) == ("down", "c4")
        assert _feedback_rows(backend) == 1


def _feedback_rows(backend: SQLBackend) -> int:
    def work(conn: Any) -> int:
        cur = conn.cursor()
        cur.execute("select count(*) from ragloop_feedback")
        return int(cur.fetchone()[0])

    result: int = backend._run(False, work)
    return result


class TestPerPrincipalCapProperty:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        batches=st.lists(
            st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 50)), min_size=1, max_size=6), max_size=6
        ),
        cap=st.integers(1, 4),
    )
    def test_every_key_holds_at_most_its_cap_and_only_its_own_oldest_go(
        self, tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[str, int]]], cap: int
    ) -> None:
        """Whatever the writes, each key keeps exactly its ``cap`` newest turns (all of them when it has fewer):
        a write never deletes a turn of a key it does not hold."""
        b = SQLiteBackend(tmp_path_factory.mktemp("cap") / "turns.db")
        written: dict[str, list[tuple[float, str]]] = {}
        n = 0
        for batch in batches:
            rows = []
            for principal, at in batch:
                rows.append(_owned(n, float(at) + n / 1000, principal))  # distinct times: no ties at the cut
                written.setdefault(principal, []).append((float(at) + n / 1000, f"k{n}"))
                n += 1
            b.write(rows, (), keep_per_principal=cap)
            for principal in {p for p, _ in batch}:
                written[principal] = sorted(written[principal])[-cap:]
        for principal, kept in written.items():
            assert sorted(_ids_of(b, principal)) == sorted(t for _, t in kept)
        b.close()
