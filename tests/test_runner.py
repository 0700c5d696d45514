"""Tests for the graph runner: validation, endings, deadlines, trace, events, cancellation, size, properties."""

from __future__ import annotations

import ast
import contextlib
import io
import time
import tokenize
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from attrs import define, field
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import ragloop.runner
from ragloop import (
    END,
    Graph,
    GraphError,
    NodeFinished,
    NodeStarted,
    Progress,
    RagloopError,
    RouteError,
    RunFinished,
    Token,
    emit,
)
from ragloop.mermaid import flowchart

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The runner promises every anyio backend: each async test runs on asyncio and on trio."""
    return str(request.param)


@define
class Log:
    """State for runner tests: the names of the nodes that ran."""

    seen: list[str] = field(factory=list)


@define
class Fn:
    """A node built from a function of the state."""

    name: str
    routes: tuple[str, ...]
    fn: Callable[[Any], Any]

    async def __call__(self, state: Log) -> str:
        state.seen.append(self.name)
        out = self.fn(state)
        if hasattr(out, "__await__"):
            out = await out
        return str(out)


def to(target: str) -> Callable[[Any], str]:
    return lambda _state: target


def boom(_state: Any) -> str:
    raise ValueError("kaput")


def linear() -> Graph:
    return Graph(
        {
            "a": Fn("a", ("b",), to("b")),
            "b": Fn("b", ("fin",), to("fin")),
            "fin": Fn("fin", (END,), to(END)),
        },
        start="a",
        finish="fin",
    )


class TestValidation:
    def test_unknown_start_lists_known_names(self) -> None:
        """An unknown start names the problem and the known nodes."""
        with pytest.raises(GraphError, match=r"start node 'x' is not in the graph.*known nodes: a, fin"):
            Graph({"a": Fn("a", (END,), to(END)), "fin": Fn("fin", (END,), to(END))}, start="x", finish="fin")

    def test_unknown_route(self) -> None:
        """A declared route to a missing node is rejected at construction."""
        with pytest.raises(GraphError, match=r"unknown route 'grde' from node 'a'"):
            Graph({"a": Fn("a", ("grde",), to(END))}, start="a", finish="a")

    def test_node_without_routes(self) -> None:
        """A node lacking a routes tuple is rejected with what it needs."""

        async def bare(state: Any) -> str:
            return END

        with pytest.raises(GraphError, match="needs a __call__ and a `routes` tuple"):
            Graph({"a": bare}, start="a", finish="a")  # type: ignore[dict-item]

    def test_bad_max_steps(self) -> None:
        """max_steps below one is a configuration error."""
        with pytest.raises(GraphError, match="max_steps must be at least 1"):
            Graph({"a": Fn("a", (END,), to(END))}, start="a", finish="a", max_steps=0)

    def test_finish_may_only_end(self) -> None:
        """A finish node that may route elsewhere is rejected: it runs once, last."""
        with pytest.raises(GraphError, match=r"finish node 'fin' runs once, last: its routes must be \('END',\)"):
            Graph({"a": Fn("a", ("fin",), to("fin")), "fin": Fn("fin", ("a", END), to(END))}, start="a", finish="fin")

    def test_mermaid(self) -> None:
        """The diagram lists the start and every declared route."""
        assert linear().to_mermaid() == (
            "flowchart TD\n    START([start]) --> a\n    a --> b\n    b --> fin\n    fin --> END([end])"
        )

    def test_flowchart_sorts_routes(self) -> None:
        """mermaid.flowchart draws each node's routes in sorted order and END as the end shape."""
        assert flowchart("x", {"x": ["z", "y", "E"]}, end="E").splitlines()[2:] == [
            "    x --> END([end])",
            "    x --> y",
            "    x --> z",
        ]


