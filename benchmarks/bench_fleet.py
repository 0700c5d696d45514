"""A fleet under load: N ``ragloop serve`` replicas on one PostgreSQL, C concurrent clients, then one replica killed.

It starts a PostgreSQL (``pgserver``, or the server of ``--db``), indexes the bundled sample knowledge base into it
(hash embedder), and starts ``--replicas`` real ``ragloop serve`` processes with ``--store``, ``--sessions`` and
``--turn-log`` all on that database, each with ``PGAPPNAME=fleet-<i>`` so ``pg_stat_activity`` tells their
connections apart. The judges are the OpenAI ones against the simulated model of ``_sim.py`` (a child process:
decide 200 ms, grade 150 ms, answer 300 ms to the first token then 10 ms per token; ``--setup offline``: no model).

``--clients`` clients start together; client *i* speaks one endpoint — ``/api/chat`` with a session, streamed chat
completions with a session, streamed ``/v1/responses`` chained by ``previous_response_id``, the AI SDK stream, or
MCP ``ask`` (``i mod 5``) — and sends ``--turns`` questions in a row, turn *t* to replica ``(i + t) mod N``: every
turn after the first continues, on another replica, a conversation started elsewhere.

Two phases, each on fresh replicas: ``steady``, then ``kill``: once half the phase's turns have ended, replica 0
gets ``SIGKILL``; a client whose turn it cut (or that finds it gone) retries that turn once on the next live replica
and sends the rest there. Per phase it reports turns/s, p50/p95 time to first token and to the last, errors by kind,
each replica's CPU (``/proc``) and the turns it answered, and the database connections of each replica (peak open,
peak active, sampled every 100 ms), with the 1-minute load average at the start and the end of the phase. After the
kill it checks what the fleet promises (docs/serving.md, "Running a fleet"): no cut stream carried a completion
marker, every acknowledged turn is in its stored session, no session holds half a turn, no turn-log row is
duplicated; the counts of violations are in the report.

Clients, replicas, model and database share the machine's cores; on a shared machine the load average says how much
else ran. It asserts nothing; it writes ``benchmarks/results/bench_fleet.json`` and ``.txt``. Every phase is bounded
(``--phase-limit`` seconds, then the clients still running are cancelled and counted).

Usage: ``python benchmarks/bench_fleet.py [--replicas 2] [--clients 200] [--turns 2] [--setup scripted]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).parent))
import _sim

from ragloop.retrievers.evaluate import percentile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SAMPLE_KB = ROOT / "src" / "ragloop" / "data" / "sample_kb"
ENDPOINTS = ("api-chat", "completions", "responses", "ai-sdk", "mcp")
QUESTIONS = (
    "How much does the Business plan cost per seat?",
    "Compare the plan pricing and how to set up SSO with SAML.",
    "Does Lumen have a Salesforce connector?",
    _sim.fanout_question(2),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


# --- the database ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def database(given: str | None) -> Any:
    """A server URL: ``given``, or a pgserver in a temporary folder, stopped and removed afterwards."""
    if given:
        yield given
        return
    import pgserver

    root = Path(tempfile.mkdtemp(prefix="bench-fleet-pg-"))
    root.chmod(0o755)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(root / "data", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(server_url: str, name: str) -> str:
    """Database ``name`` (re-created) holding the sample knowledge base in collection ``kb``; its URL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"drop database if exists {name} with (force)")
        conn.execute(f"create database {name}")
    parts = urlsplit(server_url)
    url = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("create extension if not exists vector")
    cmd = [sys.executable, "-m", "ragloop.cli", "index", str(SAMPLE_KB), "--store", url, "--collection", "kb"]
    subprocess.run([*cmd, "--embedder", "hash"], check=True, capture_output=True, text=True, timeout=600)
    return url


