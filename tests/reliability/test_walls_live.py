"""Hostile suite for live sources (issue 20, item 6): a hung database, a process that must exit, and IDOR.

On the code before this suite: a ticket source whose database hung stayed dead after the database came back
(every lookup timed out for good), a process with a hung lookup could not exit (still running 8 s after its
main function returned, for minutes in the attack run), and a lookup without a caller organisation (the live
node, the plan node, ``ragloop ask --tickets``) showed any organisation's ticket.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from ragloop.errors import LiveSourceError, SourceError
from ragloop.retrievers.live import SQLiteTicketSource, default_tickets_path
from ragloop.retrievers.sources import LiveLookupSource
from ragloop.state import Caller
from tests.reliability._support import count, offline_rag

pytestmark = pytest.mark.anyio

#: Ticket #1234 belongs to Cedar & Finch Architects; Granite Peak Outdoors is another organisation.
OWNER, OTHER = Caller(tenant="Cedar & Finch Architects"), Caller(tenant="Granite Peak Outdoors")
QUESTION = "What is the status of ticket #1234?"


def _release(fifo: Path) -> None:
    """Open the FIFO for writing and close it, so every open() stuck on it returns and its thread ends."""
    for _ in range(32):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        os.close(fd)


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[Path]:
    """A path whose 'database' never answers (a FIFO: opening it blocks); released at the end."""
    fifo = tmp_path / "tickets.sqlite"
    os.mkfifo(fifo)
    try:
        yield fifo
    finally:
        old = tmp_path / "hung.fifo"
        if old.exists():
            _release(old)
        if fifo.exists() and not fifo.is_file():
            _release(fifo)


def _recover(path: Path) -> None:
    """The database comes back: a real file replaces the hung one (threads stuck on the old one stay stuck)."""
    os.link(path, path.with_name("hung.fifo"))
    good = path.with_name("good.sqlite")
    shutil.copyfile(default_tickets_path(), good)
    os.replace(good, path)


class TestHungDatabaseRecovers:
    async def test_the_source_comes_back_once_the_database_does(self, hung: Path) -> None:
        """Lookups against a hung database time out and open the breaker (then fail at once); when the database
        is back, the probe after the cool-down succeeds and lookups work again (on main: dead for good)."""
        source = SQLiteTicketSource(hung, timeout_s=0.2, max_concurrency=2, cooldown_s=0.5)
        for _ in range(3):
            with pytest.raises(LiveSourceError, match=r"took longer than 0\.2s"):
                await source.lookup("#1234", ["1234"], caller=OWNER)
        assert source.breaker.state == "open"
        threads = threading.active_count()
        with pytest.raises(LiveSourceError, match=r"failed 3 time\(s\) in a row and is not asked for now"):
            await source.lookup("#1234", ["1234"], caller=OWNER)
        assert threading.active_count() == threads  # fails at once: no thread, no wait on the hung database
        _recover(hung)
        back = None
        with anyio.fail_after(5):
            while back is None:
                try:
                    back = await source.lookup("#1234", ["1234"], caller=OWNER)
                except LiveSourceError:
                    await anyio.sleep(0.05)
        assert [r.id for r in back] == ["1234"] and source.breaker.state == "closed"
        count("live_recovered_after_hang")

    async def test_a_failed_probe_waits_longer(self, hung: Path) -> None:
        """A probe into a database still hung fails and opens the breaker again for twice as long."""
        source = SQLiteTicketSource(hung, timeout_s=0.1, failure_threshold=1, cooldown_s=0.2)
        with pytest.raises(LiveSourceError):
            await source.lookup("#1234", ["1234"], caller=OWNER)
        await anyio.sleep(0.25)
        with pytest.raises(LiveSourceError, match="took longer"):  # the probe
            await source.lookup("#1234", ["1234"], caller=OWNER)
        await anyio.sleep(0.25)  # less than the doubled cool-down
        with pytest.raises(LiveSourceError, match="not asked for now"):
            await source.lookup("#1234", ["1234"], caller=OWNER)
        assert source.breaker.opened == 2

    async def test_stuck_threads_stay_bounded(self, hung: Path) -> None:
        """200 concurrent lookups into a hung database leave at most max_concurrency + max_stuck threads."""
        source = SQLiteTicketSource(hung, timeout_s=0.05, max_concurrency=4, cooldown_s=0.05)
        before = threading.active_count()
        peak = 0

        async def one() -> None:
            nonlocal peak
            with pytest.raises(LiveSourceError):
                await source.lookup("#1234", ["1234"], caller=OWNER)
            peak = max(peak, threading.active_count() - before)

        for _ in range(4):  # several rounds, probes included
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(one)
            await anyio.sleep(0.06)
        assert peak <= source.max_concurrency + source.max_stuck, peak
        count("live_peak_threads_hung", peak)


_HUNG_PROCESS = """
    import sys, time
    import anyio
    from ragloop.errors import LiveSourceError
    from ragloop.retrievers.live import SQLiteTicketSource
    from ragloop.state import Caller

    async def main():
        source = SQLiteTicketSource({path!r}, timeout_s={timeout})
        async with anyio.create_task_group() as tg:
            async def lookup():
                try:
                    await source.lookup("#1234", ["1234"], caller=Caller(tenant="x"))
                except LiveSourceError:
                    pass
            for _ in range(3):
                tg.start_soon(lookup)
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()  # {how}
        await source.aclose()

    anyio.run(main)
    print(time.monotonic(), flush=True)  # asked to exit
