"""Tests for ragloop.turn._builder: the Turn builder (insert_after, replace, add_source, build) and BuiltTurn."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from attrs import define, field

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError, GraphError
from ragloop.policy import ANSWER, GRADE, RETRIEVE, most_runs
from ragloop.retrievers.sources import DocumentSource
from ragloop.sample import sample_index
from ragloop.state import Decision, TurnState, Verdict
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
from ragloop.turn import BuiltTurn, Judges, Turn, TurnSettings

pytestmark = pytest.mark.anyio


def weak(query: str) -> list[Any]:
    """Hits too weak for the fast path: every query is graded."""
    return [make_hit(f"about {query}", confidence=0.3)]


def confident(query: str) -> list[Any]:
    """Two confident hits: a single query takes the fast path (retrieve → answer)."""
    return [make_hit(f"first about {query}", confidence=0.9), make_hit(f"second about {query}", confidence=0.9)]


def turn(hits: Any = weak, **judges: Any) -> Turn:
    parts: dict[str, Any] = {
        "decider": FakeDecider(),
        "grader": FakeGrader(),
        "rewriter": FakeRewriter(),
        "answerer": FakeAnswerer(),
    }
    settings = judges.pop("settings", TurnSettings())
    return Turn(FakeRetriever(hits), Judges(**(parts | judges)), settings=settings)


class NoPlan:
    """A planner of one's own that never plans (every question goes on to decide)."""

    name = "none"

    async def plan(self, question: str, history: Any = ()) -> None:
        return None


@define
class Rerank:
    """A node for insert_after: records that it ran, reverses the hits of every query, routes on."""

    routes: tuple[str, ...] = (GRADE,)
    runs: list[int] = field(factory=list)

    async def __call__(self, state: TurnState) -> str:
        self.runs.append(len(state.queries))
        for query in state.queries.values():
            query.hits = list(reversed(query.hits))
        return ANSWER if state.fast_path and ANSWER in self.routes else GRADE


async def path(built: BuiltTurn, question: str = "pricing") -> tuple[str, ...]:
    result = await built.graph.run(TurnState(question=question))
    assert result.stopped_by == "end", result.trace
    return result.path


class TestInsertAfter:
    async def test_runs_between_retrieve_and_grade(self) -> None:
        """insert_after('retrieve', 'rerank', node) puts rerank on retrieve's way to grade."""
        node = Rerank()
        built = turn().insert_after(RETRIEVE, "rerank", node).build()
        assert await path(built) == ("decide", "retrieve", "rerank", "grade", "answer")
        assert node.runs == [1]

    async def test_fast_path_still_skips_it(self) -> None:
        """A node that declares only 'grade' takes only that route: the fast path retrieve → answer stays direct."""
        node = Rerank()
        built = turn(confident).insert_after(RETRIEVE, "rerank", node).build()
        assert await path(built) == ("decide", "retrieve", "answer")
        assert node.runs == []

    async def test_declaring_both_routes_takes_the_fast_path_too(self) -> None:
        """A node that declares ('grade', 'answer') takes both of retrieve's routes and returns the one to follow."""
        node = Rerank(routes=(GRADE, ANSWER))
        built = turn(confident).insert_after(RETRIEVE, "rerank", node).build()
        assert await path(built) == ("decide", "retrieve", "rerank", "answer")
        assert dict(built.graph.edges["retrieve"]) == {"grade": "rerank", "answer": "rerank"}
        assert dict(built.graph.edges["rerank"]) == {"grade": "grade", "answer": "answer"}

    async def test_every_retrieve_round_goes_through_it(self) -> None:
        """The policy keeps its names: rewrite → retrieve → rerank → grade on every round of the loop."""
        node = Rerank()
        built = turn(grader=FakeGrader(lambda q, h: Verdict("irrelevant"))).insert_after(RETRIEVE, "rerank", node)
        names = await path(built.build(), "unanswerable")
        assert names == (
            "decide",
            *("retrieve", "rerank", "grade", "rewrite") * 2,
            "retrieve",
            "rerank",
            "grade",
            "answer",
        )
        assert len(node.runs) == 3

    async def test_chains_and_order(self) -> None:
        """A node inserted after an inserted one follows it; one inserted after retrieve again comes first."""
        built = (
            turn()
            .insert_after(RETRIEVE, "rerank", Rerank())
            .insert_after("rerank", "dedupe", Rerank())
            .insert_after(RETRIEVE, "expand", Rerank())
            .build()
        )
        assert await path(built) == ("decide", "retrieve", "expand", "rerank", "dedupe", "grade", "answer")

    async def test_step_cap_grows_with_the_runs_of_the_node_it_follows(self) -> None:
        """The longest regular turn (live, two rewrites, a hop) with a reranker still ends by 'end'."""
        angles = iter(["refund policy details", "billing statement copy"])

        def grade(q: str, h: object) -> Verdict:
            return Verdict("relevant" if q in ("billing statement copy", "hop follow up") else "irrelevant")

        base = turn(
            decider=FakeDecider(lambda q: Decision(queries=("ticket #1234",))),
            grader=FakeGrader(grade),
            rewriter=FakeRewriter(lambda q, f, t: next(angles)),
            bridger=FakeBridger(lambda q, found, tried: "hop follow up"),
        ).add_source(FakeLiveSource())
        policy = base.policy()
        built = base.insert_after(RETRIEVE, "rerank", Rerank()).build()
        assert built.graph.max_steps == TurnSettings().max_steps + most_runs(RETRIEVE, policy)
        names = await path(built, "ticket #1234")
        assert names.count("rerank") == 4 and len(names) > TurnSettings().max_steps

    @pytest.mark.parametrize(
        ("after", "name", "routes", "message"),
        [
            ("retrive", "rerank", (GRADE,), r"the turn has no node 'retrive'; its nodes: decide, retrieve"),
            (RETRIEVE, "grade", (GRADE,), r"the name 'grade' is taken"),
            ("answer", "polish", ("END",), r"'answer' ends the turn; nothing runs after it"),
            (RETRIEVE, "rerank", ("rewrite",), r"would never run: it declares none of 'retrieve''s routes"),
        ],
    )
    def test_mistakes_are_named_at_build(self, after: str, name: str, routes: tuple[str, ...], message: str) -> None:
        """An unknown node, a taken name, a node after the finish or one that would never run: a clear error."""
        builder = turn().insert_after(after, name, Rerank(routes=routes))
        with pytest.raises(GraphError, match=message):
            builder.build()