class Connections:
    """Samples each replica's connections in ``pg_stat_activity`` every 100 ms in a thread: peak open, peak
    active (running a statement), and the server's ``max_connections``."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True, application_name="bench-probe")
        self.max_connections = int(self.conn.execute("show max_connections").fetchone()[0])  # type: ignore[index]
        self.open: dict[str, int] = {}
        self.active: dict[str, int] = {}
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = self.conn.execute(
                "select application_name, count(*), count(*) filter (where state = 'active') from pg_stat_activity "
                "where backend_type = 'client backend' group by 1"
            ).fetchall()
            self.total = max(self.total, sum(int(r[1]) for r in rows))
            for name, n, active in rows:
                self.open[name] = max(self.open.get(name, 0), int(n))
                self.active[name] = max(self.active.get(name, 0), int(active))
            self._stop.wait(0.1)

    def __enter__(self) -> Connections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()


# --- the replicas ----------------------------------------------------------------------------------------------


class Replica:
    """One ``ragloop serve`` process."""

    def __init__(
        self, name: str, url: str, env: dict[str, str], clients: int, pool_size: int, python: tuple[str, ...] = ()
    ) -> None:
        self.name = name
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, *python, "-m", "ragloop.cli", "serve", "--port", str(self.port), "--no-page"]
        cmd += ["--store", url, "--collection", "kb", "--sessions", url, "--turn-log", url, "--deadline", "120"]
        cmd += ["--pool-size", str(pool_size), "--max-concurrency", str(max(64, 2 * clients))]
        # Its log to a file, never an undrained pipe: a replica whose warnings filled a pipe's 64 KiB would block
        # in its logging call, its event loop with it (read back only when it exits).
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            cmd, env={**env, "PGAPPNAME": name}, stdout=subprocess.DEVNULL, stderr=self.log, text=True
        )
        self.alive = True
        self.answered = 0

    def wait_ready(self, limit_s: float = 300.0) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.stderr()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.base + "/readyz", timeout=5).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} was not ready within {limit_s} s")

    def kill(self) -> None:
        self.alive = False
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.log.close()

    def stderr(self) -> str:
        """What the process has written to stderr so far."""
        self.log.seek(0)
        return self.log.read()


# --- one turn --------------------------------------------------------------------------------------------------


def _request(endpoint: str, question: str, session: str | None) -> tuple[str, dict[str, Any]]:
    if endpoint == "api-chat":
        body: dict[str, Any] = {"message": question}
        return "/api/chat", body | ({"session_id": session} if session else {"new_session": True})
    if endpoint == "completions":
        body = {"model": "ragloop", "messages": [{"role": "user", "content": question}], "stream": True}
        return "/v1/chat/completions", body | ({"session_id": session} if session else {"new_session": True})
    if endpoint == "responses":
        body = {"model": "ragloop", "input": question, "stream": True}
        return "/v1/responses", body | ({"previous_response_id": session} if session else {})
    message = {"id": "1", "role": "user", "parts": [{"type": "text", "text": question}]}
    return "/api/chat?format=ai-sdk", {"messages": [message]}


def _read(endpoint: str, name: str, data: str, out: dict[str, Any]) -> None:
    """One server-sent event into ``out``: ``token`` (a text delta came), ``complete`` (a completion marker),
    ``reply`` (the client-safe reply), ``session``, ``error``."""
    if endpoint == "api-chat":
        if name == "token":
            out["token"] = True
        elif name == "reply":
            out["reply"], out["complete"] = json.loads(data), True
        elif name == "error":
            out["error"] = "error event: " + str(json.loads(data)["error"].get("code") or "server_error")
        return
    if data == "[DONE]":  # the end of a stream, complete only if no error came before it
        out["complete"] = out["complete"] or "error" not in out
        return
    obj = json.loads(data)
    if endpoint == "completions":
        if "error" in obj:
            out["error"] = "error event: " + str(obj["error"].get("code") or "server_error")
        for choice in obj.get("choices", []):
            if choice["delta"].get("content"):
                out["token"] = True
            if choice.get("finish_reason"):
                out["complete"], out["reply"] = True, obj.get("ragloop")
        return
    kind = obj.get("type", "")
    if endpoint == "responses":
        if kind == "response.created":
            out["session"] = obj["response"]["id"]
        elif kind == "response.output_text.delta":
            out["token"] = True
        elif kind in ("response.completed", "response.incomplete"):
            out["complete"], out["reply"] = True, obj["response"].get("ragloop")
        elif kind == "response.failed":
            out["error"] = "error event: " + str(obj["response"]["error"]["message"])[:48]
    elif kind == "text-delta":
        out["token"] = True
    elif kind == "finish":
        out["complete"] = True
    elif kind == "error":
        out["error"] = "error event: " + str(obj.get("errorText"))[:48]


def _error_code(text: str) -> str:
    """The ``error.code`` of an error body in OpenAI's envelope (``""`` when it has none)."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code") or "") if isinstance(error, dict) else ""


