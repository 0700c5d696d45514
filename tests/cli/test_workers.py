"""``ragloop serve --workers N``: worker processes on one port, restarted when they die, all stopped by one signal.

Real processes; the bounds are waits for events the test causes (a process appears, exits, a request arrives),
each allowed minutes at load 20, never a speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from ragloop.testing import ScriptedOpenAIServer, reply
from tests.reliability._fleet import free_port
from tests.serve.conftest import sse_events

pytestmark = pytest.mark.anyio

_WAIT_S = 180.0


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _sockets(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            out.add(target)
    return out


def _until(check: object, what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {_WAIT_S} s: {what}")


@contextmanager
def _serve(
    workers: int, sample_cache: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
    cmd = [sys.executable, "-m", "ragloop.cli", "serve", "--workers", str(workers), "--port", str(port)]
    cmd += ["--cache-dir", str(sample_cache), "--no-live", "--no-plan", "--no-page"]
    proc = subprocess.Popen(cmd, env={**base_env, **(env or {})}, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                return (
                    httpx.get(base + "/healthz", timeout=5).status_code == 200 and len(_children(proc.pid)) == workers
                )
            except httpx.TransportError:
                return False

        _until(up, "the workers answer")
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


class TestWorkers:
    async def test_workers_share_one_socket_and_one_signal_stops_them_all(self, sample_cache: Path) -> None:
        """Two workers hold the supervisor's listening socket; SIGTERM while a turn waits on the model: the turn's
        stream ends with the shutting_down error event, every worker exits and the supervisor exits 0."""
        async with ScriptedOpenAIServer(script=[reply("never sent").delayed(60.0)]) as model:
            env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "unused", "RAGLOOP_MODEL": "m"}
            with _serve(2, sample_cache, env) as (proc, base):
                workers = _children(proc.pid)
                shared = _sockets(proc.pid)
                for pid in workers:
                    shared &= _sockets(pid)
                assert len(workers) == 2 and shared, workers  # the listening socket is in all three
                async with (
                    httpx.AsyncClient(base_url=base, timeout=120) as client,
                    client.stream("POST", "/api/chat", json={"message": "How do I rotate an API key?"}) as r,
                ):
                    await model.wait_for_requests(1, timeout_s=_WAIT_S)
                    proc.send_signal(signal.SIGTERM)
                    body = "".join([chunk async for chunk in r.aiter_text()])
                code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=_WAIT_S))
                err = proc.stderr.read() if proc.stderr else ""
        assert code == 0, err
        name, data = sse_events(body)[-1]
        assert name == "error" and json.loads(data)["error"]["code"] == "shutting_down", body
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        assert "Traceback" not in err, err

    def test_a_killed_worker_is_started_again(self, sample_cache: Path) -> None:
        """SIGKILL one of two workers: the supervisor starts a new one, the port keeps answering, and SIGTERM then
        stops both (exit 0)."""
        with _serve(2, sample_cache) as (proc, base):
            first, second = _children(proc.pid)
            os.kill(first, signal.SIGKILL)
            _until(lambda: len(now := _children(proc.pid)) == 2 and first not in now, "a new worker")
            assert second in _children(proc.pid)
            _until(lambda: httpx.get(base + "/healthz", timeout=5).status_code == 200, "the port answers")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(_WAIT_S) == 0

    @pytest.mark.parametrize("bad", ["0", "65", "two"])
    def test_a_bad_number_of_workers_is_refused(self, bad: str) -> None:
        """--workers 0, 65 or 'two' is exit 2 with one line naming the range, before anything starts."""
        done = subprocess.run(
            [sys.executable, "-m", "ragloop.cli", "serve", "--workers", bad],
            capture_output=True,
            text=True,
            timeout=_WAIT_S,
        )
        assert done.returncode == 2
        assert "from 1 to 64" in done.stderr