@define
class Hang:
    """A decide stand-in that never finishes (until cancelled)."""

    routes: tuple[str, ...] = ("retrieve", "answer")

    async def __call__(self, state: TurnState) -> str:
        await anyio.sleep(30)
        return ANSWER


@define
class Direct:
    """A decide stand-in that always answers directly (it declares only 'answer')."""

    routes: tuple[str, ...] = (ANSWER,)

    async def __call__(self, state: TurnState) -> str:
        return ANSWER


class TestReplace:
    async def test_swapped_node_runs_under_its_own_routes(self) -> None:
        """A replacement that declares fewer routes than the node it replaces is valid, and routes as declared."""
        built = turn().replace("decide", Direct()).build()
        assert await path(built) == ("decide", "answer")
        assert dict(built.graph.edges["decide"]) == {"answer": "answer"}

    async def test_replacement_keeps_inserted_edges(self) -> None:
        """Replacing retrieve after inserting rerank keeps rerank on the new retrieve's way to grade."""
        import attrs

        other = attrs.evolve(turn().build().nodes[RETRIEVE], retriever=FakeRetriever(weak))
        built = turn().insert_after(RETRIEVE, "rerank", Rerank()).replace(RETRIEVE, other).build()
        assert built.nodes[RETRIEVE] is other
        assert await path(built) == ("decide", "retrieve", "rerank", "grade", "answer")

    async def test_deadline_still_reaches_a_replaced_node(self) -> None:
        """A hanging replacement is cancelled by the turn's deadline like any node, and the answer still comes."""
        rag = ChatRAG(turn().replace("decide", Hang()))
        with anyio.fail_after(5):
            reply = await rag.ask("pricing", deadline_s=0.2)
        assert reply.record.stopped_by == "deadline" and reply.text

    def test_unknown_name(self) -> None:
        """Replacing a node the turn does not have names the turn's nodes."""
        with pytest.raises(GraphError, match=r"replace\('grde', …\): the turn has no node 'grde'; its nodes:"):
            turn().replace("grde", Direct()).build()


@define
class Sql:
    """A plan source with a schema-less description (enough for the plan node's table)."""

    name: str = "crm"
    description: str = "customers and orders"

    async def run(self, query: str, filters: Any) -> Any:
        raise AssertionError("not run in these tests")


