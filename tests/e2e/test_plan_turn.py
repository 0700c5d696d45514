"""Planned turns end to end: the model planner and SQL writer through the real SDK against the scripted server,
the offline planner over the sample, and ``ragloop ask`` on the sample CRM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragloop.chat import ChatRAG
from ragloop.cli import main
from ragloop.llm.openai import OpenAISQLWriter
from ragloop.retrievers.sql import SQLiteSource
from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path
from ragloop.testing import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedResponse,
    json_reply,
    server_error,
    stream,
    tool_calls,
    verdicts,
)

pytestmark = pytest.mark.anyio

QUESTION = "What plan is Harbor Lane Bank on, and how much does that plan cost per seat?"
PLAN = {
    "needs_sources": True,
    "intent": "the customer's plan, then its price",
    "notes": "",
    "subqueries": [
        {
            "id": "sql1",
            "source": "sql",
            "query": "plan of the customer Harbor Lane Bank",
            "depends_on": [],
            "purpose": "find the plan",
            "slots": [],
            "filters": [],
        },
        {
            "id": "docs1",
            "source": "documents",
            "query": "{plan} plan price per seat",
            "depends_on": ["sql1"],
            "purpose": "its price",
            "slots": [{"name": "plan", "from": "sql1", "column": "plan"}],
            "filters": [],
        },
    ],
}
SQL = {"sql": "SELECT name, plan FROM customers WHERE name = ?", "params": ["Harbor Lane Bank"], "reason": ""}


def kind(request: RecordedRequest) -> str:
    """Which call this is: plan and sql by their response_format name, else the kit's judge classifier."""
    fmt = request.body.get("response_format") if isinstance(request.body, dict) else None
    name = fmt.get("json_schema", {}).get("name") if isinstance(fmt, dict) else None
    return {"retrieval_plan": "plan", "sql_query": "sql"}.get(str(name), request.judge)


def matcher(*, plan_fails: bool = False) -> object:
    def match(request: RecordedRequest) -> ScriptedResponse:
        k = kind(request)
        if k == "plan":
            return server_error(500, "planner down") if plan_fails else json_reply(PLAN)
        if k == "sql":
            return json_reply(SQL)
        if k == "grade":
            return verdicts(request, "relevant")
        return stream("Harbor Lane Bank is on the Enterprise plan [1]. Enterprise is priced custom [2].", chunk_size=6)

    return match


def crm(client: object | None = None) -> SQLiteSource:
    writer = OpenAISQLWriter(client, "fast-model") if client is not None else None  # type: ignore[arg-type]
    return SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, *((writer,) if writer else ()))


async def test_model_plan_two_waves_cites_row_and_passage(sample_cache: Path) -> None:
    """The model plans SQL then documents; the answer cites a row and a passage; the record shows two waves."""
    async with ScriptedOpenAIServer(matcher=matcher()) as server, server.client(max_retries=0) as client:  # type: ignore[arg-type]
        rag = ChatRAG.sample(
            client,
            cache_dir=sample_cache,
            fast_model="fast-model",
            answer_model="answer-model",
            plan_sources=(crm(client),),
        )
        reply = await rag.ask(QUESTION)
        await rag.aclose()
    kinds = [kind(r) for r in server.chat_requests]
    assert kinds[:2] == ["plan", "sql"] and kinds[-1] == "answer"
    plan = reply.record.plan
    assert plan is not None and plan.planner == "fast-model"
    assert [w.ids for w in plan.waves] == [("sql1",), ("docs1",)]
    assert [f.status for f in plan.fates] == ["ok", "ok"]
    assert plan.fates[1].query == "Enterprise plan price per seat"
    sources = [c.source for c in reply.citations]
    assert sources[0] == "crm.sqlite#customers/8"
    assert any("plans-and-pricing" in s for s in sources[1:])
    assert reply.record.path[0] == "plan"
    assert json.dumps(reply.record.as_dict())  # the record stays JSON


async def test_model_planner_failure_falls_back_offline(sample_cache: Path) -> None:
    """A failing model planner is recorded; the offline planner's plan runs with the same two waves."""
    async with ScriptedOpenAIServer(matcher=matcher(plan_fails=True)) as server, server.client(max_retries=0) as client:  # type: ignore[arg-type]
        rag = ChatRAG.sample(client, cache_dir=sample_cache, fast_model="fast-model", plan_sources=(crm(),))
        reply = await rag.ask(QUESTION)
        await rag.aclose()
    plan = reply.record.plan
    assert plan is not None and plan.planner == "fallback: offline"
    assert len(plan.waves) == 2
    assert any(e.startswith("plan: ") for e in reply.record.errors)


