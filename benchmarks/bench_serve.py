"""Serving under load: N concurrent streaming clients against ``ragloop serve`` on 127.0.0.1.

It starts the real command (``python -m ragloop.cli serve``, uvicorn, one process) over the bundled sample
knowledge base, indexed with the hash embedder (a MiniLM query embedding costs 30–80 ms of CPU here, which
alone would serialise hundreds of turns on the 2-core machine; ``--embedder minilm`` shows that), with the
sample ticket database as its live source. Two set-ups, measured in the same run:

- ``offline``: the offline judges (no model at all) — ragloop's own serving cost;
- ``scripted``: the OpenAI judges through the real ``openai`` client against the scripted model server
  (``ragloop.testing`` in a child process, ``_sim.py``: decide 200 ms, grade 150 ms, rewrite 180 ms,
  answer 300 ms to the first token then 10 ms per token, 60 tokens) — a realistic model deployment.

At each level N (default 1, 50, 200) and for each endpoint (``--endpoints``: ``api-chat`` — ``POST /api/chat``,
ragloop's typed events; ``completions`` — ``/v1/chat/completions`` streamed; ``responses`` — ``/v1/responses``
streamed; ``ai-sdk`` — ``/api/chat?format=ai-sdk``; ``mcp`` — the ``ask`` tool over ``/mcp`` through the MCP
SDK's client, whose answer comes whole, so its TTFT is the time to the tool result), measured one after another
against the same server, N clients (one ``httpx.AsyncClient`` each connection, all started
together) each stream ``--turns`` questions in a row,
cycling over five questions (one topic, two topics, a rewrite, a ticket lookup, four topics). Per turn it
records the time to the first ``token`` event (TTFT) and to the ``reply`` event (last token); a turn
completes when its ``reply`` event arrives. Errors are non-200 statuses, ``error`` events, cut streams and
client exceptions. The server runs with ``--max-concurrency`` above N, so nothing is refused with 429.
It also reports the judge calls per turn (the server's ``ragloop_judge_calls_total``; with the scripted
model, each is a model call), the CPU milliseconds per completed turn of the server process, of the model server process
and of the clients (from ``/proc``): with two cores, 2000 / (their sum) bounds the turns per second. And it
records the machine's 1-minute load average at the end of each level: on a shared machine, other work takes
cores away from the server, and the latencies show it.

The client and the server share the machine's cores: the figures include the clients' own CPU. It asserts
nothing; it prints a table and writes ``benchmarks/results/bench_serve.json`` and ``.txt``.

Usage: ``python benchmarks/bench_serve.py [--levels 1 50 200] [--turns 3] [--setups offline scripted]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).parent))
import _sim

from ragloop.retrievers.evaluate import percentile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT / "src" / "ragloop" / "data"
QUESTIONS = (
    "How much does the Business plan cost per seat?",
    "Compare the plan pricing and how to set up SSO with SAML.",
    "Does Lumen have a Salesforce connector?",
    "What is the status of ticket #1234?",
    _sim.fanout_question(4),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def judge_calls(url: str) -> dict[str, float]:
    """The server's ``ragloop_judge_calls_total`` per judge and backend (``grade/model``), from ``/metrics``."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("ragloop_judge_calls_total{"):
            labels, value = line.rsplit(" ", 1)
            judge = labels.split('judge="')[1].split('"')[0]
            backend = labels.split('backend="')[1].split('"')[0]
            out[f"{judge}/{backend}"] = float(value)
    return out


def build_index(embedder: str, out: Path) -> None:
    """``ragloop index`` the sample knowledge base into ``out``."""
    cmd = [sys.executable, "-m", "ragloop.cli", "index", str(DATA / "sample_kb"), "--out", str(out)]
    subprocess.run([*cmd, "--embedder", embedder], check=True, capture_output=True, text=True)


