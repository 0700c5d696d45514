"""benchmarks/bench_prompt_cache.py without a model server: how it reads llama.cpp's log, and its refusal of a
``--before`` that holds no ragloop. (A full run starts llama.cpp and takes minutes; see benchmarks/README.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_prompt_cache  # noqa: E402

LOG = """\
srv  params_from_: Chat format: Content-only
slot launch_slot_: id  0 | task 0 | processing task
slot print_timing: id  0 | task 0 | prompt eval time =     495.82 ms /    43 tokens (   11.53 ms per token,    86.72 tokens per second)
slot print_timing: id  0 | task 0 |        eval time =     816.23 ms /    24 tokens (   35.49 ms per token,    28.18 tokens per second)
slot print_timing: id  0 | task 25 | prompt eval time =    5475.79 ms /   491 tokens (   11.15 ms per token,    89.67 tokens per second)
slot print_timing: id  0 | task 25 |        eval time =    1760.01 ms /    32 tokens (   56.77 ms per token,    17.61 tokens per second)
"""  # noqa: E501


def test_the_server_log_gives_processed_prompt_tokens_their_time_and_requests(tmp_path: Path) -> None:
    """Only ``prompt eval`` lines count (not generation's ``eval time``), from the given byte offset on."""
    log = tmp_path / "server.log"
    log.write_text(LOG, encoding="utf-8")
    tokens, ms, requests = bench_prompt_cache._server_log_tokens(log, 0)
    assert (tokens, requests) == (43 + 491, 2) and abs(ms - (495.82 + 5475.79)) < 1e-6
    second = LOG.index("slot print_timing: id  0 | task 25 | prompt")
    assert bench_prompt_cache._server_log_tokens(log, second)[::2] == (491, 1)


def test_a_before_folder_without_ragloop_is_refused_before_any_server_starts(tmp_path: Path) -> None:
    """``--before`` must be an exported ``src/``: anything else is one usage error, exit 2, no server."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_prompt_cache.py"), "--before", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2 and "--before must be an exported src/" in done.stderr


def test_layout_reports_each_prompts_length_and_shared_prefix(tmp_path: Path) -> None:
    """``--layout`` (no server): per prompt kind and version, its characters and those two requests share; this
    checkout against itself gives equal rows, nearly all of each prompt shared."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_prompt_cache.py"), "--layout", "--before", str(ROOT / "src"),
         "--out", str(tmp_path / "cache.json")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in (tmp_path / "cache-layout.txt").read_text().splitlines() if line[:1] != "#"][1:]
    assert {r[0] for r in rows} == {"grade", "grade_batch", "answer", "decide_json"} and len(rows) == 8
    for before, after in zip(rows[::2], rows[1::2], strict=True):
        assert before[2:] == after[2:] and float(after[4]) > 0.9
