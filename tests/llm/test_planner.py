"""Tests for ragloop.llm.planner: the offline planner's decomposition, routing and bridge step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragloop.llm.planner import OfflinePlanner, Planner
from ragloop.plan import build_waves, validate_plan
from ragloop.retrievers.sql import SQLiteSource
from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path, sample_plan_questions_path, sample_questions_path

pytestmark = pytest.mark.anyio

SOURCES = ("sql", "documents", "tickets")


def _planner() -> OfflinePlanner:
    return OfflinePlanner(SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW), live={"tickets": "tickets"})


def _questions(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class TestOfflinePlanner:
    def test_is_a_planner(self) -> None:
        """OfflinePlanner satisfies the Planner protocol."""
        assert isinstance(_planner(), Planner)

    async def test_no_sql_source_never_plans(self) -> None:
        """Without a SQL source every question keeps the decide route."""
        assert await OfflinePlanner().plan("What plan is Harbor Lane Bank on?") is None

    async def test_bridge_plan(self) -> None:
        """'that plan' after a customer lookup becomes a slot filled from the SQL rows' plan column."""
        plan = await _planner().plan("What plan is Harbor Lane Bank on, and how much does that plan cost per seat?")
        assert plan is not None
        sql, docs = plan.subqueries
        assert (sql.id, sql.source, sql.query) == ("sql1", "sql", "What plan is Harbor Lane Bank on")
        assert (docs.source, docs.query, docs.depends_on) == (
            "documents",
            "how much does {plan} plan cost per seat",
            ("sql1",),
        )
        assert [(s.name, s.source, s.column) for s in docs.slots] == [("plan", "sql1", "plan")]

    async def test_tickets_clause_adds_a_live_lookup(self) -> None:
        """A data clause about tickets also reads the tickets the SQL finds, through the live source."""
        plan = await _planner().plan(
            "What error code did the latest ticket of Bluefin Media report, and what does that error code mean?"
        )
        assert plan is not None
        by_id = plan.by_id()
        assert by_id["tickets1"].filter_map() == {"ids": "{ids}"}
        assert by_id["docs1"].query == "what does {error_code} error code mean"
        assert build_waves(plan.subqueries) == (("sql1",), ("tickets1", "docs1"))

    async def test_no_back_reference_means_one_wave(self) -> None:
        """A document clause that does not point back runs alongside the SQL clause."""
        plan = await _planner().plan(
            "Which customers churned last quarter, and what happens to their data after they cancel?"
        )
        assert plan is not None
        assert build_waves(plan.subqueries) == (("sql1", "docs1"),)

    async def test_sample_plan_questions(self) -> None:
        """Every sample planner question gets a valid plan with the expected number of waves."""
        planner = _planner()
        for q in _questions(sample_plan_questions_path()):
            plan = await planner.plan(str(q["question"]))
            assert plan is not None, q["id"]
            validate_plan(plan, SOURCES)
            assert len(build_waves(plan.subqueries)) == q["waves"], q["id"]

    async def test_existing_sample_questions_keep_the_decide_route(self) -> None:
        """No question of the original sample set (docs, tickets by id, small talk) is planned."""
        planner = _planner()
        planned = [q["question"] for q in _questions(sample_questions_path()) if await planner.plan(str(q["question"]))]
        assert planned == []

    async def test_category_values_alone_are_not_data(self) -> None:
        """'Business plan' names a category value, not an entity: a documentation question."""
        assert await _planner().plan("How much does the Business plan cost per seat?") is None

    async def test_which_table_question_is_data(self) -> None:
        """'which customers …' asks the database."""
        plan = await _planner().plan("Which customers are on the Enterprise plan?")
        assert plan is not None and [q.source for q in plan.subqueries] == ["sql"]
