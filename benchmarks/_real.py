"""``bench_turn.py --base-url``: turn latency against a real OpenAI-compatible server (e.g. llama.cpp + SmolLM2).

Each turn runs the real default graph (``ChatRAG`` with the OpenAI judges, every request capped, the offline
decider and answerer as fallbacks; real hybrid retrieval over the bundled sample knowledge base) against the
server. Every judge call, search, embedding and live lookup is wrapped in a timing span (``_sim.Timed``), so a
turn's wall time splits into:

- ``model``: time covered by judge calls (the server's queueing, prompt processing and generation, plus the
  SDK and HTTP on localhost);
- ``retrieval``: time covered by searches, embeddings and live lookups and not by a judge call;
- ``ragloop``: wall − time covered by any span: the runner, the nodes, events, the reply (ragloop's own share).

Per node it reports wall time (``TurnRecord.timings``), model time (the node's judge spans), model calls and
tokens (server-reported, from the turn's usage meter), and per turn the time to the first answer token.
It asserts nothing; it writes JSON and prints tables.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _sim

from ragloop.chat import ChatRAG, ReplyReady
from ragloop.events import RunFinished, Token
from ragloop.turn import Judges, Turn, TurnSettings

NODES = ("decide", "retrieve", "grade", "live", "rewrite", "hop", "answer")
JUDGE_NODE = {"decide": "decide", "grade": "grade", "rewrite": "rewrite", "answer": "answer", "direct": "answer"}
MODEL_KINDS = frozenset(JUDGE_NODE)
QUESTIONS = {
    "greeting": "Hi there!",
    "single": "How much does the Business plan cost per seat?",
    "two-topic": "Compare the plan pricing and how to set up SSO with SAML.",
}


def build(base_url: str, model: str, index: Any, settings: TurnSettings, caps: dict[str, int]) -> tuple[ChatRAG, Any]:
    """The default turn against ``base_url`` with every external call timed (see ``_sim.Timed``)."""
    import openai

    from ragloop.llm.offline import OfflineAnswerer, OfflineDecider
    from ragloop.llm.openai import OpenAIJudges
    from ragloop.retrievers.live import SQLiteTicketSource
    from ragloop.text.terms import CorpusStats

    stats = CorpusStats.from_texts([c.text for c in index.chunks])
    offline_decider = OfflineDecider(stats, max_queries=settings.max_queries)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=300.0)
    judges = OpenAIJudges.create(
        client,
        fast_model=model,
        answer_model=model,
        timeout_s=120.0,
        glossary=offline_decider.terms_glossary,
        grade_max_chars=600,
        max_tokens=caps,
    )
    timed = Judges(
        _sim.Timed(judges.decider, "decide"),
        _sim.Timed(judges.grader, "grade"),
        _sim.Timed(judges.rewriter, "rewrite"),
        _sim.Timed(judges.answerer, "answer"),
        fallback_decider=offline_decider,
        fallback_answerer=OfflineAnswerer(stats),
    )
    turn = Turn(
        _sim.Timed(index.retriever("hybrid"), "search"),
        timed,
        settings=settings,
        embedder=_sim.Timed(index.embedder, "embed"),
    )
    rag = ChatRAG(turn.add_source(_sim.Timed(SQLiteTicketSource(require_caller=False), "live")))
    return rag, client


async def one_turn(rag: ChatRAG, question: str) -> dict[str, Any]:
    """Run one streamed turn and measure it."""
    spans: list[tuple[str, float, float]] = []
    token = _sim.SPANS.set(spans)
    reply, usage, ttft = None, [], None
    t0 = time.perf_counter()
    try:
        async for event in rag.stream(question, deadline_s=900.0):
            if ttft is None and isinstance(event, Token):
                ttft = time.perf_counter() - t0
            elif isinstance(event, RunFinished):
                usage = list(event.result.state.usage.calls)
            elif isinstance(event, ReplyReady):
                reply = event.reply
        wall = time.perf_counter() - t0
    finally:
        _sim.SPANS.reset(token)
    assert reply is not None
    record = reply.record.as_dict()
    # a per-query grading call is timed as "grade_batch:<n>" (see _sim.Timed); it is a grade call here
    model_spans = [(k.split("_batch:")[0], a, b) for k, a, b in spans if k.split("_batch:")[0] in MODEL_KINDS]
    per_node: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "tokens": 0, "model_s": 0.0})
    for node in NODES:
        mine = [s for s in model_spans if JUDGE_NODE[s[0]] == node]
        if mine:
            per_node[node]["model_s"] = _sim.union_seconds(mine)
    for call in usage:
        if call.model != "offline" and call.judge in JUDGE_NODE:
            entry = per_node[JUDGE_NODE[call.judge]]
            entry["calls"] += 1
            entry["tokens"] += call.prompt_tokens + call.completion_tokens
    covered = _sim.union_seconds(spans)
    model = _sim.union_seconds(model_spans)
    return {
        "wall": wall,
        "ttft": ttft if ttft is not None else wall,
        "timings": dict(record["timings"]),
        "nodes": {k: dict(v) for k, v in per_node.items()},
        "path": list(record["path"]),
        "outcome": reply.outcome,
        "decision": record["decision"]["reason"],
        "llm_calls": sum(1 for c in usage if c.model != "offline"),
        "prompt_tokens": sum(c.prompt_tokens for c in usage),
        "completion_tokens": sum(c.completion_tokens for c in usage),
        "model": model,
        "retrieval": covered - model,
        "ragloop": wall - covered,
        "errors": list(record["errors"]),
        "text": reply.text[:120],
    }


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def summarise(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the timed turns of one scenario."""
    nodes: dict[str, Any] = {}
    for node in NODES:
        visits = [t for t in turns if node in t["timings"]]
        if visits:
            nodes[node] = {
                "wall_ms": _median([t["timings"][node] * 1e3 for t in visits]),
                "model_ms": _median([t["nodes"].get(node, {}).get("model_s", 0.0) * 1e3 for t in visits]),
                "calls": _median([t["nodes"].get(node, {}).get("calls", 0) for t in visits]),
                "tokens": _median([t["nodes"].get(node, {}).get("tokens", 0) for t in visits]),
            }
    return {
        "turns": len(turns),
        "path": turns[-1]["path"],
        "outcome": turns[-1]["outcome"],
        "decision": turns[-1]["decision"],
        "wall_ms": _median([t["wall"] * 1e3 for t in turns]),
        "ttft_ms": _median([t["ttft"] * 1e3 for t in turns]),
        "model_ms": _median([t["model"] * 1e3 for t in turns]),
        "retrieval_ms": _median([t["retrieval"] * 1e3 for t in turns]),
        "ragloop_ms": _median([t["ragloop"] * 1e3 for t in turns]),
        "ragloop_pct": _median([100 * t["ragloop"] / t["wall"] for t in turns]),
        "llm_calls": _median([t["llm_calls"] for t in turns]),
        "prompt_tokens": _median([t["prompt_tokens"] for t in turns]),
        "completion_tokens": _median([t["completion_tokens"] for t in turns]),
        "nodes": nodes,
        "errors": sorted({e[:160] for t in turns for e in t["errors"]}),
        "sample_reply": turns[-1]["text"],
    }