class TestEdges:
    """A route leads to the node of its name unless the graph's edges send it elsewhere."""

    def graph(self, **edges: dict[str, str]) -> Graph:
        nodes = {
            "a": Fn("a", ("b", "fin"), to("b")),
            "b": Fn("b", ("fin",), to("fin")),
            "x": Fn("x", ("b",), to("b")),
            "fin": Fn("fin", (END,), to(END)),
        }
        return Graph(nodes, start="a", finish="fin", edges=edges)

    async def test_rewired_route_runs_the_node_it_leads_to(self) -> None:
        """a returns 'b', its edge sends 'b' to x, and x's own 'b' leads to b: a → x → b → fin."""
        result = await self.graph(a={"b": "x"}).run(Log())
        assert result.path == ("a", "x", "b", "fin")

    def test_edges_and_routes_are_resolved_once(self) -> None:
        """The graph keeps every declared route with its target; routes (and the diagram) show the targets."""
        g = self.graph(a={"b": "x"})
        assert dict(g.edges["a"]) == {"b": "x", "fin": "fin"}
        assert g.routes["a"] == frozenset({"x", "fin"})
        assert "    a --> x" in g.to_mermaid() and "    a --> b" not in g.to_mermaid()

    def test_edge_to_a_missing_node(self) -> None:
        """An edge that leads nowhere is rejected, naming the route, its node and where it led."""
        with pytest.raises(GraphError, match=r"unknown route 'b' from node 'a' \(its edge leads to 'rerank'\)"):
            self.graph(a={"b": "rerank"})

    def test_edge_on_an_undeclared_route(self) -> None:
        """An edge on a route the node does not declare is a mistake, not silently ignored."""
        with pytest.raises(GraphError, match=r"edge from 'b' on 'grade': 'b' does not declare 'grade'"):
            self.graph(b={"grade": "x"})

    def test_edge_of_an_unknown_node(self) -> None:
        """Edges of a node that is not in the graph are rejected."""
        with pytest.raises(GraphError, match=r"edges name node 'nope', which is not in the graph"):
            self.graph(nope={"b": "x"})

    def test_end_cannot_be_rewired(self) -> None:
        """END always ends the run: no edge may send it to a node."""
        with pytest.raises(GraphError, match=r"edge from 'fin' on 'END': END ends a run"):
            self.graph(fin={END: "a"})

    async def test_undeclared_return_is_still_a_route_error(self) -> None:
        """Returning the name of an edge's target instead of a declared route is refused."""
        g = Graph(
            {"a": Fn("a", ("b",), to("x")), "b": Fn("b", (END,), to(END)), "x": Fn("x", ("b",), to("b"))},
            start="a",
            finish="b",
            edges={"a": {"b": "x"}},
        )
        with pytest.raises(RouteError, match=r"node 'a' returned 'x'.*its routes are: b"):
            await g.run(Log())


class TestImmutable:
    def test_a_built_graph_cannot_be_changed(self) -> None:
        """Setting an attribute of a built graph, or a node in its table, is refused."""
        g = linear()
        with pytest.raises(GraphError, match="a built Graph cannot be changed"):
            g.max_steps = 99
        with pytest.raises(TypeError):
            g.nodes["a"] = Fn("a", (END,), to(END))  # type: ignore[index]
        with pytest.raises(TypeError):
            g.edges["a"]["b"] = "fin"  # type: ignore[index]

    def test_the_nodes_given_are_copied(self) -> None:
        """Changing the mapping a graph was built from does not change the graph."""
        nodes: dict[str, Any] = {"a": Fn("a", (END,), to(END))}
        g = Graph(nodes, start="a", finish="a")
        nodes["b"] = Fn("b", (END,), to(END))
        assert list(g.nodes) == ["a"]