async def test_offline_gap_is_named(sample_cache: Path) -> None:
    """Offline, a SQL part beyond the patterns is refused and named as missing; the document part answers."""
    rag = ChatRAG.sample(cache_dir=sample_cache, plan_sources=(crm(),))
    reply = await rag.ask(
        "Which customers churned last quarter in each region, and what happens to their data after they cancel?"
    )
    await rag.aclose()
    plan = reply.record.plan
    assert plan is not None
    fates = {f.id: f for f in plan.fates}
    assert fates["sql1"].status == "refused" and "cannot answer offline" in fates["sql1"].reason
    assert fates["docs1"].status == "ok"
    assert reply.outcome == "partial"
    # the gap is named in the user's own words (#33): never a plan step, a source name or the planner's reason
    assert {"churned", "region"} <= set(reply.missing)
    assert not any(word in m for m in reply.missing for word in ("sql", "docs1", "cannot answer offline"))
    assert "sql1" not in reply.text and "sql:" not in reply.text and "churned" in reply.text
    assert any("data-retention" in c.source for c in reply.citations)


async def test_simple_question_keeps_the_decide_route(sample_cache: Path) -> None:
    """A documentation question with a planner configured still takes today's decide route."""
    rag = ChatRAG.sample(cache_dir=sample_cache, plan_sources=(crm(),))
    reply = await rag.ask("How much does the Business plan cost per seat?")
    await rag.aclose()
    assert reply.record.plan is None
    assert reply.record.path[:2] == ("plan", "decide")


def routed(request: RecordedRequest) -> ScriptedResponse:
    """decide searches one query per topic it sees ("and" joins two), grading says relevant, the answer streams."""
    k = kind(request)
    if k == "decide":
        question = str(request.messages[-1]["content"])
        topics = ["API key rotation", "SAML single sign-on setup"] if " and " in question else ["API key rotation"]
        return tool_calls([("search", {"query": t}) for t in topics])
    return matcher()(request)  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize(
    ("question", "most"),
    [("How do I rotate an API key?", 3), ("How do I rotate an API key and set up SAML single sign-on?", 4)],
)
async def test_a_simple_question_makes_no_planning_call(sample_cache: Path, question: str, most: int) -> None:
    """With plan sources and a model planner, a question naming no database entity is decide, one grade per
    query and the answer: at most 3 chat requests for one topic, 4 for two (was 4 and 5: a plan call first)."""
    async with ScriptedOpenAIServer(matcher=routed) as server, server.client(max_retries=0) as client:  # type: ignore[arg-type]
        rag = ChatRAG.sample(client, cache_dir=sample_cache, fast_model="fast-model", plan_sources=(crm(client),))
        reply = await rag.ask(question)
        await rag.aclose()
    kinds = [kind(r) for r in server.chat_requests]
    assert "plan" not in kinds and kinds[0] == "decide" and kinds[-1] == "answer"
    assert len(kinds) <= most, kinds
    assert reply.record.plan is None and reply.citations


async def test_the_sample_plan_questions_still_reach_the_planner() -> None:
    """Every plan question of the sample names a database entity or table, so the offline planner (the gate)
    plans it and the model planner is asked, as before."""
    from ragloop.llm.planner import OfflinePlanner

    lines = (Path(__file__).parents[2] / "src" / "ragloop" / "data" / "plan_questions.jsonl").read_text()
    questions = [json.loads(line)["question"] for line in lines.splitlines() if line.strip()]
    planner = OfflinePlanner(crm())
    assert questions and all([await planner.plan(q) is not None for q in questions])


