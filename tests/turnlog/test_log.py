"""The turn log on SQLite: rows written and read back, versioned tables, retention, feedback scoped to its
principal, and a log that never slows or fails a turn (full queue, dead or hanging database, a raising hook)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError, InputError, TurnLogError
from ragloop.turnlog import (
    SCHEMA_VERSION,
    FeedbackItem,
    LogPolicy,
    PendingTurn,
    SQLiteBackend,
    StoredRow,
    TurnLog,
)
from tests.turnlog.conftest import ANSWERED, run_turn

pytestmark = pytest.mark.anyio


class _GatedBackend(SQLiteBackend):
    """A SQLite backend whose writes wait until the test opens the gate (a database that hangs)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()

    def write(self, rows: Sequence[StoredRow], feedback: Sequence[FeedbackItem], **kw: Any) -> int:
        self.gate.wait(30)
        return super().write(rows, feedback, **kw)


class _FlakyBackend(SQLiteBackend):
    """A SQLite backend that fails while ``down`` is set (a database that went away and came back)."""

    down = True

    def write(self, rows: Sequence[StoredRow], feedback: Sequence[FeedbackItem], **kw: Any) -> int:
        if self.down:
            raise sqlite3.OperationalError("database is locked")
        return super().write(rows, feedback, **kw)


def _url(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'turns.db'}"


async def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await anyio.sleep(0.02)


class TestRoundTrip:
    async def test_rows_written_and_read_back_in_order(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Recorded turns are written by the writer and read back oldest first, with their fields."""
        log = TurnLog.open(_url(tmp_path))
        questions = ["Hi!", "How do I rotate an API key?"]
        turns = [await run_turn(hash_rag, q, at=1000.0 + i) for i, q in enumerate(questions)]
        assert all(log.record(t) for t in turns)
        assert await log.flush()
        read = log.turns(0.0)
        assert [t.row.turn_id for t in read] == [t.turn_id for t in turns]
        assert read[1].row.question == "How do I rotate an API key?" and read[1].row.hits
        assert log.stats().written == 2 and log.stats().errors == 0
        await log.aclose()

    async def test_schema_version_row(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """The tables carry one schema-version row; a log written by a newer ragloop is refused, naming the fix."""
        log = TurnLog.open(_url(tmp_path))
        log.record(await run_turn(hash_rag, "Hi!"))
        await log.aclose()
        conn = sqlite3.connect(tmp_path / "turns.db")
        versions = conn.execute("select name, version from ragloop_turnlog_schema").fetchall()
        assert versions == [("turns", SCHEMA_VERSION)]
        conn.execute("update ragloop_turnlog_schema set version = ?", (SCHEMA_VERSION + 1,))
        conn.commit()
        conn.close()
        with pytest.raises(ConfigError, match="upgrade ragloop"):
            TurnLog.open(_url(tmp_path)).turns()

    async def test_reading_a_missing_log_creates_nothing(self, tmp_path: Path) -> None:
        """Reading a path that holds no log is an error naming it, and leaves no file behind."""
        log = TurnLog.open(_url(tmp_path))
        with pytest.raises(ConfigError, match="does not exist"):
            log.turns()
        await log.aclose()
        assert not (tmp_path / "turns.db").exists()

    @pytest.mark.parametrize("url", ["mysql://u:secret@h/db", "sqlite:", "", "turns.db"])
    def test_bad_url_is_one_clear_error(self, url: str) -> None:
        """A URL of no known kind is refused at once, saying the two forms, and never echoes a password."""
        with pytest.raises(ConfigError, match="sqlite:") as info:
            TurnLog.open(url)
        assert "secret" not in str(info.value)

    def test_missing_folder_refused(self, tmp_path: Path) -> None:
        """A SQLite path in a folder that does not exist is refused when the log opens."""
        with pytest.raises(ConfigError, match="does not exist"):
            TurnLog.open(f"sqlite:{tmp_path / 'nope' / 'turns.db'}")


class TestRetention:
    async def test_old_rows_deleted_when_the_log_opens(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """With retention_days, turns older than that are deleted (feedback with them) when the log opens."""
        now = 10_000_000.0
        log = TurnLog.open(_url(tmp_path), clock=lambda: now)
        log.record(await run_turn(hash_rag, "Hi!", at=now - 40 * 86_400))
        log.record(await run_turn(hash_rag, "How do I rotate an API key?", at=now - 86_400))
        await log.aclose()
        kept = TurnLog.open(_url(tmp_path), retention_days=30, clock=lambda: now)
        await _wait_for(lambda: kept.stats().purged == 1)
        assert [t.row.question for t in kept.turns(0.0)] == ["How do I rotate an API key?"]
        await kept.aclose()

    def test_retention_must_be_positive(self, tmp_path: Path) -> None:
        """A retention of zero or less days is a configuration error (it would delete everything)."""
        with pytest.raises(ConfigError, match="retention_days"):
            TurnLog.open(_url(tmp_path), retention_days=0)


class TestPerKeyCap:
    async def test_one_key_flooding_the_log_keeps_only_its_own_newest(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """``max_turns_per_principal`` bounds each key's rows: a key logging more loses its own oldest (counted
        in ``stats().trimmed``), another key's turns all stay."""
        log = TurnLog.open(_url(tmp_path), max_turns_per_principal=2, batch_size=1)
        log.record(await run_turn(hash_rag, "Hi!", principal="victim", at=100.0))
        for i in range(5):
            log.record(await run_turn(hash_rag, f"Hello {i}!", principal="flooder", at=200.0 + i))
        assert await log.flush()
        by_key: dict[str, list[float]] = {}
        for t in log.turns(0.0):
            by_key.setdefault(t.row.principal, []).append(t.row.at)
        # (the log stores keys hashed: compare the two keys' rows, not their names)
        assert sorted(by_key.values()) == [[100.0], [203.0, 204.0]] and log.stats().trimmed == 3
        await log.aclose()

    def test_the_cap_must_be_positive(self, tmp_path: Path) -> None:
        """A cap below one turn is a configuration error, said with the setting's name."""
        with pytest.raises(ConfigError, match="max_turns_per_principal"):
            TurnLog.open(_url(tmp_path), max_turns_per_principal=0)


