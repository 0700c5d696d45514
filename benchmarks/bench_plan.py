"""Retrieval plans: dependency waves against all-sequential and all-parallel, for wall time and correctness.

Each of the five sample planner questions (``src/ragloop/data/plan_questions.jsonl``) is planned by the offline
planner and executed three ways against the real sources (the sample CRM database through the read-only SQL
source, the sample knowledge base through hybrid search, the sample ticket database through the live ticket
source), each source wrapped with a simulated latency (a real deployment's ballpark: SQL 80 ms, document search
120 ms, ticket system 150 ms, added to the real work):

- ``waves``: topological waves, each wave's sub-queries concurrently (what the plan node does);
- ``sequential``: one sub-query at a time in dependency order (correct, slow);
- ``parallel``: every sub-query at once, ignoring dependencies (fast, but a sub-query that needs a value from
  another runs without it: its slot is empty).

A run is *correct* when every expected row (``customers/8`` …) and every expected document
(``plans-and-pricing.md`` …) is among the results, and each dependent document search ran with the value it
needed (``slot_query``: "Enterprise", "E6002" …). For a question marked ``"offline": false`` (p04: "last
quarter", whose rows depend on today's date: its SQL part runs against the real clock and finds none in the
sample's 2024 data) only its expected documents are checked. Each (question, strategy) pair runs ``--repeats``
times, round-robin; the median is reported.

It asserts nothing; it prints a table and writes ``benchmarks/results/bench_plan.json``.

Usage: ``python benchmarks/bench_plan.py [--repeats 7] [--embedder hash|minilm|auto] [--cache-dir DIR] [--json]``
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from attrs import define

from ragloop.llm.planner import OfflinePlanner
from ragloop.nodes.plan import PlanExecution, Strategy, execute_plan
from ragloop.retrievers.live import SQLiteTicketSource
from ragloop.retrievers.sources import DocumentSource, Filters, LiveLookupSource, Source, SourceResult
from ragloop.retrievers.sql import SQLiteSource
from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path, sample_index, sample_plan_questions_path

RESULTS = Path(__file__).parent / "results"
#: Simulated latency per source, in seconds, added to the real work.
LATENCY = {"sql": 0.080, "documents": 0.120, "tickets": 0.150}
STRATEGIES: tuple[Strategy, ...] = ("waves", "sequential", "parallel")


@define
class Delayed:
    """A source with a simulated network latency before the real work."""

    inner: Source
    latency: float

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def description(self) -> str:
        return self.inner.description

    async def run(self, query: str, filters: Filters) -> SourceResult:
        await anyio.sleep(self.latency)
        return await self.inner.run(query, filters)


def correct(question: dict[str, Any], done: PlanExecution) -> tuple[bool, list[str]]:
    """Whether the run found what the question needs, and what was wrong otherwise."""
    sources = [h.chunk.source for r in done.results.values() for h in r.hits]
    problems = [
        f"row {row} not found" for row in question["expected_rows"] if not any(s.endswith(row) for s in sources)
    ]
    problems += [f"{doc} not found" for doc in question["expected_sources"] if not any(doc in s for s in sources)]
    plan = done.run.plan
    for sub in plan.subqueries:
        fate = done.run.fate(sub.id)
        needs_value = "{" in sub.query and question["slot_query"]
        if needs_value and question["slot_query"] not in done.queries.get(sub.id, ""):
            problems.append(f"{sub.id} ran as {done.queries.get(sub.id)!r} without {question['slot_query']!r}")
        if fate is not None and fate.status in ("failed", "skipped") and question["offline"]:
            problems.append(f"{sub.id} {fate.status}: {fate.reason[:80]}")
    return not problems, problems


async def run(repeats: int, cache_dir: Path | None, embedder_kind: str) -> dict[str, Any]:
    from ragloop.retrievers.embed import HashEmbedder, default_embedder

    embedder = HashEmbedder() if embedder_kind == "hash" else default_embedder()
    index = sample_index(cache_dir, embedder=embedder)
    sql = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW)
    real: dict[str, Source] = {
        "sql": sql,
        "documents": DocumentSource(index.retriever("hybrid")),  # type: ignore[arg-type]
        "tickets": LiveLookupSource(SQLiteTicketSource(require_caller=False)),
    }
    sources: dict[str, Source] = {name: Delayed(s, LATENCY[name]) for name, s in real.items()}
    planner = OfflinePlanner(sql, live={"tickets": "tickets"})
    questions = [json.loads(line) for line in sample_plan_questions_path().read_text().splitlines() if line.strip()]
    plans = {q["id"]: await planner.plan(q["question"]) for q in questions}
    for q in questions:  # warm-up: schema, index, connections
        plan = plans[q["id"]]
        assert plan is not None, q["id"]
        await execute_plan(plan, sources)
    samples: dict[tuple[str, str], list[float]] = {}
    verdicts: dict[tuple[str, str], tuple[bool, list[str]]] = {}
    waves: dict[str, list[list[str]]] = {}
    for _ in range(repeats):
        for q in questions:
            for strategy in STRATEGIES:
                plan = plans[q["id"]]
                assert plan is not None
                started = time.perf_counter()
                done = await execute_plan(plan, sources, strategy=strategy)
                samples.setdefault((q["id"], strategy), []).append(time.perf_counter() - started)
                verdicts[(q["id"], strategy)] = correct(q, done)
                if strategy == "waves":
                    waves[q["id"]] = [list(w.ids) for w in done.run.waves]
    rows = []
    for q in questions:
        row: dict[str, Any] = {"id": q["id"], "question": q["question"], "wave_ids": waves[q["id"]]}
        for strategy in STRATEGIES:
            ok, problems = verdicts[(q["id"], strategy)]
            row[strategy] = {
                "median_ms": round(statistics.median(samples[(q["id"], strategy)]) * 1000, 1),
                "correct": ok,
                "problems": problems,
            }
        rows.append(row)
    totals = {
        s: {
            "median_ms_sum": round(sum(r[s]["median_ms"] for r in rows), 1),
            "wrong": sum(not r[s]["correct"] for r in rows),
        }
        for s in STRATEGIES
    }
    return {
        "benchmark": "bench_plan",
        "repeats": repeats,
        "latency_s": LATENCY,
        "embedder": embedder.name,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "questions": rows,
        "totals": totals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--embedder", choices=("hash", "minilm", "auto"), default="auto")
    parser.add_argument("--cache-dir", type=Path, default=None, help="sample index cache (~/.cache/ragloop)")
    parser.add_argument("--out", default=str(RESULTS / "bench_plan.json"))
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = parser.parse_args()
    report = anyio.run(run, args.repeats, args.cache_dir, args.embedder)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print(f"bench_plan: {args.repeats} repeats, simulated latency {LATENCY}, embedder {report['embedder']}")
    print(f"{'id':<6} {'waves':<26} " + " ".join(f"{s + ' ms':>14} {'ok':>3}" for s in STRATEGIES))
    for r in report["questions"]:
        shape = " | ".join(",".join(w) for w in r["wave_ids"])
        cells = " ".join(f"{r[s]['median_ms']:>14.1f} {'yes' if r[s]['correct'] else 'NO':>3}" for s in STRATEGIES)
        print(f"{r['id']:<6} {shape:<26} {cells}")
    t = report["totals"]
    print(
        "total  "
        + " ".join(f"{s}: {t[s]['median_ms_sum']:.1f} ms, {t[s]['wrong']} wrong" for s in STRATEGIES)
        + f"  (waves/sequential {t['waves']['median_ms_sum'] / t['sequential']['median_ms_sum']:.2f})"
    )
    for r in report["questions"]:
        for s in STRATEGIES:
            for p in r[s]["problems"]:
                print(f"  {r['id']} {s}: {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
