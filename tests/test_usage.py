"""Usage metering: the price table and each turn's cost, cache-hit counts, and when a call ended."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

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

    def test_cached_prompt_tokens_at_their_own_rate(self) -> None:
        """With a cached rate, the prompt tokens a server took from its cache are billed at it and the rest at the
        input rate; without one, all at the input rate; a count above the prompt's is capped at it."""
        price = Price(2.0, 8.0, cached_input_per_m=0.5)
        assert price.cost(1_000_000, 0, cached_prompt_tokens=600_000) == pytest.approx(0.4 * 2.0 + 0.6 * 0.5)
        assert Price(2.0, 8.0).cost(1_000_000, 0, cached_prompt_tokens=600_000) == pytest.approx(2.0)
        assert price.cost(1000, 0, cached_prompt_tokens=5000) == pytest.approx(1000 * 0.5 / 1e6)
        assert price.cost(1000, 0, cached_prompt_tokens=-5) == pytest.approx(1000 * 2.0 / 1e6)
        calls = [LLMCall("grade", "fast", 1000, 10, cached_prompt_tokens=800)]
        table = {"fast": Price(1.0, 4.0, cached_input_per_m=0.25)}
        assert cost_of(calls, table) == pytest.approx((200 * 1.0 + 800 * 0.25 + 10 * 4.0) / 1e6)

    @given(
        prompt=st.integers(0, 10**7),
        completion=st.integers(0, 10**6),
        cached=st.integers(-(10**7), 10**8),
        rate=st.floats(0, 100),
        cached_rate=st.floats(0, 100),
    )
    def test_a_cache_discount_never_costs_more_nor_below_zero(
        self, prompt: int, completion: int, cached: int, rate: float, cached_rate: float
    ) -> None:
        """Whatever the server reports as cached: the cost lies between everything at the cheaper prompt rate and
        everything at the dearer one."""
        cost = Price(rate, 1.0, cached_input_per_m=cached_rate).cost(prompt, completion, cached)
        low, high = sorted((rate, cached_rate))
        assert (prompt * low + completion) / 1e6 - 1e-9 <= cost <= (prompt * high + completion) / 1e6 + 1e-9

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