async def run(base_url: str, model: str, index: Any, turns: int, caps: dict[str, int]) -> dict[str, Any]:
    """One untimed warm-up round, then ``turns`` timed rounds over the scenarios (round-robin)."""
    # One server slot; short answer prompts; limits that measure the model rather than time it out.
    settings = TurnSettings(grade_concurrency=1, max_blocks=4, grade_timeout_s=120.0, deadline_s=900.0)
    rag, client = build(base_url, model, index, settings, caps)
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in QUESTIONS}
    try:
        for round_ in range(turns + 1):
            for name, question in QUESTIONS.items():
                result = await one_turn(rag, question)
                if round_ > 0:
                    raw[name].append(result)
    finally:
        await rag.aclose()
        await client.close()
    return {name: summarise(ts) for name, ts in raw.items()}


def main(args: Any) -> None:
    """Run against ``args.base_url`` and write ``args.out`` (default ``results/bench_turn_real.json``)."""
    import anyio

    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.sample import sample_index

    caps = {"decide": 160, "grade": 48, "rewrite": 24, "answer": 96}  # decide: room for json_schema's 4 x 80 chars
    embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder()
    index = sample_index(Path(args.cache_dir), embedder=embedder)
    started = time.time()
    scenarios = anyio.run(run, args.base_url, args.model, index, args.turns, caps)
    report = {
        "server": args.base_url,
        "model": args.model,
        "machine": f"{platform.machine()} {platform.system()}, {__import__('os').cpu_count()} CPUs (shared)",
        "python": sys.version.split()[0],
        "turns_per_scenario": args.turns,
        "output_caps": caps,
        "embedder": embedder.name,
        "seconds": round(time.time() - started, 1),
        "scenarios": scenarios,
    }
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / "bench_turn_real.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print_tables(report)


def print_tables(report: dict[str, Any]) -> None:
    """The report as tables."""
    print(
        f"server {report['server']} (model {report['model']}); {report['turns_per_scenario']} timed turns per "
        f"scenario after one warm-up; output caps {report['output_caps']}; medians\n"
    )
    print(
        f"{'scenario':<10}{'path':<34}{'calls':>6}{'tokens in/out':>15}{'TTFT ms':>9}{'total ms':>10}"
        f"{'model ms':>10}{'retrieval':>10}{'ragloop ms':>11}{'share':>8}"
    )
    for name, s in report["scenarios"].items():
        path = "→".join(x[:3] for x in s["path"])
        print(
            f"{name:<10}{path:<34}{s['llm_calls']:>6.0f}{s['prompt_tokens']:>9.0f}/{s['completion_tokens']:<5.0f}"
            f"{s['ttft_ms']:>9.0f}{s['wall_ms']:>10.0f}{s['model_ms']:>10.0f}{s['retrieval_ms']:>10.1f}"
            f"{s['ragloop_ms']:>11.1f}{s['ragloop_pct']:>7.2f}%"
        )
    print("\nper node: wall ms / model ms / calls / tokens (medians over turns that visit the node)")
    for name, s in report["scenarios"].items():
        cells = [
            f"{n} {v['wall_ms']:.0f}/{v['model_ms']:.0f}/{v['calls']:.0f}/{v['tokens']:.0f}"
            for n, v in s["nodes"].items()
        ]
        print(f"{name:<10}" + "  ".join(cells))
    for name, s in report["scenarios"].items():
        print(f"\n{name}: decision: {s['decision'][:150]}")
        for e in s["errors"]:
            print(f"  absorbed: {e}")
