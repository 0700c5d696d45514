"""Node-by-node tests of the chat turn, with in-memory fakes."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop import END
from ragloop.errors import JudgeError
from ragloop.events import Progress, Token
from ragloop.nodes.answer import Answer, build_blocks, decide_outcome, resolve_citations
from ragloop.nodes.decide import Decide
from ragloop.nodes.grade import Grade, grade_all
from ragloop.nodes.hop import Hop
from ragloop.nodes.live import Live, split_matches
from ragloop.nodes.retrieve import Retrieve, merge_budget, merge_hits
from ragloop.nodes.rewrite import Rewrite
from ragloop.retrievers.live import LiveRecord
from ragloop.state import ContextBlock, Decision, Graded, QueryState, TurnState, Verdict
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
from ragloop.turn import TurnSettings, build_graph, default_nodes, turn_record

pytestmark = pytest.mark.anyio


def with_queries(*queries: str, question: str = "q", status: str = "pending") -> TurnState:
    """A state whose decide step made ``queries``; pending for retrieve unless another status is given."""
    state = TurnState(question=question)
    for q in queries:
        state.queries[q] = QueryState(text=q, root=q, status=status)  # type: ignore[arg-type]
    state.pending = list(queries) if status == "pending" else []
    return state


class TestDecide:
    async def test_direct_reply_routes_to_answer(self) -> None:
        """A direct reply goes straight to answer without queries."""
        node = Decide(FakeDecider(lambda q: Decision(reply="Hello!")))
        state = TurnState(question="hi")
        assert await node(state) == "answer"
        assert state.decision is not None and state.decision.direct and not state.queries

    async def test_queries_deduplicated_and_capped(self) -> None:
        """Queries are deduplicated (case/punctuation) and capped by max_queries."""
        node = Decide(
            FakeDecider(lambda q: Decision(queries=("SSO setup", "sso setup?", "a", "b", "c"))), max_queries=3
        )
        state = TurnState(question="x")
        assert await node(state) == "retrieve"
        assert state.pending == ["SSO setup", "a", "b"]

    async def test_failing_decider_falls_back_to_question(self) -> None:
        """A decider error falls back to searching the question itself, and is recorded."""

        def broken(q: str) -> Decision:
            raise JudgeError("model down")

        state = TurnState(question="how do refunds work")
        assert await Decide(FakeDecider(broken))(state) == "retrieve"
        assert state.pending == ["how do refunds work"]
        assert state.errors and "model down" in state.errors[0]

    async def test_fallback_decider_used(self) -> None:
        """When a fallback decider is configured it answers after the primary fails."""

        def broken(q: str) -> Decision:
            raise JudgeError("model down")

        state = TurnState(question="hello")
        node = Decide(FakeDecider(broken), fallback=FakeDecider(lambda q: Decision(reply="hi")))
        assert await node(state) == "answer"


class TestMerge:
    def test_dedup_keeps_best_copy_and_all_finders(self) -> None:
        """Copies of one text are merged; the best-scoring copy wins; every finder is listed."""
        a = make_hit("SSO uses SAML.", score=0.5, chunk_id="c1")
        b = make_hit("sso  uses saml", score=0.9, chunk_id="c2")
        merged = merge_hits({"q1": [a], "q2": [b]}, budget=10)
        assert len(merged) == 1
        assert merged[0].id == "c2" and merged[0].best_query == "q2" and merged[0].queries == ("q1", "q2")

    def test_budget_interleaves_queries(self) -> None:
        """The cap keeps each query's best hit before anyone's second."""
        q1 = [make_hit(f"one {i}", score=10 - i) for i in range(5)]
        q2 = [make_hit(f"two {i}", score=1 - i / 10) for i in range(5)]
        merged = merge_hits({"q1": q1, "q2": q2}, budget=2)
        assert {h.text for h in merged} == {"one 0", "two 0"}

    def test_budget_grows_sublinearly(self) -> None:
        """The total budget grows slower than the number of queries and is capped."""
        assert merge_budget(1, per_query=6, total=12) == 6
        assert merge_budget(4, per_query=6, total=100) == 12
        assert merge_budget(50, per_query=6, total=12) == 12

    @given(
        st.dictionaries(
            st.sampled_from(["q1", "q2", "q3"]),
            st.lists(
                st.tuples(st.sampled_from(["alpha", "beta", "Alpha!", "gamma", "delta"]), st.floats(0, 1)),
                max_size=5,
            ),
            max_size=3,
        ),
        st.integers(0, 8),
    )
    def test_merge_properties(self, raw: dict[str, list[tuple[str, float]]], budget: int) -> None:
        """Merge is order-independent, keeps the best copy, caps, and loses no provenance."""
        results = {q: [make_hit(t, score=s, chunk_id=f"{q}-{i}") for i, (t, s) in enumerate(v)] for q, v in raw.items()}
        merged = merge_hits(results, budget=budget)
        reversed_input = {q: list(reversed(results[q])) for q in reversed(list(results))}
        assert merge_hits(reversed_input, budget=budget) == merged
        assert len(merged) <= budget
        assert len({h.text.lower().strip("!") for h in merged}) == len(merged)
        assert [h.score for h in merged] == sorted((h.score for h in merged), reverse=True)
        for h in merged:
            key = h.text.lower().strip("!")
            finders = {q for q, hits in results.items() for x in hits if x.text.lower().strip("!") == key}
            assert set(h.queries) == finders
            assert h.score == max(x.score for q in finders for x in results[q] if x.text.lower().strip("!") == key)


class TestRetrieve:
    async def test_one_failing_query_does_not_cancel_others(self) -> None:
        """A raising and a hanging query are recorded as failed; the third's hits are used."""
        retriever = FakeRetriever(
            {"good": [make_hit("good text")]},
            errors={"bad": OSError("index down")},
            delays={"slow": 30},
        )
        state = with_queries("good", "bad", "slow")
        with anyio.fail_after(5):
            assert await Retrieve(retriever, timeout_s=0.05)(state) == "grade"
        assert state.queries["bad"].status == "failed" and "index down" in (state.queries["bad"].error or "")
        assert state.queries["slow"].status == "failed" and "timed out" in (state.queries["slow"].error or "")
        assert [h.text for h in state.hits] == ["good text"]

    async def test_queries_run_concurrently(self) -> None:
        """Several queries are searched at once (bounded by max_concurrency)."""
        retriever = FakeRetriever(delays={"a": 0.05, "b": 0.05, "c": 0.05})
        await Retrieve(retriever, max_concurrency=2)(with_queries("a", "b", "c"))
        assert retriever.concurrency.peak == 2

    async def test_fast_path(self) -> None:
        """One query whose hits are all confident skips grading."""
        retriever = FakeRetriever({"q": [make_hit("x", confidence=0.9), make_hit("y", confidence=0.8)]})
        state = with_queries("q")
        assert await Retrieve(retriever, fast_path_confidence=0.75)(state) == "answer"
        assert state.fast_path and state.queries["q"].status == "enough" and len(state.graded) == 2

    async def test_fast_path_keeps_only_confident_hits(self) -> None:
        """Enough confident hits skip grading; the weak tail is dropped rather than passed on ungraded."""
        hits = [make_hit("x", confidence=0.9), make_hit("y", confidence=0.8), make_hit("z", confidence=0.3)]
        state = with_queries("q")
        assert await Retrieve(FakeRetriever({"q": hits}), fast_path_min_hits=2)(state) == "answer"
        assert [g.hit.text for g in state.graded] == ["x", "y"] and len(state.queries["q"].hits) == 2

    async def test_no_fast_path_for_an_id_the_hits_do_not_name(self) -> None:
        """Confident hits that do not name the query's ticket id go to grading (and maybe live)."""
        hits = [make_hit("How tickets work", confidence=0.95), make_hit("Ticket statuses", confidence=0.9)]
        state = with_queries("status of ticket #1234")
        assert await Retrieve(FakeRetriever({"status of ticket #1234": hits}))(state) == "grade"

    async def test_no_fast_path_with_a_weak_hit_or_two_queries(self) -> None:
        """A single weak hit, or two queries, go to grading."""
        weak = FakeRetriever({"q": [make_hit("x", confidence=0.9), make_hit("y", confidence=0.2)]})
        assert await Retrieve(weak)(with_queries("q")) == "grade"
        two = FakeRetriever(lambda q: [make_hit(q, confidence=1.0)])
        assert await Retrieve(two)(with_queries("a", "b")) == "grade"

    async def test_thrash_guard_filters_shown_chunks(self) -> None:
        """Chunks shown by an earlier attempt are not retrieved again."""
        hit = make_hit("seen before", chunk_id="c1")
        state = with_queries("q")
        state.shown.add("c1")
        await Retrieve(FakeRetriever({"q": [hit, make_hit("new")]}))(state)
        assert [h.text for h in state.hits] == ["new"]

    async def test_emits_progress(self) -> None:
        """retrieve reports 'searching…' and 'found N passages' progress events."""
        from ragloop import Graph

        g = Graph(
            {"retrieve": _Only(Retrieve(FakeRetriever({"q": [make_hit("x")]})))}, start="retrieve", finish="retrieve"
        )
        kinds = [e.kind async for e in g.stream(with_queries("q")) if isinstance(e, Progress)]
        assert kinds == ["search", "retrieved"]


