"""The MCP server through the official SDK's own client: over stdio (``ragloop mcp``) and over HTTP (``/mcp``)."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ragloop.chat import ChatRAG
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.serve import ApiKey, IndexDocuments, ServeSettings, create_app
from ragloop.state import Chunk
from ragloop.testing import FakeRetriever, ScriptedOpenAIServer, reply
from tests.serve.conftest import DOCS, fake_rag, serving

pytestmark = pytest.mark.anyio

KEYS = (ApiKey("alice", key="sk-acme", tenant="acme"), ApiKey("bob", key="sk-globex", tenant="globex"))


def _tenant_index() -> KnowledgeIndex:
    """Two tenants' documents about the same topic."""
    chunks = [
        Chunk("a1", "Acme rotates API keys every 90 days in the admin console.", "acme-keys.md", "Acme keys",
              doc_id="acme-keys.md", url="https://acme.example/keys", metadata=(("tenant", "acme"),)),
        Chunk("g1", "Globex rotates API keys with the globex CLI, never in the console.", "globex-keys.md",
              "Globex keys", doc_id="globex-keys.md", metadata=(("tenant", "globex"),)),
    ]  # fmt: skip
    return KnowledgeIndex.build(chunks, HashEmbedder())


@asynccontextmanager
async def http_client(url: str, key: str | None) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP with ``key`` as bearer token."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http)) as client,
    ):
        yield client


