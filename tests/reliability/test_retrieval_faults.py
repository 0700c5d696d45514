"""Item 2: retrieval faults (a failing or hanging query, a failing embedder or index) and a live source that
goes down, comes back, and never runs more lookups at once than its limit."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import pytest

from ragloop.chat import ChatRAG
from ragloop.llm.offline.answer import NOT_COVERED
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.live import SQLiteTicketSource, default_tickets_path
from ragloop.turn import TurnSettings
from tests.reliability._support import FaultyRetriever, count, offline_rag, scale, small_index

pytestmark = pytest.mark.anyio

TWO_TOPICS = "How long does the audit log keep actions and how big can a CSV import be?"
NOTHING_FOUND = NOT_COVERED  # the offline answerer's honest none


class FailingEmbedder:
    """An embedder whose queries always fail (a dead embedding service)."""

    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, dim
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Raise like a dead embedding service."""
        self.calls += 1
        raise ConnectionError("embedding service unreachable")


class TestQueryFaults:
    async def test_one_failing_query_leaves_the_others(self) -> None:
        """One of two queries raising: the other's results are used, the failure is recorded, outcome partial."""
        index = small_index()
        retriever = FaultyRetriever(index.retriever("hybrid"), raise_on=frozenset({"csv"}))
        # No rewrites: this checks the fan-out, not the rewriter (which may find the failed topic another way).
        settings = TurnSettings(max_attempts=0)
        reply = await offline_rag(index, retriever=retriever, settings=settings).ask(TWO_TOPICS)
        count("retrieval_raise", sum("csv" in q.lower() for q in retriever.started), group="faults_injected")
        count("turns_retrieval_faults")
        failed = [q for q in reply.record.queries if q.error]
        assert failed and all("unavailable" in q.error and "csv" in q.text.lower() for q in failed)
        assert reply.outcome == "partial" and {c.source for c in reply.citations} == {"audit.md"}
        assert "400 days" in reply.text and any("csv" in m.lower() for m in reply.missing)

    async def test_one_hanging_query_times_out_and_the_others_answer(self) -> None:
        """One of two queries hanging: it times out per query, the other answers, the turn ends in time."""
        index = small_index()
        retriever = FaultyRetriever(index.retriever("hybrid"), hang_on=frozenset({"csv"}))
        settings = TurnSettings(retrieve_timeout_s=0.2, deadline_s=3.0, max_attempts=0)
        started = time.perf_counter()
        with anyio.fail_after(3.0):
            reply = await offline_rag(index, retriever=retriever, settings=settings).ask(TWO_TOPICS)
        count("retrieval_hang", len(retriever.cancelled), group="faults_injected")
        count("turns_retrieval_faults")
        assert retriever.cancelled, "the hanging search was never cancelled"
        assert time.perf_counter() - started < 3.0 and reply.record.stopped_by == "end"
        assert any("timed out after 0.2s" in (q.error or "") for q in reply.record.queries)
        assert reply.outcome == "partial" and "400 days" in reply.text

    async def test_failing_embedder_answers_none_honestly(self) -> None:
        """A dead query embedder fails every hybrid search: outcome none, no citations, errors recorded."""
        base = small_index()
        embedder = FailingEmbedder(base.embedder.name, base.embedder.dim)
        broken = KnowledgeIndex(base.chunks, base.bm25, base.dense, embedder)
        reply = await offline_rag(broken).ask("How many times are failed webhook deliveries retried?")
        count("embedder_down", embedder.calls, group="faults_injected")
        count("turns_retrieval_faults")
        assert embedder.calls >= 1
        assert reply.outcome == "none" and not reply.citations and NOTHING_FOUND in reply.text
        assert reply.record.queries and all("unreachable" in (q.error or "") for q in reply.record.queries)
        assert reply.record.stopped_by == "end"

    async def test_failing_index_answers_none_honestly(self) -> None:
        """An index whose every search raises: outcome none, the gap stated, every query's error recorded."""
        index = small_index()
        retriever = FaultyRetriever(index.retriever("hybrid"), raise_on=frozenset(_all_words(index)))
        reply = await offline_rag(index, retriever=retriever).ask(TWO_TOPICS)
        count("index_down", len(retriever.started), group="faults_injected")
        count("turns_retrieval_faults")
        assert reply.outcome == "none" and not reply.citations and NOTHING_FOUND in reply.text
        assert all(q.error for q in reply.record.queries) and len(reply.record.missing) == 2


def _all_words(index: KnowledgeIndex) -> set[str]:
    words = {w.lower() for c in index.chunks for w in c.text.split()}
    return words | {w.lower().strip("?") for w in TWO_TOPICS.split()}


def _ticket_ids(limit: int) -> list[int]:
    with sqlite3.connect(default_tickets_path().as_uri() + "?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM tickets ORDER BY id LIMIT ?", (limit,))]


class TestLiveSource:
    async def test_down_then_reconnects_on_the_next_turn(self, tmp_path: Path) -> None:
        """A missing ticket database is recorded and the turn answers; once back, the next turn reconnects."""
        db = tmp_path / "tickets.sqlite"
        source = SQLiteTicketSource(db, require_caller=False)
        rag: ChatRAG = offline_rag(live_sources=(source,))
        question = "What is the status of ticket #1017?"
        down = await rag.ask(question)
        count("live_down", 1, group="faults_injected")
        assert down.record.live and "does not exist" in str(down.record.live[0].error)
        assert down.text and down.record.stopped_by == "end" and not down.citations
        shutil.copy(default_tickets_path(), db)
        up = await rag.ask(question)
        await rag.aclose()
        count("turns_retrieval_faults", 2)
        assert up.record.live[0].accepted == ("1017",) and up.record.live[0].error is None
        assert source.errors == 1 and source.connects >= 1
        assert any(c.source.endswith("/tickets/1017") for c in up.citations)

    async def test_concurrency_limit_holds_under_load(self) -> None:
        """Many concurrent turns asking about different tickets never run more lookups at once than the limit."""
        limit = 2
        source = SQLiteTicketSource(max_concurrency=limit, require_caller=False)
        rag = offline_rag(live_sources=(source,))
        ids = _ticket_ids(scale(40, 200))
        replies: dict[int, object] = {}

        async def one(tid: int) -> None:
            replies[tid] = await rag.ask(f"What is the status of ticket #{tid}?")

        async with anyio.create_task_group() as tg:
            for tid in ids:
                tg.start_soon(one, tid)
        await rag.aclose()
        count("turns_live_load", len(ids))
        count("live_max_in_flight_seen", source.max_in_flight)
        assert source.lookups == len(ids)
        assert 1 <= source.max_in_flight <= limit
        for tid, reply in replies.items():
            assert reply.record.live[0].accepted == (str(tid),)  # type: ignore[attr-defined]