class _Only:
    """Wraps a node so that it ends the run (for streaming one node)."""

    routes = (END,)

    def __init__(self, node: object) -> None:
        self.node = node

    async def __call__(self, state: TurnState) -> str:
        await self.node(state)  # type: ignore[operator]
        return END


class TestGrade:
    async def test_each_query_graded_against_itself(self) -> None:
        """A chunk found by one query is graded against that query only."""
        grader = FakeGrader()
        state = with_queries("a", "b")
        state.queries["a"].hits = [make_hit("for a")]
        state.queries["b"].hits = [make_hit("for b")]
        await Grade(grader)(state)
        assert sorted((q, t) for q, t in [(c[0], c[1]) for c in grader.calls]) == sorted(
            [("a", state.queries["a"].hits[0].id), ("b", state.queries["b"].hits[0].id)]
        )

    async def test_fail_open_on_error_and_timeout(self) -> None:
        """A grader error or timeout keeps the chunk, flags it and records the reason."""

        def judge(q: str, hit: object) -> Verdict:
            raise JudgeError("bad json")

        state = with_queries("a")
        state.queries["a"].hits = [make_hit("t")]
        assert await Grade(FakeGrader(judge))(state) == "answer"
        assert state.fail_open and "bad json" in state.fail_open[0][2]
        assert state.queries["a"].status == "enough"
        slow = with_queries("a")
        slow.queries["a"].hits = [make_hit("t")]
        await Grade(FakeGrader(delay_s=5), timeout_s=0.02)(slow)
        assert "timed out" in slow.fail_open[0][2]

    async def test_short_query_routes_to_rewrite_then_answer(self) -> None:
        """Short queries with attempts left go to rewrite; without, to answer."""
        state = with_queries("a")
        state.queries["a"].hits = [make_hit("t")]
        grader = FakeGrader(lambda q, h: Verdict("irrelevant"))
        assert await Grade(grader)(state) == "rewrite"
        assert state.queries["a"].status == "short"
        state2 = with_queries("a")
        state2.queries["a"].attempt = 2
        assert await Grade(grader, max_attempts=2)(state2) == "answer"

    async def test_signal_routes_to_live(self) -> None:
        """A short query carrying a live source's signal goes to live."""
        state = with_queries("status of ticket #1234")
        assert await Grade(FakeGrader(), [FakeLiveSource()])(state) == "live"

    @given(st.lists(st.sampled_from(["ok", "no", "raise"]), min_size=1, max_size=12))
    def test_failure_pattern_keeps_exactly_failed(self, pattern: list[str]) -> None:
        """Any pattern of grader failures keeps exactly the failed chunks (fail-open) and counts them."""
        hits = [make_hit(f"text {i}", chunk_id=f"c{i}") for i in range(len(pattern))]
        plan = {h.id: p for h, p in zip(hits, pattern, strict=True)}

        def judge(q: str, hit: object) -> Verdict:
            action = plan[hit.id]  # type: ignore[attr-defined]
            if action == "raise":
                raise JudgeError("boom")
            return Verdict("relevant" if action == "ok" else "irrelevant")

        graded = anyio.run(
            lambda: grade_all(FakeGrader(judge), [("q", h) for h in hits], timeout_s=1, max_concurrency=4)
        )
        assert [g.hit.id for g in graded] == [h.id for h in hits]
        failed = {g.hit.id for g in graded if g.verdict.fail_open}
        assert failed == {i for i, p in plan.items() if p == "raise"}
        assert all(g.verdict.keep for g in graded if g.verdict.fail_open)
        assert {g.hit.id for g in graded if g.verdict.keep} == {i for i, p in plan.items() if p != "no"}