class TestAddSource:
    def test_live_source_reaches_the_live_node_and_the_chat(self) -> None:
        """A live source goes to the live node and to the built turn (which a chat closes)."""
        source = FakeLiveSource()
        built = turn().add_source(source).build()
        assert built.nodes["live"].sources == (source,)  # type: ignore[attr-defined]
        assert built.live_sources == (source,)
        assert "plan" not in built.nodes

    def test_plan_source_starts_the_turn_with_plan(self) -> None:
        """The first plan source adds the plan node first; its table holds documents, live and plan sources."""
        live, sql = FakeLiveSource(), Sql()
        built = turn().add_source(live).add_source(sql).build()
        assert built.graph.start == "plan"
        sources = built.nodes["plan"].sources  # type: ignore[attr-defined]
        assert list(sources) == ["documents", "tickets", "crm"]
        assert isinstance(sources["documents"], DocumentSource) and sources["crm"] is sql
        assert built.graph.max_steps == TurnSettings().max_steps + 1

    def test_document_source_over_another_retriever(self) -> None:
        """A second index is a plan source (DocumentSource(retriever, name=…)) for a planner that reads
        descriptions (one of your own, or the model planner)."""
        manuals = DocumentSource(FakeRetriever(weak), name="manuals", description="product manuals")
        built = turn(planner=NoPlan()).add_source(manuals).build()
        assert built.nodes["plan"].sources["manuals"] is manuals  # type: ignore[attr-defined]

    def test_a_document_source_the_offline_planner_cannot_reach_is_refused(self) -> None:
        """With the offline planner alone a second DocumentSource would never be searched: build() refuses it
        and names add_retriever (the join every query searches) and the model planner."""
        manuals = DocumentSource(FakeRetriever(weak), name="manuals", description="product manuals")
        with pytest.raises(ConfigError, match=r"'manuals'.*never be searched.*add_retriever\('manuals'.*plan_model"):
            turn().add_source(manuals).build()

    def test_a_bare_retriever_is_refused_with_the_way_to_add_it(self) -> None:
        """A retriever is neither kind of source: the error says to join it (add_retriever) or wrap it."""
        with pytest.raises(ConfigError, match=r"FakeRetriever.*neither.*add_retriever\('manuals'.*DocumentSource"):
            turn().add_source(FakeRetriever(weak))  # type: ignore[arg-type]

    def test_neither_kind(self) -> None:
        """Something that is no source at all is refused, naming what each kind has."""
        with pytest.raises(ConfigError, match=r"a live source has name, signals, lookup and aclose"):
            turn().add_source(object())  # type: ignore[arg-type]

    def test_both_kinds(self) -> None:
        """An object that is both a live and a plan source is ambiguous: refused."""

        @define
        class Both(FakeLiveSource):
            description: str = "tickets"

            async def run(self, query: str, filters: Any) -> Any:
                return None

        with pytest.raises(ConfigError, match=r"both a live source and a plan source"):
            turn().add_source(Both())

    def test_duplicate_name(self) -> None:
        """Two sources with one name: refused (one would hide the other)."""
        with pytest.raises(ConfigError, match=r"a source named 'tickets' was added already"):
            turn().add_source(FakeLiveSource()).add_source(FakeLiveSource())


class TestBuild:
    def test_built_turn_cannot_change(self) -> None:
        """The graph of a built turn is immutable; changing the builder afterwards leaves it as it was."""
        builder = turn()
        built = builder.build()
        with pytest.raises(GraphError, match="cannot be changed"):
            built.graph.max_steps = 99
        builder.insert_after(RETRIEVE, "rerank", Rerank())
        assert "rerank" not in built.nodes and "rerank" in builder.build().nodes

    def test_default_graph_is_the_edge_table(self) -> None:
        """Without changes every route leads to the node of its name."""
        graph = turn().build().graph
        assert all(r == t for edges in graph.edges.values() for r, t in edges.items())

    def test_of_names_what_is_missing(self) -> None:
        """The flat form without its required collaborators says which and how to pass them."""
        with pytest.raises(ConfigError, match=r"a turn needs grader, rewriter, answerer"):
            Turn.of(retriever=FakeRetriever(weak), decider=FakeDecider())

    def test_chat_takes_a_turn_or_wiring_not_both(self) -> None:
        """ChatRAG(turn, retriever=...) is refused: one constructor path at a time."""
        with pytest.raises(ConfigError, match=r"pass a turn or its collaborators \(retriever\), not both"):
            ChatRAG(turn(), retriever=FakeRetriever(weak))

    def test_chat_of_a_builder_and_of_a_built_turn(self) -> None:
        """ChatRAG builds a Turn it is given, and runs a BuiltTurn as it is."""
        built = turn().build()
        assert ChatRAG(built).graph is built.graph
        assert set(ChatRAG(turn()).nodes) == set(built.nodes)

    def test_flat_form_and_builder_make_the_same_graph(self) -> None:
        """ChatRAG(retriever=…, decider=…) and ChatRAG(Turn(…)) assemble the same nodes and edges."""
        parts = {
            "decider": FakeDecider(),
            "grader": FakeGrader(),
            "rewriter": FakeRewriter(),
            "answerer": FakeAnswerer(),
        }
        retriever = FakeRetriever(weak)
        flat = ChatRAG(retriever=retriever, **parts).graph
        built = ChatRAG(Turn(retriever, Judges(**parts))).graph
        assert {n: dict(e) for n, e in flat.edges.items()} == {n: dict(e) for n, e in built.edges.items()}
        assert (flat.start, flat.finish, flat.max_steps) == (built.start, built.finish, built.max_steps)