"""


class TestProcessExits:
    @pytest.mark.parametrize(
        ("timeout", "how"),
        [(0.1, "lookups already timed out and abandoned"), (60.0, "lookups still waiting, cancelled")],
    )
    def test_a_process_with_hung_lookups_exits_within_a_second(self, hung: Path, timeout: float, how: str) -> None:
        """The process returns from its main function with lookups stuck in the database and is gone within a
        second (on main it was still running 8 s later: anyio's worker threads are not daemon threads)."""
        script = textwrap.dedent(_HUNG_PROCESS.format(path=str(hung), timeout=timeout, how=how))
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("the process did not exit")
        ended = time.monotonic()
        asked = float(out.strip().splitlines()[-1])
        assert proc.returncode == 0
        # The lookups hang for good (a FIFO) or for 60 s: a process that waited for them would take that long, so
        # 10 s (interpreter shutdown on a machine at load 20 included) still shows it did not wait.
        assert ended - asked < 10.0, ended - asked
        count("live_exit_seconds_after_ask", round(ended - asked, 3))

    async def test_aclose_never_waits_on_a_stuck_lookup(self, hung: Path) -> None:
        """aclose returns at once while a lookup is stuck in the database."""
        source = SQLiteTicketSource(hung, timeout_s=0.1)
        with pytest.raises(LiveSourceError):
            await source.lookup("#1234", ["1234"], caller=OWNER)
        # The lookup's thread is stuck in the FIFO for good: a close that waited for it would never return, so any
        # finite bound shows it does not wait; 5 s leaves room for a machine at load 20.
        with anyio.fail_after(5):
            await source.aclose()


class TestOnlyTheCallersTickets:
    async def test_live_node(self) -> None:
        """Through the chat (live node): the owner sees #1234; another organisation, a caller with a user but no
        organisation, and no caller at all get no ticket (on main the last two saw it)."""
        source = SQLiteTicketSource()
        rag = offline_rag(live_sources=[source])
        own = await rag.ask(QUESTION, caller=OWNER)
        assert [lk.accepted for lk in own.record.live] == [("1234",)]
        for caller in (OTHER, Caller(user="u1"), None):
            reply = await rag.ask(QUESTION, caller=caller)
            assert all(not lk.accepted for lk in reply.record.live), caller
            assert not any(c.source.endswith("/tickets/1234") for c in reply.citations), caller
        anonymous = await rag.ask(QUESTION)
        assert "shown only to their organisation" in str(anonymous.record.live[0].error)
        await rag.aclose()

    async def test_plan_node(self) -> None:
        """Through the plan node's scoping: the owner's ticket only, nothing for another organisation or nobody."""
        from ragloop.nodes.plan import _for_turn

        tickets = SQLiteTicketSource()
        plan_sources = {"tickets": LiveLookupSource(tickets)}
        own = await _for_turn(plan_sources, OWNER, {})["tickets"].run("ticket #1234", {"ids": ("1234",)})
        assert [h.id for h in own.hits] == ["tickets:1234"]
        other = await _for_turn(plan_sources, OTHER, {})["tickets"].run("ticket #1234", {"ids": ("1234",)})
        assert other.hits == ()
        with pytest.raises(SourceError, match="shown only to their organisation"):
            await _for_turn(plan_sources, None, {})["tickets"].run("ticket #1234", {"ids": ("1234",)})
        await tickets.aclose()

    @pytest.mark.parametrize(
        ("org", "shown"), [(None, False), ("Granite Peak Outdoors", False), ("Cedar & Finch Architects", True)]
    )
    def test_cli_ask_with_tickets(
        self,
        org: str | None,
        shown: bool,
        tmp_path: Path,
        sample_cache: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """``ragloop ask --tickets DB``: only with ``--org`` of the ticket's organisation is the ticket shown;
        without ``--org`` none is, and stderr says why (on main, without --org, any ticket was shown)."""
        from ragloop.cli import main

        db = tmp_path / "tickets.sqlite"
        shutil.copyfile(default_tickets_path(), db)
        argv = ["ask", QUESTION, "--json", "--tickets", str(db), "--cache-dir", str(sample_cache), "--no-plan"]
        assert main(argv + (["--org", org] if org else [])) == 0
        captured = capsys.readouterr()
        reply = json.loads(captured.out)
        cited = any(c["source"].endswith("/tickets/1234") for c in reply["citations"])
        assert cited is shown and [lk["accepted"] for lk in reply["record"]["live"]] == [["1234"] if shown else []]
        assert ("no --org" in captured.err) is (org is None)
