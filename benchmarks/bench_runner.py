"""Runner overhead: µs per transition and per invoke, against a bare anyio loop, plus import time.

What it measures, in one process run, side by side:

* **loop**: a 3-node cycle a → b → c → a … with trivial async nodes, run for ``--transitions`` steps
  (the step cap ends it), so the figure is the runner's cost per node transition with the trace on.
* **linear**: one invoke of a 5-node linear graph (a → b → c → d → e → END), repeated ``--invokes`` times:
  the fixed cost of a run (run id, logger binding, result, ``turn.finished`` log event).
* **bare**: the same two shapes as a plain ``while`` loop over a dict of async functions — the floor.
* **import**: ``python -c "import ragloop"`` wall time in a fresh interpreter (median of ``--imports``).

Each figure is the median over ``--repeats`` rounds (the spread is min–max); rounds interleave ragloop
and the bare loop so machine noise hits both alike. structlog is configured to drop events below WARNING
so the log line of each run is not what is measured (the library never configures logging itself).
It asserts nothing; it prints a table and writes JSON to ``benchmarks/results/bench_runner.json``.

Usage: ``python benchmarks/bench_runner.py [--transitions 10000] [--invokes 2000] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from ragloop import END, Graph

RESULTS = Path(__file__).parent / "results"


class Hop:
    """A trivial node that returns a fixed next name."""

    def __init__(self, nxt: str, routes: tuple[str, ...]) -> None:
        self.nxt, self.routes = nxt, routes

    async def __call__(self, state: Any) -> str:
        return self.nxt


def loop_graph(transitions: int) -> Graph:
    nodes = {"a": Hop("b", ("b",)), "b": Hop("c", ("c",)), "c": Hop("a", ("a", END))}
    return Graph(nodes, start="a", finish="c", max_steps=transitions)


def linear_graph() -> Graph:
    names = ["a", "b", "c", "d", "e"]
    nodes = {n: Hop(nxt, (nxt,)) for n, nxt in zip(names, [*names[1:], END], strict=True)}
    return Graph(nodes, start="a", finish="e")


async def bare_loop(funcs: dict[str, Callable[[Any], Awaitable[str]]], start: str, cap: int) -> int:
    current, steps = start, 0
    while current != END and steps < cap:
        current = await funcs[current](None)
        steps += 1
    return steps


def bare_funcs(graph: Graph) -> dict[str, Callable[[Any], Awaitable[str]]]:
    return {name: node.__call__ for name, node in graph.nodes.items()}


async def time_loop(transitions: int) -> tuple[float, float]:
    g = loop_graph(transitions)
    t = time.perf_counter()
    result = await g.run(None)
    ragloop_us = (time.perf_counter() - t) / len(result.trace) * 1e6
    funcs = bare_funcs(g)
    t = time.perf_counter()
    steps = await bare_loop(funcs, "a", transitions)
    bare_us = (time.perf_counter() - t) / steps * 1e6
    return ragloop_us, bare_us


async def time_linear(invokes: int) -> tuple[float, float]:
    g = linear_graph()
    t = time.perf_counter()
    for _ in range(invokes):
        await g.run(None)
    ragloop_us = (time.perf_counter() - t) / invokes * 1e6
    funcs = bare_funcs(g)
    t = time.perf_counter()
    for _ in range(invokes):
        await bare_loop(funcs, "a", 100)
    bare_us = (time.perf_counter() - t) / invokes * 1e6
    return ragloop_us, bare_us


def import_ms(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import ragloop"], check=True)
        out.append((time.perf_counter() - t) * 1e3)
    base = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        base.append((time.perf_counter() - t) * 1e3)
    return [x - statistics.median(base) for x in out]


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=10_000)
    parser.add_argument("--invokes", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--imports", type=int, default=7)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    rows: dict[str, dict[str, list[float]]] = {
        "loop": {"ragloop": [], "bare": []},
        "linear": {"ragloop": [], "bare": []},
    }
    for _ in range(args.repeats):
        r, b = anyio.run(time_loop, args.transitions)
        rows["loop"]["ragloop"].append(r)
        rows["loop"]["bare"].append(b)
        r, b = anyio.run(time_linear, args.invokes)
        rows["linear"]["ragloop"].append(r)
        rows["linear"]["bare"].append(b)
    imp = import_ms(args.imports)

    report: dict[str, Any] = {"python": sys.version.split()[0], "args": vars(args)}
    print(f"{'shape':<34}{'ragloop µs':>12}{'bare µs':>10}{'ratio':>8}   spread (ragloop min–max)")
    for shape, label in (("loop", "per transition, 3-node loop"), ("linear", "per invoke, 5-node linear")):
        r, b = summary(rows[shape]["ragloop"]), summary(rows[shape]["bare"])
        ratio = r["median"] / b["median"]
        report[shape] = {"ragloop_us": r, "bare_us": b, "ratio": ratio}
        print(
            f"{label:<34}{r['median']:>12.2f}{b['median']:>10.2f}{ratio:>7.1f}x   {r['min']:.2f}–{r['max']:.2f}"
        )
    im = summary(imp)
    report["import_ms"] = im
    print(
        f"{'import ragloop (ms, fresh process)':<34}{im['median']:>12.1f}{'':>18}   {im['min']:.1f}–{im['max']:.1f}"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_runner.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
