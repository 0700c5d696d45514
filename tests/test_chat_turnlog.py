"""ChatRAG with a turn log: every reply has a turn_id, finished turns are logged (ask and stream, cache hits too),
feedback is scoped to the asking principal, and a dead log never costs an answer."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from ragloop.caches import Caches, MemoryCache
from ragloop.chat import ChatRAG, ReplyReady
from ragloop.errors import ConfigError, StoreUnavailable
from ragloop.gaps import build_report, is_gap
from ragloop.state import Hit
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit
from ragloop.turn import Judges, Turn
from ragloop.turnlog import FeedbackItem, SQLiteBackend, StoredRow, TurnLog

pytestmark = pytest.mark.anyio

DOCS = {"How do I rotate a key?": [make_hit("Create a new key, then revoke the old one.", source="api-keys.md")]}


def _rag(log: TurnLog | None, caches: Caches | None = None) -> ChatRAG:
    judges = Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer())
    return ChatRAG(Turn(FakeRetriever(DOCS), judges, caches=caches), turn_log=log)


class _DownStore(FakeRetriever):
    async def search(self, query: str, k: int = 10, filters: object = None) -> Sequence[Hit]:
        raise StoreUnavailable("the knowledge store's database cannot be reached")


class _DeadBackend(SQLiteBackend):
    def write(self, rows: Sequence[StoredRow], feedback: Sequence[FeedbackItem], **kw: Any) -> int:
        raise sqlite3.OperationalError("unable to open database file")


class TestTurnId:
    async def test_every_reply_names_its_turn(self) -> None:
        """turn_id is the record's run id, and both JSON shapes carry it, with or without a turn log."""
        reply = await _rag(None).ask("How do I rotate a key?")
        assert reply.turn_id == reply.record.run_id and len(reply.turn_id) == 16
        assert reply.as_dict()["turn_id"] == reply.client_dict()["turn_id"] == reply.turn_id


class TestLogging:
    async def test_ask_and_stream_are_logged(self, tmp_path: Path) -> None:
        """A turn through ask and one through stream each leave one row under their turn id, with the principal."""
        log = TurnLog.open(f"sqlite:{tmp_path / 't.db'}")
        rag = _rag(log)
        asked = await rag.ask("How do I rotate a key?", principal="key:1")
        streamed = None
        async for event in rag.stream("How do I rotate a key?", principal="key:2"):
            if isinstance(event, ReplyReady):
                streamed = event.reply
        assert streamed is not None
        await log.flush()
        rows = {t.row.turn_id: t.row for t in log.turns()}
        assert set(rows) == {asked.turn_id, streamed.turn_id}
        assert rows[asked.turn_id].principal != rows[streamed.turn_id].principal
        assert rows[asked.turn_id].citations[0].source == "api-keys.md"
        await rag.aclose()
        assert log.stats().written == 2

    async def test_reply_cache_hits_are_logged_as_their_own_turns(self, tmp_path: Path) -> None:
        """A reply from the reply cache is a new turn (new id) and is logged like any other."""
        log = TurnLog.open(f"sqlite:{tmp_path / 't.db'}")
        rag = _rag(log, caches=Caches(replies=MemoryCache()))
        first = await rag.ask("How do I rotate a key?")
        again = await rag.ask("How do I rotate a key?")
        assert again.record.cache_hits == {"reply": 1} and again.turn_id != first.turn_id
        await rag.aclose()
        assert {t.row.turn_id for t in TurnLog.open(f"sqlite:{tmp_path / 't.db'}").turns()} == {
            first.turn_id,
            again.turn_id,
        }

    async def test_dead_log_costs_the_row_not_the_answer(self, tmp_path: Path) -> None:
        """With a turn log that cannot write, the answer is the same as without one; the loss is counted."""
        log = TurnLog(_DeadBackend(tmp_path / "t.db"))
        rag = _rag(log)
        reply = await rag.ask("How do I rotate a key?")
        plain = await _rag(None).ask("How do I rotate a key?")
        assert (reply.text, reply.outcome) == (plain.text, plain.outcome)
        await log.flush()
        assert log.stats().errors == 1 and log.stats().written == 0
        await rag.aclose()


class TestStoreOutage:
    async def test_a_turn_every_search_of_which_failed_is_logged_but_no_gap(self, tmp_path: Path) -> None:
        """A store outage ends a turn 'none' (a server refuses it with a 503): the log keeps the row, its queries
        marked failed, and ``ragloop gaps`` does not report the question as missing from the knowledge base."""
        log = TurnLog.open(f"sqlite:{tmp_path / 't.db'}")
        judges = Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer())
        rag = ChatRAG(Turn(_DownStore(), judges), turn_log=log)
        replies = [await rag.ask("How do I rotate a key?", principal=p) for p in ("key:1", "key:2")]
        await rag.aclose()
        turns = TurnLog.open(f"sqlite:{tmp_path / 't.db'}").turns()
        assert [r.outcome for r in replies] == ["none", "none"] and len(turns) == 2
        assert all(t.row.queries and all(q.failed for q in t.row.queries) for t in turns)
        assert not any(is_gap(t) for t in turns)
        report = build_report(turns, since=turns[0].row.at - 1, until=turns[-1].row.at + 1, min_turns=1)
        assert (report.turns, report.gap_turns, report.topics) == (2, 0, ())


class TestFeedback:
    async def test_feedback_scoped_to_the_principal(self, tmp_path: Path) -> None:
        """The asker may rate the reply; another principal, or an unknown turn id, gets False."""
        log = TurnLog.open(f"sqlite:{tmp_path / 't.db'}")
        rag = _rag(log)
        reply = await rag.ask("How do I rotate a key?", principal="key:1")
        assert await rag.feedback(reply.turn_id, "down", comment="outdated", principal="key:1")
        assert not await rag.feedback(reply.turn_id, "up", principal="key:2")
        assert not await rag.feedback("0123456789abcdef", "up", principal="key:1")
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 't.db'}").turns()
        assert (turn.rating, turn.comment) == ("down", "outdated")

    async def test_feedback_without_a_log_says_how_to_get_one(self) -> None:
        """Rating a turn of a chat without a turn log is a configuration error naming the fix."""
        rag = _rag(None)
        reply = await rag.ask("How do I rotate a key?")
        with pytest.raises(ConfigError, match=r"turn_log=TurnLog\.open"):
            await rag.feedback(reply.turn_id, "up")
