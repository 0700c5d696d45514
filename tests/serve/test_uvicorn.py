"""The app behind a real uvicorn on 127.0.0.1: the ``openai`` SDK as client, client disconnects, ``ragloop serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from ragloop.chat import ChatRAG
from ragloop.serve import ServeSettings, create_app
from ragloop.testing import FakeRetriever, ScriptedOpenAIServer, reply
from tests.serve.conftest import DOCS, fake_rag, serving, sse_events

pytestmark = pytest.mark.anyio


class TestOpenAISDK:
    async def test_sdk_non_streaming(self, sample_rag: ChatRAG) -> None:
        """The openai SDK gets a completion with a Sources footer, usage and the ragloop extension field."""
        with serving(create_app(sample_rag)) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
                completion = await client.chat.completions.create(
                    model="ragloop", messages=[{"role": "user", "content": "How do I rotate an API key?"}]
                )
        content = completion.choices[0].message.content or ""
        assert "Sources:\n[" in content
        extension = (completion.model_extra or {})["ragloop"]
        assert extension["outcome"] in ("context", "partial")
        assert any(c["source"] == "api-keys.md" for c in extension["citations"])
        assert completion.usage is not None

    async def test_sdk_streaming(self, sample_rag: ChatRAG) -> None:
        """The openai SDK streams the answer chunk by chunk; the stop chunk carries the citations."""
        with serving(create_app(sample_rag)) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
                stream = await client.chat.completions.create(
                    model="ragloop",
                    messages=[{"role": "user", "content": "How do I rotate an API key?"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                parts, extension, usage = [], None, None
                async for chunk in stream:
                    if chunk.choices:
                        parts.append(chunk.choices[0].delta.content or "")
                        if chunk.choices[0].finish_reason == "stop":
                            extension = (chunk.model_extra or {})["ragloop"]
                    usage = chunk.usage or usage
        assert len([p for p in parts if p]) > 3  # streamed, not one lump
        text = "".join(parts)
        assert extension is not None and extension["citations"]
        assert text.startswith(extension["text"].split("[")[0][:20])
        assert "Sources:" in text and usage is not None

    async def test_sdk_sees_validation_errors_as_bad_request(self, sample_rag: ChatRAG) -> None:
        """A too-long question is a 400 the SDK raises as BadRequestError, naming the field and the limit."""
        with serving(create_app(sample_rag)) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
                with pytest.raises(openai.BadRequestError) as caught:
                    await client.chat.completions.create(
                        model="ragloop", messages=[{"role": "user", "content": "x" * 9000}], stream=True
                    )
        assert caught.value.param == "messages[0].content"  # type: ignore[attr-defined]
        assert "the limit is 8,000" in str(caught.value)


class TestModelFailures:
    async def test_a_failing_model_still_answers_and_the_metrics_count_it(self, sample_cache: Path) -> None:
        """Every model call fails (HTTP 500): the offline fallbacks answer, the metrics count each failed judge
        call and each grade that failed open, and no upstream error text reaches the client."""
        async with ScriptedOpenAIServer() as model:  # an empty script: every request is a 500
            llm = model.client()
            rag = ChatRAG.sample(llm, cache_dir=sample_cache, fast_model="m")
            with serving(create_app(rag), close=llm.close) as url:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    r = await client.post("/v1/chat/completions", json=_ask("How do I rotate an API key?"))
                    metrics = (await client.get("/metrics")).text
        assert r.status_code == 200
        body = r.json()
        assert body["ragloop"]["citations"]
        assert "script exhausted" not in r.text and "scripted server" not in r.text
        assert 'ragloop_judge_errors_total{judge="decide"} 1.0' in metrics
        assert 'ragloop_judge_calls_total{backend="model",judge="decide"} 1.0' in metrics
        assert 'ragloop_judge_calls_total{backend="offline",judge="decide"} 1.0' in metrics  # the fallback
        assert "ragloop_grades_fail_open_total 0.0" not in metrics

    async def test_readyz_probes_the_model_endpoint(self, rag: ChatRAG) -> None:
        """/readyz is 200 while the model endpoint answers (here: another ragloop's /v1/models), 503 when it is
        gone (connection refused)."""
        with serving(create_app(rag)) as model_url:
            llm = openai.AsyncOpenAI(base_url=model_url + "/v1", api_key="unused")
            with serving(create_app(rag, llm=llm), close=llm.close) as url:
                up = httpx.get(url + "/readyz")
        llm = openai.AsyncOpenAI(base_url=model_url + "/v1", api_key="unused")
        with serving(create_app(rag, llm=llm), close=llm.close) as url:  # the model server has stopped
            down = httpx.get(url + "/readyz")
        assert up.status_code == 200 and up.json()["checks"]["model"] == "ok"
        assert down.status_code == 503 and down.json()["checks"]["model"] == "unreachable"


class TestDisconnect:
    async def test_disconnect_cancels_the_turn_and_its_model_call(self, sample_cache: Path) -> None:
        """A client that goes away mid-turn cancels the turn: the model request in flight is dropped at once."""
        async with ScriptedOpenAIServer(script=[reply("never sent").delayed(30.0)]) as model:
            llm = model.client()
            rag = ChatRAG.sample(llm, cache_dir=sample_cache, fast_model="m")
            app = create_app(rag)
            with serving(app, close=llm.close) as url:
                async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                    async with client.stream("POST", "/api/chat", json={"message": "How do I rotate an API key?"}):
                        await model.wait_for_requests(1)  # the decide call is waiting on the model
                        closed_at = time.monotonic()
                    # leaving the block closes the connection before any answer
                    with anyio.fail_after(5):
                        while model.stats.requests_aborted < 1:
                            await anyio.sleep(0.02)
                    dropped_after = time.monotonic() - closed_at
                    metrics = (await client.get("/metrics")).text
                    while "ragloop_turns_in_flight 0.0" not in metrics:
                        await anyio.sleep(0.02)
                        metrics = (await client.get("/metrics")).text
        assert dropped_after < 2.0
        assert "ragloop_turns_cancelled_total 1.0" in metrics
        assert 'ragloop_http_requests_total{endpoint="api.chat",status="499"} 1.0' in metrics
        assert "ragloop_turns_total{" not in metrics  # the turn never finished

    async def test_disconnect_frees_the_slot(self) -> None:
        """With one slot, a departed client's turn frees it: the next request starts, it is not refused."""
        rag = fake_rag(retriever=FakeRetriever(DOCS, delays={"rotate api key": 30.0}))
        app = create_app(rag, settings=ServeSettings(max_concurrent_turns=1))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                statuses = []
                for _ in range(3):
                    with anyio.fail_after(5):
                        async with client.stream("POST", "/api/chat", json={"message": "q"}) as r:
                            statuses.append(r.status_code)
                            async for line in r.aiter_lines():
                                if line.startswith("event: progress"):
                                    break
                    with anyio.fail_after(5):
                        while "ragloop_turns_in_flight 0.0" not in (metrics := (await client.get("/metrics")).text):
                            await anyio.sleep(0.02)
        assert statuses == [200, 200, 200]
        assert "ragloop_turns_cancelled_total 3.0" in metrics

    async def test_client_gone_while_sending_the_body(self, rag: ChatRAG) -> None:
        """A client that closes mid-body is counted as 499, not a server error, and holds no slot."""
        import socket

        with serving(create_app(rag)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as raw:
                raw.sendall(
                    b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"message": '
                )
            async with httpx.AsyncClient(base_url=url) as client:
                with anyio.fail_after(5):
                    while 'endpoint="api.chat",status="499"' not in (metrics := (await client.get("/metrics")).text):
                        await anyio.sleep(0.02)
        assert 'status="500"' not in metrics
        assert "ragloop_turns_in_flight 0.0" in metrics

    @pytest.mark.parametrize(
        ("content_type", "length", "status"),
        [("text/plain", 300, b"415"), ("application/json", 3000, b"413")],
        ids=["415", "413"],
    )
    def test_a_refused_body_is_read_before_the_refusal(
        self, rag: ChatRAG, content_type: str, length: int, status: bytes
    ) -> None:
        """A client still sending a small refused body gets the 415/413, not "connection reset by peer".

        The refusal closes the connection; bytes arriving at a closed socket make the kernel reset it, so a
        client writing its body in pieces (as HTTP clients do) failed mid-write, or lost the reply (seen in CI
        on /mcp). The server reads a refused body of up to 1 MiB, for up to 1 s, before it replies.
        """
        import socket

        with serving(create_app(rag, settings=ServeSettings(max_body_bytes=1000))) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                raw.sendall(
                    f"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {length}\r\n\r\n".encode()
                )
                for _ in range(3):  # were the reply sent on the headers, the socket would be closed by now
                    time.sleep(0.1)
                    raw.sendall(b"x" * (length // 3))
                reply = b""
                while chunk := raw.recv(65536):
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 " + status)

    def test_a_refused_body_that_never_comes_does_not_hold_the_refusal(self, rag: ChatRAG) -> None:
        """A client that declares a small refused body and never sends it still gets its 415 (the read before the
        reply gives up after a second), and the connection is closed."""
        import socket

        with serving(create_app(rag)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(
                    b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 500\r\n\r\n"
                )
                reply = b""
                while chunk := raw.recv(65536):
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 415")


class TestServeCommand:
    def test_ragloop_serve_answers_health_and_chat(self, sample_cache: Path, tmp_path: Path) -> None:
        """`ragloop serve` starts from the README's words and answers /healthz, /readyz, /api/chat and /."""
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "ragloop.cli", "serve", "--port", str(port), "--cache-dir", str(sample_cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            health = _wait_up(base, proc)
            ready = httpx.get(base + "/readyz")
            r = httpx.post(base + "/api/chat", json={"message": "How do I rotate an API key?"}, timeout=30)
            page = httpx.get(base + "/")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
        assert health.json() == {"status": "ok"}
        assert ready.status_code == 200
        names = [name for name, _ in sse_events(r.text)]
        assert names[-1] == "reply" and "token" in names
        assert json.loads(sse_events(r.text)[-1][1])["citations"]
        assert page.status_code == 200 and "Ask the docs" in page.text
        assert f"serving on http://127.0.0.1:{port}/" in err

    def test_ragloop_serve_over_a_postgres_store(self, pg_url: str) -> None:
        """`ragloop serve --store URL` answers from a collection written by `ragloop index --store`."""
        if not hasattr(ChatRAG, "from_store"):
            pytest.skip("this tree has no Postgres knowledge store (ChatRAG.from_store) yet")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        kb = Path(__file__).resolve().parents[2] / "src" / "ragloop" / "data" / "sample_kb"
        index = [sys.executable, "-m", "ragloop.cli", "index", str(kb), "--store", pg_url, "--collection", "served"]
        done = subprocess.run([*index, "--embedder", "hash"], env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        port = _free_port()
        serve = [sys.executable, "-m", "ragloop.cli", "serve", "--store", pg_url, "--collection", "served"]
        proc = subprocess.Popen([*serve, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_up(base, proc)
            r = httpx.post(base + "/v1/chat/completions", json=_ask("What does the audit log record?"), timeout=60)
        finally:
            proc.terminate()
            proc.communicate(timeout=20)
        assert r.status_code == 200, r.text
        assert "audit-log.md" in {c["source"] for c in r.json()["ragloop"]["citations"]}


def _ask(question: str) -> dict[str, object]:
    return {"model": "ragloop", "messages": [{"role": "user", "content": question}]}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(base: str, proc: subprocess.Popen[str]) -> httpx.Response:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ragloop serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            return httpx.get(base + "/healthz", timeout=1)
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("ragloop serve did not start in 60 s")


class TestServeOptions:
    def test_sessions_option(self, tmp_path: Path) -> None:
        """--sessions takes memory, sqlite:PATH or a postgresql:// URL (with the session quota of the flags);
        anything else is a one-line error."""
        from ragloop.cli._serve import _sessions
        from ragloop.errors import ConfigError
        from ragloop.serve import MemorySessionStore, SessionQuota, SQLiteSessionStore

        assert isinstance(_sessions("memory"), MemorySessionStore)
        store = _sessions(f"sqlite:{tmp_path / 's.sqlite'}", SessionQuota(per_owner=5, idle_s=60))
        assert isinstance(store, SQLiteSessionStore) and store.quota == SessionQuota(per_owner=5, idle_s=60)
        anyio.run(store.aclose)
        with pytest.raises(ConfigError, match="--sessions must be memory, sqlite:PATH or a postgresql:// URL"):
            _sessions("redis://x")

    def test_source_base_url_links_sources(self) -> None:
        """--source-base-url links a file source under the base URL; URL sources keep their own."""
        from ragloop.cli._serve import _source_url

        link = _source_url("https://docs.example.com/kb")
        assert link("guides/sso saml.md") == "https://docs.example.com/kb/guides/sso%20saml.md"
        assert link("https://elsewhere.example/x") == "https://elsewhere.example/x"
        assert _source_url(None) is None


class TestServeAccess:
    """Who may call `ragloop serve`: keys, the loopback rule, the Host allowlist it sets up."""

    def _args(self, *argv: str) -> Any:
        from ragloop.cli import build_parser

        return build_parser().parse_args(["serve", *argv])

    @pytest.mark.parametrize(
        ("argv", "keys", "hosts", "who"),
        [
            ((), 0, ("localhost", "127.0.0.1", "::1"), "loopback only"),
            (("--host", "::1"), 0, ("localhost", "127.0.0.1", "::1"), "loopback only"),
            (("--host", "localhost", "--allowed-host", "kb.local"), 0, ("kb.local",), "loopback only"),
            (("--host", "0.0.0.0"), 2, (), "API keys required (2)"),
            (("--host", "0.0.0.0", "--allowed-host", "docs.example.com"), 1, ("docs.example.com",), "required (1)"),
            (("--host", "10.0.0.5", "--allow-no-keys"), 0, (), "--allow-no-keys"),
        ],
    )
    def test_access_rules(self, argv: tuple[str, ...], keys: int, hosts: tuple[str, ...], who: str) -> None:
        """Loopback without keys allows only loopback Host names; keys or an explicit opt-out open other hosts."""
        from ragloop.cli._serve import _access

        allowed, line = _access(self._args(*argv), keys)
        assert allowed == hosts and who in line

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "kb.example.com"])
    def test_a_public_address_without_keys_is_refused(self, host: str) -> None:
        """Any address that is not loopback, without keys and without --allow-no-keys: ConfigError naming the fix."""
        from ragloop.cli._serve import _access
        from ragloop.errors import ConfigError

        with pytest.raises(ConfigError, match=r"set RAGLOOP_API_KEYS or --keys keys\.toml"):
            _access(self._args("--host", host), 0)

    def test_a_bad_keys_file_stops_serve_in_one_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`ragloop serve --keys keys.toml` with an unknown field: exit 2, one line naming entry and field."""
        from ragloop.cli import main

        monkeypatch.delenv("RAGLOOP_API_KEYS", raising=False)
        keys = tmp_path / "keys.toml"
        keys.write_text('[[key]]\nkey = "sk-1"\nprincipal = "a"\nteant = "acme"\n')
        assert main(["serve", "--keys", str(keys), "--index", "/nonexistent"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "[[key]] 1 has unknown fields ['teant']" in err

    def test_a_header_timeout_that_is_not_positive_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--header-timeout 0: exit 2, one line."""
        from ragloop.cli import main

        assert main(["serve", "--header-timeout", "0", "--index", "/nonexistent"]) == 2
        assert "header_timeout_s must be a positive number" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("flag", "value", "says"),
        [
            ("--sessions-per-key", "0", "session quotas must be at least 1"),
            ("--session-idle", "nan", "idle_s must be a positive number"),
            ("--mcp-sessions-per-key", "0", "mcp_sessions_per_key must be a whole number"),
            ("--max-concurrency-per-key", "0", "max_turns_per_key must be a whole number"),
            ("--feedback-per-minute", "-1", "feedback_per_key must be a whole number"),
        ],
    )
    def test_a_per_key_limit_that_cannot_work_is_refused(
        self, flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A per-key limit flag of 0, a negative or NaN: exit 2, one line naming the setting."""
        from ragloop.cli import main

        assert main(["serve", flag, value, "--index", "/nonexistent"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err


class TestWriteTimeout:
    def test_a_client_that_never_reads_is_disconnected_after_the_write_timeout(self) -> None:
        """A client that sends a request and reads nothing: once the socket buffers are full, the write waits
        write_timeout_s (1 s) and the connection is aborted — the app sees the client gone, the client's socket
        is reset (before: the response's write waited for ever, holding the socket, its descriptor and, in
        ragloop's app, a turn slot)."""
        import socket
        import threading

        from ragloop.serve import h11_protocol

        gone = threading.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            async with anyio.create_task_group() as tg:

                async def listen() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    gone.set()
                    tg.cancel_scope.cancel()

                tg.start_soon(listen)
                for _ in range(100_000):  # 6.5 GB at most: far more than any socket buffer holds
                    await send({"type": "http.response.body", "body": b"x" * 65_536, "more_body": True})

        with serving(app, http=h11_protocol(write_timeout_s=1.0)) as url:
            port = int(url.rsplit(":", 1)[1])
            with socket.socket() as client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.connect(("127.0.0.1", port))
                client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                # The bound: the 1 s write timeout, after the kernel's buffers (a few MB) fill, with a wide margin.
                assert gone.wait(30), "the server still writes to a client that reads nothing"
                client.settimeout(30)
                with pytest.raises((ConnectionResetError, BrokenPipeError)):
                    while client.recv(1 << 20):  # what was buffered, then the reset
                        pass
                    raise ConnectionResetError("closed")  # an orderly close counts too: the server let go
