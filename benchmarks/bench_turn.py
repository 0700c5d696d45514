"""Turn latency: per-node p50/p95, time to first token, LLM calls and tokens, and ragloop's own overhead.

Each turn runs the real default graph (``ChatRAG`` with the OpenAI judges, real hybrid retrieval over the
bundled sample knowledge base, the SQLite ticket source) against a simulated model deployment: the scripted
OpenAI server (``ragloop.testing``) answering each judge's request in a child process with these latencies:
decide 200 ms, grade 150 ms, rewrite 180 ms, answer 300 ms to the first token then 10 ms per token
(60 tokens). See ``_sim.py`` for how it answers.

Scenarios (round-robin, so machine noise hits all alike; one untimed warm-up turn each):

- ``greeting``: "Hi there!" — decide replies directly;
- ``single``: one topic, default settings (its hits are graded);
- ``single-fast``: the same question with ``fast_path_confidence`` set just under its hits' lowest
  confidence, so the fast path skips grading — the difference is what the fast path saves;
- ``two-topic``: two topics, searched and graded concurrently;
- ``rewrite``: the first query's hits are all graded irrelevant, one rewrite finds them;
- ``ticket``: "status of ticket #1234" — the knowledge base comes up short, the live ticket source answers;
- ``fanout-1`` … ``fanout-4``: 1–4 topics, to show that grading N queries' hits costs about one grade
  latency, not N;
- ``single-graded``: the single-topic question with the fast path off (``fast_path_confidence=1.01``), so its
  hits are graded (per query: one grading call);
- ``single-graded-per-passage``, ``two-topic-per-passage``: the same questions with ``per_passage_grading=True``,
  one grading call per passage as before per-query grading (issue 16): the "before" of the comparison;
- ``repeat``: ``single-graded``'s question asked a second time in a row on a chat with caches
  (``ragloop.caches.Caches``, emptied before each first ask): what the second identical question costs.

Every turn is priced with an illustrative price table (``PRICES``, per million input/output tokens, passed as
``TurnSettings.prices``); the cost column is ``TurnRecord.cost``.

Per turn it records the wall time (``ChatRAG.stream`` until ``ReplyReady``), the time to the first answer
token, per-node time (``TurnRecord.timings``), LLM calls and tokens (server-reported; the scripted server
counts words), and splits the wall time with spans recorded around every judge call, search, embedding and
live lookup:

- ``simulated`` = the unavoidable wait: per group of overlapping spans, the longest member's scripted model
  latency (searches, embeddings and lookups count their measured time — they are real work);
- ``transport`` = time inside judge calls beyond the scripted latency (openai SDK, HTTP on localhost, the
  server) — not ragloop's code, but every deployment pays it;
- ``orchestration`` = wall − time covered by any span: the runner, the nodes, events, the reply — ragloop's
  own cost (target: < 1 % of the turn);
- ``overhead vs simulated`` = wall − simulated = transport + orchestration (the issue's definition).

It asserts nothing; it prints tables and writes ``benchmarks/results/bench_turn.json``.

Usage: ``python benchmarks/bench_turn.py [--turns 20] [--embedder minilm|hash] [--json]``

With ``--base-url URL [--model NAME]`` it runs turns against a real OpenAI-compatible server instead (see
``_real.py``: per node wall time, model time, calls and tokens, time to first token, ragloop's own share) and
writes ``benchmarks/results/bench_turn_real.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import attrs
import structlog

sys.path.insert(0, str(Path(__file__).parent))
import _sim

from ragloop.caches import Caches
from ragloop.chat import ChatRAG, ReplyReady
from ragloop.events import Token
from ragloop.retrievers.evaluate import percentile
from ragloop.turn import TurnSettings
from ragloop.usage import Price

RESULTS = Path(__file__).parent / "results"
NODES = ("decide", "retrieve", "grade", "live", "rewrite", "answer")
SINGLE = "How much does the Business plan cost per seat?"
TWO = "Compare the plan pricing and how to set up SSO with SAML."
#: Illustrative prices per million input/output tokens (a small and a large hosted model's ballpark).
PRICES = {"sim-fast": Price(0.15, 0.60), "sim-answer": Price(2.50, 10.00)}
SCENARIOS = {
    "greeting": "Hi there!",
    "single": SINGLE,
    "single-graded": SINGLE,
    "single-graded-per-passage": SINGLE,
    "single-fast": SINGLE,
    "two-topic": TWO,
    "two-topic-per-passage": TWO,
    "repeat": SINGLE,
    "rewrite": "Does Lumen have a Salesforce connector?",
    "ticket": "What is the status of ticket #1234?",
    **{f"fanout-{n}": _sim.fanout_question(n) for n in (1, 2, 3, 4)},
}


async def one_turn(rag: ChatRAG, question: str) -> dict[str, Any]:
    """Run one streamed turn and measure it."""
    spans: list[tuple[str, float, float]] = []
    token = _sim.SPANS.set(spans)
    reply = None
    ttft: float | None = None
    t0 = time.perf_counter()
    try:
        async for event in rag.stream(question):
            if ttft is None and isinstance(event, Token):
                ttft = time.perf_counter() - t0
            if isinstance(event, ReplyReady):
                reply = event.reply
        wall = time.perf_counter() - t0
    finally:
        _sim.SPANS.reset(token)
    assert reply is not None
    record = reply.record
    covered = _sim.union_seconds(spans)
    simulated = _sim.simulated_critical_path(spans)
    return {
        "wall": wall,
        "ttft": ttft if ttft is not None else wall,
        "timings": dict(record.timings),
        "path": list(record.path),
        "fast_path": record.fast_path,
        "llm_calls": record.llm_calls,
        "grade_calls": sum(1 for c in record.calls if c.judge == "grade"),
        "tokens": record.tokens.total,
        "prompt_tokens": record.tokens.prompt,
        "completion_tokens": record.tokens.completion,
        "cost": record.cost or 0.0,
        "cache_hits": dict(record.cache_hits),
        "outcome": reply.outcome,
        "simulated": simulated,
        "transport": covered - simulated,
        "orchestration": wall - covered,
        "errors": list(record.errors),
    }


async def fast_threshold(index: Any, settings: TurnSettings) -> float:
    """A fast-path confidence just under the lowest confidence of the single-topic query's kept hits."""
    query = _sim.DECIDE[SINGLE]["queries"][0]
    hits = await index.search(query, settings.k)
    kept = sorted(hits, key=lambda h: -h.score)[: settings.per_query_budget]
    return max(0.0, min(float(h.confidence) for h in kept) - 0.01)