def test_ragloop_ask_sql_then_documents(sample_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ragloop ask --org` on the sample: citations to a row and a passage, and a record with two waves; another
    organisation (or none) gets no CRM row of Harbor Lane Bank."""
    status = main(["ask", QUESTION, "--json", "--cache-dir", str(sample_cache), "--org", "Harbor Lane Bank"])
    assert status == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    sources = [c["source"] for c in out["citations"]]
    assert "crm.sqlite#customers/8" in sources
    assert any("plans-and-pricing" in s for s in sources)
    waves = out["record"]["plan"]["waves"]
    assert [w["ids"] for w in waves] == [["sql1"], ["docs1"]]
    for org in (["--org", "Zephyr Telecom"], []):
        assert main(["ask", QUESTION, "--json", "--cache-dir", str(sample_cache), *org]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert not any("crm.sqlite" in c["source"] for c in out["citations"])


async def test_plan_and_waves_are_streamed(sample_cache: Path) -> None:
    """The event stream carries the plan, then one progress event per wave with its fates and seconds."""
    from ragloop.events import Progress

    rag = ChatRAG.sample(cache_dir=sample_cache, plan_sources=(crm(),))
    events = [e async for e in rag.stream(QUESTION) if isinstance(e, Progress) and e.node == "plan"]
    await rag.aclose()
    assert [e.kind for e in events] == ["plan", "wave", "wave"]
    assert events[0].data["waves"] == [["sql1"], ["docs1"]]
    assert [f["id"] for f in events[2].data["fates"]] == ["docs1"] and events[2].data["seconds"] >= 0


def _lying_plan(change: str) -> dict[str, object]:
    plan = json.loads(json.dumps(PLAN))
    sql1, docs1 = plan["subqueries"]
    if change == "unknown source":
        sql1["source"] = "mongo"
    elif change == "cycle":
        sql1["depends_on"] = ["docs1"]
    elif change == "huge id":  # a server that ignores max_completion_tokens
        sql1["id"] = "x" * 100_000
        docs1["depends_on"] = [sql1["id"]]
        docs1["slots"][0]["from"] = sql1["id"]
    return plan


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("unknown source", "uses unknown source 'mongo'; known: documents, sql, tickets"),
        ("cycle", "dependency cycle: sql1 -> docs1 -> sql1"),
        ("huge id", "invalid retrieval plan: sub-query id 'xxx"),
    ],
)
async def test_a_lying_planner_falls_back_and_the_record_says_why(sample_cache: Path, change: str, needle: str) -> None:
    """An invalid model plan is refused whole: the offline plan answers, one bounded error names the fault."""
    plan = _lying_plan(change)

    def match(request: RecordedRequest) -> ScriptedResponse:
        return json_reply(plan) if kind(request) == "plan" else matcher()(request)  # type: ignore[operator]

    async with ScriptedOpenAIServer(matcher=match) as server, server.client(max_retries=0) as client:  # type: ignore[arg-type]
        rag = ChatRAG.sample(client, cache_dir=sample_cache, fast_model="fast-model", plan_sources=(crm(client),))
        reply = await rag.ask(QUESTION)
        await rag.aclose()
    assert reply.text and reply.outcome in ("context", "partial")
    assert reply.record.plan is not None and reply.record.plan.planner == "fallback: offline"
    (error,) = [e for e in reply.record.errors if e.startswith("plan: ")]
    assert needle in error and len(error) < 1_200


async def test_model_sql_that_is_not_a_select_is_refused_and_named(sample_cache: Path) -> None:
    """A SQL writer proposing DELETE, or SELECT; DROP, runs nothing: the fate says why, the turn still answers."""
    for sql, reason in [
        ("DELETE FROM customers", "only a SELECT may run"),
        ("SELECT name, plan FROM customers; DROP TABLE customers", "exactly one statement"),
        ("SELECT sql FROM sqlite_master", "'sqlite_master' is not allowlisted"),
    ]:

        def match(request: RecordedRequest, sql: str = sql) -> ScriptedResponse:
            if kind(request) == "sql":
                return json_reply({"sql": sql, "params": [], "reason": ""})
            return matcher()(request)  # type: ignore[operator,no-any-return]

        async with ScriptedOpenAIServer(matcher=match) as server, server.client(max_retries=0) as client:  # type: ignore[arg-type]
            rag = ChatRAG.sample(client, cache_dir=sample_cache, fast_model="fast-model", plan_sources=(crm(client),))
            reply = await rag.ask(QUESTION)
            await rag.aclose()
        plan = reply.record.plan
        assert plan is not None and plan.planner == "fast-model"
        fates = {f.id: f for f in plan.fates}
        assert fates["sql1"].status == "refused" and reason in fates["sql1"].reason, fates["sql1"].reason
        assert fates["docs1"].status == "skipped"
        assert reply.text


async def test_a_hung_planner_leaves_the_turn_time_to_answer(sample_cache: Path) -> None:
    """A model server that never answers the plan call: within its share of the turn the offline plan takes over
    and the turn answers from the sample (before: the planner's timeout and retries used the whole deadline)."""
    from attrs import evolve

    def match(request: RecordedRequest) -> ScriptedResponse:
        if kind(request) == "plan":
            return evolve(json_reply(PLAN), delay_s=60.0)
        return matcher()(request)  # type: ignore[operator,no-any-return]

    async with ScriptedOpenAIServer(matcher=match) as server, server.client() as client:  # type: ignore[arg-type]
        rag = ChatRAG.sample(
            client, cache_dir=sample_cache, fast_model="fast-model", plan_sources=(crm(client),), timeout_s=60.0
        )
        reply = await rag.ask(QUESTION, deadline_s=20.0)
        await rag.aclose()
    plan = reply.record.plan
    assert plan is not None and plan.planner == "fallback: offline"
    assert [e for e in reply.record.errors if "model planner did not answer within its budget" in e]
    assert reply.outcome in ("context", "partial") and reply.citations
