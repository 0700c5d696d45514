"""Item 3: a client that disconnects mid-stream cancels every in-flight call of its turn within 100 ms.

Each stage of the turn is caught in flight (an LLM call at decide, grade, rewrite or answer; a hanging
retrieval; a hanging live lookup), then the consumer either closes the event iterator or its task is
cancelled. Afterwards no task of that turn is alive and the scripted server has seen the request aborted
and the connection closed.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest
from attrs import define, field

from ragloop.chat import ChatRAG
from ragloop.events import Event, NodeStarted, Token
from ragloop.retrievers.live import LiveRecord
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream
from ragloop.turn import TurnSettings
from tests.reliability._llm import good_response
from tests.reliability._support import FaultyRetriever, count, offline_rag, small_index, turn_tasks

pytestmark = pytest.mark.anyio

#: The issue's bound on how fast a disconnect must reach every in-flight call.
CANCEL_WITHIN_S = 0.1
QUESTION = "How many times are failed webhook deliveries retried?"
TICKET_QUESTION = "What is the status of ticket #1017?"
LLM_STAGES = ("decide", "grade", "rewrite", "answer")
MODES = ("aclose", "cancel")


@define
class HangingLiveSource:
    """A ticket source whose lookups never return until cancelled."""

    name: str = "tickets"
    started: anyio.Event = field(factory=anyio.Event)
    cancelled: list[float] = field(factory=list)

    def signals(self, query: str) -> tuple[str, ...]:
        """Ticket ids (``#1234``) in the query."""
        return tuple(re.findall(r"#(\d{3,7})\b", query))

    async def lookup(self, query: str, ids: Sequence[str]) -> Sequence[LiveRecord]:
        """Hang until cancelled."""
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.append(time.monotonic())
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        """Nothing to close."""


def slow_for(stage: str) -> Callable[[RecordedRequest], ScriptedResponse]:
    """A matcher whose ``stage`` requests hang (or stream very slowly), the others answered at once."""

    def matcher(request: RecordedRequest) -> ScriptedResponse:
        judge = request.judge
        if judge == stage == "answer":
            return stream("Deliveries are retried 8 times [1]. " * 20, chunk_size=8, token_delay_s=0.5)
        if judge == stage:
            return good_response(request).delayed(30.0)
        return good_response(request, grade_label="irrelevant" if stage == "rewrite" else "relevant")

    return matcher


def is_trigger(stage: str, event: Event) -> bool:
    """The event after which ``stage`` is about to be (or is) in flight."""
    if stage == "answer":
        return isinstance(event, Token)
    return isinstance(event, NodeStarted) and event.node == stage


async def disconnect(
    rag: ChatRAG, question: str, stage: str, mode: str, in_flight: Callable[[], bool]
) -> tuple[float, set[asyncio.Task[Any]]]:
    """Start a streamed turn, wait until ``stage`` is in flight, disconnect; return (seconds to stop, baseline)."""
    baseline = set(asyncio.all_tasks())

    async def until_in_flight() -> None:
        with anyio.fail_after(5):
            while not in_flight():
                await anyio.sleep(0.002)

    if mode == "aclose":
        events = rag.stream(question)  # read with anext(): a `break` out of `async for` would stop the turn itself
        while not is_trigger(stage, await anext(events)):
            pass
        await until_in_flight()
        t0 = time.monotonic()
        await events.aclose()
        return time.monotonic() - t0, baseline

    with anyio.CancelScope() as outer:

        async def consume() -> None:
            async for _ in rag.stream(question):
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await until_in_flight()
            t0 = time.monotonic()
            outer.cancel()
    return time.monotonic() - t0, baseline


async def assert_no_turn_tasks(baseline: set[asyncio.Task[Any]]) -> None:
    """Within the bound, every task started by the turn has finished."""
    deadline = time.monotonic() + CANCEL_WITHIN_S
    while list(turn_tasks(baseline)) and time.monotonic() < deadline:
        await anyio.sleep(0.005)
    assert not list(turn_tasks(baseline)), list(turn_tasks(baseline))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stage", LLM_STAGES)
async def test_disconnect_cancels_llm_call(stage: str, mode: str) -> None:
    """Disconnecting while an LLM call is in flight aborts it within 100 ms and closes its connection."""
    arrived = threading.Event()
    inner = slow_for(stage)

    def matcher(request: RecordedRequest) -> ScriptedResponse:
        if request.judge == stage:
            arrived.set()
        return inner(request)

    async with ScriptedOpenAIServer(matcher=matcher) as server:
        async with server.client() as client:
            rag = ChatRAG.from_index(small_index(), client, fast_model="fast", settings=TurnSettings(deadline_s=20))
            stopped, baseline = await disconnect(rag, QUESTION, stage, mode, arrived.is_set)
            await assert_no_turn_tasks(baseline)
            with anyio.fail_after(2):
                while server.stats.in_flight:
                    await anyio.sleep(0.005)
        stats = await server.wait_idle(timeout_s=2)
    count(f"{stage}_{mode}", group="cancellations")
    assert stopped < CANCEL_WITHIN_S, f"the turn took {stopped * 1000:.0f} ms to stop"
    assert stats.requests_aborted >= 1, stats
    assert stats.open_connections == 0 and stats.in_flight == 0


@pytest.mark.parametrize("mode", MODES)
async def test_disconnect_cancels_hanging_retrieval(mode: str) -> None:
    """Disconnecting during a hanging search cancels it within 100 ms; no task of the turn survives."""
    index = small_index()
    retriever = FaultyRetriever(index.retriever("hybrid"), hang_on=frozenset({"webhook"}))
    rag = offline_rag(index, retriever=retriever)
    t_before = time.monotonic()
    stopped, baseline = await disconnect(rag, QUESTION, "retrieve", mode, retriever.hanging.is_set)
    await assert_no_turn_tasks(baseline)
    count(f"retrieve_{mode}", group="cancellations")
    assert stopped < CANCEL_WITHIN_S
    assert len(retriever.cancelled) == 1 and retriever.cancelled[0] >= t_before


@pytest.mark.parametrize("mode", MODES)
async def test_disconnect_cancels_hanging_live_lookup(mode: str) -> None:
    """Disconnecting during a hanging live lookup cancels it within 100 ms; no task of the turn survives."""
    source = HangingLiveSource()
    rag = offline_rag(live_sources=(source,))
    stopped, baseline = await disconnect(rag, TICKET_QUESTION, "live", mode, source.started.is_set)
    await assert_no_turn_tasks(baseline)
    count(f"live_{mode}", group="cancellations")
    assert stopped < CANCEL_WITHIN_S
    assert len(source.cancelled) == 1


async def test_dropped_iterator_cancels_the_turn() -> None:
    """A consumer that breaks out and drops the iterator (no aclose) still stops the turn within 100 ms."""
    index = small_index()
    retriever = FaultyRetriever(index.retriever("hybrid"), hang_on=frozenset({"webhook"}))
    rag = offline_rag(index, retriever=retriever)
    baseline = set(asyncio.all_tasks())
    events = aiter(rag.stream(QUESTION))  # the iterator an `async for` would hold
    while not is_trigger("retrieve", await anext(events)):
        pass
    with anyio.fail_after(5):
        await retriever.hanging.wait()
    t0 = time.monotonic()
    del events  # dropping the loop's iterator (no aclose) cancels the run at once
    while not retriever.cancelled and time.monotonic() - t0 < 1.0:
        await anyio.sleep(0.002)
    await assert_no_turn_tasks(baseline)
    count("retrieve_dropped", group="cancellations")
    assert retriever.cancelled and retriever.cancelled[0] - t0 < CANCEL_WITHIN_S
