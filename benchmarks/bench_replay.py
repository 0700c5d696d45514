"""``ragloop replay`` on 10,000 logged turns: how long a docs change takes to measure on real questions.

The log is ``bench_gaps.synthetic_rows`` (30 days; 75 % answered questions drawn from a fixed list, 25 % gap
questions from 60 topics with varied wording), written straight into a SQLite turn log. The knowledge base is the
bundled sample, indexed with the hash embedder (what the offline CI gate uses). ``ragloop replay --turn-log …
--index … --since 31d --limit N --json`` is timed end to end in this process (read the log, load the index, ask
every distinct question offline, compare, render). Replay asks a question once however many turns asked it, so
the distinct questions are reported beside the turns, with the time per distinct question. ``--unique`` is the
worst case: every logged question made distinct (``(ref N)`` appended), so every turn is asked.

It asserts nothing; it prints the figures with the load average (1, 5, 15 min) taken before and after and writes
``benchmarks/results/bench_replay.json`` and ``.txt``.

Usage: ``nice python benchmarks/bench_replay.py [--rows 10000] [--unique] [--out FILE]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_gaps

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _unique(data: list[Any]) -> list[Any]:
    import attrs

    from ragloop.turnlog import question_hash

    out = []
    for k, stored in enumerate(data):
        question = f"{stored.row.question.rstrip('?')} (ref {k})?"
        row = attrs.evolve(stored.row, question=question, question_hash=question_hash(question))
        out.append(attrs.evolve(stored, row=row))
    return out


def replay_time(rows: int, *, unique: bool = False) -> dict[str, Any]:
    """Write ``rows`` synthetic turns, index the sample, time one ``ragloop replay`` over all of them."""
    from ragloop.cli import main
    from ragloop.sample import sample_kb_path
    from ragloop.turnlog import SQLiteBackend

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = bench_gaps.synthetic_rows(rows)
        if unique:
            data = _unique(data)
        backend = SQLiteBackend(tmp / "turns.db")
        for i in range(0, len(data), 5_000):
            backend.write(data[i : i + 5_000], ())
        backend.close()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["index", str(sample_kb_path()), "--out", str(tmp / "index"), "--embedder", "hash"]) == 0
        load_before = _load()
        out, err = io.StringIO(), io.StringIO()
        started = time.perf_counter()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(
                [
                    "replay",
                    "--turn-log",
                    f"sqlite:{tmp / 'turns.db'}",
                    "--index",
                    str(tmp / "index"),
                    "--since",
                    "31d",
                    "--limit",
                    str(rows),
                    "--json",
                ]
            )
        seconds = time.perf_counter() - started
        summary = json.loads(out.getvalue())["summary"]
        return {
            "rows": rows,
            "unique": unique,
            "distinct_questions": summary["questions"],
            "turns_replayed": summary["turns"],
            "verdicts": {k: summary[k] for k in ("broken", "fixed", "changed", "same")},
            "exit_status": status,
            "seconds": round(seconds, 2),
            "ms_per_distinct_question": round(1000 * seconds / max(1, summary["questions"]), 2),
            "progress_lines": err.getvalue().count("questions\n"),
            "load_before": load_before,
            "load_after": _load(),
        }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="logged turns to replay")
    parser.add_argument("--unique", action="store_true", help="make every logged question distinct (worst case)")
    parser.add_argument("--out", type=Path, default=None, help="results file (default bench_replay[-unique].json)")
    args = parser.parse_args(argv)
    out = args.out or RESULTS / ("bench_replay-unique.json" if args.unique else "bench_replay.json")
    result = replay_time(args.rows, unique=args.unique)
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "command": " ".join(sys.argv)}
    lines = [
        f"ragloop replay over {result['rows']:,} logged turns ({result['distinct_questions']:,} distinct questions), "
        "sample knowledge base, hash embedder, offline judges",
        f"  wall time {result['seconds']:.1f} s ({result['ms_per_distinct_question']:.1f} ms per distinct question); "
        f"exit {result['exit_status']}; verdicts {result['verdicts']}",
        f"  load average (1/5/15 min) before {result['load_before']}, after {result['load_after']}; "
        f"{meta['cpus']} CPUs; Python {meta['python']}",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"replay": result, "meta": meta}, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
