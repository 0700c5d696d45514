"""Smoke run of benchmarks/bench_gaps.py with tiny sizes: it runs and reports the documented shape (no timing is
looked at)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.test_smoke import run_json


def test_reports_cost_report_time_and_grouping(tmp_path: Path) -> None:
    """bench_gaps reports the turn log's cost, the report time for each mode and the grouping quality."""
    out = tmp_path / "gaps.json"
    report = run_json(
        "bench_gaps.py", "--turns", "2", "--rows", "3000", "--embedded-rows", "500", "--embedder", "hash",
        "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--json",
    )  # fmt: skip
    cost = report["turn_log_cost"]
    assert {"p50_off_ms", "p50_on_ms", "p50_overhead_pct", "handoff_us_per_turn", "writer_us_per_row"} <= set(cost)
    assert cost["rows_written"] >= 2 and cost["write_errors"] == 0
    assert report["report_time"]["terms"]["rows"] == 3000
    assert report["report_time"]["terms+index-embedder"]["rows"] == 500
    assert all(report["report_time"][m]["status"] == 0 for m in ("terms", "terms+index-embedder"))
    assert set(report["grouping"]) == {"terms", "terms+hash-512"}
    assert 0.0 <= report["grouping"]["terms"]["held_out_at_default"]["f1"] <= 1.0
    assert out.with_suffix(".txt").read_text().startswith("grouping quality")
