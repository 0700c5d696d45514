"""Blocking work in a daemon thread of its own, awaited without holding the process hostage.

AnyIO's worker threads are not daemon threads: one stuck in a system call that never returns (a database file
on a hung network mount, a FIFO where a file should be) keeps the interpreter from exiting, and a cancelled
``to_thread.run_sync`` without ``abandon_on_cancel`` waits for it. :func:`run_in_daemon_thread` starts a
daemon thread per call and polls for its end, so a cancel or a deadline stops the wait at once and the process
can always exit; the caller bounds how many such threads may be left behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

#: Polling starts at this interval (seconds) and doubles up to :data:`_SLOWEST`.
_FASTEST, _SLOWEST = 0.0005, 0.02


async def run_in_daemon_thread(fn: Callable[[], T], *, name: str) -> T:
    """``fn()`` in a new daemon thread; its result or its exception. Cancelling stops waiting (the thread is
    left to finish on its own and can never keep the process alive)."""
    done = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def target() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting task, which raises it
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    delay = _FASTEST
    while not done.is_set():
        await anyio.sleep(delay)
        delay = min(delay * 2, _SLOWEST)
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
