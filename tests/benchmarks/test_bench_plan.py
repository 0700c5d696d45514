"""Smoke run of benchmarks/bench_plan.py: it runs every strategy on every sample question and reports its shape.

No timing value is asserted; correctness of the strategies is (it does not depend on the machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_reports_every_question_and_strategy(tmp_path: Path) -> None:
    """One repeat with the hash embedder: waves and sequential answer every question, parallel gets some wrong."""
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_plan.py"), "--repeats", "1", "--embedder", "hash",
         "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [q["id"] for q in report["questions"]] == ["p01", "p02", "p03", "p04", "p05"]
    assert report["totals"]["waves"]["wrong"] == 0
    assert report["totals"]["sequential"]["wrong"] == 0
    assert report["totals"]["parallel"]["wrong"] == 4
    assert [len(q["wave_ids"]) for q in report["questions"]] == [2, 2, 2, 1, 2]
