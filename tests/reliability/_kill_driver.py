"""Run ``ragloop index`` in forked children that SIGKILL themselves at chosen filesystem steps.

Used by test_index_durability.py as a subprocess::

    python -m tests.reliability._kill_driver DOCS TRIALS_DIR K1,K2,...

For each ``K``, ``TRIALS_DIR/trial-K/kb`` already holds the previous index; a forked child runs
``ragloop index DOCS --out TRIALS_DIR/trial-K/kb --embedder hash`` and kills itself (SIGKILL, no cleanup, no
``finally``) at its K-th step: a call of ``os.mkdir``, ``os.fsync``, ``os.rename`` or ``shutil.rmtree``. With
``K = 0`` nothing is killed, and the child reports how many steps a whole run takes. One JSON line per trial
goes to stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Any


def _hooked(name: str, real: Callable[..., Any], state: dict[str, int]) -> Callable[..., Any]:
    def step(*args: Any, **kwargs: Any) -> Any:
        state["n"] += 1
        if state["n"] == state["kill_at"]:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    step.__name__ = name
    return step


def main() -> int:
    docs, trials, points = sys.argv[1], sys.argv[2], [int(k) for k in sys.argv[3].split(",")]
    # Import the heavy modules once, before forking, so every child starts its run at once.
    import ragloop.cli
    import ragloop.retrievers.index
    import ragloop.retrievers.ingest

    for k in points:
        out = os.path.join(trials, f"trial-{k}", "kb")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read)
            state = {"n": 0, "kill_at": k}
            os.mkdir = _hooked("mkdir", os.mkdir, state)
            os.fsync = _hooked("fsync", os.fsync, state)
            os.rename = _hooked("rename", os.rename, state)
            shutil.rmtree = _hooked("rmtree", shutil.rmtree, state)  # type: ignore[assignment]
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            status = ragloop.cli.main(["index", docs, "--out", out, "--embedder", "hash"])
            os.write(write, str(state["n"]).encode())
            os._exit(status)
        os.close(write)
        _, wait_status = os.waitpid(pid, 0)
        steps = os.read(read, 64).decode() or None
        os.close(read)
        killed = os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGKILL
        code = None if killed else os.WEXITSTATUS(wait_status)
        print(json.dumps({"k": k, "killed": killed, "exit": code, "steps": steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