class TestNeverFailsATurn:
    async def test_full_queue_drops_and_counts(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """With the writer stuck, rows past the queue's size are dropped at once and counted; none raises."""
        backend = _GatedBackend(tmp_path / "turns.db")
        log = TurnLog(backend, max_queue=3, batch_size=1)
        turn = await run_turn(hash_rag, "Hi!")
        accepted: list[bool] = []
        caller = threading.Thread(target=lambda: accepted.extend(log.record(turn) for _ in range(20)))
        caller.start()
        caller.join(10)  # a record() that waited for the stuck writer would never return
        assert not caller.is_alive() and len(accepted) == 20
        assert accepted.count(False) >= 16 and log.stats().dropped == accepted.count(False)
        backend.gate.set()
        await log.aclose()

    async def test_dead_database_costs_rows_then_recovers(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """While the database fails, rows are lost and counted as errors; once it is back, rows are written."""
        backend = _FlakyBackend(tmp_path / "turns.db")
        log = TurnLog(backend)
        turn = await run_turn(hash_rag, "Hi!")
        assert log.record(turn)
        await _wait_for(lambda: log.stats().errors == 1)
        assert "locked" in (log.stats().last_error or "")
        backend.down = False
        again = await run_turn(hash_rag, "How do I rotate an API key?")
        assert log.record(again)
        await _wait_for(lambda: log.stats().written == 1, timeout_s=15)
        assert [t.row.turn_id for t in log.turns()] == [again.turn_id]
        await log.aclose()

    async def test_hanging_database_close_is_bounded(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Closing over a database that hangs returns within its bound; what it held is counted as dropped."""
        backend = _GatedBackend(tmp_path / "turns.db")
        log = TurnLog(backend, batch_size=1)
        turn = await run_turn(hash_rag, "Hi!")
        for _ in range(3):
            log.record(turn)
        with anyio.fail_after(10):  # bounded: it gives up on the stuck writer after its timeout
            await log.aclose(timeout_s=0.3)
        assert log.stats().dropped >= 1 and not log.record(turn)
        backend.gate.set()

    async def test_raising_redaction_hook_costs_the_row(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """A PII hook that raises loses its row (an error), never writes the question unredacted."""

        def hook(text: str) -> str:
            raise RuntimeError("pii service down")

        log = TurnLog.open(_url(tmp_path), policy=LogPolicy(redact=hook))
        log.record(await run_turn(hash_rag, "How do I rotate an API key?"))
        assert await log.flush()
        assert log.stats().errors == 1 and log.stats().written == 0
        await log.aclose()

    async def test_concurrent_writers_one_file(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Two logs (two processes' worth) and eight threads writing one SQLite file lose nothing."""
        turns = [await run_turn(hash_rag, q) for q in ("Hi!", "How do I rotate an API key?")]
        logs = [TurnLog.open(_url(tmp_path)), TurnLog.open(_url(tmp_path))]

        def writer(n: int) -> None:
            for i in range(25):
                base = turns[i % 2]
                log = logs[n % 2]
                log.record(PendingTurn(**{**_fields(base), "turn_id": f"w{n}-{i}"}))

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for log in logs:
            await log.aclose()
        read = TurnLog.open(_url(tmp_path)).turns()
        assert len(read) == 200 and sum(log.stats().errors for log in logs) == 0

    async def test_odd_text_is_stored(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Lone surrogates and NUL in what a turn hands over are stored as U+FFFD, not lost or raised."""
        turn = await run_turn(hash_rag, "How do I rotate an API key?")
        odd = PendingTurn(**{**_fields(turn), "question": "key \ud800 rotate \x00 now", "principal": "p\udfff"})
        log = TurnLog.open(_url(tmp_path))
        log.record(odd)
        await log.aclose()
        [row] = [t.row for t in TurnLog.open(_url(tmp_path)).turns()]
        assert row.question == "key \ufffd rotate \ufffd now"


def _fields(turn: PendingTurn) -> dict[str, object]:
    import attrs

    return {f.name: getattr(turn, f.name) for f in attrs.fields(PendingTurn)}


class TestFeedback:
    async def test_own_turn_rated_queued_or_written(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """The asker may rate a turn still in the queue, or one already written (after a restart); the latest
        rating and its comment come back with the turn."""
        log = TurnLog.open(_url(tmp_path))
        turn = await run_turn(hash_rag, "How do I rotate an API key?", principal="key:1")
        log.record(turn)
        assert await log.feedback(turn.turn_id, "up", principal="key:1")
        await log.aclose()
        reopened = TurnLog.open(_url(tmp_path))
        assert await reopened.feedback(turn.turn_id, "down", comment="outdated", principal="key:1")
        [read] = reopened.turns()
        assert (read.rating, read.comment) == ("down", "outdated")
        await reopened.aclose()

    async def test_foreign_or_unknown_turn_refused(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Another principal's turn, or a turn id the log never saw, is not rated (False: the API's 404)."""
        log = TurnLog.open(_url(tmp_path))
        turn = await run_turn(hash_rag, "Hi!", principal="key:1")
        log.record(turn)
        assert not await log.feedback(turn.turn_id, "down", principal="key:2")
        assert not await log.feedback(turn.turn_id, "down")  # anonymous is not key:1
        assert not await log.feedback("no-such-turn", "down", principal="key:1")
        await log.aclose()
        reopened = TurnLog.open(_url(tmp_path))
        assert not await reopened.feedback(turn.turn_id, "down", principal="key:2")
        await reopened.aclose()

    @pytest.mark.parametrize(
        ("turn_id", "rating", "comment", "field"),
        [
            ("t", "meh", None, "rating"),
            ("", "up", None, "turn_id"),
            ("t" * 200, "up", None, "turn_id"),
            ("t", "up", "x" * 5000, "comment"),
        ],
    )
    async def test_bad_feedback_is_an_input_error(
        self, tmp_path: Path, turn_id: str, rating: str, comment: str | None, field: str
    ) -> None:
        """A bad rating, turn id or comment is an input error naming the field."""
        log = TurnLog.open(_url(tmp_path))
        with pytest.raises(InputError, match=field):
            await log.feedback(turn_id, rating, comment=comment)  # type: ignore[arg-type]
        await log.aclose()

    async def test_unreachable_database_is_a_turn_log_error(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """Rating a known turn while the database fails raises TurnLogError (the API's 503), naming the log."""
        backend = _FlakyBackend(tmp_path / "turns.db")
        log = TurnLog(backend)
        turn = await run_turn(hash_rag, "Hi!")
        log.record(turn)
        with pytest.raises(TurnLogError, match="could not record feedback"):
            await log.feedback(turn.turn_id, "up")
        await log.aclose()


class TestBriefRead:
    async def test_answered_turns_come_back_brief(self, tmp_path: Path, hash_rag: ChatRAG) -> None:
        """brief_answered leaves out the hits of turns answered in full and not rated down, and only theirs."""
        log = TurnLog.open(_url(tmp_path))
        answered = await run_turn(hash_rag, ANSWERED)
        rated = await run_turn(hash_rag, ANSWERED)
        gap = await run_turn(hash_rag, "Does Lumen integrate with Zapier?")
        for turn in (answered, rated, gap):
            log.record(turn)
        assert await log.feedback(rated.turn_id, "down")
        assert await log.flush()
        full = {t.row.turn_id: t.row for t in log.turns()}
        brief = {t.row.turn_id: t.row for t in log.turns(brief_answered=True)}
        assert answered.record.outcome == "context" and full[answered.turn_id].hits
        assert brief[answered.turn_id].hits == () and brief[answered.turn_id].terms == full[answered.turn_id].terms
        assert brief[rated.turn_id] == full[rated.turn_id] and brief[gap.turn_id] == full[gap.turn_id]
        await log.aclose()