class Server:
    """``ragloop serve`` in a child process (``with Server(index, env) as url:``)."""

    def __init__(self, index: Path, env: dict[str, str], max_concurrency: int) -> None:
        self.index, self.env, self.max_concurrency = index, env, max_concurrency

    def __enter__(self) -> str:
        port = _free_port()
        cmd = [sys.executable, "-m", "ragloop.cli", "serve", "--index", str(self.index), "--port", str(port)]
        cmd += ["--tickets", str(DATA / "tickets.sqlite"), "--max-concurrency", str(self.max_concurrency)]
        cmd += ["--deadline", "120", "--no-page"]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ragloop serve exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            try:
                httpx.get(url + "/healthz", timeout=1).raise_for_status()
                return url
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("ragloop serve did not start in 60 s")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: Per endpoint: (path, request body for a question, how an SSE line marks the first token / the end / an error).
ENDPOINTS: dict[str, Any] = {
    "api-chat": ("/api/chat", lambda q: {"message": q}),
    "completions": ("/v1/chat/completions", lambda q: {"messages": [{"role": "user", "content": q}], "stream": True}),
    "responses": ("/v1/responses", lambda q: {"input": q, "stream": True}),
    "ai-sdk": (
        "/api/chat?format=ai-sdk",
        lambda q: {"messages": [{"id": "1", "role": "user", "parts": [{"type": "text", "text": q}]}]},
    ),
}


def _mark(endpoint: str, name: str, data: str) -> str:
    """``first``, ``last``, ``error`` or ``""`` for one server-sent event of ``endpoint``."""
    if endpoint == "api-chat":
        return {"token": "first", "reply": "last", "error": "error"}.get(name, "")
    if endpoint == "completions":
        if data == "[DONE]":
            return ""
        if '"error"' in data[:12]:
            return "error"
        return "last" if '"finish_reason":"stop"' in data else "first" if '"content":"' in data else ""
    if endpoint == "responses":
        marks = {"response.output_text.delta": "first", "response.completed": "last", "response.incomplete": "last"}
        return marks.get(name, "error" if name == "response.failed" else "")
    kind = data[9:30]  # ai-sdk: data is {"type":"…",…}
    if kind.startswith("text-delta"):
        return "first"
    return "last" if kind.startswith("finish") else "error" if kind.startswith("error") else ""


async def one_turn(client: httpx.AsyncClient, question: str, endpoint: str = "api-chat") -> dict[str, Any]:
    """Stream one turn; the times to the first token and to the end of the answer, or the error."""
    path, body = ENDPOINTS[endpoint]
    started = time.perf_counter()
    first = last = None
    try:
        async with client.stream("POST", path, json=body(question)) as r:
            if r.status_code != 200:
                await r.aread()
                return {"error": f"HTTP {r.status_code}"}
            name = ""
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    mark = _mark(endpoint, name, line.removeprefix("data: "))
                    if mark == "first" and first is None:
                        first = time.perf_counter() - started
                    elif mark == "last":
                        last = time.perf_counter() - started
                    elif mark == "error":
                        return {"error": "error event"}
    except httpx.HTTPError as exc:
        return {"error": type(exc).__name__}
    if last is None:
        return {"error": "stream ended without a reply"}
    return {"ttft": first if first is not None else last, "last": last}


