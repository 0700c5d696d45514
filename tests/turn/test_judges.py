"""Tests for ragloop.turn.judges: the Judges bundle, offline and model, and the planners it makes."""

from __future__ import annotations

from typing import Any

import pytest
from attrs import define

from ragloop.errors import ConfigError
from ragloop.llm.offline import OfflineAnswerer, OfflineDecider
from ragloop.llm.offline.bridge import OfflineBridger
from ragloop.llm.offline.verify import OfflineVerifier
from ragloop.llm.planner import OfflinePlanner
from ragloop.retrievers.sources import DocumentSource
from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeLiveSource, FakeRetriever, FakeRewriter
from ragloop.turn import Judges, PlanModel

TEXTS = ["Single sign-on (SSO) uses SAML.", "The Business plan costs $19 per seat.", "Rotate API keys yearly."]


@define
class Schema:
    """A source with a schema: what the offline planner plans SQL over."""

    name: str = "crm"
    description: str = "customers"

    async def schema(self) -> Any:
        raise AssertionError("not read here")

    async def run(self, query: str, filters: Any) -> Any:
        raise AssertionError("not run here")


class TestOffline:
    def test_offline_judges(self) -> None:
        """Judges.offline has every offline judge, the bridger and verifier, and says it is offline."""
        judges = Judges.offline(TEXTS, glossary={"SSO": "single sign-on"}, max_queries=2)
        assert isinstance(judges.decider, OfflineDecider) and isinstance(judges.answerer, OfflineAnswerer)
        assert isinstance(judges.bridger, OfflineBridger) and isinstance(judges.verifier, OfflineVerifier)
        assert judges.offline_only and judges.plan_model is None and judges.fallback_decider is None


class TestOpenAI:
    def test_needs_a_fast_model(self) -> None:
        """A client without fast_model is a configuration error that says what to pass."""
        with pytest.raises(ConfigError, match="pass fast_model"):
            Judges.openai(object(), TEXTS, fast_model=None)  # type: ignore[arg-type]

    @pytest.mark.anyio
    async def test_model_judges_with_offline_fallbacks(self) -> None:
        """Judges.openai: the model's four judges, the offline decider and answerer behind them, the plan model."""
        import openai

        from ragloop.llm.openai import OpenAIAnswerer, OpenAIDecider

        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="none")
        judges = Judges.openai(client, TEXTS, fast_model="fast", answer_model="big", timeout_s=3.0)
        assert isinstance(judges.decider, OpenAIDecider) and isinstance(judges.answerer, OpenAIAnswerer)
        assert isinstance(judges.fallback_decider, OfflineDecider)
        assert isinstance(judges.fallback_answerer, OfflineAnswerer)
        assert judges.plan_model == PlanModel(client, "fast", 3.0, compat=judges.decider.compat)  # type: ignore[attr-defined]
        assert not judges.offline_only
        await client.close()


class TestPlanners:
    def sources(self) -> dict[str, Any]:
        return {"documents": DocumentSource(FakeRetriever()), "crm": Schema()}

    def test_offline_planner_plans_over_the_schema_source(self) -> None:
        """Without a model the offline planner plans alone, over the first source with a schema."""
        planner, fallback = Judges.offline(TEXTS).planners(self.sources(), [FakeLiveSource()])
        assert isinstance(planner, OfflinePlanner) and fallback is None
        assert planner.sql is not None and planner.sql.name == "crm" and planner.live == {"tickets": "tickets"}

    def test_model_planner_with_offline_behind_it(self) -> None:
        """With a plan model the model planner plans over every source, the offline planner behind it."""
        from ragloop.llm.openai import OpenAIPlanner

        judges = Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer(), plan_model=PlanModel(None, "m", 2))
        planner, fallback = judges.planners(self.sources(), ())
        assert isinstance(planner, OpenAIPlanner) and isinstance(fallback, OfflinePlanner)
        assert [s.name for s in planner.sources] == ["documents", "crm"] and planner.timeout_s == 2

    def test_given_planner_wins(self) -> None:
        """A planner given in the bundle is used as it is, with its own fallback."""
        mine, backup = OfflinePlanner(None), OfflinePlanner(None)
        judges = Judges(
            FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer(), planner=mine, fallback_planner=backup
        )
        assert judges.planners(self.sources(), ()) == (mine, backup)


class TestSmallKnowledgeBase:
    def test_a_few_pages_abstain_on_their_own_scale(self) -> None:
        """Offline judges over four pages use the small-corpus abstention threshold; over many, the default."""
        from ragloop.llm.offline.answer import AbstainRule
        from ragloop.llm.offline.answer._abstain import SMALL_THRESHOLD
        from ragloop.turn.judges import Judges
        from tests.llm.test_offline_grade import SHOP
        from tests.strategies import OFFLINE_CORPUS

        small = Judges.offline(SHOP).answerer
        assert isinstance(small, OfflineAnswerer) and small.abstain_rule.threshold == SMALL_THRESHOLD
        big = Judges.offline(OFFLINE_CORPUS).answerer
        assert isinstance(big, OfflineAnswerer) and big.abstain_rule == AbstainRule()
