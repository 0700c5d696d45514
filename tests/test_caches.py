"""Caches: the in-memory TTL/LRU default, the cached retriever, embedder and grader, index versions, and a
repeated question through the real SDK that hits the retrieval and grade caches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from ragloop.caches import Cache, Caches, MemoryCache, cache_key
from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError
from ragloop.llm.cached import CachedGrader
from ragloop.llm.openai import OpenAIJudges
from ragloop.retrievers.cached import CachedEmbedder, CachedRetriever
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.state import Chunk, Hit, Verdict
from ragloop.testing import (
    FakeGrader,
    FakeRetriever,
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    make_hit,
    stream,
    tool_calls,
    verdicts,
)
from ragloop.turn import Judges, Turn, TurnSettings
from ragloop.usage import UsageMeter, metering

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestMemoryCache:
    def test_is_a_cache(self) -> None:
        """The default satisfies the protocol."""
        assert isinstance(MemoryCache(), Cache)

    def test_least_recently_used_is_evicted(self) -> None:
        """Past max_items the entry used longest ago goes, not the one just read."""
        cache: MemoryCache[int] = MemoryCache(max_items=2)
        cache.set("a", 1)
        cache.set("b", 2)
        assert cache.get("a") == 1
        cache.set("c", 3)
        assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)

    def test_entries_expire(self) -> None:
        """An entry is gone ttl_s after it was stored."""
        clock = Clock()
        cache: MemoryCache[str] = MemoryCache(ttl_s=10, clock=clock)
        cache.set("k", "v")
        clock.now = 9.9
        assert cache.get("k") == "v"
        clock.now = 10.0
        assert cache.get("k") is None
        assert len(cache) == 0

    def test_bad_settings_say_what_to_do(self) -> None:
        """A zero size or TTL is refused with the accepted ranges."""
        with pytest.raises(ConfigError, match="max_items >= 1"):
            MemoryCache(max_items=0)

    def test_keys_are_stable_and_order_sensitive(self) -> None:
        """The same parts give the same key; other parts another."""
        assert cache_key("q", 1, [("a", "b")]) == cache_key("q", 1, [("a", "b")])
        assert cache_key("q", 1) != cache_key(1, "q")


class TestCachedRetriever:
    async def test_repeat_hits_and_version_change_misses(self) -> None:
        """The same search is served from the cache until the index version changes."""
        inner = FakeRetriever({"ttl": [make_hit("Keys expire.")]})
        version = ["v1"]
        cached = CachedRetriever(inner, MemoryCache(), lambda: version[0])
        meter = UsageMeter()
        with metering(meter):
            first = await cached.search("ttl", 5)
            again = await cached.search("ttl", 5)
            version[0] = "v2"
            await cached.search("ttl", 5)
        assert first == again and inner.calls == ["ttl", "ttl"]
        assert meter.cache_hits == {"retrieval": 1}

    async def test_a_versioned_store_is_asked_before_every_lookup(self) -> None:
        """A retriever whose version lives elsewhere (another replica may write it) is asked before each lookup:
        a version changed behind this process's back makes the very next search miss."""

        class Shared(FakeRetriever):
            version = "v1"
            checks = 0

            async def check_version(self) -> str:
                self.checks += 1
                return self.version

        inner = Shared({"ttl": [make_hit("Keys expire.")]})
        cached = CachedRetriever(inner, MemoryCache(), lambda: inner.version)
        await cached.search("ttl", 5)
        await cached.search("ttl", 5)
        inner.version = "v2"  # another process wrote the store
        await cached.search("ttl", 5)
        assert inner.calls == ["ttl", "ttl"] and inner.checks == 3

    async def test_depth_and_filters_are_part_of_the_key(self) -> None:
        """Another k or other filters are other searches."""
        inner = FakeRetriever({"ttl": [make_hit("Keys expire.")]})
        cached = CachedRetriever(inner, MemoryCache(), lambda: "v")
        await cached.search("ttl", 5)
        await cached.search("ttl", 6)
        assert len(inner.calls) == 2