async def stream_turn(client: httpx.AsyncClient, base: str, endpoint: str, question: str, session: str | None) -> dict:
    """One streamed turn: ``ttft``, ``last``, ``complete``, ``reply``, ``session``, or ``error`` (an exception's
    class name, ``HTTP <status>``, ``error event``, ``no completion marker``)."""
    path, body = _request(endpoint, question, session)
    out: dict[str, Any] = {"question": question, "endpoint": endpoint, "complete": False}
    started = time.perf_counter()
    try:
        async with client.stream("POST", base + path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                out["error"] = f"HTTP {r.status_code} {_error_code(r.text)}".rstrip()
                return out
            name = "message"
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    _read(endpoint, name, line.removeprefix("data: "), out)
                    if out.get("token") and "ttft" not in out:
                        out["ttft"] = time.perf_counter() - started
                    if out["complete"] and "last" not in out:  # the reply is whole from here on
                        out["last"] = time.perf_counter() - started
                        out.setdefault("ttft", out["last"])
                elif not line:
                    name = "message"
    except httpx.HTTPError as exc:
        out["error"] = type(exc).__name__
        return out
    out.setdefault("last", time.perf_counter() - started)
    out.setdefault("ttft", out["last"])
    if not out["complete"] and "error" not in out:
        out["error"] = "no completion marker"
    if out.get("reply") and out["reply"].get("session_id"):
        out["session"] = out["reply"]["session_id"]
    return out


async def mcp_ask(base: str, question: str) -> dict[str, Any]:
    """One MCP session (the SDK's client, streamable HTTP) calling ``ask`` once: the answer comes whole, so the
    time to the first token is the time to the tool result. A session per turn (the turns of a client alternate
    replicas anyway), its ``initialize`` included in the time; a session lives and dies inside this call, so a
    replica killed under it fails this turn only."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    out: dict[str, Any] = {"question": question, "endpoint": "mcp", "complete": False}
    started = time.perf_counter()
    try:
        async with (
            httpx2.AsyncClient(timeout=180.0) as http,
            Client(streamable_http_client(base + "/mcp", http_client=http)) as client,
        ):
            result = await client.call_tool("ask", {"question": question})
    except Exception as exc:  # noqa: BLE001 — a benchmark counts every failure by its kind
        out["error"] = type(exc).__name__
        return out
    out["ttft"] = out["last"] = time.perf_counter() - started
    if result.is_error:
        said = " ".join(getattr(c, "text", "") for c in result.content)
        out["error"] = "tool error: " + said[:48]
    else:
        out["complete"] = True
    return out


# --- a phase ---------------------------------------------------------------------------------------------------


async def run_clients(replicas: list[Replica], clients: int, turns: int, kill: bool, limit_s: float) -> dict:
    """Every client's turns; with ``kill``, replica 0 is SIGKILLed once half the turns have ended."""
    log: list[dict[str, Any]] = []
    answered = ended = 0
    killed_at: float | None = None
    half = clients * turns // 2
    half_reached = anyio.Event()
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    timeout = httpx.Timeout(180.0, connect=30.0)

    async def one_turn(client: httpx.AsyncClient, replica: Replica, endpoint: str, q: str, s: Any) -> dict:
        nonlocal answered, ended
        if endpoint == "mcp":
            out = await mcp_ask(replica.base, q)
        else:
            out = await stream_turn(client, replica.base, endpoint, q, s)
        out["replica"] = replica.name
        out["killed"] = killed_at is not None
        log.append(out)
        ended += 1
        if ended >= half:  # half the phase's turns have ended, answered or not
            half_reached.set()
        if out["complete"]:
            answered += 1
            replica.answered += 1
        return out

    async def client_task(i: int) -> None:
        endpoint = ENDPOINTS[i % len(ENDPOINTS)]
        session: str | None = None
        previous: str | None = None
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            for t in range(turns):
                live = [r for r in replicas if r.alive]
                wanted = replicas[(i + t) % len(replicas)]
                replica = wanted if wanted.alive else live[(i + t) % len(live)]
                q = QUESTIONS[(i + t) % len(QUESTIONS)]
                out = await one_turn(client, replica, endpoint, q, session)
                if out.get("error") and not out["complete"] and not replica.alive:  # cut or refused: retry once
                    live = [r for r in replicas if r.alive]
                    out["retried"] = True
                    out = await one_turn(client, live[(i + t) % len(live)], endpoint, q, session)
                    out["retry"] = True
                # A turn continuing, on this replica, a conversation whose last turn another one answered.
                out["cross_replica"] = session is not None and out["replica"] != previous
                session = out.get("session") or session
                previous = out["replica"]

    async def killer() -> None:
        nonlocal killed_at
        await half_reached.wait()
        replicas[0].kill()
        killed_at = time.perf_counter()

    started = time.perf_counter()
    with anyio.move_on_after(limit_s) as bounded:
        async with anyio.create_task_group() as tg:
            if kill:
                tg.start_soon(killer)
            async with anyio.create_task_group() as group:
                for i in range(clients):
                    group.start_soon(client_task, i)
            tg.cancel_scope.cancel()
    return {
        "log": log,
        "wall_s": time.perf_counter() - started,
        "cut_short": bounded.cancelled_caught,
        "killed_after_s": None if killed_at is None else round(killed_at - started, 2),
    }


def check(url: str, log: list[dict[str, Any]]) -> dict[str, int]:
    """Violations of the fleet's promises after a run (all should be 0), and what was checked."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        sessions = {sid: json.loads(m) for sid, m in conn.execute("select id, messages::text from ragloop_sessions")}
        ids = [r[0] for r in conn.execute("select turn_id from ragloop_turns")]
        torn = conn.execute("select count(*) from ragloop_turns where outcome is null or data is null").fetchone()
    half = sum(1 for m in sessions.values() if [r for r, _ in m] != ["user", "assistant"] * (len(m) // 2))
    lost = 0
    acked = [e for e in log if e["complete"] and e.get("reply") and e["endpoint"] != "ai-sdk"]
    for e in acked:
        sid = e["reply"].get("session_id") or (e.get("session") or "")[len("resp_") :].rsplit(".", 1)[0]
        stored = sessions.get(sid, [])
        if not any(r == "assistant" and c == e["reply"]["text"] for r, c in stored):
            lost += 1
    cut_complete = sum(1 for e in log if e.get("retried") and e["complete"])
    return {
        "sessions": len(sessions),
        "acknowledged_turns_checked": len(acked),
        "acknowledged_turns_missing": lost,
        "sessions_with_half_a_turn": half,
        "turn_log_rows": len(ids),
        "turn_log_duplicates": len(ids) - len(set(ids)),
        "turn_log_torn": int(torn[0]) if torn else 0,
        "cut_streams_with_completion_marker": cut_complete,
    }


def summarise(phase: str, run: dict[str, Any], replicas: list[Replica], cpu: dict[str, float], conns: Connections):
    log = run["log"]
    ok = [e for e in log if e["complete"]]
    errors: dict[str, int] = {}
    for e in log:
        if e.get("error"):
            kind = e["error"] + (" (dead replica)" if e.get("retried") else "")
            kind += " (after the completion marker)" if e["complete"] else ""
            errors[kind] = errors.get(kind, 0) + 1
    ttft = [e["ttft"] for e in ok]
    last = [e["last"] for e in ok]
    ms = lambda values, p: round(percentile(values, p) * 1000, 1) if values else None  # noqa: E731
    return {
        "phase": phase,
        "turns_sent": len(log),
        "completed": len(ok),
        "retried": sum(1 for e in log if e.get("retry")),
        "retried_completed": sum(1 for e in log if e.get("retry") and e["complete"]),
        "surviving_replica_errors": sum(1 for e in log if e.get("error") and not e.get("retried")),
        "cross_replica_continuations": sum(1 for e in ok if e.get("cross_replica")),
        "errors_by_kind": errors,
        "wall_s": round(run["wall_s"], 2),
        "cut_short_by_limit": run["cut_short"],
        "killed_after_s": run["killed_after_s"],
        "turns_per_s": round(len(ok) / run["wall_s"], 2),
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p95_ms": ms(ttft, 95),
        "last_p50_ms": ms(last, 50),
        "last_p95_ms": ms(last, 95),
        "by_endpoint": {
            ep: {
                "completed": sum(1 for e in ok if e["endpoint"] == ep),
                "last_p50_ms": ms([e["last"] for e in ok if e["endpoint"] == ep], 50),
            }
            for ep in ENDPOINTS
        },
        "replicas": {
            r.name: {
                "turns_answered": r.answered,
                "cpu_s": round(cpu[r.name], 2),
                "cpu_ms_per_turn": round(1000 * cpu[r.name] / max(1, r.answered), 1),
                "db_connections_peak_open": conns.open.get(r.name, 0),
                "db_connections_peak_active": conns.active.get(r.name, 0),
                "killed": not r.alive,
            }
            for r in replicas
        },
        "db_connections_peak_total": conns.total,
        "db_max_connections": conns.max_connections,
    }


def phase(name: str, server: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    url = fresh_database(server, f"bench_fleet_{name}")
    load_start = load()
    replicas = [Replica(f"fleet-{i}", url, env, args.clients, args.pool_size) for i in range(args.replicas)]
    try:
        for r in replicas:
            r.wait_ready()
        before = {r.name: cpu_seconds(r.proc.pid) for r in replicas}
        last_cpu = dict(before)

        def sample_cpu() -> None:  # a killed replica's CPU is what it had used when it died
            for r in replicas:
                if r.alive:
                    last_cpu[r.name] = cpu_seconds(r.proc.pid)

        with Connections(url) as conns:
            stop = threading.Event()

            def cpu_loop() -> None:
                while not stop.wait(0.2):
                    sample_cpu()

            sampler = threading.Thread(target=cpu_loop, daemon=True)
            sampler.start()
            run = anyio.run(run_clients, replicas, args.clients, args.turns, name == "kill", args.phase_limit)
            stop.set()
            sampler.join(5)
            sample_cpu()
        cpu = {n: last_cpu[n] - before[n] for n in before}
    finally:
        for r in replicas:
            r.stop()
    row = summarise(name, run, replicas, cpu, conns)
    row["checks"] = check(url, run["log"])
    row["load_average_1min"] = {"start": load_start, "end": load()}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--turns", type=int, default=2, help="turns per client, in a row")
    parser.add_argument("--setup", choices=["scripted", "offline"], default="scripted")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the simulated model latencies")
    parser.add_argument("--pool-size", type=int, default=10, help="each replica's store pool")
    parser.add_argument("--phases", nargs="+", default=["steady", "kill"], choices=["steady", "kill"])
    parser.add_argument("--phase-limit", type=float, default=600.0, help="seconds a phase may run")
    parser.add_argument("--db", help="a PostgreSQL server URL to use instead of a temporary pgserver")
    parser.add_argument("--out", default=str(RESULTS / "bench_fleet.json"))
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_", "PG"))}
    rows = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(database(args.db))
        if args.setup == "scripted":
            model = _sim.ModelServer(args.scale)
            env |= {"OPENAI_BASE_URL": model.__enter__(), "OPENAI_API_KEY": "bench"}
            env |= {"RAGLOOP_MODEL": "sim-fast", "RAGLOOP_ANSWER_MODEL": "sim-answer"}
            stack.callback(model.__exit__, None, None, None)
        for name in args.phases:
            row = phase(name, server, env, args)
            rows.append(row)
            print(line(row), flush=True)
    meta = {
        "command": "python benchmarks/bench_fleet.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "replicas": args.replicas,
        "clients": args.clients,
        "turns_per_client": args.turns,
        "setup": args.setup,
        "latency_s": {k: round(v * args.scale, 4) for k, v in _sim.BASE_LATENCY.items()}
        if args.setup == "scripted"
        else None,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "phases": rows}, indent=2) + "\n")
    text = [f"# {meta['command']}  ({meta['machine']}, {meta['date']})", *(line(r) for r in rows)]
    for r in rows:
        text.append(f"{r['phase']} checks: {json.dumps(r['checks'])}")
        text.append(f"{r['phase']} errors: {json.dumps(r['errors_by_kind'])}")
        for name, rep in r["replicas"].items():
            text.append(f"{r['phase']} {name}: {json.dumps(rep)}")
    out.with_suffix(".txt").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    print(json.dumps({"meta": meta, "phases": [{k: v for k, v in r.items() if k != "by_endpoint"} for r in rows]}))


def line(r: dict[str, Any]) -> str:
    """One phase's figures on one line, the load average beside them."""
    cpu = " ".join(f"{n} {v['cpu_ms_per_turn']:.0f} ms/turn ({v['turns_answered']})" for n, v in r["replicas"].items())
    conns = " ".join(
        f"{n} {v['db_connections_peak_open']}/{v['db_connections_peak_active']}" for n, v in r["replicas"].items()
    )
    load_avg = r["load_average_1min"]
    return (
        f"{r['phase']:<6} turns {r['completed']}/{r['turns_sent']} (retried {r['retried']})  "
        f"{r['turns_per_s']:.1f} turns/s  TTFT p50 {r['ttft_p50_ms']} ms p95 {r['ttft_p95_ms']} ms  "
        f"last p50 {r['last_p50_ms']} ms p95 {r['last_p95_ms']} ms  errors {sum(r['errors_by_kind'].values())}  "
        f"CPU {cpu}  DB conns open/active {conns} (total peak {r['db_connections_peak_total']} of "
        f"{r['db_max_connections']})  load {load_avg['start']} -> {load_avg['end']}"
    )


if __name__ == "__main__":
    main()
