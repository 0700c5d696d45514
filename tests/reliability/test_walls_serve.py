"""Issue 20, the serve walls: attacks on ``ragloop serve`` (the app behind a real uvicorn on 127.0.0.1), two keys.

Every test is an attack that worked on the code before issue 20 (see the commit messages for what each one got
through); each now ends in a refusal or an answer from inside the caller's walls.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from ragloop.retrievers.live import LiveRecord
from ragloop.serve import ApiKey, ServeSettings, create_app, h11_protocol
from ragloop.serve._principals import KeyRing
from ragloop.state import Caller
from ragloop.testing import FakeDecider, FakeLiveSource
from tests.reliability._walls import ALICE, BOB, CAROL, KEYS, SECRETS, bearer, tenant_rag
from tests.serve.conftest import serving, sse_events

pytestmark = pytest.mark.anyio

_SECRET_Q = "What is the webhook signing secret prefix?"
_BILLING_Q = "Which account are invoices paid to by wire?"


def _ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "ragloop", "messages": [{"role": "user", "content": question}], **extra}


def _leaks(text: str, tenant: str) -> list[str]:
    """Markers of tenants other than ``tenant`` found in ``text``."""
    return [m for other, marks in SECRETS.items() if other != tenant for m in marks if m in text]


class TestPrincipals:
    async def test_each_key_reads_only_its_tenants_rows(self) -> None:
        """alice (acme) and bob (globex) ask the same question on both endpoints: each gets only its own
        tenant's pages (before: every key read every tenant's rows)."""
        app = create_app(tenant_rag(), settings=ServeSettings(keys=KEYS))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for key, tenant in ((ALICE, "acme"), (BOB, "globex")):
                    r = await client.post("/v1/chat/completions", headers=bearer(key), json=_ask(_SECRET_Q))
                    assert r.status_code == 200, r.text
                    assert not _leaks(r.text, tenant)
                    assert any(m in r.text for m in SECRETS[tenant])  # it did answer from its own pages
                    sources = {c["source"] for c in r.json()["ragloop"]["citations"]}
                    assert sources and all(s.startswith(f"{tenant}/") for s in sources), sources
                    sse = await client.post("/api/chat", headers=bearer(key), json={"message": _SECRET_Q})
                    assert sse_events(sse.text)[-1][0] == "reply" and not _leaks(sse.text, tenant)

    @pytest.mark.parametrize("asked", [{"tenant": "globex"}, {"tenant": ["acme", "globex"]}, {"tenant": "ACME"}])
    async def test_a_client_filter_cannot_widen_the_scope(self, asked: dict[str, Any]) -> None:
        """alice's filter tenant=globex (or acme+globex) is a 403 naming the rule, before any turn runs."""
        decider = FakeDecider()
        app = create_app(tenant_rag(decider=decider), settings=ServeSettings(keys=KEYS))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                r = await client.post(
                    "/v1/chat/completions", headers=bearer(ALICE), json=_ask(_SECRET_Q, filters=asked)
                )
                sse = await client.post(
                    "/api/chat", headers=bearer(ALICE), json={"message": _SECRET_Q, "filters": asked}
                )
        for response in (r, sse):
            assert response.status_code == 403, response.text
            error = response.json()["error"]
            assert error["code"] == "filter_outside_scope" and error["param"] == "filters"
            assert "outside what this API key may read" in error["message"]
            assert not _leaks(response.text, "acme")
        assert decider.calls == []  # refused before the turn

    async def test_a_client_filter_narrows_inside_the_tenant(self) -> None:
        """alice may narrow to product=billing (acme's invoices only); carol's key is billing-only already and
        cannot ask for integrations."""
        app = create_app(tenant_rag(), settings=ServeSettings(keys=KEYS))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                narrow = await client.post(
                    "/v1/chat/completions", headers=bearer(ALICE), json=_ask(_SECRET_Q, filters={"product": "billing"})
                )
                carol = await client.post("/v1/chat/completions", headers=bearer(CAROL), json=_ask(_SECRET_Q))
                paid = await client.post("/v1/chat/completions", headers=bearer(CAROL), json=_ask(_BILLING_Q))
                wider = await client.post(
                    "/v1/chat/completions",
                    headers=bearer(CAROL),
                    json=_ask(_SECRET_Q, filters={"product": "integrations"}),
                )
        for r in (narrow, carol):
            assert r.status_code == 200, r.text
            sources = {c["source"] for c in r.json()["ragloop"]["citations"]}
            assert sources <= {"acme/invoices.md"} and "ACME-7731" not in r.text and not _leaks(r.text, "acme")
        assert wider.status_code == 403
        assert "ACME-IBAN-5520" in paid.text and not _leaks(paid.text, "acme")

    async def test_the_tenant_reaches_live_lookups_as_the_caller(self) -> None:
        """A live lookup from alice's turn runs for Caller(tenant='acme', user='alice'); bob's for globex."""
        live = FakeLiveSource({"4242": LiveRecord("tickets", "4242", "Ticket #4242", "Ticket #4242 is open.")})
        app = create_app(tenant_rag(live_sources=(live,)), settings=ServeSettings(keys=KEYS))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for key in (ALICE, BOB):
                    r = await client.post(
                        "/v1/chat/completions", headers=bearer(key), json=_ask("status of ticket #4242")
                    )
                    assert r.status_code == 200, r.text
        assert Caller(tenant="acme", user="alice") in live.callers
        assert Caller(tenant="globex", user="bob") in live.callers
        assert None not in live.callers

    async def test_the_plan_nodes_document_search_stays_inside_the_scope(self) -> None:
        """On the plan path (the plan node's document source) bob still sees only globex pages."""
        rag = tenant_rag(plan=True)
        app = create_app(rag, settings=ServeSettings(keys=KEYS))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                r = await client.post("/v1/chat/completions", headers=bearer(BOB), json=_ask(_SECRET_Q))
        assert r.status_code == 200, r.text
        assert rag.nodes["plan"].planner.calls == 1  # type: ignore[attr-defined]
        assert not _leaks(r.text, "globex") and "GLOBEX" in r.text

    async def test_ragloop_api_keys_are_each_their_own_principal(self) -> None:
        """RAGLOOP_API_KEYS-style keys keep working, each its own principal: one key's session is unknown to
        the other."""
        app = create_app(tenant_rag(), settings=ServeSettings(api_keys=("first-key", "second-key")))
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                one = {"authorization": "Bearer first-key"}
                two = {"authorization": "Bearer second-key"}
                r = await client.post(
                    "/api/chat", headers=one, json={"message": "rotate an API key", "new_session": True}
                )
                sid = json.loads(sse_events(r.text)[-1][1])["session_id"]
                own = await client.post("/api/chat", headers=one, json={"message": "and then?", "session_id": sid})
                other = await client.post("/api/chat", headers=two, json={"message": "and then?", "session_id": sid})
                nobody = await client.post(
                    "/api/chat", headers={"authorization": "Bearer third"}, json={"message": "q"}
                )
        assert own.status_code == 200 and other.status_code == 404 and nobody.status_code == 401

    def test_every_configured_key_is_compared(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The lookup compares the presented key's digest with every key's (no early exit that tells which)."""
        import ragloop.serve._principals as principals

        calls: list[int] = []
        real = principals.hmac.compare_digest

        def counting(a: bytes, b: bytes) -> bool:
            calls.append(1)
            return real(a, b)

        ring = KeyRing(tuple(ApiKey(f"p{i}", key=f"key-number-{i}") for i in range(5)))
        monkeypatch.setattr(principals.hmac, "compare_digest", counting)
        for presented in ("key-number-0", "key-number-4", "key-number-", "nope"):
            calls.clear()
            ring.find(presented)
            assert len(calls) == 5, presented
        assert ring.find("key-number-0") is not None and ring.find("key-number-") is None


class TestNoKeys:
    def test_serve_without_keys_refuses_a_public_address(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`ragloop serve --host 0.0.0.0` with no keys: exit 2, one line naming the fix, nothing served (before:
        it served the whole knowledge base to the network)."""
        from ragloop.cli import main

        monkeypatch.delenv("RAGLOOP_API_KEYS", raising=False)
        assert main(["serve", "--host", "0.0.0.0", "--index", "/nonexistent", "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "without API keys" in err and "--keys" in err and "RAGLOOP_API_KEYS" in err

    def test_serve_without_keys_on_loopback_says_so_and_allows_only_loopback_hosts(self, sample_cache: Path) -> None:
        """On 127.0.0.1 with no keys the start line says "loopback only"; a rebinding Host is refused; an idle
        server ends with exit 0 on SIGTERM."""
        proc, base = _start_serve(["--cache-dir", str(sample_cache), "--no-live", "--no-plan"])
        try:
            ok = httpx.get(base + "/v1/models", timeout=5)
            rebound = httpx.get(base + "/v1/models", headers={"host": "attacker.example"}, timeout=5)
            by_name = httpx.get(base + "/v1/models", headers={"host": f"localhost:{base.rsplit(':', 1)[1]}"}, timeout=5)
            probe = httpx.get(base + "/healthz", headers={"host": "10.1.2.3:8000"}, timeout=5)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert ok.status_code == 200 and by_name.status_code == 200 and probe.status_code == 200
        assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "host_not_allowed"
        assert "no API keys: loopback only" in err


class TestRequestHardening:
    @pytest.mark.parametrize(
        "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]
    )
    async def test_a_cross_origin_simple_post_never_runs_a_turn(self, content_type: str | None) -> None:
        """A body a browser may send cross-origin without preflight (text/plain, form, multipart) or with no type
        is 415 before any turn runs (before: a text/plain post from any web page ran a turn)."""
        decider = FakeDecider()
        app = create_app(tenant_rag(decider=decider))
        headers = {"content-type": content_type} if content_type else {}
        body = json.dumps({"message": "rotate an API key"}).encode()
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for path in ("/api/chat", "/v1/chat/completions"):
                    r = await client.post(path, content=body, headers=headers)
                    assert r.status_code == 415, r.text
                    assert r.json()["error"]["code"] == "unsupported_media_type"
                    assert "application/json" in r.json()["error"]["message"]
                good = await client.post(
                    "/api/chat", content=body, headers={"content-type": "Application/JSON; charset=utf-8"}
                )
        assert good.status_code == 200
        assert len(decider.calls) == 1  # only the JSON request ran

    async def test_a_host_outside_the_allowlist_is_refused(self) -> None:
        """--allowed-host docs.example.com: that host (any port, any case) and *.docs.example.com are served; a
        DNS-rebinding name gets 400 before any endpoint runs (before: every Host was served)."""
        settings = ServeSettings(allowed_hosts=("docs.example.com", "*.internal.example"))
        app = create_app(tenant_rag(), settings=settings)
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                statuses = {
                    host: (await client.get("/v1/models", headers={"host": host})).status_code
                    for host in ("docs.example.com", "DOCS.example.com:8443", "a.internal.example", "attacker.example",
                                 "internal.example", "docs.example.com.attacker.example", "127.0.0.1")
                }  # fmt: skip
                post = await client.post("/api/chat", headers={"host": "attacker.example"}, json={"message": "q"})
                page = await client.get("/", headers={"host": "attacker.example"})
                probes = [
                    (await client.get(p, headers={"host": "10.0.0.9"})).status_code for p in ("/healthz", "/readyz")
                ]
        assert statuses == {
            "docs.example.com": 200,
            "DOCS.example.com:8443": 200,
            "a.internal.example": 200,
            "attacker.example": 400,
            "internal.example": 400,
            "docs.example.com.attacker.example": 400,
            "127.0.0.1": 400,
        }
        assert post.status_code == 400 and post.json()["error"]["code"] == "host_not_allowed"
        assert page.status_code == 400 and probes == [200, 200]  # health probes come by address

    def test_half_open_request_heads_are_closed_within_the_limit(self) -> None:
        """60 connections that send half a request head and stop are all closed within the head timeout (before:
        400 such sockets stayed open for good)."""
        with serving(create_app(tenant_rag()), http=h11_protocol(header_timeout_s=0.5)) as url:
            host, port = url.removeprefix("http://").split(":")
            socks = []
            for _ in range(60):
                s = socket.create_connection((host, int(port)))
                s.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appli")
                socks.append(s)
            started = time.monotonic()
            closed = [_wait_closed(s, 5.0) for s in socks]
            took = time.monotonic() - started
            for s in socks:
                s.close()
            healthy = httpx.get(url + "/healthz", timeout=5)
        assert all(closed) and took < 4.0, (sum(closed), took)
        assert healthy.status_code == 200

    def test_an_idle_connection_that_never_sends_a_head_is_closed(self) -> None:
        """A connection that opens and sends nothing is closed too (by the head timer, or keep-alive's)."""
        with serving(create_app(tenant_rag()), http=h11_protocol(header_timeout_s=0.5)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as s:
                assert _wait_closed(s, 5.0)

    def test_a_trickling_body_is_cut_with_408(self) -> None:
        """A complete head with a body that arrives a byte now and then: 408 within body_timeout_s, the connection
        closed (before: the turn's read waited for ever)."""
        app = create_app(tenant_rag(), settings=ServeSettings(body_timeout_s=0.5))
        with serving(app, http=h11_protocol(header_timeout_s=0.5)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as s:
                s.sendall(
                    b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 1000\r\n\r\n{"message": "'
                )
                started = time.monotonic()
                reply = b""
                s.settimeout(0.2)
                while time.monotonic() - started < 5:
                    try:
                        if not reply:  # trickle until the answer starts, as a slow client would
                            s.sendall(b"a")
                        chunk = s.recv(4096)
                    except TimeoutError:
                        continue
                    except OSError:  # a reset once the server gave up on the body ends the read too
                        break
                    if not chunk:
                        break
                    reply += chunk
                took = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 408"), reply[:80]
        assert b"request_timeout" in reply and took < 3.0

    def test_a_body_the_app_never_reads_cannot_hold_the_connection(self) -> None:
        """A refused request (401: wrong key) whose body keeps trickling is closed after the head timeout."""
        app = create_app(tenant_rag(), settings=ServeSettings(keys=KEYS))
        with serving(app, http=h11_protocol(header_timeout_s=0.5)) as url:
            host, port = url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as s:
                s.sendall(
                    b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n{"
                )
                started = time.monotonic()
                s.settimeout(0.1)
                closed = False
                while time.monotonic() - started < 5 and not closed:
                    try:
                        s.sendall(b" ")
                        closed = s.recv(4096) == b""
                    except TimeoutError:
                        continue
                    except OSError:
                        closed = True
                took = time.monotonic() - started
        assert closed and took < 3.0, took


def _wait_closed(s: socket.socket, limit: float) -> bool:
    """Whether the server closes ``s`` within ``limit`` seconds (whatever it sent first)."""
    s.settimeout(limit)
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            if s.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_serve(extra: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``ragloop serve`` on a free port; waits for /healthz. Returns the process and its base URL."""
    port = _free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragloop.cli", "serve", "--port", str(port), *extra],
        env={**base_env, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ragloop serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            httpx.get(base + "/healthz", timeout=1)
            return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("ragloop serve did not start in 60 s")


_HOSTILE = (
    "Rotate\x1b[31m the key\x1b[0m from Settings, \x1b]8;;javascript:alert(1)\x07here\x1b]8;;\x07 [1].\r"
    "\x1b]52;c;cm0gLXJmIH4=\x07\x9b2J\x9d0;pwned\x9c Then revoke the old one.\x1b[?25l"
)
_BAD = ("\x1b", "\x9b", "\x9d", "\x9c", "\x07", "\r", "javascript", "cm0gLXJm", "pwned", "[31m", "\\u001b", "\\u009b")


def _texts(response: httpx.Response) -> str:
    """Every string a client decodes from ``response`` (JSON bodies and SSE payloads), joined."""
    out: list[str] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, str):
            out.append(obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for _, data in sse_events(response.text):
            if data != "[DONE]":
                walk(json.loads(data))
    else:
        walk(response.json())
    return "\n".join(out)


class TestCleanText:
    async def test_model_escape_sequences_never_reach_a_client(self, tmp_path: Path) -> None:
        """The model streams CSI colours, an OSC 8 javascript: link, an OSC 52 clipboard write, C1 CSI/OSC and a
        carriage return, cut into 3-character deltas (sequences split across tokens): no byte of them reaches a
        client on either endpoint, streamed or not, nor the stored session (before: all of it did)."""
        from ragloop.chat import ChatRAG
        from ragloop.serve import SQLiteSessionStore
        from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream
        from tests.reliability._llm import good_response
        from tests.reliability._walls import tenant_index

        def matcher(request: RecordedRequest) -> ScriptedResponse:
            return stream(_HOSTILE, chunk_size=3) if request.judge == "answer" else good_response(request)

        store = SQLiteSessionStore(tmp_path / "s.sqlite")
        async with ScriptedOpenAIServer(matcher=matcher) as model:
            llm = model.client()
            rag = ChatRAG.from_index(tenant_index(), llm, fast_model="m", timeout_s=2.0)
            app = create_app(rag, sessions=store)
            question = "How do I rotate an API key?"
            with serving(app, close=llm.close) as url:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    whole = await client.post("/v1/chat/completions", json=_ask(question))
                    chunks = await client.post("/v1/chat/completions", json=_ask(question, stream=True))
                    sse = await client.post("/api/chat", json={"message": question, "new_session": True})
        sid = json.loads(sse_events(sse.text)[-1][1])["session_id"]
        saved = await store.load("anonymous", sid)
        await store.aclose()
        for response in (whole, chunks, sse):
            assert response.status_code == 200, response.text
            text = _texts(response)
            assert "here" in text and "Then revoke the old one." in text  # the words themselves arrive
            found = [b for b in _BAD if b in text or b in response.text]
            assert not found, (found, response.text[:300])
        assert saved is not None and not [b for m in saved for b in _BAD if b in m.content]


class TestCitationLinks:
    def _folder(self, root: Path) -> Path:
        docs = root / "kb"
        docs.mkdir()
        (docs / "evil.md").write_text(
            "---\nurl: javascript:alert(document.cookie)\n---\n# Rotating\x1b[5m keys\n\n"
            "Rotate an API key from Settings, then revoke the old key within 24 hours.\n"
        )
        (docs / "data.md").write_text(
            "---\nurl: data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\n---\n# Key rotation\n\n"
            "API key rotation: create the new key first, then revoke the old API key.\n"
        )
        (docs / "good.md").write_text(
            "---\nurl: https://docs.example.com/keys\n---\n# API keys\n\nAn API key is rotated from Settings.\n"
        )
        return docs

    async def test_script_and_data_links_never_reach_a_client(self, tmp_path: Path) -> None:
        """Front matter `url: javascript:…` and `url: data:…` (and a source_url that maps to javascript:) never
        reach ragloop.citations[].url, the Sources footer or the SSE reply; an https link does (before: they all
        went through as given)."""
        from ragloop.retrievers.embed import HashEmbedder
        from ragloop.retrievers.index import KnowledgeIndex
        from ragloop.retrievers.ingest import ingest_path
        from ragloop.retrievers.metadata import with_metadata
        from tests.reliability._support import offline_rag

        folder = self._folder(tmp_path)
        chunks = with_metadata(ingest_path(folder).chunks, folder)
        pages = {c.url.partition("#")[0] for c in chunks}  # each chunk links its section (#21): page#anchor
        assert pages >= {"javascript:alert(document.cookie)", "https://docs.example.com/keys"}
        rag = offline_rag(KnowledgeIndex.build(chunks, HashEmbedder(256)))
        question = "How do I rotate an API key?"
        for source_url in (None, lambda source: "javascript:void(" + source + ")"):
            app = create_app(rag, source_url=source_url)
            with serving(app) as url:
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    whole = await client.post("/v1/chat/completions", json=_ask(question))
                    chunked = await client.post("/v1/chat/completions", json=_ask(question, stream=True))
                    sse = await client.post("/api/chat", json={"message": question})
            citations = whole.json()["ragloop"]["citations"]
            assert len(citations) >= 2, whole.text
            for response in (whole, chunked, sse):
                text = _texts(response)
                assert "javascript:" not in text and "data:text" not in text, text
                assert "\x1b" not in text
            urls = {c["source"]: c["url"] for c in citations}
            assert urls.get("evil.md") is None and urls.get("data.md") is None
            if "good.md" in urls:
                assert urls["good.md"] == "https://docs.example.com/keys#api-keys"


_COUNTER = iter(range(10_000))


class TestStoreOutage:
    async def _database(self, pg_url: str) -> tuple[str, str]:
        """A database of its own (so it can be taken down without touching other tests) holding the tenants'
        pages; returns its name and URL."""
        import psycopg

        from ragloop.retrievers.embed import HashEmbedder
        from ragloop.retrievers.postgres import PostgresStore
        from tests.reliability._walls import tenant_chunks

        name = f"walls_outage_{os.getpid()}_{next(_COUNTER)}"
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"create database {name}")
        url = _with_database(pg_url, name)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("create extension if not exists vector")
        async with PostgresStore(url, HashEmbedder(256), collection="kb") as store:
            await store.sync(tenant_chunks())
        return name, url

    async def _set_down(self, pg_url: str, name: str, down: bool) -> None:
        """Take the database down (no new connections, every open one killed) or bring it back."""
        import psycopg

        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute(f"alter database {name} with allow_connections {'false' if down else 'true'}")
            if down:
                await conn.execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = %s", (name,))

    async def test_a_store_outage_is_a_503_or_an_error_event_never_found_nothing(self, pg_url: str) -> None:
        """The store's database goes down mid-service: /readyz turns 503 naming the store and the session store,
        a whole completion is 503 store_unavailable, a stream ends with an error event or chunk saying the
        knowledge base is unavailable, and no client reads "I couldn't find anything"; when the database comes
        back, so do /readyz and the answers (before: 200 "I couldn't find anything relevant", /readyz ready)."""
        import psycopg

        from ragloop.chat import ChatRAG
        from ragloop.serve import PostgresSessionStore
        from ragloop.turn import TurnSettings

        name, url = await self._database(pg_url)
        try:
            settings = TurnSettings(retrieve_timeout_s=1.0, deadline_s=10.0)
            rag = ChatRAG.from_store(url, collection="kb", settings=settings)
            sessions = PostgresSessionStore(url, wait_s=1.0)

            async def close() -> None:
                await sessions.aclose()
                await rag.aclose()

            app = create_app(rag, settings=ServeSettings(ready_interval_s=0.0), sessions=sessions)
            question = "What is the webhook signing secret prefix?"
            with serving(app, close=close) as base:
                async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                    up = await client.get("/readyz")
                    fine = await client.post("/v1/chat/completions", json=_ask(question))
                    await self._set_down(pg_url, name, True)
                    down = await client.get("/readyz")
                    whole = await client.post("/v1/chat/completions", json=_ask(question))
                    chunked = await client.post("/v1/chat/completions", json=_ask(question, stream=True))
                    sse = await client.post("/api/chat", json={"message": question})
                    metrics = (await client.get("/metrics")).text
                    await self._set_down(pg_url, name, False)
                    with anyio.move_on_after(20):  # the pools reconnect with backoff
                        while (back := await client.get("/readyz")).status_code != 200:
                            await anyio.sleep(0.2)
                    again = await client.post("/v1/chat/completions", json=_ask(question))
        finally:
            await self._set_down(pg_url, name, False)
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute(f"drop database if exists {name} with (force)")
        assert up.status_code == 200 and up.json()["checks"]["store"] == "ok", up.text
        assert (fine.status_code == 200 and "ACME-7731" in fine.text) or "GLOBEX-4412" in fine.text
        assert down.status_code == 503, down.text
        assert down.json()["checks"]["store"] == "unavailable" and down.json()["checks"]["sessions"] == "unavailable"
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_unavailable", whole.text
        assert "knowledge base is unavailable" in whole.json()["error"]["message"]
        data = [d for _, d in sse_events(chunked.text)]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "store_unavailable", chunked.text
        name_, payload = sse_events(sse.text)[-1]
        assert name_ == "error" and json.loads(payload)["error"]["code"] == "store_unavailable", sse.text
        for response in (whole, chunked, sse):
            assert "couldn't find" not in response.text.lower()
        assert 'ragloop_requests_rejected_total{reason="store_unavailable"} 3.0' in metrics
        assert back.status_code == 200, back.text
        assert again.status_code == 200 and "couldn't find" not in again.text

    async def test_a_busy_store_is_a_503_store_busy_with_retry_after_never_unavailable(self, pg_url: str) -> None:
        """The store's one pooled connection held by the test (the server up): every search of a turn waits for
        it, queueing again while the turn's 6 s deadline allows, and the client gets 503 ``store_busy`` with
        ``Retry-After`` (a whole completion)
        or an error event ``store_busy`` (a stream) — never ``store_unavailable`` nor "found nothing"; released,
        the same question is answered (before: 503 store_unavailable, "the knowledge base is unavailable")."""
        import psycopg

        from ragloop.chat import ChatRAG
        from ragloop.turn import TurnSettings

        name, url = await self._database(pg_url)
        try:
            settings = TurnSettings(retrieve_timeout_s=1.0, deadline_s=6.0)
            rag = ChatRAG.from_store(url, collection="kb", settings=settings, pool_size=1)
            store = rag.store
            assert store is not None
            # The server's deadline is the turn's (its default 60 s would override the rag's 6 s).
            app = create_app(rag, settings=ServeSettings(ready_interval_s=0.0, deadline_s=settings.deadline_s))
            question = "What is the webhook signing secret prefix?"
            taken, release = anyio.Event(), anyio.Event()

            async def hold() -> None:
                async with store._conn.pool.connection():
                    taken.set()
                    await release.wait()

            # A turn ends by its deadline plus the server's grace (15 s); the client waits well past that.
            limit = settings.deadline_s + ServeSettings().deadline_grace_s + 60
            with serving(app, close=rag.aclose) as base:
                async with httpx.AsyncClient(base_url=base, timeout=limit) as client, anyio.create_task_group() as tg:
                    fine = await client.post("/v1/chat/completions", json=_ask(question))  # opens the pool
                    tg.start_soon(hold)
                    await taken.wait()
                    try:
                        whole = await client.post("/v1/chat/completions", json=_ask(question))
                        sse = await client.post("/api/chat", json={"message": question})
                        metrics = (await client.get("/metrics")).text
                    finally:
                        release.set()
                    again = await client.post("/v1/chat/completions", json=_ask(question))
        finally:
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
                await conn.execute(f"drop database if exists {name} with (force)")
        assert fine.status_code == 200, fine.text
        assert whole.status_code == 503 and whole.json()["error"]["code"] == "store_busy", whole.text
        assert "busy" in whole.json()["error"]["message"] and int(whole.headers["retry-after"]) >= 1
        name_, payload = sse_events(sse.text)[-1]
        assert name_ == "error" and json.loads(payload)["error"]["code"] == "store_busy", sse.text
        for response in (whole, sse):
            assert "store_unavailable" not in response.text and "couldn't find" not in response.text.lower()
        assert 'ragloop_requests_rejected_total{reason="store_busy"} 2.0' in metrics
        assert 'reason="store_unavailable"' not in metrics
        assert again.status_code == 200 and "couldn't find" not in again.text, again.text


def _with_database(url: str, name: str) -> str:
    """``url`` with its database replaced by ``name`` (pgserver URLs: postgresql://user:@/db?host=/socket)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


class TestShutdown:
    @pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
    async def test_a_signal_cancels_the_turns_in_flight_and_exits_0(self, sig: int, sample_cache: Path) -> None:
        """SIGINT or SIGTERM while a turn waits on the model: the turn's stream ends with an error event saying the
        server is shutting down, the model call is dropped, and `ragloop serve` exits 0 within seconds (before:
        exit 130 on SIGINT, killed by SIGTERM)."""
        from ragloop.testing import ScriptedOpenAIServer, reply

        async with ScriptedOpenAIServer(script=[reply("never sent").delayed(30.0)]) as model:
            env = {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "unused", "RAGLOOP_MODEL": "m"}
            proc, base = _start_serve(["--cache-dir", str(sample_cache), "--no-live", "--no-plan"], env)
            try:
                question = {"message": "How do I rotate an API key?"}
                async with (
                    httpx.AsyncClient(base_url=base, timeout=30) as client,
                    client.stream("POST", "/api/chat", json=question) as r,
                ):
                    await model.wait_for_requests(1, timeout_s=20)  # the decide call waits on the model
                    proc.send_signal(sig)
                    signalled = time.monotonic()
                    body = "".join([chunk async for chunk in r.aiter_text()])
                code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
                took = time.monotonic() - signalled
                with anyio.fail_after(5):
                    while model.stats.requests_aborted < 1:
                        await anyio.sleep(0.05)
            finally:
                if proc.poll() is None:
                    proc.kill()
                _, err = proc.communicate(timeout=20)
        assert code == 0, err
        assert took < 8.0, took
        name, data = sse_events(body)[-1]
        assert name == "error" and json.loads(data)["error"]["code"] == "shutting_down", body
        assert "Traceback" not in err, err
