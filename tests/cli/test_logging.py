"""The command's logging: one short redacted line per failure, no locals, storms counted, stderr never blocks."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog

from ragloop.cli._logging import (
    BackgroundWriter,
    RedactingFilter,
    StormLimit,
    configure,
    describe_exception,
    redact_line,
    short_exception,
)
from tests.retrievers.conftest import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]

URL = "postgresql://ragloop:S3cret-Passw0rd@db.internal:5432/kb"


def _failure() -> BaseException:
    def connect(conninfo: str) -> None:
        password = "S3cret-Passw0rd"  # a local variable a rich traceback would print
        raise OSError(f"connection to {conninfo} failed (password={password})")

    try:
        try:
            connect(URL)
        except OSError as exc:
            raise RuntimeError("the knowledge store is unavailable") from exc
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


class TestDescribeException:
    def test_one_line_with_the_raising_frame_and_the_cause_and_no_secret(self) -> None:
        """Type: message (at file:line in function); caused by …, redacted, on one line."""
        text = describe_exception(_failure())
        assert text.startswith("RuntimeError: the knowledge store is unavailable (at test_logging.py:")
        assert "; caused by OSError: connection to postgresql://***@db.internal" in text and "in connect)" in text
        assert "S3cret" not in text and "\n" not in text

    def test_a_message_of_a_megabyte_is_cut(self) -> None:
        """The description is bounded whatever the exception says."""
        assert len(describe_exception(ValueError("x" * 1_000_000))) < 700


class TestStormLimit:
    def test_a_storm_is_dropped_after_the_burst_and_counted_on_the_next_line(self) -> None:
        """burst events of one kind per window; the rest dropped and counted; the next window says how many."""
        now = [0.0]
        limit = StormLimit(burst=2, window_s=10, clock=lambda: now[0])

        def passes(event: str, error: BaseException | None = None) -> dict[str, Any] | None:
            values: dict[str, Any] = {"event": event, "logger": "ragloop.serve"}
            if error is not None:
                values["exc_info"] = error
            try:
                return dict(limit(None, "error", values))
            except structlog.DropEvent:
                return None

        seen = [passes("search failed", OSError()) for _ in range(50)]
        assert sum(s is not None for s in seen) == 2 and limit.dropped == 48
        assert passes("search failed", ValueError()) is not None  # another error type: another kind
        assert passes("other event") is not None
        now[0] = 11.0
        after = passes("search failed", OSError())
        assert after is not None and after["suppressed"] == 48
        now[0] = 30.0
        again = passes("search failed", OSError())
        assert again is not None and "suppressed" not in again


class TestPipeline:
    def test_the_configured_pipeline_prints_one_short_redacted_line_per_failure(self) -> None:
        """Through configure(): log.exception with a password in the message, the context and a local gives
        one line, no traceback, no local, no password."""
        out = io.StringIO()
        undo = configure()
        assert undo is not None
        try:
            logger_factory = structlog.PrintLoggerFactory(out)
            structlog.configure(logger_factory=logger_factory)
            log = structlog.get_logger("ragloop.serve")
            try:
                raise _failure()
            except RuntimeError:
                log.exception("search failed", store=URL, token="Bearer abcdefghijklmnop")
        finally:
            undo()
        text = out.getvalue()
        assert text.count("\n") == 1 and "Traceback" not in text and "S3cret" not in text, text
        assert "abcdefghijklmnop" not in text and "error='RuntimeError: the knowledge store" in text

    def test_redact_line_redacts_whatever_the_renderer_made(self) -> None:
        """The last processor's output is redacted even when a value was not a string (a repr)."""

        class Conn:
            def __repr__(self) -> str:
                return f"<Conn {URL}>"

        render = redact_line(structlog.processors.KeyValueRenderer())
        line = render(None, "error", {"event": "x", "conn": Conn()})
        assert "S3cret" not in line and "***@db.internal" in line

    def test_short_exception_replaces_exc_info_with_one_field(self) -> None:
        """exc_info goes; error carries the description (appended to an error field already there)."""
        event = short_exception(None, "error", {"event": "x", "exc_info": _failure(), "error": "first"})
        assert "exc_info" not in event and str(event["error"]).startswith("first; RuntimeError:")


class TestRedactingFilter:
    def test_a_stdlib_record_is_redacted_shortened_and_storms_dropped(self) -> None:
        """A library's logger.exception with a URL in its message: one redacted line, no traceback; the same
        record 20 times: 5 pass."""
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.addFilter(RedactingFilter(burst=5))
        logger = logging.getLogger("tests.cli.redacting")
        logger.addHandler(handler)
        logger.propagate = False
        try:
            for _ in range(20):
                try:
                    raise _failure()
                except RuntimeError:
                    logger.exception("session %s crashed on %s", "abc", URL)
        finally:
            logger.removeHandler(handler)
        lines = out.getvalue().splitlines()
        assert len(lines) == 5 and "S3cret" not in out.getvalue() and "Traceback" not in out.getvalue()
        assert "postgresql://***@db.internal" in lines[0] and "(RuntimeError: the knowledge store" in lines[0]