def p(xs: list[float], q: float) -> float:
    return float(percentile(xs, q))


def _hit_kinds(turns: list[dict[str, Any]]) -> list[str]:
    return sorted({k for t in turns for k in t["cache_hits"]})


def summarise(turns: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [t["wall"] for t in turns]
    out: dict[str, Any] = {
        "turns": len(turns),
        "path": turns[-1]["path"],
        "outcome": turns[-1]["outcome"],
        "fast_path": turns[-1]["fast_path"],
        "total_ms": {"p50": p(walls, 50) * 1e3, "p95": p(walls, 95) * 1e3},
        "ttft_ms": {"p50": p([t["ttft"] for t in turns], 50) * 1e3, "p95": p([t["ttft"] for t in turns], 95) * 1e3},
        "nodes_ms": {},
        "llm_calls": statistics.mean(t["llm_calls"] for t in turns),
        "grade_calls": statistics.mean(t["grade_calls"] for t in turns),
        "tokens": statistics.mean(t["tokens"] for t in turns),
        "prompt_tokens": statistics.mean(t["prompt_tokens"] for t in turns),
        "completion_tokens": statistics.mean(t["completion_tokens"] for t in turns),
        "cost_usd": statistics.mean(t["cost"] for t in turns),
        "cache_hits": {k: statistics.mean(t["cache_hits"].get(k, 0) for t in turns) for k in _hit_kinds(turns)},
        "simulated_ms_p50": p([t["simulated"] for t in turns], 50) * 1e3,
        "transport_ms_p50": p([t["transport"] for t in turns], 50) * 1e3,
        "orchestration_ms": {
            "p50": p([t["orchestration"] for t in turns], 50) * 1e3,
            "p95": p([t["orchestration"] for t in turns], 95) * 1e3,
        },
        "orchestration_pct_p50": p([100 * t["orchestration"] / t["wall"] for t in turns], 50),
        "overhead_vs_simulated_pct_p50": p([100 * (t["wall"] - t["simulated"]) / t["wall"] for t in turns], 50),
        "errors": sorted({e for t in turns for e in t["errors"]}),
    }
    for node in NODES:
        xs = [t["timings"][node] for t in turns if node in t["timings"]]
        if xs:
            out["nodes_ms"][node] = {"p50": p(xs, 50) * 1e3, "p95": p(xs, 95) * 1e3}
    return out


async def run_all(url: str, index: Any, turns: int, names: list[str]) -> tuple[dict[str, list[dict[str, Any]]], float]:
    settings = TurnSettings(prices=PRICES)
    fast_settings = TurnSettings(fast_path_confidence=await fast_threshold(index, settings), prices=PRICES)
    default_rag, c1 = _sim.build_chat(url, index, settings)
    fast_rag, c2 = _sim.build_chat(url, index, fast_settings)
    per_passage_rag, c3 = _sim.build_chat(url, index, TurnSettings(per_passage_grading=True, prices=PRICES))
    graded = TurnSettings(fast_path_confidence=1.01, prices=PRICES)  # no fast path: the hits are graded
    graded_rag, c5 = _sim.build_chat(url, index, graded)
    graded_pp_rag, c6 = _sim.build_chat(url, index, attrs.evolve(graded, per_passage_grading=True))
    caches = Caches()
    cached_rag, c4 = _sim.build_chat(url, index, graded, caches=caches)
    rags = {
        "single-fast": fast_rag,
        "single-graded": graded_rag,
        "single-graded-per-passage": graded_pp_rag,
        "two-topic-per-passage": per_passage_rag,
    }
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        for round_ in range(turns + 1):
            for name in names:
                question = SCENARIOS[name]
                rag = rags.get(name, default_rag)
                if name == "repeat":  # the first ask fills the emptied caches; the second is measured
                    caches.clear()
                    await one_turn(cached_rag, question)
                    rag = cached_rag
                result = await one_turn(rag, question)
                if round_ > 0:  # round 0 warms connections, the embedder and the caches
                    results[name].append(result)
    finally:
        pairs = ((default_rag, c1), (fast_rag, c2), (per_passage_rag, c3), (cached_rag, c4), (graded_rag, c5))
        for rag, client in (*pairs, (graded_pp_rag, c6)):
            await rag.aclose()
            await client.close()
    return results, fast_settings.fast_path_confidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20, help="timed turns per scenario")
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--cache-dir", default="/tmp/ragloop-bench-cache", help="where the sample index is cached")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every simulated latency (smoke runs)")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--out", default=None, help="JSON report path (default results/bench_turn[_real].json)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of tables")
    parser.add_argument("--base-url", default=None, help="a real OpenAI-compatible server (see _real.py)")
    parser.add_argument("--model", default="smollm2", help="model name with --base-url")
    args = parser.parse_args()
    if args.base_url:
        import _real

        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
        _real.main(args)
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    _sim.set_scale(args.scale)

    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.sample import sample_index

    embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder()
    index = sample_index(Path(args.cache_dir), embedder=embedder)
    with _sim.ModelServer(args.scale) as url:
        raw, threshold = anyio.run(run_all, url, index, args.turns, args.scenarios)
    scenarios = {name: summarise(turns) for name, turns in raw.items()}
    nothing: dict[str, Any] = {"total_ms": {"p50": 0.0}, "llm_calls": 0.0}
    single, fast = scenarios.get("single", nothing), scenarios.get("single-fast", nothing)
    grade_latency_ms = _sim.LATENCY["grade"] * 1e3
    compare = [
        {
            "scenario": name,
            "llm_calls_per_passage": scenarios[f"{name}-per-passage"]["llm_calls"],
            "llm_calls_per_query": scenarios[name]["llm_calls"],
            "tokens_per_passage": scenarios[f"{name}-per-passage"]["tokens"],
            "tokens_per_query": scenarios[name]["tokens"],
            "prompt_tokens_per_passage": scenarios[f"{name}-per-passage"]["prompt_tokens"],
            "prompt_tokens_per_query": scenarios[name]["prompt_tokens"],
            "cost_per_passage_usd": scenarios[f"{name}-per-passage"]["cost_usd"],
            "cost_per_query_usd": scenarios[name]["cost_usd"],
            "total_ms_p50_per_passage": scenarios[f"{name}-per-passage"]["total_ms"]["p50"],
            "total_ms_p50_per_query": scenarios[name]["total_ms"]["p50"],
        }
        for name in ("single-graded", "two-topic")
        if name in scenarios and f"{name}-per-passage" in scenarios
    ]
    repeat = None
    if "repeat" in scenarios and "single-graded" in scenarios:
        first = scenarios["single-graded"]
        repeat = {
            "first_llm_calls": first["llm_calls"],
            "second_llm_calls": scenarios["repeat"]["llm_calls"],
            "first_total_ms_p50": first["total_ms"]["p50"],
            "second_total_ms_p50": scenarios["repeat"]["total_ms"]["p50"],
            "second_cache_hits": scenarios["repeat"]["cache_hits"],
        }
    report: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.system()}, {__import__('os').cpu_count()} CPUs (shared)",
        "python": sys.version.split()[0],
        "args": vars(args),
        "embedder": embedder.name,
        "latency_s": dict(_sim.LATENCY),
        "fast_path_confidence_used": threshold,
        "prices_per_million_usd": {m: [p.input_per_m, p.output_per_m] for m, p in PRICES.items()},
        "per_query_vs_per_passage_grading": compare,
        "repeated_question": repeat,
        "scenarios": scenarios,
        "fast_path_saves_ms_p50": single["total_ms"]["p50"] - fast["total_ms"]["p50"],
        "fast_path_saves_llm_calls": single["llm_calls"] - fast["llm_calls"],
        "grade_fanout": [
            {
                "topics": n,
                "grade_calls": scenarios[f"fanout-{n}"]["grade_calls"],
                "grade_ms_p50": scenarios[f"fanout-{n}"]["nodes_ms"].get("grade", {}).get("p50", 0.0),
                "ratio_to_one_grade": scenarios[f"fanout-{n}"]["nodes_ms"].get("grade", {}).get("p50", 0.0)
                / grade_latency_ms,
            }
            for n in (1, 2, 3, 4)
            if f"fanout-{n}" in scenarios
        ],
    }
    out = Path(args.out or RESULTS / "bench_turn.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print_tables(report)


def print_tables(report: dict[str, Any]) -> None:
    lat = report["latency_s"]
    print(
        f"simulated latency: decide {lat['decide'] * 1e3:.0f} ms, grade {lat['grade'] * 1e3:.0f} ms, rewrite "
        f"{lat['rewrite'] * 1e3:.0f} ms, answer {lat['answer_first'] * 1e3:.0f} ms + 60 × "
        f"{lat['answer_token'] * 1e3:.0f} ms; embedder {report['embedder']}; "
        f"{report['args']['turns']} turns per scenario\n"
    )
    head = (
        f"{'scenario':<26}{'path':<40}{'calls':>6}{'tokens':>7}{'cost $':>10}{'TTFT p50':>9}{'total p50':>10}{'p95':>7}"
    )
    print(head)
    for name, s in report["scenarios"].items():
        path = "→".join(x[:3] for x in s["path"]) + (" (fast)" if s["fast_path"] else "")
        print(
            f"{name:<26}{path:<40}{s['llm_calls']:>6.0f}{s['tokens']:>7.0f}{s['cost_usd']:>10.6f}"
            f"{s['ttft_ms']['p50']:>9.0f}{s['total_ms']['p50']:>10.0f}{s['total_ms']['p95']:>7.0f}"
        )
    prices = ", ".join(f"{m} ${i}/${o}" for m, (i, o) in report["prices_per_million_usd"].items())
    print(f"(cost: illustrative prices per million input/output tokens: {prices})")
    if report["per_query_vs_per_passage_grading"]:
        print("\ngrading per passage (before) → per query (after): model calls, tokens, cost per turn")
        for row in report["per_query_vs_per_passage_grading"]:
            print(
                f"  {row['scenario']:<14} calls {row['llm_calls_per_passage']:.0f} → {row['llm_calls_per_query']:.0f}, "
                f"tokens {row['tokens_per_passage']:.0f} → {row['tokens_per_query']:.0f} "
                f"(prompt {row['prompt_tokens_per_passage']:.0f} → {row['prompt_tokens_per_query']:.0f}), "
                f"total p50 {row['total_ms_p50_per_passage']:.0f} → {row['total_ms_p50_per_query']:.0f} ms, "
                f"cost ${row['cost_per_passage_usd']:.6f} → ${row['cost_per_query_usd']:.6f}"
            )
    rep = report["repeated_question"]
    if rep:
        print(
            f"\nrepeated question (caches on): model calls {rep['first_llm_calls']:.0f} → "
            f"{rep['second_llm_calls']:.0f}, total p50 {rep['first_total_ms_p50']:.0f} → "
            f"{rep['second_total_ms_p50']:.0f} ms; cache hits of the second ask: {rep['second_cache_hits']}"
        )
    print("\nper node, ms p50 / p95 (summed over visits)")
    print(f"{'scenario':<26}" + "".join(f"{n:>16}" for n in NODES))
    for name, s in report["scenarios"].items():
        cells = [
            f"{s['nodes_ms'][n]['p50']:.0f} / {s['nodes_ms'][n]['p95']:.0f}" if n in s["nodes_ms"] else "–"
            for n in NODES
        ]
        print(f"{name:<26}" + "".join(f"{c:>16}" for c in cells))
    print("\nwhere the time goes, ms p50: simulated model + retrieval | transport (SDK+HTTP) | ragloop orchestration")
    for name, s in report["scenarios"].items():
        print(
            f"{name:<26}{s['simulated_ms_p50']:>9.1f}{s['transport_ms_p50']:>9.1f}"
            f"{s['orchestration_ms']['p50']:>9.2f}  ({s['orchestration_pct_p50']:.2f} % of the turn; "
            f"wall − simulated = {s['overhead_vs_simulated_pct_p50']:.1f} %)"
        )
    print(
        f"\nfast path (confidence ≥ {report['fast_path_confidence_used']:.2f}) saves "
        f"{report['fast_path_saves_ms_p50']:.0f} ms p50 and {report['fast_path_saves_llm_calls']:.0f}"
        " LLM calls per turn"
    )
    print("grading fan-out: topics → grade calls, grade node p50, × one grade latency")
    for row in report["grade_fanout"]:
        print(
            f"  {row['topics']} → {row['grade_calls']:.0f} calls, {row['grade_ms_p50']:.0f} ms, "
            f"{row['ratio_to_one_grade']:.2f}×"
        )
    errors = {name: s["errors"] for name, s in report["scenarios"].items() if s["errors"]}
    if errors:
        print("\nerrors absorbed by the nodes:", json.dumps(errors, indent=1))


if __name__ == "__main__":
    main()