def _ticket(i: str) -> LiveRecord:
    return LiveRecord("tickets", i, f"Ticket #{i}", f"Ticket {i} is about SSO.")


class TestLive:
    async def test_exact_id_accepted(self) -> None:
        """A record with the requested id answers the query."""
        state = with_queries("ticket #1234", status="short")
        source = FakeLiveSource({"1234": _ticket("1234")})
        assert await Live([source])(state) == "answer"
        assert state.queries["ticket #1234"].status == "enough"
        assert state.live[0]["accepted"] == ["1234"] and state.graded[0].hit.chunk.title == "Ticket #1234"

    async def test_wrong_id_rejected(self) -> None:
        """#1233 returned for #1234 is a recorded mismatch, not an answer."""
        state = with_queries("ticket #1234", status="short")
        source = FakeLiveSource({"1233": _ticket("1233")}, wrong={"1234": "1233"})
        assert await Live([source])(state) == "rewrite"
        assert state.live[0]["mismatches"] == ["1233"] and not state.graded

    async def test_no_signal_no_call(self) -> None:
        """Queries without the signal never reach the source."""
        state = with_queries("pricing", status="short")
        source = FakeLiveSource()
        await Live([source])(state)
        assert source.lookups == []

    async def test_source_down_is_recorded(self) -> None:
        """A failing source is recorded and the turn goes on."""
        state = with_queries("ticket #1234", status="short")
        await Live([FakeLiveSource(fail_times=1)])(state)
        assert "down" in str(state.live[0]["error"])

    @given(st.integers(1000, 99999), st.integers(1000, 99999))
    def test_split_never_accepts_other_id(self, asked: int, got: int) -> None:
        """The id matcher never accepts a different id of the same kind."""
        accepted, rejected = split_matches([str(asked)], [_ticket(str(got))])
        assert (accepted != []) == (asked == got)
        assert len(accepted) + len(rejected) == 1


