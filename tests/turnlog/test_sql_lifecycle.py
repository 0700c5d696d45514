"""The gaps' state in the turn log's database (schema v2) on SQLite and PostgreSQL: round trip, upserts, the
migration of a v1 log, a reader that never writes, retention that takes the state of purged turns with it."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
