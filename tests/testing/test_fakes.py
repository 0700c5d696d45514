"""The in-memory fakes of ``ragloop.testing``: they answer as scripted, fail or stall on cue, and record calls."""

from __future__ import annotations

import anyio
import pytest

from ragloop.retrievers.live import LiveRecord
from ragloop.state import ContextBlock, Decision, PageContext, Verdict
from ragloop.testing import (
    FakeAnswerer,
    FakeBridger,
    FakeDecider,
    FakeGrader,
    FakeLiveSource,
    FakeRetriever,
    FakeRewriter,
    make_hit,
)

pytestmark = pytest.mark.anyio


class TestMakeHit:
    def test_id_is_the_text_hash_unless_given(self) -> None:
        """Equal texts share an id, different texts do not, and an explicit id wins."""
        assert make_hit("a").id == make_hit("a").id != make_hit("b").id
        assert make_hit("a", chunk_id="c1").id == "c1"
        assert make_hit("a", source="x.md").chunk.title == "x.md"


class TestFakeRetriever:
    async def test_answers_fails_and_records(self) -> None:
        """Scripted hits (capped at k), a scripted error, and every query recorded in order."""
        hits = [make_hit(f"t{i}") for i in range(3)]
        retriever = FakeRetriever({"q": hits}, errors={"bad": OSError("down")})
        assert list(await retriever.search("q", k=2)) == hits[:2]
        assert list(await retriever.search("unknown")) == []
        with pytest.raises(OSError, match="down"):
            await retriever.search("bad")
        assert retriever.calls == ["q", "unknown", "bad"]

    async def test_function_results_and_peak_concurrency(self) -> None:
        """Results may be a function of the query; parallel delayed searches show up in the peak."""
        retriever = FakeRetriever(lambda q: [make_hit(q)], delays={"a": 0.05, "b": 0.05})
        async with anyio.create_task_group() as tg:
            tg.start_soon(retriever.search, "a")
            tg.start_soon(retriever.search, "b")
        assert retriever.concurrency.peak == 2 and retriever.concurrency.now == 0
        assert [h.text for h in await retriever.search("c")] == ["c"]


class TestFakeJudges:
    async def test_decider_default_searches_the_question(self) -> None:
        """The default decision searches the question as asked; calls keep history and page."""
        decider = FakeDecider()
        assert await decider.decide("how?", (), PageContext()) == Decision(queries=("how?",))
        custom = FakeDecider(lambda q: Decision(reply="hi"))
        assert (await custom.decide("hello", (), PageContext())).reply == "hi"
        assert len(decider.calls) == 1

    async def test_grader_uses_its_function(self) -> None:
        """The grader returns ``fn(query, hit)`` and records (query, hit id)."""
        grader = FakeGrader(lambda q, h: Verdict("irrelevant", reason=q))
        hit = make_hit("text")
        assert (await grader.grade("q", hit)).label == "irrelevant"
        assert grader.calls == [("q", hit.id)]

    async def test_rewriter_and_bridger(self) -> None:
        """The rewriter's default names the attempt; the bridger's default proposes nothing."""
        rewriter = FakeRewriter()
        assert await rewriter.rewrite("question", "failed", ["a", "b"]) == "question alternative 2"
        bridger = FakeBridger()
        assert await bridger.follow_up("question", ["found"], []) is None
        assert bridger.calls == [("question", 1)]

    async def test_answerer_streams_and_fails_after(self) -> None:
        """The answer names the outcome and cites each block; ``fail_after`` raises mid-stream."""
        blocks = [ContextBlock(1, "a", source="a.md"), ContextBlock(2, "b", source="b.md")]
        tokens = [t async for t in FakeAnswerer().answer("q", blocks, "partial", missing=["x"])]
        assert tokens == ["partial: ", "[1] ", "[2] ", "missing: x"]
        failing = FakeAnswerer(fail_after=1)
        got: list[str] = []
        with pytest.raises(RuntimeError):
            async for token in failing.answer("q", blocks, "context"):
                got.append(token)
        assert got == ["context: "]


class TestFakeLiveSource:
    async def test_signals_lookup_wrong_ids_and_failures(self) -> None:
        """Ticket ids are found in the query; ``wrong`` swaps a record; ``fail_times`` lookups fail first."""
        records = {i: LiveRecord("tickets", i, f"Ticket #{i}", "status: open") for i in ("1234", "9999")}
        source = FakeLiveSource(records, wrong={"1234": "9999"}, fail_times=1)
        assert source.signals("status of #1234 and #1234?") == ("1234",)
        with pytest.raises(ConnectionError):
            await source.lookup("q", ["1234"])
        assert [r.id for r in await source.lookup("q", ["1234"])] == ["9999"]
        assert source.lookups == [("1234",), ("1234",)]


async def test_fake_retriever_applies_metadata_filters() -> None:
    """FakeRetriever takes the retrievers' `filters` argument and keeps only the hits whose metadata match."""
    import attrs

    from ragloop.testing import FakeRetriever, make_hit

    acme, other = make_hit("Acme's page", chunk_id="a"), make_hit("Other page", chunk_id="b")
    acme = attrs.evolve(acme, chunk=attrs.evolve(acme.chunk, metadata={"tenant": "acme"}))
    other = attrs.evolve(other, chunk=attrs.evolve(other.chunk, metadata={"tenant": "globex"}))
    fake = FakeRetriever({"q": [acme, other]})
    assert [h.id for h in await fake.search("q", filters={"tenant": ("acme",)})] == ["a"]
    assert [h.id for h in await fake.search("q")] == ["a", "b"]