class TestCachedEmbedder:
    async def test_only_misses_are_embedded(self) -> None:
        """Rows come back in order; the second call embeds only the new text."""
        inner = HashEmbedder()
        seen: list[list[str]] = []

        class Counting:
            name, dim = inner.name, inner.dim

            async def embed(self, texts: list[str]) -> np.ndarray:  # type: ignore[type-arg]
                seen.append(list(texts))
                return await inner.embed(texts)

        cached = CachedEmbedder(Counting(), MemoryCache())
        a = await cached.embed(["alpha", "beta"])
        b = await cached.embed(["beta", "gamma"])
        assert seen == [["alpha", "beta"], ["gamma"]]
        assert np.allclose(b[0], a[1]) and b.shape == (2, inner.dim)

    async def test_a_vector_is_kept_per_caller_scope(self) -> None:
        """Inside a scoped turn the same text is embedded once per scope: a tenant cannot tell from a cache
        hit's speed that another tenant asked the same words."""
        from ragloop.retrievers.scope import turn_scope

        inner = HashEmbedder()
        seen: list[list[str]] = []

        class Counting:
            name, dim = inner.name, inner.dim

            async def embed(self, texts: list[str]) -> np.ndarray:  # type: ignore[type-arg]
                seen.append(list(texts))
                return await inner.embed(texts)

        cached = CachedEmbedder(Counting(), MemoryCache())
        for tenant in ("acme", "globex", "acme"):
            with turn_scope({"tenant": (tenant,)}):
                await cached.embed(["reset password"])
        assert seen == [["reset password"], ["reset password"]]


class TestCachedGrader:
    async def test_fail_open_is_never_cached_and_content_is_the_key(self) -> None:
        """A verdict is reused for the same passage text; a fail-open one is asked again."""
        grader = FakeGrader()
        cached = CachedGrader(grader, MemoryCache(), model="m")
        hit = make_hit("Keys expire.")
        assert (await cached.grade("ttl", hit)).label == "relevant"
        await cached.grade("ttl", make_hit("Keys expire.", chunk_id="other-id"))
        assert len(grader.calls) == 1

        class FailingOpen:
            calls = 0

            async def grade(self, query: str, hit: Hit) -> Verdict:
                FailingOpen.calls += 1
                return Verdict("relevant", reason="failed", fail_open=True)

        flaky = CachedGrader(FailingOpen(), MemoryCache(), model="m")
        await flaky.grade("ttl", hit)
        await flaky.grade("ttl", hit)
        assert FailingOpen.calls == 2

    async def test_a_verdict_is_kept_per_caller_scope(self) -> None:
        """The same passage and query graded in two scopes is graded twice (an offline grader's statistics are
        the scope's), and once per scope after that."""
        from ragloop.llm.scoped import turn_scope

        grader = FakeGrader()
        cached = CachedGrader(grader, MemoryCache(), model="m")
        hit = make_hit("Keys expire.")
        for tenant in ("acme", "globex", "acme", "globex"):
            with turn_scope({"tenant": (tenant,)}):
                await cached.grade("ttl", hit)
        await cached.grade("ttl", hit)
        assert len(grader.calls) == 3


class TestIndexVersion:
    def test_content_changes_the_version(self) -> None:
        """Two indexes with other chunk text have other versions; the same content the same one."""
        emb = HashEmbedder()
        one = KnowledgeIndex.build([Chunk(id="a", text="Keys expire after a TTL.")], emb)
        same = KnowledgeIndex.build([Chunk(id="a", text="Keys expire after a TTL.")], emb)
        other = KnowledgeIndex.build([Chunk(id="a", text="Keys never expire.")], emb)
        assert one.version == same.version != other.version


def _model(request: RecordedRequest) -> ScriptedResponse:
    if request.judge == "decide":
        return tool_calls([("search", {"query": "Business plan price per seat"})])
    if request.judge == "grade":
        return verdicts(request, "relevant")
    return stream("The Business plan costs per seat [1].", chunk_size=8)


