"""Where a served turn's CPU goes: one ``ragloop serve`` replica under cProfile, driven by concurrent clients.

The replica is the fleet's (``bench_fleet.py``): ``--store``, ``--sessions`` and ``--turn-log`` on one PostgreSQL
(pgserver), the sample knowledge base (hash embedder). It runs under ``_profiled.py``, whose cProfile is switched
on (SIGUSR1) after warm-up turns on every endpoint and off (SIGUSR2) when ``--clients`` clients have each sent
``--turns`` turns over the five endpoints (as ``bench_fleet.py`` spreads them): the profile holds the measured
turns only, and only the main thread (the event loop: HTTP, the turn, the judges' calls; not the turn log's writer
thread). Two set-ups: ``offline`` (no model: the offline judges) and ``scripted`` (the OpenAI judges against
``_sim.py``'s simulated model).

The summary has the replica's CPU seconds per answered turn (``/proc``, profiler overhead included: compare set-ups
and runs, not absolute values), the share of profiled time spent in ragloop's own code, in each third-party
package and in the standard library (by ``tottime``, the time inside a function itself), and the top functions by
``tottime``. Written to ``benchmarks/results/profile_serve-<setup>.txt`` (``--tag`` adds a suffix).

With ``--src DIR`` it profiles the ragloop under ``DIR/src`` instead (e.g. ``git archive`` of an older commit).
With ``--compare DIR`` it profiles nothing: per set-up it serves the same load ``--rounds`` times with the ragloop
under ``DIR/src`` ("before") and with this checkout's ("after"), alternating, and reports each replica's CPU per
answered turn and turns per CPU-second (turns/s per core) from ``/proc``, with the load average beside each
round, in ``benchmarks/results/profile_serve-compare.txt``.

Usage: ``python benchmarks/profile_serve.py [--setups offline scripted] [--clients 20] [--turns 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))
import _sim
import bench_fleet

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


#: Where the event loop waits rather than works (its tottime is idle time, not CPU).
_WAITS = ("<method 'poll' of 'select.epoll' objects>", "<method 'acquire' of '_thread.lock' objects>")


def owner(filename: str, name: str = "") -> str:
    """Who a profiled function belongs to: ``ragloop``, a third-party package, ``stdlib``, ``builtins`` or
    ``waiting`` (the event loop idle in ``epoll``)."""
    if name in _WAITS:
        return "waiting"
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins"
    parts = Path(filename).parts
    if "ragloop" in parts and "site-packages" not in parts:
        return "ragloop"
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].split(".")[0].removesuffix(".py")
    return "stdlib"


def summary(profile: Path, turns: int, cpu_s: float, top: int) -> tuple[str, dict[str, Any]]:
    """The profile's text summary and its figures."""
    stats = pstats.Stats(str(profile))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_owner: dict[str, float] = {}
    rows = []
    for (filename, line, name), (_, calls, tottime, cumtime, _) in raw.items():
        who = owner(filename, name)
        if who == "waiting":
            continue
        by_owner[who] = by_owner.get(who, 0.0) + tottime
        rows.append((tottime, cumtime, calls, who, f"{Path(filename).name}:{line}({name})"))
    total = sum(by_owner.values()) or 1.0
    rows.sort(reverse=True)
    shares = {k: round(100 * v / total, 1) for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1])}
    lines = [
        f"turns answered {turns}, replica CPU {cpu_s:.2f} s = {1000 * cpu_s / max(1, turns):.1f} ms per turn "
        f"(profiler overhead included), profiled CPU-ish time {total:.2f} s (idle epoll waits left out)",
        "share of profiled time (tottime) by owner: " + ", ".join(f"{k} {v}%" for k, v in list(shares.items())[:12]),
        f"top {top} functions by tottime (ms per turn):",
        "  tottime   cumtime      calls  owner         function",
    ]
    for tottime, cumtime, calls, who, where in rows[:top]:
        per = 1000 / max(1, turns)
        lines.append(f"  {tottime * per:7.2f}  {cumtime * per:8.2f}  {calls:9d}  {who:<12}  {where}")
    ours = [r for r in rows if r[3] == "ragloop"][:top]
    lines.append(f"top {top} of ragloop's own functions by tottime (ms per turn):")
    for tottime, cumtime, calls, _, where in ours:
        per = 1000 / max(1, turns)
        lines.append(f"  {tottime * per:7.2f}  {cumtime * per:8.2f}  {calls:9d}  {where}")
    figures = {"turns": turns, "cpu_ms_per_turn": round(1000 * cpu_s / max(1, turns), 1), "shares": shares}
    return "\n".join(lines), figures


