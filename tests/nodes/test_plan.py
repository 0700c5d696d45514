"""Tests for ragloop.nodes.plan: the wave executor and the plan node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest
from attrs import define, field
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import QueryRefused
from ragloop.llm.planner import Planner
from ragloop.nodes.plan import PlanNode, execute_plan, slot_values
from ragloop.plan import Plan, Slot, SubQuery, dependents
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.state import Message, TurnState
from ragloop.testing import make_hit
from ragloop.turn import TurnSettings
from tests.strategies import plan_dags

_S = TurnSettings()
#: The plan node's knobs as the default turn sets them.
KNOBS: dict[str, Any] = {
    "max_subqueries": _S.max_subqueries,
    "timeout_s": _S.plan_timeout_s,
    "max_concurrency": _S.plan_concurrency,
}


def plan_node(planner: Planner, sources: Mapping[str, Any], **fields: Any) -> PlanNode:
    """A plan node with the default turn's knobs, unless ``fields`` sets them."""
    return PlanNode(planner, sources, **{**KNOBS, **fields})


pytestmark = pytest.mark.anyio


@define
class FakeSource:
    """A plan source answering from a query → rows mapping; can fail, refuse or stall per query."""

    name: str
    rows: Mapping[str, Sequence[Mapping[str, str]]] = field(factory=dict)
    fail: frozenset[str] = frozenset()
    refuse: frozenset[str] = frozenset()
    delay: float = 0.0
    description: str = "fake"
    calls: list[tuple[str, dict[str, tuple[str, ...]]]] = field(factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def run(self, query: str, filters: Filters) -> SourceResult:
        self.calls.append((query, dict(filters)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await anyio.sleep(self.delay)
            if query in self.fail:
                raise ConnectionError(f"{self.name} is down")
            if query in self.refuse:
                raise QueryRefused("cannot answer offline: test")
            rows = self.rows.get(query, [{"id": query, "value": f"v-{query}"}])
            return SourceResult(hits=[make_hit(f"{query} {r}") for r in rows], rows=rows)
        finally:
            self.in_flight -= 1


def _bridge(**kw: object) -> Plan:
    return Plan(
        (
            SubQuery("cust", "sql", "plan of Harbor Lane Bank"),
            SubQuery("price", "documents", "{plan} price", depends_on=("cust",), slots=(Slot("plan", "cust", "plan"),)),
            SubQuery(
                "tix",
                "tickets",
                "tickets of the customer",
                filters={"ids": "{ids}"},
                depends_on=("cust",),
                slots=(Slot("ids", "cust", "id"),),
            ),
        ),
        intent="bridge",
    )


def _sources(**sql: object) -> dict[str, FakeSource]:
    rows = {"plan of Harbor Lane Bank": [{"id": "8", "plan": "Enterprise"}, {"id": "9", "plan": "Enterprise"}]}
    sql.setdefault("rows", rows)
    return {
        "sql": FakeSource("sql", **sql),  # type: ignore[arg-type]
        "documents": FakeSource("documents"),
        "tickets": FakeSource("tickets"),
    }


class TestExecutePlan:
    async def test_slots_fill_queries_and_filters(self) -> None:
        """Wave 2 runs with values from wave 1's rows: in the query text and as a multi-valued filter."""
        sources = _sources()
        done = await execute_plan(_bridge(), sources)
        assert [w.ids for w in done.run.waves] == [("cust",), ("price", "tix")]
        assert sources["documents"].calls == [("Enterprise price", {})]
        assert sources["tickets"].calls == [("tickets of the customer", {"ids": ("8", "9")})]
        assert [f.status for f in done.run.fates] == ["ok", "ok", "ok"]
        assert done.queries["price"] == "Enterprise price"

    @pytest.mark.parametrize(
        ("kw", "status", "reason"),
        [
            ({"fail": frozenset({"plan of Harbor Lane Bank"})}, "failed", "which failed"),
            ({"refuse": frozenset({"plan of Harbor Lane Bank"})}, "refused", "which was refused"),
            ({"rows": {"plan of Harbor Lane Bank": []}}, "empty", "which found nothing"),
        ],
    )
    async def test_failure_skips_dependents_with_reason(self, kw: dict[str, object], status: str, reason: str) -> None:
        """A failed, refused or empty sub-query skips its dependents, which never reach their sources."""
        sources = _sources(**kw)
        done = await execute_plan(_bridge(), sources)
        fates = {f.id: f for f in done.run.fates}
        assert fates["cust"].status == status
        assert fates["price"].status == fates["tix"].status == "skipped"
        assert f"depends on 'cust', {reason}" == fates["price"].reason
        assert sources["documents"].calls == [] and sources["tickets"].calls == []
        assert [f.id for f in done.run.gaps] == ["cust", "price", "tix"]

    async def test_timeout_fails_one_sibling_only(self) -> None:
        """A sub-query past its timeout fails; a sibling in the same wave still succeeds."""
        plan = Plan((SubQuery("slow", "sql", "slow"), SubQuery("fast", "documents", "fast")))
        sources = {"sql": FakeSource("sql", delay=1.0), "documents": FakeSource("documents")}
        done = await execute_plan(plan, sources, timeout_s=0.05)
        fates = {f.id: f for f in done.run.fates}
        assert fates["slow"].status == "failed" and "timed out" in fates["slow"].reason
        assert fates["fast"].status == "ok"

    async def test_missing_slot_column_skips_with_the_columns_seen(self) -> None:
        """A slot whose column is absent from the rows skips the sub-query and lists the columns there were."""
        plan = Plan(
            (
                SubQuery("a", "sql", "a"),
                SubQuery("b", "documents", "{x} y", depends_on=("a",), slots=(Slot("x", "a", "region"),)),
            )
        )
        done = await execute_plan(plan, {"sql": FakeSource("sql"), "documents": FakeSource("documents")})
        fate = done.run.fate("b")
        assert fate is not None and fate.status == "skipped"
        assert "no value in column 'region'" in fate.reason and "columns: id, value" in fate.reason

    async def test_wave_runs_concurrently_and_bounded(self) -> None:
        """A wave's sub-queries overlap in time, never more than max_concurrency at once."""
        plan = Plan(tuple(SubQuery(f"q{i}", "documents", f"q{i}") for i in range(6)))
        source = FakeSource("documents", delay=0.1)
        await execute_plan(plan, {"documents": source}, max_concurrency=3)
        assert source.max_in_flight == 3  # they overlapped (three at once), and never more than the bound

    async def test_sequential_and_parallel_strategies(self) -> None:
        """Sequential runs one sub-query at a time; parallel ignores dependencies and runs with empty slots."""
        sources = _sources()
        done = await execute_plan(_bridge(), sources, strategy="sequential")
        assert [w.ids for w in done.run.waves] == [("cust",), ("price",), ("tix",)]
        sources = _sources()
        done = await execute_plan(_bridge(), sources, strategy="parallel")
        assert len(done.run.waves) == 1
        assert sources["documents"].calls == [("price", {})]  # the plan name never arrived
        assert sources["tickets"].calls == [("tickets of the customer", {"ids": ()})]

    async def test_progress_callback_per_wave(self) -> None:
        """on_wave sees each wave's timing and fates."""
        seen: list[tuple[int, list[str]]] = []

        async def on_wave(run: object, fates: Sequence[object]) -> None:
            seen.append((run.n, [f.id for f in fates]))  # type: ignore[attr-defined]

        await execute_plan(_bridge(), _sources(), on_wave=on_wave)
        assert seen == [(1, ["cust"]), (2, ["price", "tix"])]

    @settings(max_examples=60, deadline=None)
    @given(plan_dags(max_size=6), st.data())
    def test_failure_skips_exactly_transitive_dependents(
        self, pairs: list[tuple[str, tuple[str, ...]]], data: st.DataObject
    ) -> None:
        """Against a reference model: a sub-query runs iff all its dependencies succeeded; skipped = dependents."""
        ids = [i for i, _ in pairs]
        failing = data.draw(st.sets(st.sampled_from(ids)))
        plan = Plan(tuple(SubQuery(i, "s", i, depends_on=d) for i, d in pairs))
        source = FakeSource("s", fail=frozenset(failing))
        done = anyio.run(lambda: execute_plan(plan, {"s": source}))
        deps = dict(pairs)
        expected: dict[str, str] = {}
        while len(expected) < len(ids):
            for i in ids:
                if i in expected or any(d not in expected for d in deps[i]):
                    continue
                if any(expected[d] != "ok" for d in deps[i]):
                    expected[i] = "skipped"
                else:
                    expected[i] = "failed" if i in failing else "ok"
        got = {f.id: f.status for f in done.run.fates}
        assert got == expected
        failed = {i for i, s in got.items() if s == "failed"}
        assert {i for i, s in got.items() if s == "skipped"} == dependents(plan.subqueries, failed)
        assert {q for q, _ in source.calls} == {i for i, s in got.items() if s != "skipped"}


class TestSlotValues:
    def test_unique_in_row_order(self) -> None:
        """Values keep row order, without repeats or blanks."""
        sub = SubQuery("b", "d", "{p}", depends_on=("a",), slots=(Slot("p", "a", "plan"),))
        rows = [{"plan": "Team"}, {"plan": ""}, {"plan": "Business"}, {"plan": "Team"}]
        values, problem = slot_values(sub, {"a": SourceResult(rows=rows)})
        assert values == {"p": ("Team", "Business")} and problem == ""


@define
class ScriptedPlanner:
    """A planner that returns a fixed plan, or raises."""

    result: Plan | Exception | None
    name: str = "scripted"
    calls: int = 0

    async def plan(self, question: str, history: Sequence[Message]) -> Plan | None:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class TestPlanNode:
    def test_planner_protocol(self) -> None:
        """The scripted planner satisfies the Planner protocol."""
        assert isinstance(ScriptedPlanner(None), Planner)

    async def test_no_plan_goes_to_decide(self) -> None:
        """A question the planner does not plan keeps today's route."""
        node = plan_node(ScriptedPlanner(None), _sources())
        state = TurnState(question="hi")
        assert await node(state) == "decide"
        assert state.plan is None

    async def test_single_wave_of_documents_is_a_decide(self) -> None:
        """A plan of document searches in one wave becomes decide's queries and goes to retrieve."""
        plan = Plan((SubQuery("a", "documents", "sso setup"), SubQuery("b", "documents", "plan prices")))
        node = plan_node(ScriptedPlanner(plan), _sources())
        state = TurnState(question="q")
        assert await node(state) == "retrieve"
        assert state.decision is not None and state.decision.queries == ("sso setup", "plan prices")
        assert state.pending == ["sso setup", "plan prices"]

    async def test_bridge_plan_runs_and_hands_over(self) -> None:
        """Rows become graded context, passages go to grading, and the plan run is on the state."""
        sources = _sources()
        node = plan_node(ScriptedPlanner(_bridge()), sources)
        state = TurnState(question="q")
        assert await node(state) == "grade"
        assert state.plan is not None and len(state.plan.waves) == 2
        assert state.queries["plan of Harbor Lane Bank"].status == "enough"
        assert state.queries["Enterprise price"].status == "pending"
        assert state.queries["tickets of the customer"].status == "enough"
        assert {g.query for g in state.graded} == {"plan of Harbor Lane Bank", "tickets of the customer"}
        assert all(g.verdict.label == "relevant" for g in state.graded)

    async def test_gaps_are_no_context_with_reason(self) -> None:
        """A refused sub-query and its skipped dependents end as no_context, named with the reason (the answer lists
        them as missing)."""
        node = plan_node(ScriptedPlanner(_bridge()), _sources(refuse=frozenset({"plan of Harbor Lane Bank"})))
        state = TurnState(question="q")
        assert await node(state) == "answer"
        q = state.queries["plan of Harbor Lane Bank (sql: cannot answer offline: test)"]
        assert q.status == "no_context" and q.error == "sql: cannot answer offline: test"
        skipped = state.queries["[plan] price (documents: depends on 'cust', which was refused)"]
        assert skipped.status == "no_context" and skipped.error == "documents: depends on 'cust', which was refused"

    async def test_failing_planner_falls_back(self) -> None:
        """A planner that raises is recorded and the fallback plans."""
        node = plan_node(ScriptedPlanner(RuntimeError("model down")), _sources(), fallback=ScriptedPlanner(_bridge()))
        state = TurnState(question="q")
        assert await node(state) == "grade"
        assert state.plan is not None and state.plan.planner == "fallback: scripted"
        assert state.errors == ["plan: RuntimeError: model down"]

    async def test_invalid_plan_falls_back(self) -> None:
        """An invalid plan is named in the errors; the fallback's plan (here: none) is used."""
        bad = Plan((SubQuery("a", "crm", "x"),))
        node = plan_node(ScriptedPlanner(bad), _sources(), fallback=ScriptedPlanner(None), gate=False)
        state = TurnState(question="q")
        assert await node(state) == "decide"
        assert "unknown source 'crm'" in state.errors[0]


class TestPlanGate:
    async def test_a_question_the_fallback_does_not_plan_never_asks_the_model(self) -> None:
        """The offline planner finds no plan source's entity: decide routes the question, no planning call."""
        model, offline = ScriptedPlanner(_bridge(), name="model"), ScriptedPlanner(None, name="offline")
        node = plan_node(model, _sources(), fallback=offline)
        state = TurnState(question="How do I rotate an API key?")
        assert await node(state) == "decide"
        assert (model.calls, offline.calls) == (0, 1) and state.plan is None and not state.errors

    async def test_a_question_the_fallback_plans_gets_the_models_plan(self) -> None:
        """The offline planner plans it: the model planner is asked and its plan runs."""
        model, offline = ScriptedPlanner(_bridge(), name="model"), ScriptedPlanner(_bridge(), name="offline")
        node = plan_node(model, _sources(), fallback=offline)
        state = TurnState(question="What plan is Harbor Lane Bank on?")
        assert await node(state) == "grade"
        assert state.plan is not None and state.plan.planner == "model"
        assert (model.calls, offline.calls) == (1, 1)

    async def test_a_failing_model_falls_back_to_the_gates_plan_without_planning_twice(self) -> None:
        """The model fails after the gate let the question through: the offline plan the gate made runs."""
        model, offline = ScriptedPlanner(RuntimeError("down"), name="model"), ScriptedPlanner(_bridge(), name="offline")
        node = plan_node(model, _sources(), fallback=offline)
        state = TurnState(question="q")
        assert await node(state) == "grade"
        assert state.plan is not None and state.plan.planner == "fallback: offline"
        assert (model.calls, offline.calls) == (1, 1)

    async def test_a_failing_gate_asks_the_model(self) -> None:
        """An offline planner that raises does not decide the route: the model planner is asked, as without a
        gate."""
        model, offline = ScriptedPlanner(_bridge(), name="model"), ScriptedPlanner(RuntimeError("x"), name="offline")
        node = plan_node(model, _sources(), fallback=offline)
        state = TurnState(question="q")
        assert await node(state) == "grade"
        assert model.calls == 1 and state.plan is not None and state.plan.planner == "model"

    async def test_gate_off_asks_the_model_about_everything(self) -> None:
        """gate=False: the model planner is asked first, whatever the offline planner would say."""
        model, offline = ScriptedPlanner(None, name="model"), ScriptedPlanner(None, name="offline")
        node = plan_node(model, _sources(), fallback=offline, gate=False)
        assert await node(TurnState(question="hi")) == "decide"
        assert (model.calls, offline.calls) == (1, 0)


class TestSlotInjection:
    async def test_hostile_row_value_cannot_reach_sql_text(self, tmp_path: object) -> None:
        """A value read in wave 1 (a customer named with SQL in it) fills a wave-2 SQL sub-query's text and filter:
        both the offline writer and the filter bind it as a parameter, and the database is unchanged."""
        import hashlib
        import sqlite3
        from pathlib import Path

        from ragloop.retrievers.sql import SQLiteSource

        path = Path(str(tmp_path)) / "hostile.sqlite"
        hostile = "Evil'; DROP TABLE customers; --"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, plan TEXT NOT NULL)")
            db.executemany("INSERT INTO customers VALUES (?, ?, ?)", [(1, hostile, "Team"), (2, "Acme", "Business")])
        db.close()
        before = hashlib.sha256(path.read_bytes()).hexdigest()
        sql = SQLiteSource(path, {"customers": ("id", "name", "plan")})
        plan = Plan(
            (
                SubQuery("who", "sql", "customer 1"),
                SubQuery("text", "sql", "plan of {name}", depends_on=("who",), slots=(Slot("name", "who", "name"),)),
                SubQuery(
                    "filt",
                    "sql",
                    "customer 2",
                    filters={"name": "{name}"},
                    depends_on=("who",),
                    slots=(Slot("name", "who", "name"),),
                ),
            )
        )
        done = await execute_plan(plan, {"sql": sql})
        fates = {f.id: f for f in done.run.fates}
        assert fates["who"].status == "ok"
        # The hostile name is a known value of customers.name, so the writer matched it: bound as a parameter.
        assert fates["text"].status == "ok" and [r["plan"] for r in done.results["text"].rows] == ["Team"]
        assert fates["filt"].status == "empty"  # customer 2 is not named like customer 1: bound, compared, no row
        assert all("DROP" not in s for s in sql.statements)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
