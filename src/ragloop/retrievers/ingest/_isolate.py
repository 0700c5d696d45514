"""Running untrusted work in worker processes, each task under a wall-time and a memory budget.

:func:`run_isolated` calls a module-level function on each task in a pool of worker processes and yields the
results **in task order**. A task that raises, overruns its wall-time budget, runs out of memory or kills its
worker (a native ``abort()``, a segfault, the OOM killer) yields a :class:`Failure` naming what happened; the
pool replaces the worker and goes on. Nothing a task does can end the caller's run or hold it past the budget:

- **Wall time** is enforced by the parent: a worker still busy at its task's deadline is killed (``SIGKILL``),
  so a loader stuck in C code cannot hold it.
- **Memory** is enforced in the worker by ``RLIMIT_AS`` (address space, on POSIX): an allocation past it fails,
  Python raises ``MemoryError`` (reported, and the worker is replaced since its heap may be fragmented), and
  native code that aborts instead is reported as a crash naming the budget.
- Workers are fresh interpreters (``python -c``) talking over their stdin and stdout, never forks of the
  caller, so a caller with threads (an event loop, a model runtime) is safe, and a script that calls this
  without an ``if __name__ == "__main__"`` guard is not run again (as ``multiprocessing`` would). They ignore
  ``SIGINT`` (Ctrl-C reaches the caller, which stops them all), print nowhere, and end when their pipe closes;
  should the caller die mid-task, ``RLIMIT_CPU`` ends a worker stuck in a loader soon after its budget.

At most ``window`` tasks are handed out beyond the oldest unfinished one, so a stalled task holds back a bounded
number of finished results, not the whole run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from attrs import define, frozen

__all__ = ["Budget", "Failure", "default_workers", "run_isolated"]

T = TypeVar("T")
R = TypeVar("R")


@frozen
class Budget:
    """What one task may spend in its worker.

    Attributes:
        seconds: Wall-clock seconds from hand-out to result (``None``: no limit).
        memory_bytes: Address space the worker may map (``RLIMIT_AS``; ``None``: no limit). It counts the
            interpreter and the imported loaders too (about 70 MB).
        seconds_per_mb: Seconds more per MB of a task's size (the ``size`` given to ``run_isolated``): a large
            legitimate file gets longer than a small one that only pretends to be hard work.
    """

    seconds: float | None = 30.0
    memory_bytes: int | None = 512 << 20
    seconds_per_mb: float = 0.0

    def seconds_for(self, size: int) -> float | None:
        """The wall-time budget of a task of ``size`` bytes (``None``: no limit)."""
        if self.seconds is None:
            return None
        return self.seconds + self.seconds_per_mb * size / (1 << 20)


@frozen
class Failure:
    """A task that gave no result.

    Attributes:
        kind: ``"timeout"``, ``"memory"`` (``MemoryError`` in the worker), ``"crash"`` (the worker died:
            a signal or an exit) or ``"error"`` (the function raised).
        detail: The exception (``"ValueError: …"``), the signal (``"SIGABRT"``) or the exit status.
    """

    kind: str
    detail: str


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _worker_main() -> None:  # pragma: no cover — runs in the worker process
    """A worker's entry point: the protocol on stdin/stdout, then :func:`_serve`. Its stdout is moved to a private
    descriptor first, so that nothing a loader prints can corrupt the results."""
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    _serve(Connection(0, writable=False), Connection(out, readable=False))


def _serve(tasks: Connection, replies: Connection) -> None:  # pragma: no cover — runs in the worker process
    """A worker's loop: its first message is ``(fn, memory_bytes)``; then each ``(task, seconds)`` gets
    ``(True, result, False)`` or ``(False, Failure, exits)`` back (``exits``: the worker ends after it, as
    after a ``MemoryError``); ``None`` or a closed pipe ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        fn, memory_bytes = tasks.recv()
    except (EOFError, OSError):
        return
    limits = _limits()
    if memory_bytes is not None and limits is not None:
        with contextlib.suppress(ValueError, OSError):  # a lower hard limit already holds
            limits.setrlimit(limits.RLIMIT_AS, (memory_bytes, memory_bytes))
    while True:
        try:
            message = tasks.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task, seconds = message
        if seconds is not None and limits is not None:
            # A backstop should the caller die mid-task: CPU time past the wall budget ends the worker.
            used = limits.getrusage(limits.RUSAGE_SELF)
            spent = int(used.ru_utime + used.ru_stime)
            with contextlib.suppress(ValueError, OSError):
                limits.setrlimit(limits.RLIMIT_CPU, (spent + int(seconds) + 5, limits.RLIM_INFINITY))
        fatal = False
        try:
            reply: tuple[bool, Any] = (True, fn(task))
        except MemoryError:
            reply, fatal = (False, Failure("memory", "MemoryError")), True
        except Exception as exc:  # noqa: BLE001 — whatever a task raises is its own result
            reply = (False, Failure("error", f"{type(exc).__name__}: {exc}"[:500]))
        except BaseException as exc:  # noqa: BLE001 — SystemExit and the like from a loader end the worker
            reply, fatal = (False, Failure("error", f"{type(exc).__name__}: {exc}"[:500])), True
        try:
            replies.send((*reply, fatal))
        except MemoryError:
            replies.send((False, Failure("memory", "MemoryError while sending the result"), True))
            fatal = True
        except Exception as exc:  # noqa: BLE001 — a result that cannot be pickled
            failure = Failure("error", f"cannot send the result ({type(exc).__name__}: {exc})"[:500])
            replies.send((False, failure, fatal))
        del reply
        if fatal:
            return


