"""Smoke run of benchmarks/bench_clean.py: it times every pattern at every size and reports the growth fields.

No timing value is asserted (the machine is shared); only the report's shape.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_reports_every_pattern_at_every_size(tmp_path: Path) -> None:
    """Two tiny sizes, one repeat: a row per pattern with a time per size, a ratio and an exponent."""
    out = tmp_path / "clean.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_clean.py"), "--sizes", "2048,4096", "--repeats", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["sizes"] == [2048, 4096] and len(report["rows"]) >= 20
    for row in report["rows"]:
        assert len(row["seconds"]) == 2 and row["ratio_largest_to_smallest"] > 0
        assert isinstance(row["exponent"], float)
    assert "exponent" in done.stdout