class TestOpening:
    def test_from_index_and_the_chat_constructor_agree(self, sample_cache: Any) -> None:
        """ChatRAG.sample is ChatRAG(Turn.sample(...)): same nodes, offline, with the sample's live source."""
        rag = ChatRAG.sample(cache_dir=sample_cache)
        built = Turn.sample(cache_dir=sample_cache).build()
        assert set(rag.nodes) == set(built.nodes) and rag.offline and built.offline
        assert [s.name for s in rag.live_sources] == [s.name for s in built.live_sources] == ["tickets"]

    @pytest.mark.parametrize("opener", ["from_retriever", "from_index", "sample"])
    def test_an_unknown_option_is_refused_not_ignored(self, opener: str, sample_cache: Any) -> None:
        """A misspelt or misplaced keyword (``turn_log=``, which belongs to ChatRAG) raises ConfigError naming
        it and the fix, on the Turn and the ChatRAG openers alike (it used to be silently ignored)."""
        calls = {
            "from_retriever": lambda **kw: ChatRAG.from_retriever(FakeRetriever(weak), ["a text"], **kw),
            "from_index": lambda **kw: Turn.from_index(sample_index(sample_cache), **kw),
            "sample": lambda **kw: ChatRAG.sample(cache_dir=sample_cache, **kw),
        }
        with pytest.raises(ConfigError, match=r"unknown option\(s\) 'turn_log' \(a turn log belongs to the chat"):
            calls[opener](turn_log=object())
        with pytest.raises(ConfigError, match=r"'setings'.*known: .*settings"):
            calls[opener](setings=TurnSettings())


class TestAddRetriever:
    async def test_every_query_searches_both_and_hits_keep_their_ranks(self) -> None:
        """add_retriever joins a second index to the turn's own search: each query searches both, the reply can
        cite the manuals' page, and every hit keeps its rank per retriever."""
        docs = FakeRetriever(lambda q: [make_hit(f"docs on {q}", source="docs.md", confidence=0.3)])
        manuals = FakeRetriever(lambda q: [make_hit(f"manual on {q}", source="manual.md", confidence=0.3)])
        parts = {"decider": FakeDecider(), "grader": FakeGrader(), "rewriter": FakeRewriter()}
        turn = Turn(docs, Judges(answerer=FakeAnswerer(), **parts)).add_retriever("manuals", manuals, weight=2.0)
        reply = await ChatRAG(turn).ask("install the agent")
        assert docs.calls == manuals.calls == ["install the agent"]
        assert [c.source for c in reply.citations] == ["manual.md", "docs.md"]  # the heavier list first
        hits = await turn.build().retriever.search("x")  # type: ignore[union-attr]
        assert {h.chunk.source: dict(h.ranks) for h in hits} == {
            "manual.md": {"manuals": 1},
            "docs.md": {"documents": 1},
        }

    def test_names_and_weights_are_checked(self) -> None:
        """A name used twice (documents is the turn's own), a negative weight or a non-retriever: one line each,
        and the builder is left as it was."""
        t = turn().add_retriever("manuals", FakeRetriever(weak))
        before = t.retriever
        with pytest.raises(ConfigError, match="'manuals' was added already"):
            t.add_retriever("manuals", FakeRetriever(weak))
        with pytest.raises(ConfigError, match="'documents' was added already"):
            t.add_retriever("documents", FakeRetriever(weak))
        with pytest.raises(ConfigError, match=">= 0"):
            t.add_retriever("faq", FakeRetriever(weak), weight=-1)
        with pytest.raises(ConfigError, match=r"not a retriever.*faq"):
            t.add_retriever("faq", object())  # type: ignore[arg-type]
        assert t.retriever is before

    def test_cached_searches_follow_every_joined_retrievers_version(self) -> None:
        """With an index version (Turn.from_index gives one), the joined turn's version changes when the added
        retriever's does, so cached searches of the old second index are not served."""

        class Versioned(FakeRetriever):
            version = "m1"

        manuals = Versioned(weak)
        t = Turn(FakeRetriever(weak), turn().judges, index_version=lambda: "docs-v1")
        built = t.add_retriever("manuals", manuals).build()
        before = built.index_version()
        manuals.version = "m2"
        assert built.index_version() != before and before.startswith("docs-v1|")
