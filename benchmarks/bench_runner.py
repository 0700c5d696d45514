"""Runner overhead: µs per transition and per invoke, against a bare anyio loop, plus import time.

What it measures, in one process run, side by side:

* **loop**: a 3-node cycle a → b → c → a … with trivial async nodes, run for ``--transitions`` steps
  (the step cap ends it), so the figure is the runner's cost per node transition with the trace on.
* **linear**: one invoke of a 5-node linear graph (a → b → c → d → e → END), repeated ``--invokes`` times:
  the fixed cost of a run (run id, logger binding, result, ``turn.finished`` log event).
* **bare**: the same two shapes as a plain ``while`` loop over a dict of async functions — the floor.
* **import**: ``python -c "import ragloop"`` wall time in a fresh interpreter (median of ``--imports``).
* **peers**: when importable, the same two shapes on LangGraph (``StateGraph``, async nodes; the loop ends
  through a conditional edge on a step counter in the state) and PocketFlow (``AsyncNode`` / ``AsyncFlow``;
  the loop ends when ``post_async`` returns no action), in the same rounds, and their import time. Install
  them into a separate virtual environment, never the project's::

      python3 -m venv /tmp/peers-venv
      /tmp/peers-venv/bin/pip install -e . -r benchmarks/requirements-peers.txt
      /tmp/peers-venv/bin/python benchmarks/bench_runner.py

  LangGraph's loop runs ``--peer-transitions`` steps (default 2,000), as it is ~100× slower per step.

* **deadline overshoot**: how far past ``deadline + finish_grace_s`` a run ends when its finish node is still
  running at the end of its grace (the longest a run can take): the deadline cancels a node and the forced
  finish hangs, or the deadline passes during a hanging finish, with and without a ``salvage`` hook, each
  ``--deadline-runs`` times on asyncio and on trio (deadline 50 ms, grace 100 ms). Negative means early: a
  salvage hook gets the last quarter of the grace (at most 0.5 s) and ends at once here.

Each figure is the median over ``--repeats`` rounds (the spread is min–max); rounds interleave ragloop,
the bare loop and the peers so machine noise hits all alike, and the load average before and after the rounds
is printed and kept beside the figures. Logging is left as the library leaves it (nothing
configured: each run's ``turn.finished`` event is dropped by the standard library's level check).
It asserts nothing; it prints a table and writes JSON to ``benchmarks/results/bench_runner.json``.

Usage: ``python benchmarks/bench_runner.py [--transitions 10000] [--invokes 2000] [--repeats 7] [--no-peers]
[--deadline-runs 20]``
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from ragloop import END, Graph

RESULTS = Path(__file__).parent / "results"


class Hop:
    """A trivial node that returns a fixed next name."""

    def __init__(self, nxt: str, routes: tuple[str, ...]) -> None:
        self.nxt, self.routes = nxt, routes

    async def __call__(self, state: Any) -> str:
        return self.nxt


def loop_graph(transitions: int) -> Graph:
    """a → b → c → a … until the step cap forces the finish node (which may only end the run)."""
    nodes = {"a": Hop("b", ("b",)), "b": Hop("c", ("c",)), "c": Hop("a", ("a",)), "stop": Hop(END, (END,))}
    return Graph(nodes, start="a", finish="stop", max_steps=transitions)


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
    return {name: node.__call__ for name, node in graph.nodes.items() if name != "stop"}


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


class Hang:
    """A node that waits until it is cancelled."""

    def __init__(self, routes: tuple[str, ...]) -> None:
        self.routes = routes

    async def __call__(self, state: Any) -> str:
        await anyio.sleep(3600)
        return self.routes[0]


class Salvaging(Hang):
    """A finish node that waits until cancelled, then ends cheaply in its salvage hook."""

    async def salvage(self, state: Any) -> None:
        state["salvaged"] = True


def deadline_graphs(grace_s: float) -> dict[str, Graph]:
    """The runs that take longest for their deadline: the finish node still running at deadline + grace."""
    return {
        # the deadline cancels `work`; the forced finish then runs past its grace and is salvaged
        "mid_node_then_salvage": Graph(
            {"work": Hang(("fin",)), "fin": Salvaging((END,))}, start="work", finish="fin", finish_grace_s=grace_s
        ),
        # the deadline passes while finish runs; it is cut at deadline + grace - reserve and salvaged
        "mid_finish_then_salvage": Graph({"fin": Salvaging((END,))}, start="fin", finish="fin", finish_grace_s=grace_s),
        # the same without a salvage hook: cut at deadline + grace
        "mid_finish_no_salvage": Graph({"fin": Hang((END,))}, start="fin", finish="fin", finish_grace_s=grace_s),
    }


async def time_deadlines(deadline_s: float, grace_s: float, runs: int) -> dict[str, list[float]]:
    """Milliseconds each run took past ``deadline_s + grace_s`` (the runner's overshoot), per scenario."""
    out: dict[str, list[float]] = {}
    for name, graph in deadline_graphs(grace_s).items():
        for _ in range(runs):
            t = time.perf_counter()
            await graph.run({}, deadline_s=deadline_s)
            out.setdefault(name, []).append((time.perf_counter() - t - deadline_s - grace_s) * 1e3)
    return out


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


# -- peers (optional) -----------------------------------------------------------------------------------


def _langgraph_graph(n_nodes: int, loop: bool, cap: int) -> Any:
    from typing import TypedDict

    from langgraph.graph import END as LG_END
    from langgraph.graph import StateGraph

    class S(TypedDict):
        n: int

    async def step(state: S) -> dict[str, int]:
        return {"n": state["n"] + 1}

    names = [chr(ord("a") + i) for i in range(n_nodes)]
    g = StateGraph(S)
    for name in names:
        g.add_node(name, step)
    g.set_entry_point(names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    if loop:
        g.add_conditional_edges(names[-1], lambda s: LG_END if s["n"] >= cap else names[0])
    else:
        g.add_edge(names[-1], LG_END)
    return g.compile()


async def time_langgraph(transitions: int, invokes: int) -> tuple[float, float]:
    loop = _langgraph_graph(3, True, transitions)
    t = time.perf_counter()
    out = await loop.ainvoke({"n": 0}, {"recursion_limit": transitions + 10})
    loop_us = (time.perf_counter() - t) / out["n"] * 1e6
    linear = _langgraph_graph(5, False, 0)
    t = time.perf_counter()
    for _ in range(invokes):
        await linear.ainvoke({"n": 0})
    return loop_us, (time.perf_counter() - t) / invokes * 1e6


def _pocketflow_flow(n_nodes: int, loop: bool, cap: int) -> Any:
    from pocketflow import AsyncFlow, AsyncNode

    class Step(AsyncNode):  # type: ignore[misc]
        async def post_async(self, shared: dict[str, int], prep_res: Any, exec_res: Any) -> str | None:
            shared["n"] += 1
            if loop and self.params.get("last") is not None and shared["n"] >= cap:
                return "stop"
            return None

    nodes = [Step() for _ in range(n_nodes)]
    for a, b in itertools.pairwise(nodes):
        a >> b
    if loop:
        nodes[-1] >> nodes[0]
    flow = AsyncFlow(start=nodes[0])
    flow.set_params({"last": None})
    last = nodes[-1]
    original = last.set_params
    last.set_params = lambda p: original({**p, "last": True})
    return flow


async def time_pocketflow(transitions: int, invokes: int) -> tuple[float, float]:
    import warnings

    warnings.filterwarnings("ignore", message="Flow ends")
    loop = _pocketflow_flow(3, True, transitions)
    shared = {"n": 0}
    t = time.perf_counter()
    await loop.run_async(shared)
    loop_us = (time.perf_counter() - t) / shared["n"] * 1e6
    linear = _pocketflow_flow(5, False, 0)
    t = time.perf_counter()
    for _ in range(invokes):
        await linear.run_async({"n": 0})
    return loop_us, (time.perf_counter() - t) / invokes * 1e6


PEERS: dict[str, tuple[str, Callable[[int, int], Awaitable[tuple[float, float]]]]] = {
    "langgraph": ("langgraph.graph", time_langgraph),
    "pocketflow": ("pocketflow", time_pocketflow),
}


def available_peers() -> dict[str, str]:
    """Peer name → installed version, for the peers that import."""
    import importlib.metadata
    import importlib.util

    found = {}
    for name, (module, _) in PEERS.items():
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            found[name] = importlib.metadata.version(name)
    return found


def peer_import_ms(module: str, repeats: int) -> list[float]:
    base = [_run_ms([sys.executable, "-c", "pass"]) for _ in range(repeats)]
    return [_run_ms([sys.executable, "-c", f"import {module}"]) - statistics.median(base) for _ in range(repeats)]


def _run_ms(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    return (time.perf_counter() - t) * 1e3


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=10_000)
    parser.add_argument("--invokes", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--imports", type=int, default=7)
    parser.add_argument("--peer-transitions", type=int, default=2_000, help="loop steps for LangGraph")
    parser.add_argument("--no-peers", action="store_true", help="skip LangGraph and PocketFlow even if installed")
    parser.add_argument("--deadline-runs", type=int, default=20, help="runs per deadline scenario and backend")
    parser.add_argument("--out", default=str(RESULTS / "bench_runner.json"))
    args = parser.parse_args()
    peers = {} if args.no_peers else available_peers()

    rows: dict[str, dict[str, list[float]]] = {
        "loop": {"ragloop": [], "bare": []},
        "linear": {"ragloop": [], "bare": []},
    }
    load_before = os.getloadavg()
    for _ in range(args.repeats):
        r, b = anyio.run(time_loop, args.transitions)
        rows["loop"]["ragloop"].append(r)
        rows["loop"]["bare"].append(b)
        r, b = anyio.run(time_linear, args.invokes)
        rows["linear"]["ragloop"].append(r)
        rows["linear"]["bare"].append(b)
        for name in peers:
            steps = args.peer_transitions if name == "langgraph" else args.transitions
            invokes = max(1, args.invokes // 10) if name == "langgraph" else args.invokes
            lo, li = anyio.run(PEERS[name][1], steps, invokes)
            rows["loop"].setdefault(name, []).append(lo)
            rows["linear"].setdefault(name, []).append(li)
    load_after = os.getloadavg()
    imp = import_ms(args.imports)

    report: dict[str, Any] = {"python": sys.version.split()[0], "args": vars(args)}
    report["load_average"] = {"before": list(load_before), "after": list(load_after)}
    print(f"load average (1, 5, 15 min) before the rounds {load_before}, after {load_after}")
    print(f"{'shape':<34}{'ragloop µs':>12}{'bare µs':>10}{'ratio':>8}   spread (ragloop min–max)")
    for shape, label in (("loop", "per transition, 3-node loop"), ("linear", "per invoke, 5-node linear")):
        rs, bs = summary(rows[shape]["ragloop"]), summary(rows[shape]["bare"])
        ratio = rs["median"] / bs["median"]
        entry: dict[str, Any] = {"ragloop_us": rs, "bare_us": bs, "ratio": ratio}
        report[shape] = entry
        print(f"{label:<34}{rs['median']:>12.2f}{bs['median']:>10.2f}{ratio:>7.1f}x   {rs['min']:.2f}–{rs['max']:.2f}")
        for name in peers:
            pm = summary(rows[shape][name])
            entry[f"{name}_us"] = pm
            print(
                f"{'  ' + name + ' ' + peers[name]:<34}{pm['median']:>12.2f}{'':>10}"
                f"{pm['median'] / rs['median']:>7.1f}x ragloop   {pm['min']:.2f}–{pm['max']:.2f}"
            )
    im = summary(imp)
    report["import_ms"] = im
    print(f"{'import ragloop (ms, fresh process)':<34}{im['median']:>12.1f}{'':>18}   {im['min']:.1f}–{im['max']:.1f}")
    report["peers"] = peers
    for name in peers:
        pim = summary(peer_import_ms(PEERS[name][0], args.imports))
        report[f"import_{name}_ms"] = pim
        label = f"import {PEERS[name][0]} (ms)"
        print(f"{label:<34}{pim['median']:>12.1f}{'':>18}   {pim['min']:.1f}–{pim['max']:.1f}")
    deadline_s, grace_s = 0.05, 0.1
    backends = ["asyncio"] + (["trio"] if importlib.util.find_spec("trio") else [])
    overshoot: dict[str, Any] = {"deadline_s": deadline_s, "grace_s": grace_s, "runs": args.deadline_runs}
    print(f"deadline overshoot: ms past deadline {deadline_s} s + grace {grace_s} s, {args.deadline_runs} runs each")
    for backend in backends:
        res = anyio.run(time_deadlines, deadline_s, grace_s, args.deadline_runs, backend=backend)
        overshoot[backend] = {name: summary(xs) for name, xs in res.items()}
        for name, xs in res.items():
            sm = summary(xs)
            print(f"  {backend + ' ' + name:<32}{sm['median']:>12.2f}{'':>18}   {sm['min']:.2f}–{sm['max']:.2f}")
    overshoot["max_ms"] = max(v["max"] for b in backends for v in overshoot[b].values())
    report["deadline_overshoot_ms"] = overshoot
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
