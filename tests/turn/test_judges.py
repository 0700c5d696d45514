"""Tests for ragloop.turn._judges: the Judges bundle, offline and model, and the planners it makes."""

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
        from ragloop.turn._judges import Judges
        from tests.llm.test_offline_grade import SHOP
        from tests.strategies import OFFLINE_CORPUS

        small = Judges.offline(SHOP).answerer
        assert isinstance(small, OfflineAnswerer) and small.abstain_rule.threshold == SMALL_THRESHOLD
        big = Judges.offline(OFFLINE_CORPUS).answerer
        assert isinstance(big, OfflineAnswerer) and big.abstain_rule == AbstainRule()


def _small_kb(tmp: Any, pages: dict[str, str]) -> Any:
    """A real index (MiniLM) over one-paragraph markdown pages, as a new user's first knowledge base."""
    from ragloop.retrievers.embed import MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path

    for name, text in pages.items():
        (tmp / f"{name.lower()}.md").write_text(f"---\ntitle: {name}\n---\n\n# {name}\n\n{text}\n", encoding="utf-8")
    return KnowledgeIndex.build(ingest_path(tmp).chunks, MiniLMEmbedder(threads=1))


SHOP_PAGES = {
    "Refunds": "Refunds are issued within 14 days of us receiving your return. The money goes back to the card you "
    "paid with. Original shipping costs are not refunded unless the item arrived faulty.",
    "Shipping": "Standard delivery takes 3 to 5 working days and is free on orders over 50 euros. We ship to every "
    "country in the European Union.",
    "Returns": "You can send an item back within 30 days of delivery for any reason. Opened earphones and gift cards "
    "cannot be returned.",
    "Warranty": "Every phone and laptop we sell carries a two-year warranty against manufacturing defects. Accidental "
    "damage is not covered, and neither is water damage.",
}
STUDIO_PAGES = {
    "Classes": "Vinyasa is a flowing class that links breath and movement; it suits people with some experience. "
    "Beginners should start with Foundations, a 60-minute class that teaches the basic poses step by step.",
    "Memberships": "The Unlimited membership costs 89 pounds a month. A 10-class pass costs 120 pounds and is valid "
    "for four months.",
    "Facilities": "Mats and blocks are provided free of charge. There are showers and lockers in both changing rooms.",
    "Cancellations": "Cancel at least 12 hours before the class starts to keep your credit.",
}


class TestSmallKnowledgeBaseByMeaning:
    """#33: on a user's first few pages, a paraphrase that shares (almost) no word with its page is answered by
    meaning (the index's embedder), and a question the pages do not answer is still refused."""

    @pytest.mark.anyio
    async def test_paraphrases_are_answered_and_outside_questions_refused(self, tmp_path: Any) -> None:
        """ "Is a cracked screen from dropping the phone covered?" (the warranty page says accidental damage is
        not) and "Which class should a complete newbie take?" (Foundations, for beginners) were refused with
        "The knowledge base doesn't cover this"; questions the pages do not answer still are."""
        from ragloop.chat import ChatRAG

        for pages, question, fact, outside in (
            (SHOP_PAGES, "Is a cracked screen from dropping the phone covered?", "Accidental damage is not covered",
             "Can I pay in instalments with Klarna?"),
            (STUDIO_PAGES, "Which class should a complete newbie take?", "Foundations", "Can I bring my dog?"),
        ):  # fmt: skip
            folder = tmp_path / fact.split()[0].lower()
            folder.mkdir()
            rag = ChatRAG.from_index(_small_kb(folder, pages))
            try:
                reply = await rag.ask(question)
                assert reply.outcome != "none", reply.text
                assert fact in reply.text and reply.citations
                refused = await rag.ask(outside)
                assert refused.outcome == "none" and not refused.citations, refused.text
            finally:
                await rag.aclose()

    def test_small_judges_judge_by_meaning_only_with_an_embedder(self) -> None:
        """Judges over four pages with the index's embedder: the grader and the answerer judge by meaning;
        without an embedder, or over many pages, they do not."""
        from ragloop.llm.offline import OfflineGrader
        from ragloop.retrievers.embed import HashEmbedder
        from tests.llm.test_offline_grade import SHOP
        from tests.strategies import OFFLINE_CORPUS

        emb = HashEmbedder()
        small = Judges.offline(SHOP, embedder=emb)
        assert isinstance(small.grader, OfflineGrader) and small.grader.embedder is emb
        assert isinstance(small.answerer, OfflineAnswerer) and small.answerer.meaning_at is not None
        assert small.answerer.abstain_rule.meaning_at is not None
        plain = Judges.offline(SHOP)
        assert isinstance(plain.grader, OfflineGrader) and plain.grader.embedder is None
        big = Judges.offline(OFFLINE_CORPUS, embedder=emb)
        assert isinstance(big.grader, OfflineGrader) and big.grader.embedder is None
        assert isinstance(big.answerer, OfflineAnswerer) and big.answerer.meaning_at is None

    def test_a_tenant_with_few_pages_in_a_big_index_judges_by_meaning(self) -> None:
        """The small-corpus rule is per scope: a tenant that sees four pages of a big index gets the meaning
        grader and answerer; the whole index (and a big tenant) does not."""
        from ragloop.llm.offline import OfflineGrader
        from ragloop.retrievers.embed import HashEmbedder
        from ragloop.retrievers.scope import Corpus
        from tests.llm.test_offline_grade import SHOP
        from tests.strategies import OFFLINE_CORPUS

        corpus = Corpus(
            (*OFFLINE_CORPUS, *SHOP),
            (*({"tenant": "big"} for _ in OFFLINE_CORPUS), *({"tenant": "shop"} for _ in SHOP)),
        )
        judges = Judges.offline(corpus, embedder=HashEmbedder())
        assert judges.knowledge is not None
        shop = judges.knowledge.for_filters({"tenant": ("shop",)})
        assert isinstance(shop.grader, OfflineGrader) and shop.grader.small_corpus and shop.grader.embedder
        assert isinstance(shop.answerer, OfflineAnswerer) and shop.answerer.meaning_at is not None
        for scope in (None, {"tenant": ("big",)}):
            other = judges.knowledge.for_filters(scope)
            assert isinstance(other.grader, OfflineGrader) and other.grader.embedder is None
            assert isinstance(other.answerer, OfflineAnswerer) and other.answerer.meaning_at is None
