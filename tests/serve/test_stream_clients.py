"""Each streaming format read by a real client: a Chromium page with plain fetch(), and the AI SDK's own code.

The page is ``docs/examples/stream-clients.html``, served beside the app (mounted at ``/rag``, same origin); the
AI SDK client is ``docs/examples/ai-sdk-client.mjs`` run by node with the ``ai`` npm package (installed once
into the user cache with npm).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

from ragloop.chat import ChatRAG
from ragloop.serve import ServeSettings, create_app
from tests._chromium import headless_chromium
from tests.serve.conftest import StuckRag, asgi_client, fake_rag, serving, sse_events

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
AI_VERSION = "7.0.173"
QUESTION = "How do I rotate an API key?"


@pytest.fixture(scope="module")
def page_server(sample_rag: ChatRAG) -> Iterator[str]:
    """The example page at /clients.html and the app at /rag, one origin."""
    html = (EXAMPLES / "stream-clients.html").read_text(encoding="utf-8")

    async def page(request: Any) -> HTMLResponse:
        return HTMLResponse(html)

    site = Starlette(routes=[Route("/clients.html", page), Mount("/rag", create_app(sample_rag))])
    with serving(site) as url:
        yield url


class TestInBrowser:
    @pytest.mark.slow
    @pytest.mark.parametrize("fmt", ["ragloop", "ai-sdk", "responses"])
    def test_the_page_reads_each_format(self, page_server: str, fmt: str) -> None:
        """Chromium's fetch() reads the answer, its sources and the outcome from each format's stream."""
        with headless_chromium("1100,900") as driver:
            driver.set_script_timeout(60)
            driver.get(page_server + "/clients.html")
            out = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                f"consume({fmt!r}, {QUESTION!r}).then(done, (e) => done({{error: String(e)}}));"
            )
            shown = driver.find_element("id", "answer").text
        assert "error" not in out, out
        assert out["status"] == 200 and out["outcome"] in ("context", "partial")
        assert out["text"].strip() and shown.strip() == out["text"].strip()
        assert any(s["title"] == "API keys" for s in out["sources"])
        if fmt == "ai-sdk":
            assert out["protocol"] == "v1"
            assert out["events"][0] == "start" and out["events"][-1] == "finish"


class TestAiSdkClient:
    @pytest.mark.slow
    def test_the_ai_sdk_assembles_the_message(self, sample_rag: ChatRAG, tmp_path_factory: Any) -> None:
        """The AI SDK's DefaultChatTransport + readUIMessageStream (what useChat runs) parse every chunk and
        build one assistant message: the text, a source part per citation, the data-ragloop part."""
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            pytest.fail("node and npm are needed for the AI SDK client test: apt-get install -y nodejs npm")
        cache = Path.home() / ".cache" / "ragloop-tests" / f"ai-{AI_VERSION}"
        if not (cache / "node_modules" / "ai" / "package.json").exists():
            cache.mkdir(parents=True, exist_ok=True)
            installed = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), f"ai@{AI_VERSION}"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if installed.returncode != 0:  # say npm's own reason (a TLS proxy's CA, no registry), not just "exit 1"
                pytest.fail(
                    f"npm could not install ai@{AI_VERSION} into {cache} (exit {installed.returncode}); behind a TLS "
                    f"proxy set NODE_EXTRA_CA_CERTS to its CA bundle. npm said:\n{installed.stderr[-2000:]}"
                )
        script = cache / "ai-sdk-client.mjs"
        shutil.copy(EXAMPLES / "ai-sdk-client.mjs", script)
        with serving(create_app(sample_rag)) as url:
            done = subprocess.run(
                [node, str(script), url + "/api/chat?format=ai-sdk", QUESTION],
                capture_output=True, text=True, timeout=60, cwd=cache,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        message = json.loads(done.stdout)
        kinds = [p["type"] for p in message["parts"]]
        text = next(p for p in message["parts"] if p["type"] == "text")
        data = next(p for p in message["parts"] if p["type"] == "data-ragloop")["data"]
        assert message["role"] == "assistant" and text["state"] == "done"
        assert text["text"].strip() == data["text"].strip() and data["outcome"] in ("context", "partial")
        sources = [p for p in message["parts"] if p["type"] in ("source-url", "source-document")]
        assert len(sources) == len(data["citations"]) >= 1
        assert "data-progress" not in kinds  # transient: shown while streaming, not kept in the message


class TestAiSdkRequests:
    async def test_history_from_ui_messages_and_the_header(self, rag: ChatRAG) -> None:
        """UI messages become the history (assistant text only); the response names its protocol."""
        body = {
            "id": "c1",
            "messages": [
                {"id": "1", "role": "user", "parts": [{"type": "text", "text": "hello"}]},
                {"id": "2", "role": "assistant", "parts": [
                    {"type": "step-start"}, {"type": "text", "text": "hi"},
                    {"type": "source-url", "sourceId": "s", "url": "https://x"}, {"type": "data-ragloop", "data": {}}]},
                {"id": "3", "role": "user", "parts": [{"type": "text", "text": "rotate api key?"}]},
            ],
        }  # fmt: skip
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/api/chat?format=ai-sdk", json=body)
        chunks = [json.loads(data) for _, data in sse_events(r.text) if data != "[DONE]"]
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert [c["type"] for c in chunks][-3:] == ["source-document", "data-ragloop", "finish"]
        assert r.text.endswith("data: [DONE]\n\n")

    async def test_a_file_part_and_an_unknown_format_are_400s(self, rag: ChatRAG) -> None:
        """A file in the question is a 400 naming the part; format=xml is a 400 naming format."""
        parts = [{"type": "text", "text": "what is this"}, {"type": "file", "mediaType": "image/png", "url": "data:"}]
        message = {"id": "1", "role": "user", "parts": parts}
        async with asgi_client(create_app(rag)) as client:
            file = await client.post("/api/chat?format=ai-sdk", json={"messages": [message]})
            fmt = await client.post("/api/chat?format=xml", json={"message": "q"})
        assert file.status_code == 400 and file.json()["error"]["param"] == "messages[0].parts[1]"
        assert fmt.status_code == 400 and fmt.json()["error"]["param"] == "format"

    async def test_a_turn_that_fails_mid_stream_ends_with_an_error_chunk(self) -> None:
        """A turn cut off after the stream started ends with an error chunk and [DONE]."""
        app = create_app(fake_rag(cls=StuckRag), settings=ServeSettings(deadline_s=0.1, deadline_grace_s=0.2))
        body = {"messages": [{"id": "1", "role": "user", "parts": [{"type": "text", "text": "rotate?"}]}]}
        async with asgi_client(app) as client:
            r = await client.post("/api/chat?format=ai-sdk", json=body)
        last = json.loads(sse_events(r.text)[-2][1])
        assert last["type"] == "error" and "deadline" in last["errorText"]
