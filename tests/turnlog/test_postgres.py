"""The turn log on a real PostgreSQL (pgserver): the same rows as SQLite, jsonb that survives odd text, two
writers, and a database that dies mid-run and comes back."""

from __future__ import annotations

import itertools
import time
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.turnlog import SCHEMA_VERSION, PendingTurn, TurnLog
from tests.retrievers.conftest import pg_server, pg_url
from tests.turnlog.conftest import run_turn

pytestmark = pytest.mark.anyio
__all__ = ["pg_server", "pg_url"]

_dbs = itertools.count()


@pytest.fixture
def log_url(pg_url: str) -> str:
    """A database of its own for each test."""
    import psycopg

    name = f"turnlog{next(_dbs)}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"drop database if exists {name}")
        admin.execute(f"create database {name}")
    url = pg_url.replace("/postgres?", f"/{name}?")
    assert url != pg_url
    return url


def _fields(turn: PendingTurn, **changes: Any) -> PendingTurn:
    import attrs

    return attrs.evolve(turn, **changes)


async def _wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await anyio.sleep(0.05)


class TestPostgresTurnLog:
    async def test_round_trip_and_schema_row(self, log_url: str, hash_rag: ChatRAG) -> None:
        """Rows go in as jsonb and come back equal to SQLite's; the schema-version row is there."""
        import psycopg

        log = TurnLog.open(log_url)
        turn = await run_turn(hash_rag, "How many webhook endpoints can a workspace have?", principal="key:1")
        log.record(turn)
        assert await log.feedback(turn.turn_id, "down", comment="too vague", principal="key:1")
        await log.aclose()
        [read] = TurnLog.open(log_url).turns()
        assert read.row.turn_id == turn.turn_id and read.row.hits
        assert (read.rating, read.comment) == ("down", "too vague")
        with psycopg.connect(log_url) as conn:
            assert conn.execute("select name, version from ragloop_turnlog_schema").fetchall() == [
                ("turns", SCHEMA_VERSION)
            ]
            assert conn.execute("select jsonb_typeof(data) from ragloop_turns").fetchone() == ("object",)

    async def test_odd_text_and_huge_question(self, log_url: str, hash_rag: ChatRAG) -> None:
        """Lone surrogates and NUL (which jsonb and text refuse) are stored as U+FFFD; a huge question is kept
        truncated and marked."""
        turn = await run_turn(hash_rag, "How do I rotate an API key?")
        log = TurnLog.open(log_url)
        log.record(_fields(turn, turn_id="odd", question="a \ud800 b \x00 c"))
        log.record(_fields(turn, turn_id="huge", question="rotate key " * 100_000))
        await log.aclose()
        rows = {t.row.turn_id: t.row for t in TurnLog.open(log_url).turns()}
        assert rows["odd"].question == "a \ufffd b \ufffd c"
        assert rows["huge"].truncated and len(rows["huge"].question or "") == 8_000

    async def test_two_writers(self, log_url: str, hash_rag: ChatRAG) -> None:
        """Two logs (two replicas) creating the tables and writing at once lose nothing."""
        turn = await run_turn(hash_rag, "Hi!")
        logs = [TurnLog.open(log_url), TurnLog.open(log_url)]
        for i in range(60):
            logs[i % 2].record(_fields(turn, turn_id=f"r{i}"))
        for log in logs:
            await log.aclose()
        assert len(TurnLog.open(log_url).turns()) == 60

    async def test_database_dies_mid_run(self, pg_server: Any, log_url: str, hash_rag: ChatRAG) -> None:
        """With the server stopped, recording still returns at once and the rows are counted as errors; after it
        starts again, new rows are written."""
        import pgserver

        log = TurnLog.open(log_url)
        turn = await run_turn(hash_rag, "Hi!")
        log.record(_fields(turn, turn_id="before"))
        assert await log.flush()

        def pg_ctl(*args: str) -> None:
            pgserver.pg_ctl(["-w", "-m", "fast", *args], pgdata=pg_server.pgdata, user=pg_server.system_user)

        await anyio.to_thread.run_sync(pg_ctl, "stop")
        try:
            assert log.record(_fields(turn, turn_id="during"))  # queued at once: the writer meets the dead server
            await _wait_for(lambda: log.stats().errors >= 1)
        finally:  # restart, not start: it reuses the options pgserver started the server with (its socket)
            await anyio.to_thread.run_sync(pg_ctl, "restart")
        written = log.stats().written
        for i in itertools.count():  # the writer backs off after failures; it must come back on its own
            log.record(_fields(turn, turn_id=f"after-{i}"))
            await anyio.sleep(0.25)
            if log.stats().written > written or i > 240:
                break
        ids = {t.row.turn_id for t in log.turns()}
        assert "before" in ids and "during" not in ids and any(i.startswith("after-") for i in ids)
        await log.aclose()
