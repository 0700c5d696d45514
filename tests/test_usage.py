"""Usage metering: the price table and each turn's cost, cache-hit counts, and when a call ended."""

from __future__ import annotations

import time

import pytest

from ragloop.chat import ChatRAG
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter, make_hit
from ragloop.turn import Judges, Turn, TurnSettings
from ragloop.usage import LLMCall, Price, UsageMeter, cost_of, metering, record_cache, record_call

pytestmark = pytest.mark.anyio

PRICES = {"fast": Price(0.15, 0.60), "big": Price(2.50, 10.00)}


class TestCost:
    def test_price_per_million_tokens(self) -> None:
        """A price is per million input and output tokens."""
        assert Price(2.5, 10.0).cost(1_000_000, 100_000) == pytest.approx(3.5)

    def test_turn_cost_sums_model_calls_and_offline_is_free(self) -> None:
        """Every model call is priced by its model; offline calls cost nothing."""
        calls = [
            LLMCall("decide", "fast", 1000, 50),
            LLMCall("answer", "big", 2000, 300),
            LLMCall("grade", "offline"),
        ]
        expected = (1000 * 0.15 + 50 * 0.60 + 2000 * 2.50 + 300 * 10.00) / 1e6
        assert cost_of(calls, PRICES) == pytest.approx(expected)

    def test_unknown_cost_is_none_not_zero(self) -> None:
        """No price table, or a model missing from it, gives no cost rather than a wrong one."""
        assert cost_of([LLMCall("decide", "fast", 10, 1)], {}) is None
        assert cost_of([LLMCall("decide", "other", 10, 1)], PRICES) is None

    async def test_record_carries_the_cost(self) -> None:
        """A turn's record is priced with TurnSettings.prices (offline judges: cost 0; without prices: None)."""

        def chat(settings: TurnSettings) -> ChatRAG:
            retriever = FakeRetriever({"q": [make_hit("text")]})
            judges = Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer())
            return ChatRAG(Turn(retriever, judges, settings=settings))

        assert (await chat(TurnSettings(prices=PRICES)).ask("q")).record.cost == 0.0
        assert (await chat(TurnSettings()).ask("q")).record.cost is None


class TestMeter:
    def test_cache_hits_are_counted_only_inside_a_turn(self) -> None:
        """record_cache counts on the running turn's meter and is a no-op outside one."""
        record_cache("grade", 3)
        meter = UsageMeter()
        with metering(meter):
            record_cache("grade", 2)
            record_cache("retrieval")
            record_cache("embedding", 0)
        assert meter.cache_hits == {"grade": 2, "retrieval": 1}

    def test_a_recorded_call_knows_when_it_ended(self) -> None:
        """record_call stamps the end time a tracer places the call with."""
        meter = UsageMeter()
        before = time.time()
        with metering(meter):
            record_call(LLMCall("decide", "fast", seconds=0.1, finish_reasons=("stop",)))
        assert before <= meter.calls[0].ended <= time.time()
        assert meter.calls[0].finish_reasons == ("stop",)
