"""Item 4: load. Many turns, many at once, random (seeded) faults: no cross-talk, no leaked tasks, flat memory.

The default run is 1,000 offline turns, 100 at a time, over the small hash-embedded index; the scripted-server
variant is smaller. ``RAGLOOP_SOAK=1`` runs 10,000 offline turns and 500 through the scripted server.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import re
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import anyio
import pytest
from attrs import define, field

from ragloop.chat import ChatRAG, Reply
from ragloop.errors import JudgeError
from ragloop.llm.offline import OfflineAnswerer, OfflineDecider, OfflineGrader, OfflineRewriter
from ragloop.retrievers.live import LiveRecord
from ragloop.state import ContextBlock, Decision, Hit, Message, Outcome, PageContext, Verdict
from ragloop.testing import FakeLiveSource, RecordedRequest, ScriptedOpenAIServer, ScriptedResponse
from ragloop.text.terms import CorpusStats
from ragloop.turn import TurnSettings
from tests.reliability._llm import FAULTS, TIMEOUT_S, fault_for, good_response
from tests.reliability._support import FIGURES, count, scale, small_index, turn_tasks

pytestmark = pytest.mark.anyio

SEED = 20240607
QUESTIONS: tuple[tuple[str, str], ...] = (
    ("How many times are failed webhook deliveries retried?", "webhooks.md"),
    ("How do I rotate an API key?", "api-keys.md"),
    ("How is SAML single sign-on configured?", "sso.md"),
    ("What does a workspace data export produce?", "export.md"),
    ("How long does the audit log keep administrator actions?", "audit.md"),
    ("When are invoices emailed to the billing contact?", "billing.md"),
    ("How big may a CSV import file be?", "import.md"),
    ("Do the mobile apps support offline drafts?", "mobile.md"),
    ("Where do two-factor authentication codes come from?", "twofa.md"),
    ("Where does the Slack integration post task updates?", "slack.md"),
    ("How long do deleted tasks stay in the trash?", "trash.md"),
    ("How many requests per minute does the REST API allow?", "limits.md"),
    ("How long does the audit log keep actions and how big may a CSV import be?", "audit.md import.md"),
    ("What is the status of ticket #4242?", "tickets:4242"),
    ("Hello there!", ""),
)
RATES = {"decide": 0.05, "retrieve_raise": 0.04, "retrieve_hang": 0.02, "grade": 0.04, "answer": 0.05, "live": 0.2}


@define
class Chaos:
    """Seeded fault decisions shared by the faulty collaborators; counts what it injected."""

    rng: random.Random
    injected: Counter[str] = field(factory=Counter)

    def roll(self, kind: str) -> bool:
        """True (and counted) with the rate of ``kind``."""
        hit = self.rng.random() < RATES[kind]
        if hit:
            self.injected[kind] += 1
        return hit


@define
class ChaosDecider:
    """The offline decider, failing at random."""

    inner: OfflineDecider
    chaos: Chaos

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Decide, or raise a JudgeError."""
        if self.chaos.roll("decide"):
            raise JudgeError("chaos: decider unavailable")
        return await self.inner.decide(question, history, page)


@define
class ChaosRetriever:
    """A retriever that raises or hangs at random."""

    inner: Any
    chaos: Chaos

    async def search(self, query: str, k: int = 10) -> Sequence[Hit]:
        """Search, raise, or hang past the per-query timeout."""
        if self.chaos.roll("retrieve_raise"):
            raise OSError("chaos: shard down")
        if self.chaos.roll("retrieve_hang"):
            await anyio.sleep_forever()
        return list(await self.inner.search(query, k))


