"""The routing policy, tested directly: it is pure, so hypothesis drives it through every kind of turn."""

from __future__ import annotations

from typing import Any

from hypothesis import given, target
from hypothesis import strategies as st

from ragloop.policy import (
    EDGES,
    ROUTES,
    RoutingPolicy,
    can_rewrite,
    is_short,
    most_runs,
    next_step,
    short_queries,
    wants_live,
)
from ragloop.state import HopAttempt, QueryState, TurnState
from ragloop.turn import TurnSettings

STATUSES = ("pending", "enough", "short", "failed", "rewritten", "no_context")


def _signal(text: str) -> bool:
    return "#" in text


policies = st.builds(
    RoutingPolicy,
    max_attempts=st.integers(0, 4),
    max_hops=st.integers(0, 3),
    live_signal=st.sampled_from([None, _signal]),
)


@st.composite
def states(draw: st.DrawFn) -> TurnState:
    """Any turn state the routing reads: queries of every status, attempt, hop and live flag; pending; hops."""
    state = TurnState(question="q")
    for i in range(draw(st.integers(0, 6))):
        text = f"query {i}" + (" #1234" if draw(st.booleans()) else "")
        state.queries[text] = QueryState(
            text=text,
            root=text,
            attempt=draw(st.integers(0, 5)),
            status=draw(st.sampled_from(STATUSES)),
            live_tried=draw(st.booleans()),
            hop=draw(st.booleans()),
        )
    state.pending = [t for t in state.queries if draw(st.booleans())]
    state.hops = [HopAttempt(query=None, found=0, accepted=False, reason="") for _ in range(draw(st.integers(0, 3)))]
    return state


class TestNextStep:
    @given(states(), policies, st.sampled_from(sorted(ROUTES)))
    def test_routes_to_a_declared_node(self, state: TurnState, policy: RoutingPolicy, after: Any) -> None:
        """Whatever the state, the next step is one the caller declared."""
        assert next_step(state, policy, after=after) in ROUTES[after]

    @given(states(), policies)
    def test_pure(self, state: TurnState, policy: RoutingPolicy) -> None:
        """Routing reads the state and never changes it."""
        before = repr(state)
        for after in ROUTES:
            next_step(state, policy, after=after)
        assert repr(state) == before

    @given(states(), policies)
    def test_after_grade(self, state: TurnState, policy: RoutingPolicy) -> None:
        """After grading: live before rewrite before answer; hop only when nothing is short."""
        step = next_step(state, policy, after="grade")
        short = short_queries(state)
        if not short:
            assert step == ("hop" if len(state.hops) < policy.max_hops else "answer")
        elif any(wants_live(q, policy) for q in short):
            assert step == "live"
        elif any(can_rewrite(q, policy) for q in short):
            assert step == "rewrite"
        else:
            assert step == "answer"

    def test_short_hop_query_is_not_short(self) -> None:
        """A follow-up hop query that found nothing never makes the turn rewrite or look up."""
        query = QueryState(text="bridge #1", root="r", status="short", hop=True)
        assert not is_short(query)
        state = TurnState(question="q", queries={"bridge #1": query})
        policy = RoutingPolicy(max_attempts=2, max_hops=0, live_signal=_signal)
        assert next_step(state, policy, after="grade") == "answer"

    def test_no_live_sources_no_live(self) -> None:
        """Without live sources a query carrying a ticket id goes to rewrite."""
        state = TurnState(question="q", queries={"#1": QueryState(text="#1", root="#1", status="short")})
        assert next_step(state, RoutingPolicy(max_attempts=1, max_hops=0), after="grade") == "rewrite"


# --- a turn driven only by the policy -------------------------------------------------------------------------


def longest_turn(policy: RoutingPolicy) -> int:
    """Steps of the longest regular turn: decide, a first round, each rewrite round with a live lookup before
    it, then a last live lookup or the hops (a turn that went live is answered without hopping), then answer."""
    return 1 + 2 + 4 * policy.max_attempts + max(1, 3 * policy.max_hops) + 1


def simulate(policy: RoutingPolicy, data: st.DataObject, cap: int) -> list[str]:
    """Run a turn whose nodes change the state as the real ones do, with hypothesis choosing every judgment,
    and whose routing is :func:`next_step` alone (decide's and retrieve's own exits aside). Stops at ``cap``."""
    state = TurnState(question="q")
    path: list[str] = []
    node = "decide"
    counter = 0

    def new_query(root: str | None, attempt: int, *, hop: bool = False) -> str:
        nonlocal counter
        counter += 1
        text = f"q{counter}" + (" #1234" if data.draw(st.booleans()) else "")
        state.queries[text] = QueryState(text=text, root=root or text, attempt=attempt, hop=hop)
        state.pending.append(text)
        return text

    while node != "answer" and len(path) < cap:
        path.append(node)
        if node == "decide":
            n = data.draw(st.integers(0, 4))
            for _ in range(n):
                new_query(None, 0)
            node = "retrieve" if n else "answer"
        elif node == "retrieve":
            pending, state.pending = state.pending, []
            for text in pending:
                if data.draw(st.booleans()):
                    state.queries[text].status = "failed"
            fast = len(pending) == 1 and len(state.queries) == 1 and data.draw(st.booleans())
            if fast:
                state.queries[pending[0]].status = "enough"
            node = "answer" if fast else "grade"
        elif node == "grade":
            for q in state.queries.values():
                if q.status == "pending":
                    q.status = data.draw(st.sampled_from(["enough", "short"]))
            node = next_step(state, policy, after="grade")
        elif node == "live":
            for q in short_queries(state):
                if wants_live(q, policy):
                    q.live_tried = True
                    if data.draw(st.booleans()):
                        q.status = "enough"
            node = next_step(state, policy, after="live")
        elif node == "rewrite":
            for q in short_queries(state):
                if can_rewrite(q, policy) and data.draw(st.booleans()):
                    q.status = "rewritten"
                    new_query(q.root, q.attempt + 1)
                else:
                    q.status = "no_context"
            node = next_step(state, policy, after="rewrite")
        elif node == "hop":
            accepted = data.draw(st.booleans())
            text = new_query(next(iter(state.queries)), 0, hop=True) if accepted else None
            state.hops.append(HopAttempt(query=text, found=1, accepted=accepted, reason=""))
            node = next_step(state, policy, after="hop")
        else:  # pragma: no cover - the policy only names declared nodes
            raise AssertionError(node)
    return [*path, node]