class TestRepeatedQuestion:
    async def test_second_identical_question_hits_retrieval_and_grade_caches(self, sample_cache: Path) -> None:
        """Asked twice, the question's search and grades come from the caches: no grading request, the record
        names the hits, and the answer is the same."""
        from ragloop.sample import sample_index

        index = sample_index(sample_cache)
        async with ScriptedOpenAIServer(matcher=_model) as server, server.client() as client:
            rag = _chat(index, client, Caches())
            first = await rag.ask("How much does the Business plan cost per seat?")
            before = len(server.chat_requests)
            second = await rag.ask("How much does the Business plan cost per seat?")
            after = server.chat_requests[before:]
        assert first.record.cache_hits.get("retrieval", 0) == 0 and first.record.cache_hits.get("grade", 0) == 0
        assert any(r.judge == "grade" for r in server.chat_requests[:before])
        assert [r.judge for r in after] == ["decide", "answer"]
        assert second.record.cache_hits["retrieval"] >= 1
        assert second.record.cache_hits["grade"] == len(first.record.grades)
        assert second.record.llm_calls == first.record.llm_calls - sum(c.judge == "grade" for c in first.record.calls)
        assert [g.chunk_id for g in second.record.grades] == [g.chunk_id for g in first.record.grades]
        assert second.text == first.text

    async def test_without_caches_nothing_is_reused(self, sample_cache: Path) -> None:
        """No caches: the second question pays for its grades again."""
        from ragloop.sample import sample_index

        index = sample_index(sample_cache)
        async with ScriptedOpenAIServer(matcher=_model) as server, server.client() as client:
            rag = _chat(index, client, None)
            await rag.ask("How much does the Business plan cost per seat?")
            second = await rag.ask("How much does the Business plan cost per seat?")
        assert second.record.cache_hits == {}
        assert sum(c.judge == "grade" for c in second.record.calls) >= 1


def _chat(index: KnowledgeIndex, client: openai.AsyncOpenAI, caches: Caches | None) -> ChatRAG:
    judges = OpenAIJudges.create(client, fast_model="fast", answer_model="answer")
    return ChatRAG(
        Turn(
            index.retriever("hybrid"),
            Judges(judges.decider, judges.grader, judges.rewriter, judges.answerer),
            caches=caches,
            index_version=lambda: index.version,
            settings=TurnSettings(fast_path_confidence=1.01),  # no fast path: the hits are graded
        )
    )


class TestReplyCache:
    async def test_off_by_default_and_reused_when_on(self) -> None:
        """Caches() keeps no replies; with a reply cache the second ask runs no turn and says so."""
        from ragloop.testing import FakeAnswerer, FakeDecider, FakeRewriter

        def chat(caches: Caches) -> tuple[ChatRAG, FakeRetriever]:
            retriever = FakeRetriever({"q": [make_hit("Keys expire after their TTL.")]})
            rag = ChatRAG(
                Turn(
                    retriever,
                    Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer()),
                    caches=caches,
                    index_version=lambda: "v1",
                    settings=TurnSettings(fast_path_confidence=1.01),
                )
            )
            return rag, retriever

        assert Caches().replies is None
        rag, retriever = chat(Caches(retrieval=None, grades=None, replies=MemoryCache()))
        first = await rag.ask("q")
        second = await rag.ask("q")
        assert len(retriever.calls) == 1
        assert second.text == first.text and second.record.cache_hits == {"reply": 1}
        assert second.record.llm_calls == 0 and second.record.run_id != first.record.run_id
        with_history = await rag.ask("q", history=[{"role": "user", "content": "earlier"}])
        assert with_history.record.cache_hits == {} and len(retriever.calls) == 2


class TestFromIndex:
    async def test_from_index_takes_caches_keyed_on_the_index_version(self, sample_cache: Path) -> None:
        """ChatRAG.from_index(..., caches=...) caches searches under the index's version (offline judges too)."""
        from ragloop.sample import sample_index

        rag = ChatRAG.from_index(sample_index(sample_cache), caches=Caches())
        await rag.ask("How do I rotate an API key?")
        again = await rag.ask("How do I rotate an API key?")
        assert again.record.cache_hits.get("retrieval", 0) >= 1

    async def test_query_embeddings_are_cached_for_searches(self, sample_cache: Path) -> None:
        """With the retrieval cache off, a query is embedded once: the second turn's searches hit the embedding
        cache (the first turn already hits it when the rewrite check embeds a query it searched)."""
        from ragloop.sample import sample_index

        rag = ChatRAG.from_index(sample_index(sample_cache), caches=Caches(retrieval=None))
        first = await rag.ask("How do I rotate an API key?")
        again = await rag.ask("How do I rotate an API key?")
        searches = sum(1 for step in again.record.path if step == "retrieve")
        assert again.record.cache_hits["embedding"] >= first.record.cache_hits.get("embedding", 0) + searches
        assert "retrieval" not in again.record.cache_hits