class TestBackgroundWriter:
    def test_a_stderr_that_never_drains_does_not_block_the_writer(self) -> None:
        """A stuck output: write returns at once, lines beyond the queue are dropped and counted."""
        release = threading.Event()

        class Stuck(io.StringIO):
            def write(self, text: str) -> int:
                release.wait(30)
                return len(text)

        writer = BackgroundWriter(Stuck(), max_lines=10)
        started = time.monotonic()
        for _ in range(1_000):
            writer.write("line\n")
        took = time.monotonic() - started
        release.set()
        writer.close()
        assert writer.dropped >= 1_000 - 11 and took < 25  # far under the 30 s a blocking write would take


_PASSWORD = "Wall-S3cret-pw"
_PROBE_TIMEOUT_S = 5.0


class TestServeUnderAnOutage:
    def test_healthz_answers_and_the_log_holds_no_password_while_the_store_is_down(
        self, pg_url: str, tmp_path: Path
    ) -> None:
        """`ragloop serve --store URL --sessions URL`, the URL carrying a password; the database goes down; MCP
        searches and chat completions keep coming. Every /healthz probe answers within the probe's own timeout,
        and the serve log holds no password, no traceback and no storm (before: rich tracebacks with locals,
        the password in clear)."""
        import anyio
        import httpx
        import psycopg

        name = f"logwall_{os.getpid()}"
        parts = urlsplit(pg_url)
        user = parts.netloc.split(":")[0].split("@")[0]
        url = urlunsplit((parts.scheme, f"{user}:{_PASSWORD}@{parts.netloc.split('@')[-1]}", "/" + name,
                          parts.query, ""))  # fmt: skip
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"drop database if exists {name} with (force)")
            conn.execute(f"create database {name}")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("create extension if not exists vector")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        kb = Path(__file__).resolve().parents[2] / "src" / "ragloop" / "data" / "sample_kb"
        cli = [sys.executable, "-m", "ragloop.cli"]
        index = [*cli, "index", str(kb), "--store", url, "--collection", "served", "--embedder", "hash"]
        done = subprocess.run(index, env=env, capture_output=True, text=True, check=False, timeout=300)
        assert done.returncode == 0, done.stderr
        port = _free_port()
        log_path = tmp_path / "serve.log"
        serve = [*cli, "serve", "--store", url, "--collection", "served", "--sessions", url, "--port", str(port)]
        probes: list[tuple[int, float]] = []
        failures: list[str] = []
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([*serve, "--no-plan"], env=env, stdout=log_file, stderr=log_file, text=True)
            base = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 120
                while True:
                    assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    try:
                        httpx.get(base + "/healthz", timeout=1)
                        break
                    except httpx.TransportError:
                        time.sleep(0.2)
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute(f"alter database {name} with allow_connections false")
                    conn.execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = %s", (name,))
                anyio.run(_load, base, probes, failures)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute(f"drop database if exists {name} with (force)")
        log = log_path.read_text()
        assert probes and all(status == 200 for status, _ in probes), probes
        assert max(took for _, took in probes) < _PROBE_TIMEOUT_S, (probes, failures)
        assert _PASSWORD not in log, log[:3000]
        assert "Traceback" not in log and "locals" not in log, log[:3000]
        assert failures.count("503") == 12 and len(failures) == 16, failures
        # 14 failing turns and their 5 s search timeouts: at most burst (5) lines of each, the rest counted
        assert log.count("knowledge base unavailable") <= 5 and log.count("query.failed") <= 5, log[:3000]
        assert log.count("Task was destroyed") <= 5, log[:3000]
        assert "repeated log lines were suppressed" in log, log[-3000:]


async def _load(base: str, probes: list[tuple[int, float]], failures: list[str]) -> None:
    """Two MCP clients searching, two asking and four chat clients asking three times, while /healthz is probed.

    (Searches over a store that is down wait out the store's pool timeout one after another, 10 s each: few.)
    """
    import anyio
    import httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    done = anyio.Event()

    async def probe() -> None:
        async with httpx.AsyncClient(timeout=_PROBE_TIMEOUT_S) as http:
            while not done.is_set():
                started = time.monotonic()
                try:
                    r = await http.get(base + "/healthz")
                    probes.append((r.status_code, time.monotonic() - started))
                except httpx.TimeoutException:
                    probes.append((0, time.monotonic() - started))
                await anyio.sleep(0.1)

    async def mcp(tool: str) -> None:
        arguments = {"query" if tool == "search" else "question": "What does the audit log record?"}
        async with (
            httpx.AsyncClient(timeout=60) as http,
            Client(streamable_http_client(base + "/mcp", http_client=http)) as client,
        ):
            try:
                result = await client.call_tool(tool, arguments)
                failures.append(f"mcp {tool}: error={result.is_error}")
            except Exception as exc:  # noqa: BLE001 — an outage may surface as a tool error or a protocol one
                failures.append(f"mcp {tool}: {type(exc).__name__}")

    async def chat() -> None:
        body = {"model": "ragloop", "messages": [{"role": "user", "content": "What does the audit log record?"}]}
        async with httpx.AsyncClient(timeout=60) as http:
            for _ in range(3):
                r = await http.post(base + "/v1/chat/completions", json=body)
                failures.append(str(r.status_code))

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        async with anyio.create_task_group() as load:
            for tool in ("search", "search", "ask", "ask"):
                load.start_soon(mcp, tool)
            for _ in range(4):
                load.start_soon(chat)
        done.set()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