@define
class ChaosGrader:
    """The offline grader, raising at random (the grade node fails open)."""

    inner: OfflineGrader
    chaos: Chaos

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Grade or raise."""
        if self.chaos.roll("grade"):
            raise JudgeError("chaos: grader unavailable")
        return await self.inner.grade(query, hit)


@define
class ChaosAnswerer:
    """The offline answerer, failing before its first token at random (the offline fallback takes over)."""

    inner: OfflineAnswerer
    chaos: Chaos

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """Stream the offline answer, or fail first."""
        if self.chaos.roll("answer"):
            raise JudgeError("chaos: answerer unavailable")
        async for token in self.inner.answer(
            question, blocks, outcome, missing=missing, direct_reply=direct_reply, history=history
        ):
            yield token


@define
class ChaosLive:
    """The fake ticket source, down at random."""

    inner: FakeLiveSource
    chaos: Chaos
    name: str = "tickets"

    def signals(self, query: str) -> tuple[str, ...]:
        """Ticket ids in ``query``."""
        return tuple(self.inner.signals(query))

    async def lookup(self, query: str, ids: Sequence[str]) -> Sequence[LiveRecord]:
        """Look up, or fail like a dead connection."""
        if self.chaos.roll("live"):
            raise ConnectionError("chaos: ticket system down")
        return list(await self.inner.lookup(query, ids))

    async def aclose(self) -> None:
        """Nothing to close."""


def chaos_rag(chaos: Chaos) -> ChatRAG:
    """Offline judges over the small index, each wrapped in chaos, with the real offline fallbacks."""
    index = small_index()
    texts = [c.text for c in index.chunks]
    stats = CorpusStats.from_texts(texts)
    ticket = LiveRecord("tickets", "4242", "Ticket #4242: export stuck", "Ticket #4242: export stuck. Status: open.")
    settings = TurnSettings(k=4, per_query_budget=4, retrieve_timeout_s=1.0, deadline_s=10.0)
    decider = OfflineDecider(stats, max_queries=settings.max_queries)
    answerer = OfflineAnswerer(stats)
    return ChatRAG(
        retriever=ChaosRetriever(index.retriever("hybrid"), chaos),
        decider=ChaosDecider(decider, chaos),
        grader=ChaosGrader(OfflineGrader.calibrate(stats, texts), chaos),
        rewriter=OfflineRewriter(stats),
        answerer=ChaosAnswerer(answerer, chaos),
        live_sources=(ChaosLive(FakeLiveSource({"4242": ticket}), chaos),),
        settings=settings,
        fallback_decider=decider,
        fallback_answerer=answerer,
    )


_WORDS = re.compile(r"\w+")


def check_reply(question: str, reply: Reply, run_ids: set[str], *, offline: bool = True) -> None:
    """No cross-talk: the record, context and citations of ``reply`` all belong to ``question``'s own turn."""
    record = reply.record
    assert record.run_id not in run_ids, "two turns share a run id"
    run_ids.add(record.run_id)
    assert reply.text.strip() and record.stopped_by == "end"
    asked = {w.casefold() for w in _WORDS.findall(question)}
    for query in record.decision.queries:
        assert {w.casefold() for w in _WORDS.findall(query)} <= asked, (question, record.decision)
    texts = {q.text for q in record.queries}
    assert all(q.root in texts for q in record.queries)
    kept = {g.chunk_id for g in record.grades if g.label != "irrelevant"}
    assert all(g.query in texts for g in record.grades)
    assert {b.chunk_id for b in reply.blocks} <= kept
    assert {c.chunk_id for c in reply.citations} <= {b.chunk_id for b in reply.blocks}
    if not offline:
        assert all(c.model in ("fast", "offline") for c in record.calls)
        return
    # The usage meter is per turn: it holds exactly this turn's offline calls (chaos failures are not metered).
    judged = Counter(c.judge for c in record.calls)
    assert judged["decide"] == 1 and judged["answer"] == 1
    live_or_fast = sum(1 for g in record.grades if g.reason.startswith(("tickets:", "fast path")))
    assert judged["grade"] == len(record.grades) - live_or_fast - record.fail_open


