"""``benchmarks/bench_fleet.py`` at a tiny size: it runs both phases, kills a replica and reports the promises.

Nothing here looks at a timing value; the script's limit (a few minutes) only keeps a broken run from hanging.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_both_phases_report_turns_connections_and_no_broken_promise(tmp_path: Path) -> None:
    """Two replicas, 5 clients x 2 turns: the steady and the kill phase each report turns, latencies, per-replica
    CPU and connections and the load; replica 0 is killed in the second, and no promise check counts a violation."""
    pytest.importorskip("pgserver")
    out = tmp_path / "fleet.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_fleet.py"), "--clients", "5", "--turns", "2"]
    done = subprocess.run(
        [*cmd, "--scale", "0.2", "--phase-limit", "300", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    steady, kill = report["phases"]
    assert (steady["phase"], kill["phase"]) == ("steady", "kill")
    assert steady["turns_sent"] == 10 and steady["completed"] > 0
    assert kill["replicas"]["fleet-0"]["killed"] and not kill["replicas"]["fleet-1"]["killed"]
    for phase in (steady, kill):
        assert set(phase["load_average_1min"]) == {"start", "end"}
        assert all(r["db_connections_peak_open"] >= 1 for r in phase["replicas"].values())
        checks = phase["checks"]
        violations = ("acknowledged_turns_missing", "sessions_with_half_a_turn", "turn_log_duplicates")
        assert all(checks[k] == 0 for k in (*violations, "turn_log_torn", "cut_streams_with_completion_marker"))
    assert json.loads(out.read_text())["meta"]["clients"] == 5
