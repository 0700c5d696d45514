"""A fleet for tests: ``ragloop serve`` replicas (real processes) on one PostgreSQL, and clients that stream.

Each replica is ``python -m ragloop.cli serve --store URL --sessions URL --turn-log URL`` with ``PGAPPNAME`` set
to its name, so ``pg_stat_activity`` tells its connections apart (ragloop's pools name themselves ``ragloop``
only as libpq's fallback). A client turn records what it saw: whether a completion marker arrived (the
``reply`` event, a ``finish_reason`` or ``[DONE]``, ``response.completed``) and how the stream ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_KB = ROOT / "src" / "ragloop" / "data" / "sample_kb"
#: How long a replica may take to answer /healthz after it starts, at load 20 (it imports, opens three pools).
START_S = 180.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name`` (pgserver URLs: ``postgresql://user:@/db?host=/socket``)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def fleet_database(pg_url: str, name: str) -> str:
    """A new database ``name`` holding the sample knowledge base (hash embedder, collection ``kb``); its URL."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name} with (force)")
        conn.execute(f"create database {name}")
    url = with_database(pg_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create extension if not exists vector")
    cmd = [sys.executable, "-m", "ragloop.cli", "index", str(SAMPLE_KB), "--store", url, "--collection", "kb"]
    subprocess.run([*cmd, "--embedder", "hash"], check=True, capture_output=True, text=True, timeout=300)
    return url


def drop_database(pg_url: str, name: str) -> None:
    """Drop ``name`` (connections still open to it are closed)."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name} with (force)")


class Replica:
    """One ``ragloop serve`` process of the fleet (``with Replica(...) as r:``; ``r.url``, ``r.kill()``)."""

    def __init__(self, name: str, db_url: str, env: Mapping[str, str] | None = None, *extra: str) -> None:
        self.name = name
        self.db_url = db_url
        self.env = dict(env or {})
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Replica:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        cmd = [sys.executable, "-m", "ragloop.cli", "serve", "--port", str(self.port), "--no-page"]
        cmd += ["--store", self.db_url, "--collection", "kb", "--sessions", self.db_url, "--turn-log", self.db_url]
        cmd += ["--deadline", "120", *self.extra]
        env = {**base, **self.env, "PGAPPNAME": self.name}
        # Its log to a file, never an undrained pipe: a replica whose warnings filled a pipe's 64 KiB would block
        # in its logging call, its event loop with it.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        deadline = time.monotonic() + START_S
        said = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"replica {self.name} exited: {self.stderr()}")
            try:
                ready = httpx.get(self.url + "/readyz", timeout=5)
                if ready.status_code == 200:
                    return self
                said = ready.text
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"replica {self.name} was not ready within {START_S} s: {said}")

    def kill(self) -> None:
        """SIGKILL: the process dies at once, mid-turn, writing nothing more."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int:
        """SIGTERM and wait (the turn log is flushed, the pools closed); the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return int(self.proc.returncode)

    def stderr(self) -> str:
        """What the process has written to stderr so far."""
        if self.proc is None or self.log.closed:
            return ""
        self.log.seek(0)
        return self.log.read()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        if self.proc is not None:
            self.log.close()


def connections(url: str) -> dict[str, int]:
    """Client connections open to the server now, by ``application_name``."""
    import psycopg

    with psycopg.connect(url, autocommit=True, application_name="fleet-probe") as conn:
        rows = conn.execute(
            "select application_name, count(*) from pg_stat_activity where backend_type = 'client backend' group by 1"
        ).fetchall()
    return {str(name): int(n) for name, n in rows}


class ConnectionPeaks:
    """Samples :func:`connections` in a thread while it runs (``with ConnectionPeaks(url) as peaks:``)."""

    def __init__(self, url: str, every_s: float = 0.05) -> None:
        self.url, self.every_s = url, every_s
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, n in connections(self.url).items():
                self.peak[name] = max(self.peak.get(name, 0), n)
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> ConnectionPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# --- client turns ---------------------------------------------------------------------------------------------


@attrs.define
class Seen:
    """What one client saw of one streamed turn.

    Attributes:
        replica: The replica it was sent to.
        question: The question.
        status: The HTTP status (``0``: no response).
        tokens: Answer text deltas received.
        complete: A completion marker arrived (the protocol's "this reply is whole").
        reply: The client-safe reply (the ``reply`` event / the ``ragloop`` field), when it arrived.
        error: How it failed: an exception's class name, ``HTTP <status>``, or ``error event``.
        response_id: The Responses API id, for ``previous_response_id``.
        endpoint: Which stream it was (``api-chat``, ``completions``, ``responses``, ``ai-sdk``).
    """

    replica: str
    question: str
    endpoint: str = ""
    status: int = 0
    tokens: list[str] = attrs.field(factory=list)
    complete: bool = False
    reply: dict[str, Any] | None = None
    error: str | None = None
    response_id: str | None = None


def _request(endpoint: str, question: str, session: str | None) -> tuple[str, dict[str, Any]]:
    if endpoint == "api-chat":
        body: dict[str, Any] = {"message": question}
        body |= {"session_id": session} if session else {"new_session": True}
        return "/api/chat", body
    if endpoint == "completions":
        body = {"model": "ragloop", "messages": [{"role": "user", "content": question}], "stream": True}
        body |= {"session_id": session} if session else {"new_session": True}
        return "/v1/chat/completions", body
    if endpoint == "responses":
        body = {"model": "ragloop", "input": question, "stream": True}
        return "/v1/responses", body | ({"previous_response_id": session} if session else {})
    assert endpoint == "ai-sdk"
    return "/api/chat?format=ai-sdk", {
        "messages": [{"id": "1", "role": "user", "parts": [{"type": "text", "text": question}]}]
    }


def _event(endpoint: str, name: str, data: str, seen: Seen) -> None:
    """Read one SSE event into ``seen``."""
    if endpoint == "api-chat":
        if name == "token":
            seen.tokens.append(json.loads(data)["text"])
        elif name == "reply":
            seen.reply, seen.complete = json.loads(data), True
        elif name == "error":
            seen.error = "error event"
        return
    if data == "[DONE]":
        seen.complete = True
        return
    obj = json.loads(data)
    if endpoint == "completions":
        if "error" in obj:
            seen.error = "error event"
        for choice in obj.get("choices", []):
            if choice["delta"].get("content"):
                seen.tokens.append(choice["delta"]["content"])
            if choice.get("finish_reason"):
                seen.complete, seen.reply = True, obj.get("ragloop")
    elif endpoint == "responses":
        kind = obj.get("type", "")
        if kind == "response.created":
            seen.response_id = obj["response"]["id"]
        elif kind == "response.output_text.delta":
            seen.tokens.append(obj["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            seen.complete, seen.reply = True, obj["response"].get("ragloop")
        elif kind == "response.failed":
            seen.error = "error event"
    else:
        kind = obj.get("type", "")
        if kind == "text-delta":
            seen.tokens.append(obj["delta"])
        elif kind == "data-ragloop":
            seen.reply = obj["data"]
        elif kind == "finish":
            seen.complete = True
        elif kind == "error":
            seen.error = "error event"


async def stream_turn(
    client: httpx.AsyncClient, replica: str, endpoint: str, question: str, session: str | None, seen: Seen | None = None
) -> Seen:
    """Send one streamed turn and read it to its end, however it ends (an exception is recorded, not raised).

    ``seen`` (new if not given) is filled as the stream arrives, so another task may watch it.
    """
    path, body = _request(endpoint, question, session)
    seen = seen if seen is not None else Seen(replica, question)
    seen.endpoint = endpoint
    try:
        async with client.stream("POST", path, json=body) as r:
            seen.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                seen.error = f"HTTP {r.status_code}"
                return seen
            name = "message"
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    _event(endpoint, name, line.removeprefix("data: "), seen)
                elif not line:
                    name = "message"
    except httpx.HTTPError as exc:
        seen.error = type(exc).__name__
    return seen


#: Questions that carry their session and turn (``S07T2``), so the model's requests and the stored messages
#: can be matched to the client that asked.
def question(session: int, turn: int) -> str:
    """The question of ``turn`` in client session ``session``."""
    topics = ("How do I rotate an API key?", "How much does the Business plan cost per seat?", "How do I set up SSO?")
    return f"S{session:02d}T{turn} {topics[(session + turn) % len(topics)]}"


_TAG = re.compile(r"S\d\dT\d")


def tag(text: str) -> str | None:
    """The ``S07T2`` tag in ``text``, if any."""
    found = _TAG.search(text)
    return found.group(0) if found else None
