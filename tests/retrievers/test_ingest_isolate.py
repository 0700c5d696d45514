"""The worker pool ingestion reads files in (ragloop.retrievers.ingest._isolate): order, budgets, crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragloop.retrievers.ingest._isolate import Budget, Failure, default_workers, run_isolated
from tests.retrievers._isolate_tasks import act, echo

ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class TestOrderAndResults:
    def test_results_come_back_in_task_order(self) -> None:
        """Tasks finishing out of order (the first sleeps longest) are still yielded in task order."""
        tasks = [("sleep", 0), ("ok", 1), ("ok", 2), ("ok", 3)]
        tasks[0] = ("sleep", 1)
        got = list(run_isolated(act, tasks, workers=3))
        assert [t for t, _ in got] == tasks
        assert [r for _, r in got] == [1, 1, 2, 3]

    def test_no_tasks_start_no_workers(self) -> None:
        """An empty task list yields nothing."""
        assert list(run_isolated(echo, [], workers=2)) == []

    def test_default_workers_is_the_cores_this_process_may_use(self) -> None:
        """One worker per core of this process's CPU affinity."""
        expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        assert default_workers() == expected

    def test_noise_on_stdout_and_stderr_does_not_corrupt_results(self, capfd: pytest.CaptureFixture[str]) -> None:
        """What a loader prints (Python or raw fd 1) goes nowhere, and the result still arrives."""
        assert list(run_isolated(act, [("print", 5), ("ok", 7)], workers=1)) == [(("print", 5), 5), (("ok", 7), 7)]
        out, err = capfd.readouterr()
        assert "noise" not in out and "noise" not in err

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(st.tuples(st.sampled_from(["ok", "raise", "exit"]), st.integers(0, 9)), max_size=8),
        st.integers(1, 3),
    )
    def test_every_task_gets_exactly_one_outcome_in_order(self, tasks: list[tuple[str, int]], workers: int) -> None:
        """Whatever mix of results, exceptions and exits: one outcome per task, in order, each of its kind."""
        got = list(run_isolated(act, tasks, workers=workers))
        assert [t for t, _ in got] == tasks
        for (what, n), outcome in got:
            if what == "ok":
                assert outcome == n
            else:
                assert isinstance(outcome, Failure) and outcome.kind == "error"


class TestBudgets:
    def test_a_native_abort_is_one_failure_and_the_run_goes_on(self) -> None:
        """os.abort() in a task kills its worker: that task is a crash naming SIGABRT, the pool replaces the
        worker, and the tasks after it succeed."""
        got = list(run_isolated(act, [("ok", 1), ("abort", 0), ("ok", 2), ("abort", 0), ("ok", 3)], workers=1))
        outcomes = [r for _, r in got]
        assert outcomes[0] == 1 and outcomes[2] == 2 and outcomes[4] == 3
        assert outcomes[1] == Failure("crash", "SIGABRT") and outcomes[3] == Failure("crash", "SIGABRT")

    def test_a_killed_worker_is_a_crash(self) -> None:
        """A worker killed from outside (the OOM killer's SIGKILL) is a crash, and the next task runs."""
        got = [r for _, r in run_isolated(act, [("kill", 0), ("ok", 4)], workers=1)]
        assert got == [Failure("crash", "SIGKILL"), 4]

    def test_a_stalled_task_is_killed_at_its_deadline(self) -> None:
        """A task sleeping 60 s under a 1 s budget is a timeout long before the 60 s, and the others finish."""
        started = time.monotonic()
        got = [r for _, r in run_isolated(act, [("sleep", 60), ("ok", 5)], budget=Budget(seconds=1), workers=1)]
        assert got == [Failure("timeout", "1 s"), 5]
        assert time.monotonic() - started < 45  # the sleep alone would take 60

    def test_memory_over_the_budget_is_a_memory_failure(self) -> None:
        """Allocating 2 GB under a 300 MB address-space budget fails in the worker as a memory failure; a small
        allocation after it (in a replaced worker) succeeds."""
        budget = Budget(seconds=60, memory_bytes=300 << 20)
        got = [r for _, r in run_isolated(act, [("alloc", 2048), ("alloc", 8)], budget=budget, workers=1)]
        assert got == [Failure("memory", "MemoryError"), 8 << 20]

    def test_a_loader_exception_is_an_error_with_its_message(self) -> None:
        """An exception becomes a Failure naming its type and message; the worker is reused."""
        got = [r for _, r in run_isolated(act, [("raise", 1), ("pid", 0), ("pid", 0)], workers=1)]
        assert got[0] == Failure("error", "ValueError: no tr above topmost tr (1)")
        assert got[1] == got[2]  # the same worker served both


class TestCleanup:
    def test_no_worker_outlives_the_run(self) -> None:
        """When the results are consumed, every worker has exited."""
        pids = [r for _, r in run_isolated(act, [("pid", 0)] * 4, workers=2)]
        assert all(isinstance(p, int) for p in pids)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in set(pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(p) for p in set(pids))

    def test_stopping_early_stops_the_workers(self) -> None:
        """Closing the results after the first one kills the workers, even one mid-task."""
        results = run_isolated(act, [("pid", 0), ("sleep", 60), ("sleep", 60)], workers=3)
        _, pid = next(results)
        started = time.monotonic()
        results.close()
        assert time.monotonic() - started < 30
        assert isinstance(pid, int)
        assert _gone(pid)

    def test_a_script_without_a_main_guard_is_not_run_again(self, tmp_path: Path) -> None:
        """A user's script calling ingest_path at top level (no ``if __name__ == "__main__"``) runs once: the
        workers are fresh interpreters, not multiprocessing children that re-import the main module."""
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "a.md").write_text("# A\n\nAlpha text here.\n")
        script = tmp_path / "index_docs.py"
        script.write_text(
            textwrap.dedent(
                f"""
                from ragloop.retrievers.ingest import ingest_path
                print("started")
                result = ingest_path({str(docs)!r}, workers=2)
                print("files", result.files)
                """
            )
        )
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["started", "files", "1"]


class TestBudgetBySize:
    def test_a_larger_task_gets_more_time(self) -> None:
        """With seconds per MB, a task's wall budget grows with its size: a 2 s sleep fits a 1 s budget plus
        4 MB at 1 s per MB, and times out without the size."""
        budget = Budget(seconds=1, seconds_per_mb=1.0)
        tasks = [("sleep", 2), ("sleep", 2)]
        sizes = iter([4 << 20, 0])
        got = [r for _, r in run_isolated(act, tasks, budget=budget, workers=1, size=lambda _: next(sizes))]
        assert got == [2, Failure("timeout", "1 s")]
        assert budget.seconds_for(16 << 20) == 17 and Budget(seconds=None).seconds_for(1 << 30) is None