class _UncapturedLogs(logging.Handler):
    """Takes ragloop's log records once started: formats and counts them, keeps none, stops their propagation.

    pytest keeps every record it captures until the test ends, which a memory check over 1,000 faulty turns
    reads as a leak of the library's own. pytest attaches its capture to loggers that do not propagate when a
    test phase begins, so :meth:`start` is called in the test body, after that.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records = 0
        self._logger = logging.getLogger("ragloop")

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)
        self.records += 1

    def start(self) -> None:
        self._logger.addHandler(self)
        self._logger.propagate = False

    def stop(self) -> None:
        self._logger.propagate = True
        self._logger.removeHandler(self)


@pytest.fixture
def uncaptured_logs() -> Iterator[_UncapturedLogs]:
    """A :class:`_UncapturedLogs`, stopped at teardown."""
    handler = _UncapturedLogs()
    try:
        yield handler
    finally:
        handler.stop()


async def test_offline_turns_under_load_with_faults(uncaptured_logs: _UncapturedLogs) -> None:
    """1,000 turns, 100 at once, random faults: every turn answers, no cross-talk, no leaked tasks, flat memory."""
    uncaptured_logs.start()
    turns, concurrency, warmup, traced = scale(1000, 10_000), 100, 100, 50
    chaos = Chaos(random.Random(SEED))
    rag = chaos_rag(chaos)
    plan = [QUESTIONS[i % len(QUESTIONS)][0] for i in range(turns + 2 * traced)]
    random.Random(SEED + 1).shuffle(plan)
    baseline = set(asyncio.all_tasks())
    run_ids: set[str] = set()
    outcomes: Counter[str] = Counter()
    running = peak = 0

    async def batch(questions: list[str]) -> None:
        pending = iter(questions)

        async def worker() -> None:
            nonlocal running, peak
            for question in pending:
                running += 1
                peak = max(peak, running)
                try:
                    reply = await rag.ask(question)
                finally:
                    running -= 1
                check_reply(question, reply, run_ids)
                outcomes[reply.outcome] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)

    def settled_blocks() -> int:
        gc.collect()
        return sys.getallocatedblocks()

    started = time.perf_counter()
    await batch(plan[:warmup])
    half = warmup + (turns - warmup) // 2
    blocks = [settled_blocks()]
    await batch(plan[warmup:half])
    blocks.append(settled_blocks())
    ids_before = len(run_ids)
    await batch(plan[half:turns])
    blocks.append(settled_blocks())
    own_blocks = len(run_ids) - ids_before  # the test's own run-id set holds one string per turn
    seconds = time.perf_counter() - started
    assert not list(turn_tasks(baseline)), "tasks of finished turns are still alive"
    # tracemalloc slows every allocation, so it watches two short windows after the long run.
    tracemalloc.start()
    try:
        await batch(plan[turns : turns + traced])
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        await batch(plan[turns + traced :])
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = turns + 2 * traced
    FIGURES["load_offline"] = {
        "turns": total,
        "concurrency_limit": concurrency,
        "max_concurrency_seen": peak,
        "seconds_untraced_turns": round(seconds, 2),
        "outcomes": dict(outcomes),
        "faults_injected": dict(chaos.injected),
        "allocated_blocks_after_warmup_middle_end": blocks,
        "traced_bytes_after_window_1_2": [first, second],
    }
    count("turns_load", total)
    for kind, n in chaos.injected.items():
        count(f"chaos_{kind}", n, group="faults_injected")
    assert len(run_ids) == total and sum(outcomes.values()) == total
    assert peak == concurrency
    assert all(chaos.injected[k] > 0 for k in RATES), chaos.injected
    assert uncaptured_logs.records > 0, "faults were injected but nothing was logged"
    assert outcomes["context"] > total // 2, outcomes  # faults degrade some turns, not the service
    # Flat memory: a leaked turn (state, record, tasks) is hundreds of blocks and many KB; allow caches to settle.
    per_turn_blocks = (blocks[2] - blocks[1] - own_blocks) / (turns - half)
    assert per_turn_blocks < 1, f"{per_turn_blocks:.1f} blocks retained per turn: {blocks}"
    assert second - first < 64 * 1024, f"traced memory grew {second - first} bytes over {traced} turns"


async def test_scripted_server_turns_under_load_with_faults() -> None:
    """Turns through the real SDK, many at once, random faults: each reply and request stays with its own turn."""
    turns, concurrency = scale(60, 500), 20
    rng = random.Random(SEED)
    lock = threading.Lock()
    injected: Counter[str] = Counter()

    def matcher(request: RecordedRequest) -> ScriptedResponse:
        with lock:
            kind = rng.choice(FAULTS) if rng.random() < 0.15 else None
            if kind is not None:
                injected[kind] += 1
        if kind is not None:
            return fault_for(kind, request.judge)
        return good_response(request)

    questions = [f"{QUESTIONS[i % 12][0]} (case {i})" for i in range(turns)]
    by_source = {c.source: c.id for c in small_index().chunks}
    replies: dict[str, Reply] = {}
    baseline = set(asyncio.all_tasks())
    async with ScriptedOpenAIServer(matcher=matcher) as server:
        async with server.client() as client:
            rag = ChatRAG.from_index(
                small_index(), client, fast_model="fast", timeout_s=TIMEOUT_S, settings=TurnSettings(deadline_s=8.0)
            )
            pending = iter(questions)

            async def worker() -> None:
                for question in pending:
                    with anyio.fail_after(10):
                        replies[question] = await rag.ask(question)

            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(worker)
        stats = await server.wait_idle()
        requests = server.chat_requests
    assert not list(turn_tasks(baseline))
    assert stats.open_connections == 0 and stats.in_flight == 0
    count("turns_load_scripted", turns)
    for kind, n in injected.items():
        count(kind, n, group="faults_injected")
    FIGURES["load_scripted"] = {
        "turns": turns,
        "concurrency": concurrency,
        "requests": len(requests),
        "faults": dict(injected),
    }
    assert sum(injected.values()) > 0
    run_ids: set[str] = set()
    for question, reply in replies.items():
        check_reply(question, reply, run_ids, offline=False)
    # Every answer request carried exactly its own turn's question and its own turn's context blocks.
    answered = 0
    for request in requests:
        if request.judge != "answer":
            continue
        user = str(request.messages[-1]["content"])
        question = user.rsplit("Question: ", 1)[1]
        reply = replies[question]
        sources = set(re.findall(r'source="([^"]+)"', user))
        assert {by_source[s] for s in sources} == {b.chunk_id for b in reply.blocks}, (question, sources)
        answered += 1
    assert answered >= turns * 0.5