class TestStdio:
    async def test_ragloop_mcp_over_stdio(self, sample_cache: Path) -> None:
        """`ragloop mcp` over stdio: tools with schemas, a search whose hits name readable resources, an answer
        with citations, the prompt, and MCP errors naming the unknown tool and the schema violation."""
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "ragloop.cli", "mcp", "--no-plan", "--cache-dir", str(sample_cache)],
            env={"PATH": "/usr/bin:/bin", "HOME": str(sample_cache)},
        )
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            found = await client.call_tool("search", {"query": "rotate an API key", "k": 3})
            hits = found.structured_content["hits"]
            doc = await client.read_resource(hits[0]["resource"])
            answer = await client.call_tool("ask", {"question": "How do I rotate an API key?"})
            prompt = await client.get_prompt("answer_from_kb", {"question": "What is SCIM?"})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("delete_everything", {})
            with pytest.raises(MCPError) as bad:
                await client.call_tool("search", {"query": "keys", "k": 500})
        assert set(tools) == {"ask", "search"}
        assert tools["ask"].output_schema is not None and "outcome" in tools["ask"].output_schema["properties"]
        assert len(hits) == 3 and hits[0]["resource"].startswith("ragloop://doc/")
        assert hits[0]["title"] and "API key" in doc.contents[0].text  # type: ignore[union-attr]
        assert answer.structured_content["outcome"] in ("context", "partial")
        assert answer.structured_content["citations"] and "Sources:" in answer.content[0].text  # type: ignore[union-attr]
        assert "What is SCIM?" in prompt.messages[0].content.text  # type: ignore[union-attr]
        assert unknown.value.code == -32602 and "unknown tool 'delete_everything'" in str(unknown.value)
        assert bad.value.code == -32602 and "k:" in str(bad.value) and "500" in str(bad.value)

    async def test_an_unknown_filter_key_is_said_as_such_with_no_traceback(
        self, sample_cache: Path, tmp_path: Path
    ) -> None:
        """search and ask with a misspelt filter key over stdio: an invalid-params error naming the key and the
        known ones (before: "the knowledge base is unavailable … retry" and a 110-line traceback on stderr)."""
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "ragloop.cli", "mcp", "--no-plan", "--cache-dir", str(sample_cache)],
            env={"PATH": "/usr/bin:/bin", "HOME": str(sample_cache)},
        )
        errors: list[MCPError] = []
        with (tmp_path / "stderr.txt").open("w+") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                for tool, arguments in (("search", {"query": "keys"}), ("ask", {"question": "How do I rotate keys?"})):
                    with pytest.raises(MCPError) as failed:
                        await client.call_tool(tool, {**arguments, "filters": {"tenatn": ["acme"]}})
                    errors.append(failed.value)
            errlog.seek(0)
            stderr = errlog.read()
        for error in errors:
            assert error.code == -32602 and "tenatn" in str(error) and "known keys" in str(error), str(error)
            assert "unavailable" not in str(error)
        assert "Traceback" not in stderr and "mcp search failed" not in stderr, stderr

    def test_a_line_over_the_cap_is_refused_with_an_error_and_the_next_is_served(self, sample_cache: Path) -> None:
        """`ragloop mcp --max-line-bytes 4000`: a 200 KB tools/call gets an error answer under its own id (not
        a hang, not 200 KB in memory), stderr says why, and the next call is answered."""
        import json
        import subprocess

        proc = subprocess.Popen(
            [sys.executable, "-m", "ragloop.cli", "mcp", "--no-plan", "--cache-dir", str(sample_cache),
             "--max-line-bytes", "4000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        huge = {"name": "search", "arguments": {"query": "x" * 200_000}}
        for message in (
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": huge},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
        ):
            proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        answers = {}
        try:
            while len(answers) < 3:
                line = proc.stdout.readline()
                assert line, "ragloop mcp closed stdout early"
                answer = json.loads(line)
                answers[answer.get("id")] = answer
        finally:
            _, err = proc.communicate(timeout=60)  # closes stdin: the server ends
        assert "error" in answers[2] and "result" in answers[3]
        assert {t["name"] for t in answers[3]["result"]["tools"]} == {"ask", "search"}
        assert "over 4,000 bytes (--max-line-bytes)" in err

    def test_capped_lines_read_a_long_line_in_pieces(self) -> None:
        """CappedLines: lines under the cap pass unchanged; one over it becomes the stand-in call with its id
        (or a notification without one), the rest of it skipped, and the next line is intact."""
        import io

        from ragloop.cli._mcp import CappedLines

        raw = b'{"id": 1}\n' + b'{"jsonrpc": "2.0", "id": "a-7", "params": "' + b"y" * 300_000 + b'"}\n'
        raw += b"z" * 5_000 + b"\n" + b'{"id": 2}\n'
        lines = CappedLines(io.BytesIO(raw), max_bytes=100)
        read = [lines.read_line() for _ in range(5)]
        assert read[0] == '{"id": 1}\n' and read[3] == '{"id": 2}\n' and read[4] is None
        assert read[1] == '{"jsonrpc": "2.0", "id": "a-7", "method": "ragloop/line_too_long"}\n'
        assert read[2] == '{"jsonrpc": "2.0", "method": "notifications/ragloop/line_too_long"}\n'
        assert lines.dropped == 2

    def test_stdout_carries_only_the_protocol(self, sample_cache: Path) -> None:
        """`ragloop mcp` writes its status lines to stderr: stdout holds only JSON-RPC lines."""
        request = (
            '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
            '"capabilities":{},"clientInfo":{"name":"t","version":"0"}}}\n'
        )
        import subprocess

        done = subprocess.run(
            [sys.executable, "-m", "ragloop.cli", "mcp", "--no-plan", "--cache-dir", str(sample_cache)],
            input=request,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        assert lines and all(line.startswith('{"') and '"jsonrpc":"2.0"' in line for line in lines)
        assert "ragloop: running offline" in done.stderr


class TestHttp:
    async def test_keys_and_tenants_wall_in_every_call(self) -> None:
        """Over /mcp a call without a key is 401; each key's tenant walls in search, ask and resource reads — a
        document of another tenant reads exactly like one that does not exist."""
        index = _tenant_index()
        rag = ChatRAG.from_index(index)
        app = create_app(rag, settings=ServeSettings(keys=KEYS), documents=IndexDocuments(index))
        with serving(app, lifespan="on") as url:
            anonymous = httpx2.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            async with http_client(url, "sk-acme") as acme:
                hits = (await acme.call_tool("search", {"query": "rotate API keys"})).structured_content["hits"]
                answer = (await acme.call_tool("ask", {"question": "How are API keys rotated?"})).structured_content
                listed = [r.uri for r in (await acme.list_resources()).resources]
                with pytest.raises(MCPError) as foreign:
                    await acme.read_resource("ragloop://doc/globex-keys.md")
                with pytest.raises(MCPError) as missing:
                    await acme.read_resource("ragloop://doc/nobody.md")
                with pytest.raises(MCPError) as widen:
                    await acme.call_tool("search", {"query": "keys", "filters": {"tenant": "globex"}})
            async with http_client(url, "sk-globex") as globex:
                theirs = (await globex.call_tool("search", {"query": "rotate API keys"})).structured_content["hits"]
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
        assert [h["doc_id"] for h in hits] == ["acme-keys.md"] and hits[0]["url"] == "https://acme.example/keys"
        assert [c["source"] for c in answer["citations"]] == ["acme-keys.md"] and "Globex" not in answer["text"]
        assert listed == ["ragloop://doc/acme-keys.md"]
        assert str(foreign.value) == str(missing.value).replace("nobody.md", "globex-keys.md")
        assert "filter" in str(widen.value) and widen.value.code == -32602
        assert [h["doc_id"] for h in theirs] == ["globex-keys.md"]

    async def test_progress_notifications_carry_the_turns_progress(self, rag: ChatRAG) -> None:
        """A call with a progress callback receives the turn's progress events, numbered in order."""
        seen: list[tuple[float, str | None]] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            seen.append((done, message))

        with serving(create_app(rag), lifespan="on") as url:
            async with http_client(url, None) as client:
                result = await client.call_tool("ask", {"question": "rotate api key?"}, progress_callback=progress)
        assert not result.is_error
        assert [n for n, _ in seen] == list(range(1, len(seen) + 1)) and len(seen) >= 2
        assert any(m and m.startswith("retrieve:") for _, m in seen)

    async def test_cancelling_the_call_cancels_the_turn_and_its_model_call(self, sample_cache: Path) -> None:
        """A client that cancels its tool call cancels the turn: the model request in flight is dropped and the
        turn's slot is freed."""
        async with ScriptedOpenAIServer(script=[reply("never sent").delayed(30.0)]) as model:
            llm = model.client()
            rag = ChatRAG.sample(llm, cache_dir=sample_cache, fast_model="m")
            app = create_app(rag)
            with serving(app, close=llm.close, lifespan="on") as url:
                async with http_client(url, None) as client:
                    with anyio.move_on_after(30) as scope:
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(client.call_tool, "ask", {"question": "How do I rotate an API key?"})
                            await model.wait_for_requests(1)
                            cancelled_at = time.monotonic()
                            tg.cancel_scope.cancel()
                    with anyio.fail_after(5):
                        while model.stats.requests_aborted < 1:
                            await anyio.sleep(0.02)
                    dropped_after = time.monotonic() - cancelled_at
                    async with httpx2.AsyncClient(base_url=url) as http:
                        with anyio.fail_after(5):
                            while "ragloop_turns_in_flight 0.0" not in (metrics := (await http.get("/metrics")).text):
                                await anyio.sleep(0.02)
        assert not scope.cancelled_caught
        assert dropped_after < 3.0
        assert "ragloop_turns_cancelled_total 1.0" in metrics

    async def test_a_busy_server_is_a_tool_error_the_model_can_read(self) -> None:
        """With every turn slot taken, ask answers isError with the reason (never a hang, never a crash)."""
        slow = fake_rag(retriever=FakeRetriever(DOCS, delays={"rotate api key": 30.0}))
        app = create_app(slow, settings=ServeSettings(max_concurrent_turns=1))
        with serving(app, lifespan="on") as url:
            async with (
                http_client(url, None) as first,
                http_client(url, None) as second,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(first.call_tool, "ask", {"question": "q"})
                async with httpx2.AsyncClient(base_url=url) as http:
                    with anyio.fail_after(5):
                        while "ragloop_turns_in_flight 1.0" not in (await http.get("/metrics")).text:
                            await anyio.sleep(0.02)
                busy = await second.call_tool("ask", {"question": "q"})
                tg.cancel_scope.cancel()
        assert busy.is_error and "server busy" in busy.content[0].text  # type: ignore[union-attr]

    async def test_without_the_lifespan_the_endpoint_says_what_to_do(self, rag: ChatRAG) -> None:
        """An app mounted without its lifespan answers /mcp with 503 naming the fix, not a crash."""
        with serving(create_app(rag)) as url:  # lifespan off, as a mount inside another app would be
            r = httpx2.post(url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 503 and "lifespan" in r.json()["error"]["message"]

    async def test_the_body_limit_applies(self, rag: ChatRAG) -> None:
        """/mcp refuses a body over max_body_bytes and a non-JSON body, as every endpoint does."""
        app = create_app(rag, settings=ServeSettings(max_body_bytes=1000))
        with serving(app, lifespan="on") as url:
            big = httpx2.post(
                url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"p": "x" * 2000}}
            )
            form = httpx2.post(url + "/mcp", content=b"a=b", headers={"content-type": "text/plain"})
        assert big.status_code == 413 and form.status_code == 415

    def test_the_server_can_be_left_out(self, rag: ChatRAG) -> None:
        """ServeSettings(mcp=False) serves no /mcp."""
        app = create_app(rag, settings=ServeSettings(mcp=False))
        assert all(getattr(r, "path", "") != "/mcp" for r in app.routes)