async def mcp_turns(url: str, questions: list[str], results: list[dict[str, Any]]) -> None:
    """One MCP client (the SDK's, streamable HTTP) calling ``ask`` for each question; the answer comes whole, so
    the time to the first token is the time to the tool result."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(timeout=180.0) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):
        for question in questions:
            started = time.perf_counter()
            try:
                result = await client.call_tool("ask", {"question": question})
            except Exception as exc:  # noqa: BLE001 — a benchmark counts every failure as an error
                results.append({"error": type(exc).__name__})
                continue
            took = time.perf_counter() - started
            results.append({"error": "tool error"} if result.is_error else {"ttft": took, "last": took})


async def level(
    url: str, n: int, turns: int, pids: dict[str, int] | None = None, endpoint: str = "api-chat"
) -> dict[str, Any]:
    """N clients, each streaming ``turns`` questions in a row, all started together.

    ``pids`` names processes (the server, the model server) whose CPU time per completed turn is reported.
    """
    results: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(180.0, connect=30.0)

    async def client_task(i: int) -> None:
        questions = [QUESTIONS[(i + t) % len(QUESTIONS)] for t in range(turns)]
        if endpoint == "mcp":
            await mcp_turns(url, questions, results)
            return
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
            for question in questions:
                results.append(await one_turn(client, question, endpoint))

    pids = dict(pids or {})
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    calls_before = judge_calls(url)
    client_before = time.process_time()
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(client_task, i)
    wall = time.perf_counter() - started
    load = os.getloadavg()[0]
    calls = {judge: n - calls_before.get(judge, 0.0) for judge, n in judge_calls(url).items()}
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    cpu["clients"] = time.process_time() - client_before
    ok = [r for r in results if "last" in r]
    errors: dict[str, int] = {}
    for r in results:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    ttft = [r["ttft"] for r in ok]
    last = [r["last"] for r in ok]
    return {
        "endpoint": endpoint,
        "clients": n,
        "turns": len(results),
        "completed": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "wall_s": round(wall, 3),
        "turns_per_s": round(len(ok) / wall, 2),
        "ttft_p50_ms": round(percentile(ttft, 50) * 1000, 1),
        "ttft_p95_ms": round(percentile(ttft, 95) * 1000, 1),
        "last_p50_ms": round(percentile(last, 50) * 1000, 1),
        "last_p95_ms": round(percentile(last, 95) * 1000, 1),
        "load_average_1min": round(load, 2),
        "judge_calls_per_turn": {judge: round(n / max(1, len(ok)), 1) for judge, n in sorted(calls.items())},
        "cpu_ms_per_turn": {name: round(1000 * sec / max(1, len(ok)), 1) for name, sec in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 50, 200])
    parser.add_argument("--turns", type=int, default=3, help="turns per client, in a row")
    parser.add_argument("--setups", nargs="+", default=["offline", "scripted"], choices=["offline", "scripted"])
    parser.add_argument("--embedder", default="hash", choices=["hash", "minilm"])
    parser.add_argument(
        "--endpoints", nargs="+", default=["api-chat", "completions", "responses", "ai-sdk", "mcp"],
        choices=["api-chat", "completions", "responses", "ai-sdk", "mcp"],
    )  # fmt: skip
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the simulated model latencies")
    parser.add_argument("--out", default=str(RESULTS / "bench_serve.json"))
    args = parser.parse_args()

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        build_index(args.embedder, index)
        for setup in args.setups:
            for n in args.levels:
                env = dict(base_env)
                model = _sim.ModelServer(args.scale) if setup == "scripted" else None
                try:
                    if model is not None:
                        env |= {"OPENAI_BASE_URL": model.__enter__(), "OPENAI_API_KEY": "bench"}
                        env |= {"RAGLOOP_MODEL": "sim-fast", "RAGLOOP_ANSWER_MODEL": "sim-answer"}
                    server = Server(index, env, max_concurrency=max(64, 2 * n))
                    with server as url:
                        pids = {"server": server.proc.pid}
                        if model is not None:
                            pids["model"] = model.proc.pid
                        for endpoint in args.endpoints:  # one server, every endpoint in turn, one after another
                            anyio.run(level, url, 1, 1, None, endpoint)  # warm-up (imports, first connection)
                            row = {"setup": setup, **anyio.run(level, url, n, args.turns, pids, endpoint)}
                            rows.append(row)
                            print(
                                f"{setup:<9} {endpoint:<12} N={n:<4} turns {row['completed']}/{row['turns']}  "
                                f"errors {row['errors']}  TTFT p50 {row['ttft_p50_ms']:.0f} ms "
                                f"p95 {row['ttft_p95_ms']:.0f} ms  last p50 {row['last_p50_ms']:.0f} ms "
                                f"p95 {row['last_p95_ms']:.0f} ms  {row['turns_per_s']:.1f} turns/s  "
                                f"load {row['load_average_1min']}",
                                flush=True,
                            )
                finally:
                    if model is not None:
                        model.__exit__(None, None, None)
    meta = {
        "command": "python benchmarks/bench_serve.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "embedder": args.embedder,
        "turns_per_client": args.turns,
        "latency_s": {k: round(v * args.scale, 4) for k, v in _sim.BASE_LATENCY.items()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "levels": rows}, indent=2) + "\n")
    lines = [
        f"# {meta['command']}  ({meta['machine']}, {meta['date']})",
        "setup     endpoint        N     completed  errors  TTFT p50  TTFT p95  last p50  last p95  turns/s  "
        "server CPU/turn  load",
    ]
    for r in rows:
        lines.append(
            f"{r['setup']:<9} {r['endpoint']:<12} {r['clients']:>4}  "
            f"{r['completed']:>5}/{r['turns']:<5} {r['errors']:>5}  "
            f"{r['ttft_p50_ms']:>6.0f} ms {r['ttft_p95_ms']:>6.0f} ms {r['last_p50_ms']:>6.0f} ms "
            f"{r['last_p95_ms']:>6.0f} ms {r['turns_per_s']:>7.1f}  "
            f"{r['cpu_ms_per_turn']['server']:>6.1f} ms  {r['load_average_1min']:>5.1f}"
        )
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
