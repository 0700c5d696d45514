"""Concurrency: 1, 10, 100 and 500 chat turns at once on one event loop, against simulated model latency.

Each level starts N turns of the same graded question ("How much does the Business plan cost per seat?":
decide → retrieve → grade 6 hits → answer, 8 model calls) together in one task group and measures each
turn's wall time, the batch's wall time, throughput (turns / batch second), CPU seconds per turn (this
process) and peak memory (RSS sampled every 20 ms, minus the RSS before the level). The runner adds no
serialisation when N turns take about as long as one; whatever slows them down shows up as CPU per turn.

Two judge set-ups, measured in the same run, level by level:

- ``sdk``: the OpenAI judges through the real ``openai`` client against the scripted server in a child
  process (``_sim.py``: decide 200 ms, grade 150 ms, rewrite 180 ms, answer 300 ms + 60 × 10 ms) — what a
  deployment pays, SDK and HTTP included; one ``AsyncOpenAI`` client shared by all turns, as in a server;
- ``runner``: the runner alone — a 4-node graph (decide → retrieve → grade → answer) whose nodes only sleep
  the same simulated latencies (retrieve: none; answer: first token + 60 tokens) — what a run costs with no
  judge, retriever or HTTP at all;
- ``sleep``: the offline decider, grader and rewriter, each first sleeping the same simulated latency, and
  the simulated 60-token answer streamed in process — ragloop alone (runner, nodes, offline judges,
  retrieval), no HTTP.

Retrieval is real (hybrid over the bundled sample knowledge base). The default embedder is the hash
embedder: a MiniLM query embedding costs ~30–80 ms of CPU on the shared 2-core machine, which alone would
serialise hundreds of turns (``--embedder minilm`` shows that). It asserts nothing; it prints a table and
writes ``benchmarks/results/bench_concurrency.json``.

Usage: ``python benchmarks/bench_concurrency.py [--levels 1 10 100 500] [--embedder hash|minilm]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).parent))
import _sim
from bench_retrieval import rss_bytes

from ragloop.retrievers.evaluate import percentile
from ragloop.turn import TurnSettings

RESULTS = Path(__file__).parent / "results"
QUESTION = "How much does the Business plan cost per seat?"


class SleepNode:
    """A node that sleeps a fixed time (or a first delay then one per token) and routes on."""

    def __init__(self, nxt: str, first: float, tokens: int = 0) -> None:
        self.nxt, self.first, self.tokens = nxt, first, tokens
        self.routes = (nxt,)

    async def __call__(self, state: Any) -> str:
        await anyio.sleep(self.first)
        for _ in range(self.tokens):
            await anyio.sleep(_sim.LATENCY["answer_token"])
        return self.nxt


class RunnerOnly:
    """The runner with sleeping nodes, behind ``ask`` like a ChatRAG (for :func:`level`)."""

    def __init__(self) -> None:
        from ragloop import END, Graph

        lat = _sim.LATENCY
        nodes = {
            "decide": SleepNode("retrieve", lat["decide"]),
            "retrieve": SleepNode("grade", 0.0),
            "grade": SleepNode("answer", lat["grade"]),
            "answer": SleepNode(END, lat["answer_first"], 60),
        }
        self.graph = Graph(nodes, start="decide", finish="answer")

    async def ask(self, question: str) -> Any:
        result = await self.graph.run(None)
        errors = tuple(f"{s.node}: {s.error}" for s in result.trace if s.error)
        return SimpleNamespace(record=SimpleNamespace(path=result.path, errors=errors))

    async def aclose(self) -> None:
        pass


async def level(rag: Any, n: int) -> dict[str, Any]:
    """Run ``n`` turns at once; measure them."""
    walls: list[float] = []
    paths: set[tuple[str, ...]] = set()
    errors: set[str] = set()
    base = rss_bytes()
    peak = base
    done = anyio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes())
            await anyio.sleep(0.02)

    async def turn() -> None:
        t = time.perf_counter()
        reply = await rag.ask(QUESTION)
        walls.append(time.perf_counter() - t)
        paths.add(reply.record.path)
        errors.update(reply.record.errors)

    cpu = time.process_time()
    t0 = time.perf_counter()
    async with anyio.create_task_group() as outer:
        outer.start_soon(sample)
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(turn)
        batch = time.perf_counter() - t0
        done.set()
    return {
        "turns": n,
        "batch_s": batch,
        "throughput_per_s": n / batch,
        "p50_ms": percentile(walls, 50) * 1e3,
        "p95_ms": percentile(walls, 95) * 1e3,
        "cpu_ms_per_turn": (time.process_time() - cpu) / n * 1e3,
        "peak_rss_mib": (peak - base) / 2**20,
        "paths": sorted("→".join(p) for p in paths),
        "errors": sorted(errors)[:5],
    }


async def run_all(url: str | None, index: Any, levels: list[int]) -> dict[str, list[dict[str, Any]]]:
    settings = TurnSettings(deadline_s=None)
    setups: dict[str, Any] = {"runner": RunnerOnly(), "sleep": _sim.build_sleepy_chat(index, settings)}
    client = None
    if url is not None:
        # One client shared by every turn, as in a server, with its connection pool lifted above the
        # SDK's default (1,000) so 500 turns' grade fan-out (3,000 requests at once) is not queued.
        setups["sdk"], client = _sim.build_chat(url, index, settings, max_connections=4000)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    for rag in setups.values():
        await rag.ask(QUESTION)  # warm-up
    for n in levels:
        for name, rag in setups.items():
            out[name].append(await level(rag, n))
    for rag in setups.values():
        await rag.aclose()
    if client is not None:
        await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 100, 500])
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="hash")
    parser.add_argument("--cache-dir", default="/tmp/ragloop-bench-cache", help="where the sample index is cached")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every simulated latency (smoke runs)")
    parser.add_argument("--no-sdk", action="store_true", help="only the in-process sleeping judges")
    parser.add_argument("--out", default=str(RESULTS / "bench_concurrency.json"))
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    _sim.set_scale(args.scale)

    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.sample import sample_index

    embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder()
    index = sample_index(Path(args.cache_dir), embedder=embedder)
    if args.no_sdk:
        results = anyio.run(run_all, None, index, args.levels)
    else:
        with _sim.ModelServer(args.scale) as url:
            results = anyio.run(run_all, url, index, args.levels)
    report = {
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs (shared)",
        "python": sys.version.split()[0],
        "args": vars(args),
        "embedder": embedder.name,
        "latency_s": dict(_sim.LATENCY),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print(f"question: {QUESTION!r}; embedder {embedder.name}")
    print(
        f"{'judges':<7}{'turns':>6}{'batch s':>9}{'turns/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'× one':>7}"
        f"{'CPU ms/turn':>12}{'peak MiB':>10}"
    )
    for name, rows in results.items():
        one = rows[0]["p50_ms"]
        for r in rows:
            print(
                f"{name:<7}{r['turns']:>6}{r['batch_s']:>9.2f}{r['throughput_per_s']:>9.1f}{r['p50_ms']:>9.0f}"
                f"{r['p95_ms']:>9.0f}{r['p50_ms'] / one:>7.2f}{r['cpu_ms_per_turn']:>12.1f}{r['peak_rss_mib']:>10.1f}"
            )
        paths = sorted({p for r in rows for p in r["paths"]})
        print(f"{'':<7}paths: {paths}")
        errs = sorted({e for r in rows for e in r["errors"]})
        if errs:
            print(f"{'':<7}errors: {errs}")


if __name__ == "__main__":
    main()