class TestRewrite:
    async def test_new_angle_is_queued(self) -> None:
        """A novel rewrite becomes a pending query of the same root."""
        state = with_queries("reset password", status="short")
        node = Rewrite(FakeRewriter(lambda q, f, t: "account recovery email link"))
        assert await node(state) == "retrieve"
        assert state.pending == ["account recovery email link"]
        new = state.queries["account recovery email link"]
        assert new.root == "reset password" and new.attempt == 1
        assert state.queries["reset password"].status == "rewritten"

    async def test_repeat_is_rejected(self) -> None:
        """A rewrite repeating a tried query is rejected and the query gives up with no_context."""
        state = with_queries("reset password", status="short")
        node = Rewrite(FakeRewriter(lambda q, f, t: "Reset the password"))
        assert await node(state) == "answer"
        assert state.queries["reset password"].status == "no_context"
        assert state.rewrites[0]["accepted"] is False

    async def test_attempt_cap(self) -> None:
        """After max_attempts the query is no_context and no rewrite is asked."""
        state = with_queries("x", status="short")
        state.queries["x"].attempt = 2
        rewriter = FakeRewriter()
        assert await Rewrite(rewriter, max_attempts=2)(state) == "answer"
        assert rewriter.calls == [] and state.queries["x"].status == "no_context"

    async def test_rewriter_error_gives_up_honestly(self) -> None:
        """A rewriter failure marks the query no_context with the reason."""

        def broken(q: str, f: str, t: object) -> str:
            raise JudgeError("no new angle")

        state = with_queries("x", status="short")
        assert await Rewrite(FakeRewriter(broken))(state) == "answer"
        assert "no new angle" in str(state.rewrites[0]["reason"])

    @given(
        st.lists(st.text("abcdefgh ", min_size=1, max_size=20), min_size=1, max_size=4),
        st.text("abcdefgh ", max_size=20),
    )
    def test_never_queues_a_near_repeat(self, tried: list[str], candidate: str) -> None:
        """Whatever the rewriter says, the node never queues a tried or near-duplicate query."""
        from ragloop.text.novelty import is_near_duplicate

        state = TurnState(question="q")
        for t in tried:
            state.queries.setdefault(t, QueryState(text=t, root=tried[0], status="short"))
        anyio.run(Rewrite(FakeRewriter(lambda q, f, t: candidate)).__call__, state)
        for q in state.pending:
            others = [t for t in state.queries if t != q]
            assert not is_near_duplicate(q, others) and q.strip()


