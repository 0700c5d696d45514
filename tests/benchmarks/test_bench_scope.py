"""Smoke run of benchmarks/bench_scope.py: two tenants, one round; the report's shape, no timing asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_reports_before_and_after_side_by_side(tmp_path: Path) -> None:
    """Cold and warm turns of both chats, the load beside each, and one scope build per tenant."""
    out = tmp_path / "scope.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_scope.py"), "--tenants", "2", "--rounds", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["tenants"] == 2 and report["scope_builds"] == 2
    assert len(report["cold_turn_ms"]["before"]) == len(report["cold_turn_ms"]["after"]) == 2
    warm = report["warm_turn_ms"]
    assert warm["before_median"] > 0 and warm["after_median"] > 0 and len(warm["load"]) == 3
    assert 0.0 <= warm["same_path_share"] <= 1.0 and report["warm_turns_each"] == 12
