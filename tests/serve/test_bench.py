"""A smoke run of benchmarks/bench_serve.py at tiny sizes: it still runs and writes the documented JSON shape.

Nothing here looks at a timing value; speed is what the script measures, not what the test asserts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_bench_serve_reports_each_level_and_setup(tmp_path: Path) -> None:
    """Both set-ups at N = 2 complete every turn and report percentiles, CPU per turn and the load average."""
    out = tmp_path / "serve.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--levels", "2", "--turns", "1"]
    cmd += ["--endpoints", "api-chat", "responses", "mcp"]
    done = subprocess.run(
        [*cmd, "--scale", "0.01", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    kinds = [(r["setup"], r["endpoint"], r["clients"]) for r in report["levels"]]
    assert kinds == [(s, e, 2) for s in ("offline", "scripted") for e in ("api-chat", "responses", "mcp")]
    for row in report["levels"]:
        assert row["completed"] == row["turns"] == 2 and row["errors"] == 0
        assert 0 < row["ttft_p50_ms"] <= row["last_p50_ms"] <= row["last_p95_ms"]
        assert {"server", "clients"} <= set(row["cpu_ms_per_turn"]) and "load_average_1min" in row
    assert "model" in report["levels"][3]["cpu_ms_per_turn"]
    assert report["levels"][0]["judge_calls_per_turn"]["decide/offline"] == 1.0
    assert report["levels"][3]["judge_calls_per_turn"]["decide/model"] == 1.0
    assert out.with_suffix(".txt").read_text().startswith("# python benchmarks/bench_serve.py")