class TestHop:
    async def test_follow_up_is_queued_as_a_hop(self) -> None:
        """A follow-up becomes a pending hop query under the first root, built from relevant passages."""
        state = with_queries("film cast", status="enough")
        state.graded.append(Graded("film cast", make_hit("Shirley Temple starred."), Verdict("relevant")))
        state.graded.append(Graded("film cast", make_hit("Unrelated."), Verdict("irrelevant")))
        bridger = FakeBridger(lambda q, found, tried: "Shirley Temple government position")
        assert await Hop(bridger)(state) == "retrieve"
        hop = state.queries["Shirley Temple government position"]
        assert hop.hop and hop.root == "film cast" and state.pending == [hop.text]
        assert bridger.calls == [("q", 1)] and state.hops[0]["accepted"] is True

    async def test_no_follow_up_or_failure_goes_to_answer(self) -> None:
        """No follow-up, a repeat, or a failing bridger all end in answer, recorded."""

        def broken(q: str, f: object, t: object) -> str:
            raise RuntimeError("bridge down")

        for bridger in (FakeBridger(), FakeBridger(lambda q, f, t: "film cast"), FakeBridger(broken)):
            state = with_queries("film cast", status="enough")
            assert await Hop(bridger)(state) == "answer"
            assert state.hops[0]["accepted"] is False
        assert "bridge down" in str(state.hops[0]["reason"])

    async def test_short_hop_never_triggers_a_rewrite(self) -> None:
        """A hop query that finds nothing is not a short query: the turn answers with what it has."""
        state = with_queries("film cast", status="enough")
        state.queries["bridge"] = QueryState(text="bridge", root="film cast", status="short", hop=True)
        state.hops.append({"query": "bridge"})
        from ragloop.nodes.grade import route_after_grading

        assert route_after_grading(state, (), max_attempts=2, max_hops=1) == "answer"
        assert decide_outcome(state) == ("context", ())

    async def test_graph_hops_once_then_answers(self) -> None:
        """With a bridger, a fully answered turn searches once more and then answers."""
        bridger = FakeBridger(lambda q, found, tried: None if len(tried) > 1 else "second hop query")
        g = graph_of(bridger=bridger)
        result = await g.run(TurnState(question="first hop"))  # type: ignore[attr-defined]
        assert result.path == ("decide", "retrieve", "grade", "hop", "retrieve", "grade", "answer")
        assert result.state.outcome == "context"