class TestPayOnlyWhenUsed:
    async def test_record_becomes_log_fields_only_when_a_log_keeps_them(self) -> None:
        """With no logging configured the record is never turned into log fields; with a log it is."""

        class Unloggable(dict[str, Any]):
            def keys(self) -> Any:
                raise AssertionError("the record was turned into log fields")

        g = Graph({"a": Fn("a", (END,), to(END))}, start="a", finish="a", summarize=lambda r: Unloggable())
        assert isinstance((await g.run(Log())).record, Unloggable)
        logged = Graph({"a": Fn("a", (END,), to(END))}, start="a", finish="a", summarize=lambda r: {"seen": 1})
        with structlog.testing.capture_logs() as logs:
            result = await logged.run(Log())
        [finished] = [e for e in logs if e["event"] == "turn.finished"]
        assert finished["seen"] == 1 and finished["run_id"] == result.run_id and finished["path"] == ["a"]

    async def test_trace_is_made_when_first_read(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A run keeps its trace as rows; the Steps are made once, when someone reads them, and then kept.

        (No log keeps events here: a configured log reads the path for turn.finished, which makes the Steps.)
        """
        import ragloop._log
        import ragloop.events

        monkeypatch.setattr(ragloop._log.Logger, "enabled", lambda self, method: False)

        made: list[int] = []
        original = ragloop.events._steps

        def counting(rows: Any) -> Any:
            made.append(len(rows))
            return original(rows)

        monkeypatch.setattr(ragloop.events, "_steps", counting)
        result = await linear().run(Log())
        assert made == []
        assert result.trace is result.trace and [s.node for s in result.trace] == ["a", "b", "fin"]
        assert made == [3] and result.path == ("a", "b", "fin")

    def test_result_of_rows_equals_result_of_steps(self) -> None:
        """RunResult takes the runner's rows or Steps alike, and compares by the steps."""
        from ragloop.events import RunResult, Step

        rows = RunResult("r", None, ((1, "a", END, 0.0, 0.5, None, False),), "end", 0.5)
        steps = RunResult("r", None, (Step(1, "a", END, 0.0, 0.5),), "end", 0.5)
        assert rows == steps and rows.trace == steps.trace and rows.timings == {"a": 0.5}

    async def test_run_ids_are_unique_16_hex_digits(self) -> None:
        """Every run gets its own id of 16 hex digits, whatever the application did to `random`."""
        import random

        random.seed(0)
        g = Graph({"a": Fn("a", (END,), to(END))}, start="a", finish="a")
        ids = [(await g.run(Log())).run_id for _ in range(500)]
        assert len(set(ids)) == 500 and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)

    def test_forked_child_gets_other_run_ids(self) -> None:
        """A worker forked from a process draws run ids of its own, not a copy of its parent's sequence."""
        import subprocess
        import sys

        script = (
            "import os\n"
            "from ragloop import END, Graph\n"
            "class A:\n"
            "    routes = (END,)\n"
            "    async def __call__(self, state): return END\n"
            "g = Graph({'a': A()}, start='a', finish='a')\n"
            "read, write = os.pipe()\n"
            "if os.fork() == 0:\n"
            "    os.write(write, g.run_sync(None).run_id.encode()); os._exit(0)\n"
            "os.wait(); print(os.read(read, 64).decode(), g.run_sync(None).run_id)\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
        child, parent = out.stdout.split()
        assert len(child) == len(parent) == 16 and child != parent


class TestEndings:
    async def test_end(self) -> None:
        """A run that reaches END stops by 'end' with a full trace."""
        result = await linear().run(Log())
        assert result.stopped_by == "end"
        assert result.path == ("a", "b", "fin")
        assert [s.next for s in result.trace] == ["b", "fin", END]
        assert all(s.error is None and not s.forced for s in result.trace)
        assert set(result.timings) == {"a", "b", "fin"}
        assert result.state.seen == ["a", "b", "fin"]

    async def test_step_cap_runs_finish_once(self) -> None:
        """A loop hitting the cap runs finish once and records step_cap."""
        g = Graph(
            {"a": Fn("a", ("a", "fin"), to("a")), "fin": Fn("fin", (END,), to(END))},
            start="a",
            finish="fin",
            max_steps=4,
        )
        result = await g.run(Log())
        assert result.stopped_by == "step_cap"
        assert result.state.seen == ["a"] * 4 + ["fin"]
        assert result.trace[-1].forced

    async def test_deadline_cancels_node_and_runs_finish(self) -> None:
        """A node sleeping past the deadline is cancelled; finish runs within its grace."""
        cancelled = []

        async def sleepy(_state: Any) -> str:
            try:
                await anyio.sleep(10)
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            return "fin"

        g = Graph({"a": Fn("a", ("fin",), sleepy), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        with anyio.fail_after(5):
            result = await g.run(Log(), deadline_s=0.05)
        assert result.stopped_by == "deadline"
        assert cancelled == [True]
        assert result.trace[0].error is not None and result.trace[0].error.startswith("deadline")
        assert result.state.seen == ["a", "fin"]

    async def test_error_is_recorded_and_logged(self) -> None:
        """A raising node is recorded in trace and log; finish runs; the caller gets a result."""
        g = Graph({"a": Fn("a", ("fin",), boom), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        with structlog.testing.capture_logs() as logs:
            result = await g.run(Log())
        assert result.stopped_by == "error"
        assert result.trace[0].error == "ValueError: kaput"
        assert isinstance(result.error, ValueError)
        assert result.state.seen == ["a", "fin"]
        failed = [e for e in logs if e["event"] == "node.failed"]
        assert failed and failed[0]["node"] == "a"
        finished = [e for e in logs if e["event"] == "turn.finished"]
        assert finished[0]["stopped_by"] == "error" and finished[0]["path"] == ["a", "fin"]

    async def test_raise_errors(self) -> None:
        """raise_errors=True re-raises the node's error instead of finishing."""
        g = Graph({"a": Fn("a", ("fin",), boom), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        with pytest.raises(ValueError, match="kaput"):
            await g.run(Log(), raise_errors=True)

    async def test_undeclared_route_is_route_error(self) -> None:
        """Returning an undeclared name raises RouteError naming node, name and routes."""
        g = Graph({"a": Fn("a", ("fin",), to("nope")), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        with pytest.raises(RouteError, match=r"node 'a' returned 'nope'.*its routes are: fin"):
            await g.run(Log())

    async def test_failing_finish_propagates(self) -> None:
        """If finish itself fails after an error, that error propagates."""
        g = Graph({"a": Fn("a", ("fin",), boom), "fin": Fn("fin", (END,), boom)}, start="a", finish="fin")
        with pytest.raises(ValueError, match="kaput"):
            await g.run(Log())

    async def test_finish_raising_on_its_normal_step_runs_once(self) -> None:
        """A finish node that raises on its normal step is recorded, not run again, and its error propagates."""
        state = Log()
        g = Graph({"a": Fn("a", ("fin",), to("fin")), "fin": Fn("fin", (END,), boom)}, start="a", finish="fin")
        events: list[Any] = []

        async def sink(event: Any) -> None:
            events.append(event)

        with structlog.testing.capture_logs() as logs, pytest.raises(ValueError, match="kaput"):
            await g.run(state, on_event=sink)
        assert state.seen == ["a", "fin"]
        assert [(e.node, e.error) for e in events if isinstance(e, NodeFinished)] == [
            ("a", None),
            ("fin", "ValueError: kaput"),
        ]
        assert [e["node"] for e in logs if e["event"] == "node.failed"] == ["fin"]

    async def test_finish_reached_at_the_cap_runs_normally(self) -> None:
        """The cap counts the nodes before finish: reaching finish as step max_steps+1 ends by 'end'."""
        g = Graph(
            {"a": Fn("a", ("b",), to("b")), "b": Fn("b", ("fin",), to("fin")), "fin": Fn("fin", (END,), to(END))},
            start="a",
            finish="fin",
            max_steps=2,
        )
        result = await g.run(Log())
        assert (result.path, result.stopped_by, result.trace[-1].forced) == (("a", "b", "fin"), "end", False)

    async def test_summarize_extends_turn_record(self) -> None:
        """The summarize hook's fields land in the turn.finished event."""
        g = Graph(
            {"a": Fn("a", (END,), to(END))}, start="a", finish="a", summarize=lambda r: {"seen": len(r.state.seen)}
        )
        with structlog.testing.capture_logs() as logs:
            await g.run(Log())
        assert [e["seen"] for e in logs if e["event"] == "turn.finished"] == [1]

    async def test_nodes_see_run_step_and_node_in_log_context(self) -> None:
        """structlog context variables carry run_id, step and node inside each node, and are reset after."""
        seen: list[dict[str, Any]] = []

        def look(state: Log) -> str:
            seen.append(structlog.contextvars.get_contextvars())
            return "b" if len(seen) == 1 else END

        g = Graph({"a": Fn("a", ("b",), look), "b": Fn("b", (END,), look)}, start="a", finish="b")
        result = await g.run(Log())
        assert [(c["step"], c["node"], c["run_id"]) for c in seen] == [
            (1, "a", result.run_id),
            (2, "b", result.run_id),
        ]
        assert {"step", "node", "run_id"}.isdisjoint(structlog.contextvars.get_contextvars())

    def test_run_sync(self) -> None:
        """run_sync runs the graph without an event loop."""
        assert linear().run_sync(Log()).path == ("a", "b", "fin")

    async def test_run_sync_inside_loop_is_clear_error(self) -> None:
        """run_sync inside a running loop says to await run() instead."""
        with pytest.raises(RagloopError, match=r"await graph\.run"):
            linear().run_sync(Log())


@define
class Reply:
    """State for deadline tests: the streamed parts and the final text."""

    seen: list[str] = field(factory=list)
    parts: list[str] = field(factory=list)
    text: str = ""


@define
class Streamer:
    """A finish node that streams numbered tokens slowly; its salvage keeps what was sent and says so."""

    n: int = 6
    delay: float = 0.05
    salvage_error: Exception | None = None
    salvage_hangs: bool = False
    starts: int = 0
    salvaged: int = 0
    routes: tuple[str, ...] = (END,)

    async def __call__(self, state: Reply) -> str:
        self.starts += 1
        state.seen.append("fin")
        for i in range(self.n):
            await anyio.sleep(self.delay)
            state.parts.append(f"t{i} ")
            await emit(Token(f"t{i} "))
        state.text = "".join(state.parts)
        return END

    async def salvage(self, state: Reply) -> None:
        self.salvaged += 1
        if self.salvage_error is not None:
            raise self.salvage_error
        if self.salvage_hangs:
            await anyio.sleep(30)
        state.text = "".join(state.parts) + "(could not finish)"
        await emit(Token("(could not finish)"))


def sleeps_forever(log: list[str]) -> Callable[[Any], Any]:
    async def node(_state: Any) -> str:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            log.append("cancelled")
            raise
        return "fin"

    return node


async def streamed(g: Graph, state: Reply, deadline_s: float) -> tuple[list[str], Any, float]:
    """Run ``g`` as a stream; return the tokens, the result and the wall time."""
    tokens: list[str] = []
    result = None
    t0 = time.perf_counter()
    async for event in g.stream(state, deadline_s=deadline_s):
        if isinstance(event, Token):
            tokens.append(event.text)
        elif isinstance(event, RunFinished):
            result = event.result
    return tokens, result, time.perf_counter() - t0


#: Generous bound on the runner's overshoot past deadline + grace in these tests (the measured one is in
#: benchmarks/results/bench_runner.json, `deadline_overshoot_ms`).
# What these bounds tell apart takes 4 s (200 tokens x 20 ms) or forever (a finish that hangs), so 1 s of slack
# for timers firing late on a machine at load 20 still separates a cut at the grace from no cut.
SLACK_S = 1.0


class TestDeadline:
    async def test_deadline_mid_finish_does_not_restart_it(self) -> None:
        """A deadline passing while finish streams lets it finish within its grace: every token once."""
        fin = Streamer(n=6, delay=0.05)
        g = Graph({"a": Fn("a", ("fin",), to("fin")), "fin": fin}, start="a", finish="fin", finish_grace_s=2.0)
        with anyio.fail_after(5):
            tokens, result, _ = await streamed(g, state := Reply(), deadline_s=0.1)
        assert tokens == [f"t{i} " for i in range(6)]
        assert (fin.starts, fin.salvaged, result.stopped_by, result.path) == (1, 0, "end", ("a", "fin"))
        assert state.text == "t0 t1 t2 t3 t4 t5 "

    async def test_finish_overrunning_grace_is_salvaged_once(self) -> None:
        """Finish still streaming at deadline + grace is cancelled and salvaged: no token twice, text kept."""
        fin = Streamer(n=200, delay=0.02)
        g = Graph({"a": Fn("a", ("fin",), to("fin")), "fin": fin}, start="a", finish="fin", finish_grace_s=0.3)
        with anyio.fail_after(5):
            tokens, result, wall = await streamed(g, state := Reply(), deadline_s=0.1)
        sent = tokens[:-1]
        assert sent and sent == [f"t{i} " for i in range(len(sent))] and tokens[-1] == "(could not finish)"
        # the text keeps what was streamed (plus at most the token whose emit the cancellation cut), then the note
        assert state.text.startswith("".join(sent)) and state.text.endswith("(could not finish)")
        assert len(state.text) - len("".join(sent) + "(could not finish)") <= len(f"t{len(sent)} ")
        assert (fin.starts, fin.salvaged, result.stopped_by) == (1, 1, "deadline")
        last = result.trace[-1]
        assert last.node == "fin" and not last.forced and last.next is None
        assert last.error.startswith("grace: finish cancelled after") and last.error.endswith("; salvaged")
        assert wall <= 0.1 + 0.3 + SLACK_S

    async def test_forced_finish_overrunning_grace_is_salvaged(self) -> None:
        """Deadline in a node: it is cancelled, finish runs once forced, and is salvaged when past its grace."""
        log: list[str] = []
        fin = Streamer(n=200, delay=0.02)
        g = Graph(
            {"a": Fn("a", ("fin",), sleeps_forever(log)), "fin": fin}, start="a", finish="fin", finish_grace_s=0.3
        )
        with anyio.fail_after(5):
            tokens, result, wall = await streamed(g, state := Reply(), deadline_s=0.1)
        assert log == ["cancelled"] and (fin.starts, fin.salvaged) == (1, 1)
        assert len(tokens) == len(set(tokens)) and state.text.endswith("(could not finish)")
        assert [(s.node, s.forced) for s in result.trace] == [("a", False), ("fin", True)]
        assert result.trace[0].error.startswith("deadline: cancelled")
        assert result.stopped_by == "deadline" and result.trace[1].error.endswith("; salvaged")
        assert wall <= 0.1 + 0.3 + SLACK_S

    async def test_failing_salvage_is_recorded(self) -> None:
        """A salvage that raises is recorded on the finish step; the run still returns."""
        fin = Streamer(n=200, delay=0.02, salvage_error=ValueError("no luck"))
        g = Graph({"fin": fin}, start="fin", finish="fin", finish_grace_s=0.2)
        with anyio.fail_after(5):
            result = await g.run(Reply(), deadline_s=0.05)
        assert result.trace[-1].error.endswith("; salvage failed: ValueError: no luck")

    async def test_hanging_salvage_is_bounded(self) -> None:
        """A salvage that hangs is cut at its reserve: the run still ends by deadline + grace."""
        fin = Streamer(n=200, delay=0.02, salvage_hangs=True)
        g = Graph({"fin": fin}, start="fin", finish="fin", finish_grace_s=0.4)
        t0 = time.perf_counter()
        with anyio.fail_after(5):
            result = await g.run(Reply(), deadline_s=0.05)
        assert result.trace[-1].error.endswith("; salvage timed out")
        assert time.perf_counter() - t0 <= 0.05 + 0.4 + SLACK_S

    async def test_finish_without_salvage_is_cut_at_grace(self) -> None:
        """A finish node without salvage is cancelled at deadline + grace and the run says so."""
        log: list[str] = []
        g = Graph({"fin": Fn("fin", (END,), sleeps_forever(log))}, start="fin", finish="fin", finish_grace_s=0.1)
        t0 = time.perf_counter()
        with anyio.fail_after(5):
            result = await g.run(Log(), deadline_s=0.05)
        assert log == ["cancelled"] and result.stopped_by == "deadline"
        assert result.trace[-1].error.startswith("grace: finish cancelled") and "salvage" not in result.trace[-1].error
        assert time.perf_counter() - t0 <= 0.05 + 0.1 + SLACK_S


class TestEvents:
    async def test_stream_yields_typed_events_in_order(self) -> None:
        """stream() yields start/finish per node, emitted events, and RunFinished last."""

        async def talk(state: Log) -> str:
            await emit(Progress(node="a", kind="note", message="hello"))
            return "fin"

        g = Graph({"a": Fn("a", ("fin",), talk), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        events = [e async for e in g.stream(Log())]
        kinds = [type(e).__name__ for e in events]
        assert kinds == [
            "NodeStarted",
            "Progress",
            "NodeFinished",
            "NodeStarted",
            "NodeFinished",
            "RunFinished",
        ]
        assert len({e.run_id for e in events}) == 1 and events[0].run_id
        finished = events[2]
        assert isinstance(finished, NodeFinished) and finished.next == "fin"
        last = events[-1]
        assert isinstance(last, RunFinished) and last.result.stopped_by == "end"

    async def test_emit_outside_stream_is_noop(self) -> None:
        """emit() outside a streamed run does nothing."""
        await emit(Progress(node="x", kind="k", message="m"))

    async def test_backpressure(self) -> None:
        """A node emitting more than the buffer holds waits for the consumer."""
        produced: list[int] = []

        async def chatty(state: Log) -> str:
            for i in range(50):
                await emit(Progress(node="a", kind="n", message=str(i)))
                produced.append(i)
            return END

        g = Graph({"a": Fn("a", (END,), chatty)}, start="a", finish="a")
        async with contextlib.aclosing(g.stream(Log(), buffer=2)) as events:
            async for event in events:
                if isinstance(event, Progress):
                    await anyio.sleep(0.01)
                    assert len(produced) <= int(event.message) + 4
                    if event.message == "5":
                        break
        assert len(produced) < 50


class TestCancellation:
    async def test_consumer_break_cancels_node_and_children(self) -> None:
        """Breaking out of stream() cancels the running node and its child tasks."""
        observed: list[str] = []
        started = anyio.Event()

        async def child(tag: str) -> None:
            try:
                await anyio.sleep(30)
            finally:
                observed.append(tag)

        async def fan_out(state: Log) -> str:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(child, "c1")
                    tg.start_soon(child, "c2")
                    started.set()
                    await emit(Progress(node="a", kind="k", message="working"))
                    await anyio.sleep(30)
            finally:
                observed.append("node")
            return END

        g = Graph({"a": Fn("a", (END,), fan_out)}, start="a", finish="a")
        with anyio.fail_after(5):
            async with contextlib.aclosing(g.stream(Log())) as events:
                async for event in events:
                    if isinstance(event, Progress):
                        break
        assert sorted(observed) == ["c1", "c2", "node"]

    async def test_plain_break_cancels_run(self) -> None:
        """A bare `break` out of `async for` (no aclose) still cancels the node and its children."""
        observed: list[str] = []

        async def child() -> None:
            try:
                await anyio.sleep(30)
            finally:
                observed.append("child")

        async def fan_out(state: Log) -> str:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(child)
                    await emit(Progress(node="a", kind="k", message="working"))
                    await anyio.sleep(30)
            finally:
                observed.append("node")
            return END

        g = Graph({"a": Fn("a", (END,), fan_out)}, start="a", finish="a")
        with anyio.fail_after(5):
            async for event in g.stream(Log()):
                if isinstance(event, Progress):
                    break
            while len(observed) < 2:
                await anyio.sleep(0.001)
        assert sorted(observed) == ["child", "node"]

    async def test_async_with_is_structured(self) -> None:
        """`async with graph.stream(...)` cancels the run on exit and leaves no task behind."""
        observed: list[str] = []

        async def slow(state: Log) -> str:
            await emit(Progress(node="a", kind="k", message="m"))
            try:
                await anyio.sleep(30)
            finally:
                observed.append("node")
            return END

        g = Graph({"a": Fn("a", (END,), slow)}, start="a", finish="a")
        with anyio.fail_after(5):
            async with g.stream(Log()) as events:
                async for event in events:
                    if isinstance(event, Progress):
                        break
        assert observed == ["node"]

    async def test_break_with_stream_still_referenced_cancels_node(self) -> None:
        """`break` out of `async for` over a stream the caller still holds cancels the node at once."""
        observed: list[str] = []
        stopped = anyio.Event()

        async def slow(state: Log) -> str:
            await emit(Progress(node="a", kind="k", message="m"))
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                observed.append("cancelled")
                raise
            finally:
                stopped.set()
            return END

        g = Graph({"a": Fn("a", (END,), slow)}, start="a", finish="a")
        events = g.stream(Log())
        async for event in events:
            if isinstance(event, Progress):
                break
        for _ in range(10):  # a few scheduler turns, no sleeping: the run was cancelled at the `break`
            if stopped.is_set():
                break
            await anyio.sleep(0)
        assert observed == ["cancelled"]
        await events.aclose()  # still usable, and idempotent

    async def test_aclose_waits_for_the_node_to_stop(self) -> None:
        """aclose() returns only once the node's cleanup has run."""
        observed: list[str] = []

        async def slow(state: Log) -> str:
            await emit(Progress(node="a", kind="k", message="m"))
            try:
                await anyio.sleep(30)
            finally:
                with anyio.CancelScope(shield=True):  # a cleanup that itself takes a while
                    await anyio.sleep(0.05)
                observed.append("cleaned")
            return END

        g = Graph({"a": Fn("a", (END,), slow)}, start="a", finish="a")
        events = g.stream(Log())
        with anyio.fail_after(5):
            assert isinstance(await events.__anext__(), NodeStarted)
            assert isinstance(await events.__anext__(), Progress)
            await events.aclose()
        assert observed == ["cleaned"]

    async def test_stream_reraises_route_error(self) -> None:
        """A RouteError inside a streamed run reaches the consumer."""
        g = Graph({"a": Fn("a", ("fin",), to("nope")), "fin": Fn("fin", (END,), to(END))}, start="a", finish="fin")
        with pytest.raises(RouteError):
            async for _ in g.stream(Log()):
                pass

    async def test_cancelled_consumer_cancels_run(self) -> None:
        """Cancelling the task that iterates the stream cancels the node."""
        observed: list[str] = []

        async def slow(state: Log) -> str:
            try:
                await anyio.sleep(30)
            finally:
                observed.append("node")
            return END

        g = Graph({"a": Fn("a", (END,), slow)}, start="a", finish="a")

        async def consume() -> None:
            async for _ in g.stream(Log()):
                pass

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        assert observed == ["node"]


# --- properties -----------------------------------------------------------------------------------------

NAMES = ["n0", "n1", "n2", "n3", "n4"]


@define
class Script:
    """What a generated node does on each visit: a route choice, a raise, or a long sleep."""

    name: str
    routes: tuple[str, ...]
    actions: list[str]
    visits: int = 0
    saw: list[str] = field(factory=list)

    async def __call__(self, state: Log) -> str:
        action = self.actions[self.visits % len(self.actions)]
        self.visits += 1
        state.seen.append(self.name)
        if action == "raise":
            raise RuntimeError(f"{self.name} failed")
        if action == "sleep":
            await anyio.sleep(5)
        return action if action in self.routes else self.routes[0]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[dict[str, Script], str, str, int]:
    n = draw(st.integers(2, 5))
    names = NAMES[:n]
    finish = names[-1]
    nodes: dict[str, Script] = {}
    for name in names:
        routes = tuple(draw(st.lists(st.sampled_from([*names, END]), min_size=1, max_size=3, unique=True)))
        pool = [*routes, "raise", "sleep"] if name != finish else [*routes]
        actions = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        nodes[name] = Script(name, routes, actions)
    # the finish node may only end the run (the graph rejects anything else), and ends it without error
    nodes[finish].routes, nodes[finish].actions = (END,), [END]
    return nodes, names[0], finish, draw(st.integers(1, 8))


@given(graphs())
def test_runs_always_return_within_cap(spec: tuple[dict[str, Script], str, str, int]) -> None:
    """Any graph returns; at most max_steps+1 nodes run; finish runs once on every non-end stop."""
    nodes, start, finish, cap = spec
    g = Graph(nodes, start=start, finish=finish, max_steps=cap, finish_grace_s=1.0)
    state = Log()
    result = anyio.run(lambda: g.run(state, deadline_s=0.05))
    assert len(result.trace) <= cap + 1
    assert [s.node for s in result.trace] == state.seen
    forced = [s for s in result.trace if s.forced]
    if result.stopped_by == "end":
        assert not forced and result.trace[-1].next == END
    else:
        assert len(forced) == 1 and result.trace[-1].forced and result.trace[-1].node == finish
    errors = [s for s in result.trace if s.error and not s.forced]
    if result.stopped_by in ("end", "step_cap"):
        assert not errors
    elif result.stopped_by == "error":
        assert errors == [result.trace[-2]] and "failed" in (errors[0].error or "")
    for a, b in zip(result.trace, result.trace[1:], strict=False):
        if not b.forced:
            assert a.next == b.node


class RunnerMachine(RuleBasedStateMachine):
    """The runner against a reference model: a plain loop over route choices."""

    @initialize(cap=st.integers(1, 6))
    def setup(self, cap: int) -> None:
        self.cap = cap
        self.plan: dict[str, list[str]] = {name: [] for name in NAMES}

    @rule(node=st.sampled_from(NAMES[:-1]), dest=st.sampled_from(NAMES))
    def add_choice(self, node: str, dest: str) -> None:
        self.plan[node].append(dest)

    @rule(node=st.sampled_from(NAMES[:-1]))
    def add_failure(self, node: str) -> None:
        self.plan[node].append("raise")

    def _model(self) -> tuple[list[str], str]:
        visits = {n: 0 for n in NAMES}
        path: list[str] = []
        current = NAMES[0]
        while True:
            if current == NAMES[-1]:  # reached normally: never cut by the cap
                return [*path, current], "end"
            if len(path) >= self.cap:
                return [*path, NAMES[-1]], "step_cap"
            choices = self.plan[current] or [NAMES[-1]]
            action = choices[visits[current] % len(choices)]
            visits[current] += 1
            path.append(current)
            if action == "raise":
                return [*path, NAMES[-1]], "error"
            current = action

    @invariant()
    def agrees_with_model(self) -> None:
        if not hasattr(self, "plan"):
            return
        nodes = {n: Script(n, (*NAMES, END), self.plan[n] or [NAMES[-1]]) for n in NAMES[:-1]} | {
            NAMES[-1]: Script(NAMES[-1], (END,), [END])
        }
        g = Graph(nodes, start=NAMES[0], finish=NAMES[-1], max_steps=self.cap)
        result = anyio.run(lambda: g.run(Log()))
        path, stopped = self._model()
        assert list(result.path) == path
        assert result.stopped_by == stopped


TestRunnerMachine = RunnerMachine.TestCase
TestRunnerMachine.settings = settings(max_examples=40, stateful_step_count=12, deadline=None)


def code_lines(source: str) -> int:
    """Lines holding code: docstrings (module, class, function), comments and blank lines do not count."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip and tok.start[0] not in docstrings:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines)


class TestSize:
    def test_code_lines_counts_only_code(self) -> None:
        """The counter skips docstrings, comments and blank lines, and counts a call split over lines fully."""
        source = '''"""Module doc."""

# a comment
def f(x):
    """Doc
    on two lines."""
    y = (x +  # trailing comment
         1)
    return "not a docstring"
'''
        assert code_lines(source) == 4

    def test_runner_is_at_most_200_code_lines(self) -> None:
        """runner.py stays small enough to read in one sitting (README.md states the figure)."""
        n = code_lines(Path(ragloop.runner.__file__).read_text())
        assert n <= 200, f"runner.py has {n} lines of code; the promise is at most 200"
        readme = (Path(__file__).parents[1] / "README.md").read_text()
        assert f"{n} lines of code" in readme, f"README.md should say runner.py has {n} lines of code"


def test_started_event_fields() -> None:
    """NodeStarted carries step and node."""
    e = NodeStarted(1, "a", run_id="r")
    assert (e.step, e.node, e.run_id) == (1, "a", "r")