def profile(setup: str, server: str, args: argparse.Namespace, tmp: Path) -> tuple[str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_", "PG"))}
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    with contextlib.ExitStack() as stack:
        if setup == "scripted":
            model = _sim.ModelServer(args.scale)
            env |= {"OPENAI_BASE_URL": model.__enter__(), "OPENAI_API_KEY": "bench"}
            env |= {"RAGLOOP_MODEL": "sim-fast", "RAGLOOP_ANSWER_MODEL": "sim-answer"}
            stack.callback(model.__exit__, None, None, None)
        url = bench_fleet.fresh_database(server, f"profile_{setup}")
        out = tmp / f"{setup}.prof"
        env["RAGLOOP_PROFILE_OUT"] = str(out)
        wrapper = (str(Path(__file__).parent / "_profiled.py"),)
        replica = bench_fleet.Replica("profiled", url, env, args.clients, 10, wrapper)
        try:
            replica.wait_ready()
            for _ in range(2):  # warm-up, every endpoint: imports, pools, caches
                anyio.run(bench_fleet.run_clients, [replica], 5, 1, False, 120.0)
            before = bench_fleet.cpu_seconds(replica.proc.pid)
            answered = replica.answered
            replica.proc.send_signal(signal.SIGUSR1)
            run = anyio.run(bench_fleet.run_clients, [replica], args.clients, args.turns, False, args.limit)
            replica.proc.send_signal(signal.SIGUSR2)
            cpu = bench_fleet.cpu_seconds(replica.proc.pid) - before
            turns = replica.answered - answered
            for _ in range(100):  # the profile is written by the signal's handler
                if out.exists() and out.stat().st_size:
                    break
                time.sleep(0.1)
        finally:
            replica.stop()
        text, figures = summary(out, turns, cpu, args.top)
        figures["errors"] = sum(1 for e in run["log"] if e.get("error"))
        return text, figures


def cpu_round(setup: str, server: str, args: argparse.Namespace, src: str | None, n: int) -> dict[str, Any]:
    """One unprofiled round: the replica's CPU per answered turn with the ragloop of ``src`` (``None``: this one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_", "PG"))}
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve() / "src")
    with contextlib.ExitStack() as stack:
        if setup == "scripted":
            model = _sim.ModelServer(args.scale)
            env |= {"OPENAI_BASE_URL": model.__enter__(), "OPENAI_API_KEY": "bench"}
            env |= {"RAGLOOP_MODEL": "sim-fast", "RAGLOOP_ANSWER_MODEL": "sim-answer"}
            stack.callback(model.__exit__, None, None, None)
        url = bench_fleet.fresh_database(server, f"compare_{setup}_{n}")
        replica = bench_fleet.Replica("compared", url, env, args.clients, 10)
        try:
            replica.wait_ready()
            for _ in range(2):
                anyio.run(bench_fleet.run_clients, [replica], 5, 1, False, 120.0)
            load_start = bench_fleet.load()
            before, answered = bench_fleet.cpu_seconds(replica.proc.pid), replica.answered
            run = anyio.run(bench_fleet.run_clients, [replica], args.clients, args.turns, False, args.limit)
            cpu = bench_fleet.cpu_seconds(replica.proc.pid) - before
            turns = replica.answered - answered
        finally:
            replica.stop()
    return {
        "setup": setup,
        "ragloop": "before" if src else "after",
        "turns": turns,
        "errors": sum(1 for e in run["log"] if e.get("error")),
        "cpu_ms_per_turn": round(1000 * cpu / max(1, turns), 1),
        "turns_per_cpu_second": round(turns / cpu, 1) if cpu else None,
        "load_average_1min": {"start": load_start, "end": bench_fleet.load()},
    }


def compare(server: str, args: argparse.Namespace, command: str) -> None:
    rows = []
    for setup in args.setups:
        for n in range(args.rounds):
            for src in (args.compare, None):
                row = cpu_round(setup, server, args, src, n)
                rows.append(row)
                print(row, flush=True)
    lines = [f"# {command}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {args.clients} clients x "
             f"{args.turns} turns per round; replica CPU from /proc, no profiler)"]  # fmt: skip
    lines.append("setup     ragloop  turns  errors  CPU ms/turn  turns per CPU-second  load (start -> end)")
    for r in rows:
        la = r["load_average_1min"]
        lines.append(
            f"{r['setup']:<9} {r['ragloop']:<7} {r['turns']:>6} {r['errors']:>7} {r['cpu_ms_per_turn']:>12} "
            f"{r['turns_per_cpu_second']:>21}  {la['start']} -> {la['end']}"
        )
    for setup in args.setups:
        for which in ("before", "after"):
            mine = [r for r in rows if r["setup"] == setup and r["ragloop"] == which]
            cpu = sum(r["cpu_ms_per_turn"] * r["turns"] for r in mine) / max(1, sum(r["turns"] for r in mine))
            lines.append(
                f"{setup} {which}: {cpu:.1f} CPU ms per turn over {len(mine)} rounds = "
                f"{1000 / cpu:.1f} turns/s per core"
            )
    (RESULTS / "profile_serve-compare.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", default=["offline", "scripted"], choices=["offline", "scripted"])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--limit", type=float, default=600.0, help="seconds the clients may run")
    parser.add_argument("--src", help="profile the ragloop of this checkout (its src/) instead")
    parser.add_argument("--compare", metavar="DIR", help="no profile: CPU per turn, DIR's ragloop against this one")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each ragloop with --compare")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--db", help="a PostgreSQL server URL instead of a temporary pgserver")
    parser.add_argument("--keep", metavar="DIR", help="keep the raw profiles (<setup>.prof) in DIR")
    args = parser.parse_args()
    command = "python benchmarks/profile_serve.py " + " ".join(sys.argv[1:])
    if args.compare:
        with bench_fleet.database(args.db) as server:
            compare(server, args, command)
        return
    with bench_fleet.database(args.db) as server, tempfile.TemporaryDirectory() as tmp:
        for setup in args.setups:
            load_start = bench_fleet.load()
            text, figures = profile(setup, server, args, Path(args.keep or tmp))
            head = (
                f"# {command}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; setup {setup}; "
                f"{args.clients} clients x {args.turns} turns; load average {load_start} -> {bench_fleet.load()})"
            )
            out = RESULTS / f"profile_serve-{setup}{args.tag}.txt"
            out.write_text(head + "\n" + text + "\n")
            print(head, text, sep="\n", flush=True)
            print(figures, flush=True)


if __name__ == "__main__":
    main()
