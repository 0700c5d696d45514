"""Tests for ragloop.retrievers._threads: blocking work in a daemon thread, awaited and abandoned cleanly."""

from __future__ import annotations

import threading

import anyio
import pytest

from ragloop.retrievers._threads import run_in_daemon_thread

pytestmark = pytest.mark.anyio


class TestRunInDaemonThread:
    async def test_result_and_exception(self) -> None:
        """The function's result comes back; its exception is raised in the caller."""
        assert await run_in_daemon_thread(lambda: 41 + 1, name="t") == 42

        def boom() -> None:
            raise ValueError("bad")

        with pytest.raises(ValueError, match="bad"):
            await run_in_daemon_thread(boom, name="t")

    async def test_runs_in_a_daemon_thread(self) -> None:
        """The work runs in a daemon thread, never the event loop's."""
        seen: list[threading.Thread] = []
        await run_in_daemon_thread(lambda: seen.append(threading.current_thread()), name="ragloop test")
        assert seen[0].daemon and seen[0] is not threading.current_thread() and seen[0].name == "ragloop test"

    async def test_a_deadline_stops_the_wait_not_the_caller(self) -> None:
        """A deadline ends the wait at once even though the thread is stuck; the thread ends when released."""
        release = threading.Event()
        started = anyio.current_time()
        with anyio.move_on_after(0.05):
            await run_in_daemon_thread(release.wait, name="stuck")
        assert anyio.current_time() - started < 1.0
        release.set()
