"""Tasks for the worker-pool tests (tests/retrievers/test_ingest_isolate.py): module-level, so a worker imports
them by name, and light to import."""

from __future__ import annotations

import os
import signal
import sys
import time


def echo(task: object) -> object:
    """Return the task."""
    return task


def act(task: tuple[str, int]) -> object:
    """Behave as the task says: ``("ok", n)`` returns n, ``("sleep", s)`` sleeps, ``("abort", _)`` calls
    ``os.abort()`` (a native crash), ``("raise", _)`` raises, ``("alloc", mb)`` allocates, ``("print", n)``
    writes to stdout and stderr, ``("exit", code)`` calls ``sys.exit``, ``("kill", _)`` SIGKILLs itself,
    ``("pid", _)`` returns the worker's pid."""
    what, n = task
    if what == "sleep":
        time.sleep(n)
    elif what == "abort":
        os.abort()
    elif what == "raise":
        raise ValueError(f"no tr above topmost tr ({n})")
    elif what == "alloc":
        block = bytearray(n << 20)
        return len(block)
    elif what == "print":
        print("noise on stdout " * n)
        os.write(1, b"raw noise on fd 1\n")
        print("noise on stderr", file=sys.stderr)
    elif what == "exit":
        sys.exit(n)
    elif what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "pid":
        return os.getpid()
    return n
