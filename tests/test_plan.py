"""Tests for ragloop.plan: plan validation, topological waves, and which sub-queries a failure skips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import PlanError
from ragloop.plan import Plan, Slot, SubQuery, build_waves, dependents, fill, placeholders, plan_problems, validate_plan
from tests.strategies import plan_dags

SOURCES = ("documents", "sql", "tickets")


def _plan(pairs: list[tuple[str, tuple[str, ...]]]) -> Plan:
    return Plan(tuple(SubQuery(i, "documents", f"query {i}", depends_on=deps) for i, deps in pairs))


def _bridge() -> Plan:
    return Plan(
        (
            SubQuery("cust", "sql", "plan of Harbor Lane Bank"),
            SubQuery("price", "documents", "{plan} price", depends_on=("cust",), slots=(Slot("plan", "cust", "plan"),)),
        ),
        intent="plan then price",
    )


class TestValidation:
    def test_valid_plan_passes(self) -> None:
        """A well-formed bridge plan has no problems and validates to itself."""
        plan = _bridge()
        assert plan_problems(plan, SOURCES) == []
        assert validate_plan(plan, SOURCES) is plan

    def test_unknown_source_is_named_with_the_known_ones(self) -> None:
        """An unknown source names the sub-query, the bad source and the known sources."""
        plan = Plan((SubQuery("a", "crm", "x"),))
        with pytest.raises(PlanError, match=r"'a' uses unknown source 'crm'; known: documents, sql, tickets"):
            validate_plan(plan, SOURCES)

    def test_cycle_is_named(self) -> None:
        """A dependency cycle is reported as the path around it."""
        plan = _plan([("a", ("c",)), ("b", ("a",)), ("c", ("b",))])
        problems = plan_problems(plan, SOURCES)
        assert any("dependency cycle: a -> c -> b -> a" in p for p in problems), problems

    def test_self_and_dangling_dependencies(self) -> None:
        """Depending on itself or on an id not in the plan are both named."""
        problems = plan_problems(_plan([("a", ("a",)), ("b", ("zz",))]), SOURCES)
        assert "sub-query 'a' depends on itself" in problems
        assert "sub-query 'b' depends on 'zz', which is not in the plan" in problems

    def test_slot_from_a_non_dependency(self) -> None:
        """A slot must read from a dependency; the message says to add it to depends_on."""
        plan = Plan(
            (
                SubQuery("a", "sql", "x"),
                SubQuery("b", "documents", "{v} y", slots=(Slot("v", "a", "plan"),)),
            )
        )
        problems = plan_problems(plan, SOURCES)
        assert any("slot 'v' of sub-query 'b' reads from 'a'" in p and "add it to depends_on" in p for p in problems)

    def test_placeholders_and_slots_must_agree(self) -> None:
        """A placeholder without a slot and a slot never used are both problems."""
        plan = Plan(
            (
                SubQuery("a", "sql", "x"),
                SubQuery("b", "documents", "{other} y", depends_on=("a",), slots=(Slot("v", "a", "plan"),)),
            )
        )
        problems = plan_problems(plan, SOURCES)
        assert "sub-query 'b' uses placeholder {other} but declares no slot 'other'" in problems
        assert "slot 'v' of sub-query 'b' is never used in its query or filters" in problems

    def test_filter_placeholders_count_as_use(self) -> None:
        """A slot used only in a filter value is used."""
        plan = Plan(
            (
                SubQuery("a", "sql", "x"),
                SubQuery(
                    "b", "tickets", "t", filters={"ids": "{ids}"}, depends_on=("a",), slots=(Slot("ids", "a", "id"),)
                ),
            )
        )
        assert plan_problems(plan, SOURCES) == []

    def test_too_many_and_duplicates_and_empty(self) -> None:
        """Size limit, duplicate ids, bad ids, empty queries and empty plans are each reported."""
        plan = Plan((*tuple(SubQuery("a", "documents", "x") for _ in range(3)), SubQuery("1x", "documents", " ")))
        problems = plan_problems(plan, SOURCES, max_subqueries=2)
        assert "the plan has 4 sub-queries; the limit is 2" in problems
        assert "sub-query id 'a' is used 3 times; ids must be unique" in problems
        assert any("'1x' must be 1-32 letters" in p for p in problems)
        assert "sub-query '1x' has an empty query" in problems
        assert plan_problems(Plan(()), SOURCES) == ["the plan has no sub-queries; plan at least one search"]

    def test_every_problem_in_one_error(self) -> None:
        """validate_plan reports all problems at once, not the first only."""
        plan = Plan((SubQuery("a", "nope", "x", depends_on=("b",)),))
        with pytest.raises(PlanError) as info:
            validate_plan(plan, SOURCES)
        assert "unknown source 'nope'" in str(info.value)
        assert "depends on 'b'" in str(info.value)


class TestPlaceholders:
    def test_placeholders_in_order(self) -> None:
        """Placeholders come back unique, in order; a doubled brace is literal."""
        assert placeholders("{a} and {b} or {a} {{c}}") == ("a", "b")

    def test_unbalanced_brace_has_none(self) -> None:
        """An unmatched brace is taken literally."""
        assert placeholders("what is {a") == ()

    def test_fill_joins_values(self) -> None:
        """Several values join with commas; unknown names stay."""
        assert fill("{plan} plan for {who}", {"plan": ("Team", "Business")}) == "Team, Business plan for {who}"


class TestWaves:
    def test_bridge_is_two_waves(self) -> None:
        """SQL first, the document search that needs its value second."""
        assert build_waves(_bridge().subqueries) == (("cust",), ("price",))

    def test_cycle_raises(self) -> None:
        """build_waves refuses a cycle with PlanError."""
        with pytest.raises(PlanError, match="cycle"):
            build_waves(_plan([("a", ("b",)), ("b", ("a",))]).subqueries)

    def test_unknown_dependency_raises(self) -> None:
        """build_waves refuses a dependency that is not in the plan."""
        with pytest.raises(PlanError, match="not in the plan"):
            build_waves(_plan([("a", ("x",))]).subqueries)

    @given(plan_dags())
    def test_every_dependency_runs_in_an_earlier_wave(self, pairs: list[tuple[str, tuple[str, ...]]]) -> None:
        """Each sub-query's dependencies all sit in strictly earlier waves; every id is in exactly one wave."""
        waves = build_waves(_plan(pairs).subqueries)
        where = {qid: n for n, wave in enumerate(waves) for qid in wave}
        assert sorted(where) == sorted(i for i, _ in pairs)
        assert sum(len(w) for w in waves) == len(pairs)
        for qid, deps in pairs:
            assert all(where[d] < where[qid] for d in deps)

    @given(plan_dags())
    def test_waves_are_maximal(self, pairs: list[tuple[str, tuple[str, ...]]]) -> None:
        """Nothing could run earlier: wave 1 is every root, and each later sub-query waits on the wave before."""
        waves = build_waves(_plan(pairs).subqueries)
        where = {qid: n for n, wave in enumerate(waves) for qid in wave}
        deps_of = dict(pairs)
        for qid, deps in pairs:
            if not deps:
                assert where[qid] == 0
            else:
                assert max(where[d] for d in deps) == where[qid] - 1
        assert all(waves)  # no empty wave
        for wave in waves:  # plan order inside a wave
            order = [i for i, _ in pairs if i in wave]
            assert list(wave) == order
        assert all(set(deps_of[q]).isdisjoint(w) for w in waves for q in w)

    @given(plan_dags(), st.data())
    def test_dependents_are_exactly_the_transitive_closure(
        self, pairs: list[tuple[str, tuple[str, ...]]], data: st.DataObject
    ) -> None:
        """dependents() is every sub-query with a dependency path to a failed one, and nothing else."""
        ids = [i for i, _ in pairs]
        failed = data.draw(st.sets(st.sampled_from(ids), max_size=len(ids)))
        deps_of = dict(pairs)

        def reaches(q: str) -> bool:
            return any(d in failed or reaches(d) for d in deps_of[q])

        expected = {q for q in ids if q not in failed and reaches(q)}
        assert dependents(_plan(pairs).subqueries, failed) == expected