class TestAnswer:
    async def test_outcomes(self) -> None:
        """context / partial / none / direct follow the roots' statuses."""
        state = with_queries("a", "b")
        state.queries["a"].status = "enough"
        state.queries["b"].status = "no_context"
        assert decide_outcome(state) == ("partial", ("b",))
        state.queries["b"].status = "enough"
        assert decide_outcome(state) == ("context", ())
        state.queries["a"].status = state.queries["b"].status = "short"
        assert decide_outcome(state) == ("none", ("a", "b"))
        state.decision = Decision(reply="hi")
        assert decide_outcome(state)[0] == "direct"
        assert decide_outcome(TurnState(question="x")) == ("none", ("x",))

    async def test_blocks_fair_and_unique(self) -> None:
        """Blocks interleave the queries, skip irrelevant hits and never repeat a chunk."""
        state = with_queries("a", "b")
        shared = make_hit("shared", chunk_id="s")
        for q, texts in (("a", ["a1", "a2"]), ("b", ["b1"])):
            for t in texts:
                state.graded.append(Graded(q, make_hit(t, chunk_id=t), Verdict("relevant")))
            state.graded.append(Graded(q, shared, Verdict("partial")))
        state.graded.append(Graded("a", make_hit("junk", chunk_id="j"), Verdict("irrelevant")))
        blocks = build_blocks(state, max_blocks=10)
        assert [b.chunk_id for b in blocks] == ["a1", "b1", "a2", "s"]
        assert [b.n for b in blocks] == [1, 2, 3, 4]

    def test_citations_resolved_and_invalid_dropped(self) -> None:
        """[n] markers resolve to blocks; markers naming no block are removed."""
        blocks = [ContextBlock(1, "t", "a.md", "A", "c1"), ContextBlock(2, "u", "b.md", "B", "c2")]
        text, cites, invalid = resolve_citations("Yes [1]. Also [2, 7]. Fake [9].", blocks)
        assert text == "Yes [1]. Also [2]. Fake ."
        assert [c.n for c in cites] == [1, 2] and invalid == [7, 9]

    async def test_streams_tokens_and_falls_back(self) -> None:
        """The primary answerer failing before any token hands over to the fallback."""
        state = with_queries("a")
        state.queries["a"].status = "enough"
        state.graded.append(Graded("a", make_hit("x", chunk_id="x"), Verdict("relevant")))
        node = Answer(FakeAnswerer(fail_after=0), fallback=FakeAnswerer())
        assert await node(state) == END
        assert state.answer == "context: [1]" and state.citations[0].chunk_id == "x"
        assert state.errors and "fake answerer failure" in state.errors[0]

    async def test_cut_stream_says_so(self) -> None:
        """A failure after some tokens keeps them and says the answer was cut off."""
        state = with_queries("a")
        state.queries["a"].status = "enough"
        state.graded.append(Graded("a", make_hit("x", chunk_id="x"), Verdict("relevant")))
        await Answer(FakeAnswerer(fail_after=1), fallback=FakeAnswerer())(state)
        assert state.answer.startswith("context:") and "cut off" in state.answer


def graph_of(**overrides: object) -> object:
    parts: dict[str, object] = dict(
        retriever=FakeRetriever(lambda q: [make_hit(f"about {q}", confidence=0.3)]),
        decider=FakeDecider(),
        grader=FakeGrader(),
        rewriter=FakeRewriter(),
        answerer=FakeAnswerer(),
    )
    parts.update(overrides)
    settings = parts.pop("settings", TurnSettings())
    return build_graph(default_nodes(settings=settings, **parts), settings)  # type: ignore[arg-type]