class TestTurnDrivenByPolicy:
    @given(policies, st.data())
    def test_always_reaches_answer_within_the_bound(self, policy: RoutingPolicy, data: st.DataObject) -> None:
        """Whatever the judges do, the turn reaches answer, in at most the longest regular turn's steps."""
        cap = longest_turn(policy) + 10
        path = simulate(policy, data, cap)
        target(float(len(path)))  # steer hypothesis towards the longest turns
        assert path[-1] == "answer", path
        assert len(path) <= longest_turn(policy), path

    @given(policies, st.data())
    def test_no_node_runs_more_often_than_most_runs(self, policy: RoutingPolicy, data: st.DataObject) -> None:
        """Each node runs at most most_runs() times in a turn (what a builder adds to the cap per inserted node)."""
        path = simulate(policy, data, longest_turn(policy) + 10)
        for node in set(path):
            target(float(path.count(node)), label=node)
            assert path.count(node) <= most_runs(node, policy), (node, path)

    @given(st.data())
    def test_default_settings_never_meet_the_step_cap(self, data: st.DataObject) -> None:
        """With TurnSettings' defaults and live sources, a turn ends before the runner's step cap."""
        settings = TurnSettings()
        policy = RoutingPolicy(max_attempts=settings.max_attempts, max_hops=settings.max_hops, live_signal=_signal)
        path = simulate(policy, data, settings.max_steps)
        assert path[-1] == "answer" and len(path) <= settings.max_steps, path

    def test_bound_is_the_longest_regular_turn(self) -> None:
        """The bound counts the 15 steps of: live, two rewrites with a lookup before each, then a hop."""
        policy = RoutingPolicy(max_attempts=2, max_hops=1, live_signal=_signal)
        longest = ["decide", "retrieve", "grade", *["live", "rewrite", "retrieve", "grade"] * 2]
        assert longest_turn(policy) == len([*longest, "hop", "retrieve", "grade", "answer"]) == 15


class TestEdgeTable:
    """The default turn's edges are written once (``policy.EDGES``); every node and the graph agree with it."""

    def nodes(self) -> dict[str, Any]:
        from ragloop.llm.planner import OfflinePlanner
        from ragloop.testing import FakeAnswerer, FakeDecider, FakeGrader, FakeRetriever, FakeRewriter
        from ragloop.turn import Judges, default_nodes

        judges = Judges(FakeDecider(), FakeGrader(), FakeRewriter(), FakeAnswerer(), planner=OfflinePlanner(None))
        return default_nodes(FakeRetriever(), judges)

    def test_every_default_node_declares_its_entry(self) -> None:
        """Each default node's routes are its entry of EDGES, in order, and no node is missing from it."""
        nodes = self.nodes()
        assert set(nodes) == set(EDGES)
        for name, node in nodes.items():
            assert tuple(node.routes) == EDGES[name], name

    def test_the_default_graph_is_the_table(self) -> None:
        """The built default graph sends every route to the node of its name: its edges are EDGES."""
        from ragloop.turn import build_graph

        graph = build_graph(self.nodes())
        assert {n: dict(e) for n, e in graph.edges.items()} == {n: {r: r for r in rs} for n, rs in EDGES.items()}

    def test_routes_of_the_policy_are_entries_of_the_table(self) -> None:
        """The policy's ROUTES are the table's entries for the nodes that route through it."""
        assert dict(ROUTES) == {after: EDGES[after] for after in ("grade", "live", "rewrite", "hop")}

    def test_nodes_return_named_constants(self) -> None:
        """No module of ragloop.nodes returns a node name as a string literal: they return policy's constants."""
        import ast
        from pathlib import Path

        import ragloop.nodes

        found = []
        for path in sorted(Path(ragloop.nodes.__file__).parent.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                returned = node.value if isinstance(node, ast.Return) else None
                values = [returned.body, returned.orelse] if isinstance(returned, ast.IfExp) else [returned]
                found += [
                    f"{path.name}:{node.lineno} returns {v.value!r}"
                    for v in values
                    if isinstance(v, ast.Constant) and v.value in EDGES
                ]
        assert not found, found