def _limits() -> Any:
    try:
        import resource
    except ImportError:  # no rlimits here (Windows): the wall-time budget still holds
        return None
    return resource


@define
class _Worker:
    process: subprocess.Popen[bytes]
    tasks: Connection
    replies: Connection
    index: int = -1
    deadline: float = float("inf")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self.tasks.close()
        self.replies.close()


def _spawn(fn: Callable[[Any], Any], budget: Budget) -> _Worker:
    """Start a worker: a fresh interpreter (never a fork of this process, whatever its threads hold) with this
    process's import path, told which function to run and its budget."""
    code = f"import sys; sys.path[:] = {sys.path!r}; from {__name__} import _worker_main; _worker_main()"
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    assert process.stdin is not None and process.stdout is not None
    tasks = Connection(os.dup(process.stdin.fileno()), readable=False)
    replies = Connection(os.dup(process.stdout.fileno()), writable=False)
    process.stdin.close()
    process.stdout.close()
    worker = _Worker(process, tasks, replies)
    with contextlib.suppress(OSError):  # it died at once: its first task finds out
        tasks.send((fn, budget.memory_bytes))
    return worker


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def run_isolated(  # noqa: C901, PLR0912, PLR0915 — one scheduling loop, kept whole so its invariants read together
    fn: Callable[[T], R],
    tasks: Iterable[T],
    *,
    budget: Budget = Budget(),
    workers: int | None = None,
    window: int | None = None,
    size: Callable[[T], int] | None = None,
) -> Iterator[tuple[T, R | Failure]]:
    """Call ``fn(task)`` for each task in worker processes; yield ``(task, result or Failure)`` in task order.

    Args:
        fn: A module-level function (workers import it by name); its arguments and results are pickled.
        tasks: The tasks, read as the pool needs them.
        budget: Wall time and memory per task (:class:`Budget`).
        workers: Worker processes (default :func:`default_workers`; fewer when there are fewer tasks).
        window: Most tasks handed out past the oldest unfinished one (default ``4 * workers``).
        size: A task's size in bytes, for :attr:`Budget.seconds_per_mb` (default: every task 0).

    Yields:
        Each task with its result, or with a :class:`Failure` (see the module docstring).
    """
    most = max(1, workers if workers is not None else default_workers())
    ahead = max(most, window if window is not None else 4 * most)
    source = iter(tasks)
    queued: dict[int, T] = {}
    allowed: dict[int, float | None] = {}  # each handed-out task's wall-time budget
    done: dict[int, R | Failure] = {}
    pool: list[_Worker] = []
    idle: list[_Worker] = []
    handed = 0  # tasks read from ``source``
    emitted = 0
    exhausted = False

    def start() -> _Worker:
        worker = _spawn(fn, budget)
        pool.append(worker)
        return worker

    def retire(worker: _Worker, outcome: R | Failure) -> None:
        done[worker.index] = outcome
        worker.index, worker.deadline = -1, float("inf")

    def replace(worker: _Worker) -> None:
        worker.kill()
        pool.remove(worker)

    try:
        while True:
            while not exhausted and handed < emitted + ahead and (idle or len(pool) < most):
                try:
                    task = next(source)
                except StopIteration:
                    exhausted = True
                    break
                worker = idle.pop() if idle else start()
                queued[handed] = task
                limit = budget.seconds_for(size(task) if size is not None else 0)
                allowed[handed] = limit
                try:
                    worker.tasks.send((task, limit))
                except (OSError, ValueError):  # it died before the task reached it: never blame the task
                    replace(worker)
                    worker = start()
                    try:
                        worker.tasks.send((task, limit))
                    except (OSError, ValueError) as exc:
                        worker.index = handed
                        retire(worker, Failure("crash", f"no worker could be started ({exc})"))
                        replace(worker)
                        handed += 1
                        continue
                worker.index = handed
                worker.deadline = time.monotonic() + limit if limit is not None else float("inf")
                handed += 1
            while emitted in done:
                allowed.pop(emitted, None)
                yield queued.pop(emitted), done.pop(emitted)
                emitted += 1
            if exhausted and emitted == handed:
                return
            busy = [w for w in pool if w.index >= 0]
            if not busy:
                continue
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = set(wait([w.replies for w in busy], timeout))
            now = time.monotonic()
            for worker in busy:
                if worker.replies in ready:
                    try:
                        _, value, exits = worker.replies.recv()
                    except (EOFError, OSError):
                        pass  # it died: handled below
                    except Exception as exc:  # noqa: BLE001 — a result that cannot be unpickled
                        retire(worker, Failure("error", f"cannot read the result ({type(exc).__name__}: {exc})"))
                        replace(worker)
                        continue
                    else:
                        retire(worker, value)
                        if exits:
                            replace(worker)  # it ends after a MemoryError or a SystemExit
                        else:
                            idle.append(worker)
                        continue
                if worker.replies in ready:  # its pipe closed without a result: it died
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        worker.process.wait(5)
                    retire(worker, Failure("crash", _signal_name(worker.process.returncode)))
                    replace(worker)
                elif now >= worker.deadline:
                    retire(worker, Failure("timeout", f"{allowed[worker.index]:.3g} s"))
                    replace(worker)
    finally:
        for worker in pool:
            if worker.index < 0 and worker.process.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    worker.tasks.send(None)
        for worker in pool:
            if worker.index < 0:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(1)
            worker.kill()