class TestGraph:
    async def test_two_topic_turn(self) -> None:
        """Two queries are retrieved, graded and answered as context, with a full record."""
        g = graph_of(decider=FakeDecider(lambda q: Decision(queries=("pricing", "sso"))))
        result = await g.run(TurnState(question="pricing and sso"))  # type: ignore[attr-defined]
        assert result.path == ("decide", "retrieve", "grade", "answer")
        record = turn_record(result)
        assert record.outcome == "context" and record.decision["queries"] == ["pricing", "sso"]
        assert len(record.grades) == 2 and record.stopped_by == "end"

    async def test_rewrite_loop_then_none(self) -> None:
        """Irrelevant hits are rewritten up to the cap, then answered honestly as none."""
        g = graph_of(grader=FakeGrader(lambda q, h: Verdict("irrelevant")))
        result = await g.run(TurnState(question="unanswerable"))  # type: ignore[attr-defined]
        assert result.path == (
            "decide",
            "retrieve",
            "grade",
            "rewrite",
            "retrieve",
            "grade",
            "rewrite",
            "retrieve",
            "grade",
            "answer",
        )
        state = result.state
        assert state.outcome == "none" and state.missing == ("unanswerable",)
        assert len(state.rewrites) == 2

    @given(
        st.lists(st.sampled_from(["relevant", "irrelevant", "raise", "partial"]), min_size=1, max_size=6),
        st.lists(st.sampled_from(["ok", "raise", "repeat"]), min_size=1, max_size=3),
        st.integers(1, 12),
        st.booleans(),
    )
    def test_every_run_ends_with_one_outcome(
        self, grades: list[str], rewrites: list[str], cap: int, decide_fails: bool
    ) -> None:
        """Whatever the judges do, a turn ends within the cap with exactly one outcome and an answer."""
        counter = {"g": 0, "r": 0}

        def grade(q: str, h: object) -> Verdict:
            action = grades[counter["g"] % len(grades)]
            counter["g"] += 1
            if action == "raise":
                raise JudgeError("grader down")
            return Verdict(action)  # type: ignore[arg-type]

        def rewrite(question: str, failed: str, tried: object) -> str:
            action = rewrites[counter["r"] % len(rewrites)]
            counter["r"] += 1
            if action == "raise":
                raise JudgeError("rewriter down")
            return failed if action == "repeat" else f"angle {counter['r']} {question}"

        def decide(q: str) -> Decision:
            if decide_fails:
                raise JudgeError("decider down")
            return Decision(queries=("one", "two"))

        g = graph_of(
            decider=FakeDecider(decide),
            grader=FakeGrader(grade),
            rewriter=FakeRewriter(rewrite),
            settings=TurnSettings(max_steps=cap),
        )
        result = anyio.run(lambda: g.run(TurnState(question="q")))  # type: ignore[attr-defined]
        assert len(result.trace) <= cap + 1
        assert result.path[-1] == "answer" and result.path.count("answer") == 1
        assert result.state.outcome in ("context", "partial", "none")
        assert result.state.answer


async def test_tokens_stream_through_runner() -> None:
    """Answer tokens reach the graph's event stream."""
    g = graph_of()
    tokens = [e.text async for e in g.stream(TurnState(question="x")) if isinstance(e, Token)]  # type: ignore[attr-defined]
    assert "".join(tokens).startswith("context:")


async def test_any_decider_exception_falls_back() -> None:
    """A custom decider raising a non-judge error still falls back to searching the question."""

    def broken(q: str) -> Decision:
        raise KeyError("bug in a custom decider")

    state = TurnState(question="refund policy")
    assert await Decide(FakeDecider(broken))(state) == "retrieve"
    assert "KeyError" in state.errors[0]


def test_longest_regular_turn_fits_the_default_cap() -> None:
    """Live, two rewrites and a hop in one turn still end by 'end', not by the step cap."""
    angles = iter(["refund policy details", "billing statement copy"])

    def grade(q: str, h: object) -> Verdict:
        # the decide query and its first rewrite come up short; the second rewrite and the hop are answered
        return Verdict("relevant" if q in ("billing statement copy", "hop follow up") else "irrelevant")

    g = graph_of(
        decider=FakeDecider(lambda q: Decision(queries=("ticket #1234",))),
        grader=FakeGrader(grade),
        rewriter=FakeRewriter(lambda q, f, t: next(angles)),
        live_sources=[FakeLiveSource()],
        bridger=FakeBridger(lambda q, found, tried: "hop follow up"),
    )
    result = anyio.run(lambda: g.run(TurnState(question="ticket #1234")))  # type: ignore[attr-defined]
    assert result.path == (
        "decide", "retrieve", "grade", "live", "rewrite", "retrieve", "grade", "rewrite", "retrieve", "grade",
        "hop", "retrieve", "grade", "answer",
    )  # fmt: skip
    assert result.stopped_by == "end"
