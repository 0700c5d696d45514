"""Hand-off to a person: POST /v1/handoff and its resolution, walled per API key; the signed webhook against a
real local receiver that is up, down, failing, or slow; a draft page that `ragloop index --include-drafts` reads."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.chat import ChatRAG
from ragloop.errors import ConfigError
from ragloop.serve import Handoff, ServeSettings, create_app, sign
from ragloop.serve._handoff import Webhook, resolution_page
from ragloop.turnlog import TurnLog
from tests.serve.conftest import asgi_client, fake_rag, serving, sse_events

pytestmark = pytest.mark.anyio

SECRET = b"shared-secret-0123"
KEYS = ServeSettings(api_keys=("key-alice", "key-bob"))


class Receiver:
    """A webhook receiver on 127.0.0.1: records each POST; answers ``statuses`` in turn (then 200), after
    ``delay_s``; ``finished`` is set when a request has been answered."""

    def __init__(self, statuses: tuple[int, ...] = (), delay_s: float = 0.0, port: int = 0) -> None:
        self.statuses = list(statuses)
        self.delay_s = delay_s
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.started = threading.Event()
        self.finished = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                owner.started.set()
                time.sleep(owner.delay_s)
                owner.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = owner.statuses.pop(0) if owner.statuses else 200
                with contextlib.suppress(OSError):  # the sender may have given up on a slow answer
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                owner.finished.set()

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _down_url() -> str:
    """A URL nothing listens on (a port bound, then closed)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/hook"


def _handoff(tmp_path: Path, url: str | None = None, **kw: Any) -> Handoff:
    return Handoff(tmp_path / "drafts", url=url, secret=SECRET if url else None, **kw)


class TestWebhook:
    async def test_delivered_and_signed(self, tmp_path: Path) -> None:
        """The receiver gets the JSON packet once, with an HMAC-SHA256 signature of the exact body."""
        with Receiver() as rx:
            hook = Webhook(_handoff(tmp_path, rx.url))
            assert hook.admit() and await hook.deliver({"handoff_id": "h-1", "question": "Zapier? é"})
        [(headers, body)] = rx.got
        expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
        assert headers["x-ragloop-signature"] == expected == sign(body, SECRET)
        assert json.loads(body)["question"] == "Zapier? é" and headers["x-ragloop-handoff"] == "h-1"
        assert (
            hook.counts == {"delivered": 1, "failed": 0, "dropped": 0, "parked": 0, "resent": 0, "dead": 0}
            and hook.pending == 0
        )

    async def test_refused_then_accepted_is_retried(self, tmp_path: Path) -> None:
        """500 and 503 are retried with backoff; the third attempt's 200 delivers it."""
        with Receiver(statuses=(500, 503)) as rx:
            hook = Webhook(_handoff(tmp_path, rx.url, backoff_s=0.01))
            assert hook.admit() and await hook.deliver({"handoff_id": "h-2"})
        assert len(rx.got) == 3 and hook.counts["delivered"] == 1

    async def test_receiver_down(self, tmp_path: Path) -> None:
        """Nothing listening: every attempt fails, it gives up (counted), and raises nothing."""
        hook = Webhook(_handoff(tmp_path, _down_url(), attempts=3, backoff_s=0.01))
        assert hook.admit() and not await hook.deliver({"handoff_id": "h-3"})
        assert (
            hook.counts == {"delivered": 0, "failed": 1, "dropped": 0, "parked": 0, "resent": 0, "dead": 0}
            and hook.pending == 0
        )

    async def test_receiver_slow(self, tmp_path: Path) -> None:
        """A receiver slower than the attempt's time limit: each attempt is cut off and retried, then given up."""
        with Receiver(delay_s=1.0) as rx:
            hook = Webhook(_handoff(tmp_path, rx.url, attempts=2, backoff_s=0.01, timeout_s=0.2))
            assert hook.admit() and not await hook.deliver({"handoff_id": "h-4"})
            assert hook.counts["failed"] == 1

    def test_pending_bound(self, tmp_path: Path) -> None:
        """Past max_pending, a packet is not sent and counted as dropped."""
        hook = Webhook(_handoff(tmp_path, "http://127.0.0.1:9/", max_pending=1))
        assert hook.admit() and not hook.admit() and hook.counts["dropped"] == 1

    def test_url_needs_a_secret(self, tmp_path: Path) -> None:
        """A webhook without a shared secret is refused when configured."""
        with pytest.raises(ValueError, match="shared secret"):
            Handoff(tmp_path, url="http://127.0.0.1:9/")


def _logged(tmp_path: Path) -> ChatRAG:
    rag = fake_rag()
    rag.turn_log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
    return rag


async def _turn(client: httpx.AsyncClient, key: str) -> str:
    r = await client.post(
        "/api/chat", json={"message": "How do I rotate an API key?"}, headers={"authorization": f"Bearer {key}"}
    )
    return str(json.loads(sse_events(r.text)[-1][1])["turn_id"])


async def _stored(rag: ChatRAG, turn_id: str) -> None:
    assert rag.turn_log is not None
    for _ in range(500):
        with contextlib.suppress(ConfigError):  # the writer has not created the file yet
            if rag.turn_log.backend.turn(turn_id) is not None:
                return
        await anyio.sleep(0.02)
    raise AssertionError("the turn was never written")


def _as(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class TestEndpoints:
    async def test_walls_and_resolution_to_a_draft(self, tmp_path: Path) -> None:
        """Alice hands off her own turn (202); Bob can neither hand it off nor resolve it (404, as unknown);
        Alice's resolution becomes a draft page with front matter (201), once (409 the second time)."""
        rag = _logged(tmp_path)
        app = create_app(rag, settings=KEYS, handoff=_handoff(tmp_path))
        async with asgi_client(app) as client:
            turn_id = await _turn(client, "key-alice")
            await _stored(rag, turn_id)
            assert (
                await client.post("/v1/handoff", json={"turn_id": turn_id}, headers=_as("key-bob"))
            ).status_code == 404
            answered = await client.post("/v1/handoff", json={"turn_id": turn_id}, headers=_as("key-alice"))
            assert answered.status_code == 409 and "thumbs-down" in answered.text  # it was answered: rate it first
            down = {"turn_id": turn_id, "rating": "down"}
            assert (await client.post("/v1/feedback", json=down, headers=_as("key-alice"))).status_code == 200
            r = await client.post("/v1/handoff", json={"turn_id": turn_id, "note": "call me"}, headers=_as("key-alice"))
            assert r.status_code == 202
            made = r.json()
            assert made["webhook"] == "not_configured" and made["handoff_id"].startswith("h-")
            path = f"/v1/handoff/{made['handoff_id']}/resolution"
            answer = {"answer": "Create a new key, then revoke the old one.", "agent": "Dana"}
            assert (await client.post(path, json=answer, headers=_as("key-bob"))).status_code == 404
            r = await client.post(path, json=answer, headers=_as("key-alice"))
            assert r.status_code == 201 and r.json()["draft"] == f"handoff-{made['handoff_id']}.md"
            assert (await client.post(path, json=answer, headers=_as("key-alice"))).status_code == 409
            bad = await client.post("/v1/handoff", json={"turn": turn_id}, headers=_as("key-alice"))
            assert bad.status_code == 400 and "unknown field 'turn'" in bad.text
            assert (
                await client.post("/v1/handoff/../etc/resolution", json=answer, headers=_as("key-alice"))
            ).status_code == 404
        await rag.aclose()
        page = (tmp_path / "drafts" / f"handoff-{made['handoff_id']}.md").read_text(encoding="utf-8")
        assert page.startswith('---\nquestion: "How do I rotate an API key?"\nagent: "Dana"\n')
        assert f'turn: "{turn_id}"' in page and 'draft: "true"' in page and page.endswith("revoke the old one.\n")

    async def test_without_turn_log_or_handoff(self, tmp_path: Path) -> None:
        """No hand-off configured: no route (404); configured without a turn log: 404 naming --turn-log."""
        async with asgi_client(create_app(fake_rag())) as client:
            assert (await client.post("/v1/handoff", json={"turn_id": "x"})).status_code == 404
        async with asgi_client(create_app(fake_rag(), handoff=_handoff(tmp_path))) as client:
            r = await client.post("/v1/handoff", json={"turn_id": "x"})
            assert r.status_code == 404 and "--turn-log" in r.text

    def test_slow_webhook_never_holds_the_request_or_a_turn(self, tmp_path: Path) -> None:
        """Through a real server: with the receiver taking 3 s, POST /v1/handoff answers 202 while the receiver
        is still working, a turn runs meanwhile, and the packet arrives, signed, afterwards."""
        rag = _logged(tmp_path)
        with Receiver(delay_s=3.0) as rx:
            app = create_app(rag, handoff=_handoff(tmp_path, rx.url, timeout_s=30.0))
            with serving(app, close=rag.aclose) as base, httpx.Client(base_url=base, timeout=30) as client:
                r = client.post("/api/chat", json={"message": "How do I rotate an API key?"})
                turn_id = json.loads(sse_events(r.text)[-1][1])["turn_id"]
                anyio.run(_stored, rag, turn_id)
                assert client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "down"}).status_code == 200
                made = client.post("/v1/handoff", json={"turn_id": turn_id})
                assert made.status_code == 202 and made.json()["webhook"] == "queued"
                assert not rx.finished.is_set()  # answered before the receiver was done
                again = client.post("/api/chat", json={"message": "How do I rotate an API key?"})
                assert again.status_code == 200
                assert rx.finished.wait(30)
                for _ in range(500):  # the sender counts the delivery once the receiver's answer is read
                    if 'ragloop_handoff_webhook_total{result="delivered"} 1.0' in client.get("/metrics").text:
                        break
                    time.sleep(0.02)
                else:
                    raise AssertionError("the delivery was never counted in /metrics")
        [(headers, body)] = rx.got
        assert headers["x-ragloop-signature"] == sign(body, SECRET)
        packet = json.loads(body)
        assert packet["turn_id"] == turn_id and packet["question"] == "How do I rotate an API key?"
        assert packet["handoff_id"] == made.json()["handoff_id"] and "nearest_pages" in packet


async def _ask(client: httpx.AsyncClient, key: str, message: str, **session: Any) -> tuple[str, str]:
    """One /api/chat turn as ``key``; its turn id and session id."""
    r = await client.post("/api/chat", json={"message": message, **session}, headers=_as(key))
    assert r.status_code == 200, r.text
    reply = json.loads(sse_events(r.text)[-1][1])
    return str(reply["turn_id"]), str(reply.get("session_id"))


class TestConversation:
    """The packet carries the caller's own session up to the handed-off turn, bounded; never another key's (#34)."""

    async def _handed_off(self, tmp_path: Path, **limits: Any) -> tuple[dict[str, Any], httpx.Response, str]:
        rag = _logged(tmp_path)
        app = create_app(rag, settings=KEYS, handoff=_handoff(tmp_path, **limits))
        async with asgi_client(app) as client:
            _, sid = await _ask(client, "key-alice", "What plans are there?", new_session=True)
            turn_id, _ = await _ask(client, "key-alice", "How do I rotate an API key?", session_id=sid)
            await _ask(client, "key-alice", "And the audit log?", session_id=sid)  # after: not this hand-off's
            await _stored(rag, turn_id)
            down = {"turn_id": turn_id, "rating": "down"}
            assert (await client.post("/v1/feedback", json=down, headers=_as("key-alice"))).status_code == 200
            # Bob names Alice's session on his own turn: 404, exactly as a session that does not exist.
            bob_turn, _ = await _ask(client, "key-bob", "How do I rotate an API key?")
            await _stored(rag, bob_turn)
            bob_down = {"turn_id": bob_turn, "rating": "down"}
            assert (await client.post("/v1/feedback", json=bob_down, headers=_as("key-bob"))).status_code == 200
            stolen = await client.post(
                "/v1/handoff", json={"turn_id": bob_turn, "session_id": sid}, headers=_as("key-bob")
            )
            unknown = await client.post(
                "/v1/handoff", json={"turn_id": bob_turn, "session_id": "nope"}, headers=_as("key-bob")
            )
            assert stolen.status_code == unknown.status_code == 404
            assert stolen.text.replace(sid, "nope") == unknown.text  # the same answer, but for the id it names
            made = await client.post(
                "/v1/handoff", json={"turn_id": turn_id, "session_id": sid}, headers=_as("key-alice")
            )
            assert made.status_code == 202, made.text
        assert rag.turn_log is not None
        owner_packet = rag.turn_log.backend.handoff(made.json()["handoff_id"])
        await rag.aclose()
        assert owner_packet is not None
        return json.loads(owner_packet[1]), stolen, turn_id

    async def test_previous_turns_up_to_the_handed_off_one(self, tmp_path: Path) -> None:
        packet, _, turn_id = await self._handed_off(tmp_path)
        talk = packet["conversation"]
        assert [m["role"] for m in talk] == ["user", "assistant", "user", "assistant"]
        assert talk[0]["content"] == "What plans are there?" and talk[2]["content"] == "How do I rotate an API key?"
        assert all(m["content"] != "And the audit log?" for m in talk) and packet["conversation_truncated"] is False
        assert packet["turn_id"] == turn_id and "gap_id" in packet and packet["outcome"]
        assert isinstance(packet["cited_pages"], list)

    async def test_bounded_by_messages_and_bytes(self, tmp_path: Path) -> None:
        packet, _, _ = await self._handed_off(tmp_path, max_messages=2)
        assert [m["role"] for m in packet["conversation"]] == ["user", "assistant"]
        assert packet["conversation"][0]["content"] == "How do I rotate an API key?"
        assert packet["conversation_truncated"] is True

    async def test_without_a_session_the_question_alone(self, tmp_path: Path) -> None:
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag, handoff=_handoff(tmp_path))) as client:
            turn_id = await _turn(client, "")
            await _stored(rag, turn_id)
            assert (await client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "down"})).status_code == 200
            made = await client.post("/v1/handoff", json={"turn_id": turn_id})
        assert rag.turn_log is not None
        stored = rag.turn_log.backend.handoff(made.json()["handoff_id"])
        await rag.aclose()
        assert stored is not None
        packet = json.loads(stored[1])
        assert packet["conversation"] == [{"role": "user", "content": "How do I rotate an API key?"}]

    async def test_a_bad_session_id_is_a_400_that_names_it(self, tmp_path: Path) -> None:
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag, handoff=_handoff(tmp_path))) as client:
            turn_id = await _turn(client, "")
            await _stored(rag, turn_id)
            assert (await client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "down"})).status_code == 200
            for bad in (123, "", "no spaces allowed", "x" * 129):
                r = await client.post("/v1/handoff", json={"turn_id": turn_id, "session_id": bad})
                assert r.status_code == 400 and r.json()["error"]["param"] == "session_id", (bad, r.text)
        await rag.aclose()


class TestConversationBounds:
    def test_oldest_dropped_first_and_a_long_newest_cut(self) -> None:
        from ragloop.serve._handoff import conversation
        from ragloop.state import Message

        history = [Message("user", "a" * 10), Message("assistant", "b" * 10), Message("user", "q")]
        talk, cut = conversation(history, "q", max_bytes=12)
        assert talk == [{"role": "assistant", "content": "b" * 10}, {"role": "user", "content": "q"}] and cut
        talk, cut = conversation([Message("user", "é" * 10)], "é" * 10, max_bytes=5)
        assert talk == [{"role": "user", "content": "éé"}] and cut  # cut on a character boundary
        talk, cut = conversation(history, "not asked", scrub=str.upper)
        assert talk[-1] == {"role": "user", "content": "NOT ASKED"} and talk[0]["content"] == "A" * 10 and not cut

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.text(max_size=40)), max_size=12),
        st.integers(0, 8),
        st.integers(0, 120),
    )
    def test_never_past_its_bounds(self, raw: list[tuple[str, str]], max_messages: int, max_bytes: int) -> None:
        from ragloop.serve._handoff import conversation
        from ragloop.state import Message

        history = [Message(r, c) for r, c in raw]  # type: ignore[arg-type]
        talk, _ = conversation(history, "the question", max_messages=max_messages, max_bytes=max_bytes)
        assert len(talk) <= max_messages
        assert sum(len(m["content"].encode("utf-8")) for m in talk) <= max_bytes


class TestDraft:
    def test_front_matter_is_one_line_per_field(self) -> None:
        """A question with newlines or quotes cannot break out of its front-matter line."""
        import datetime as dt

        page = resolution_page(
            {"question": 'line one\n---\nevil: "x"', "turn_id": "t1"}, "Answer.", "Dana", dt.datetime(2025, 5, 5)
        )
        front = page.split("---\n")[1]
        assert front.count("\n") == 7 and 'question: "line one --- evil: \\"x\\""' in front


class TestDraftsIndexed:
    def test_resolved_handoff_closes_its_gap_on_replay(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A question the docs miss → handed off → resolved into docs/_drafts → `ragloop index` leaves the draft
        out, `--include-drafts` takes it in → `ragloop replay` reports the question fixed."""
        from ragloop.cli import main
        from ragloop.retrievers.index import KnowledgeIndex
        from ragloop.turn import Turn

        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "keys.md").write_text("# API keys\n\nTo rotate an API key, create a new key and revoke the old one.\n")
        assert main(["index", str(docs), "--out", str(tmp_path / "idx"), "--embedder", "hash"]) == 0
        rag = ChatRAG(Turn.from_index(tmp_path / "idx"))
        rag.turn_log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
        question = "How do I connect Zapier to my workspace?"
        app = create_app(rag, handoff=Handoff(docs / "_drafts"))

        async def hand_off() -> str:
            async with asgi_client(app) as client:
                r = await client.post("/api/chat", json={"message": question})
                reply = json.loads(sse_events(r.text)[-1][1])
                assert reply["outcome"] == "none"
                await _stored(rag, reply["turn_id"])
                made = (await client.post("/v1/handoff", json={"turn_id": reply["turn_id"]})).json()
                answer = (
                    "To connect Zapier to your workspace, open Settings, then Integrations, and paste the Zapier URL."
                )
                body = {"answer": answer, "agent": "Dana"}
                assert (await client.post(f"/v1/handoff/{made['handoff_id']}/resolution", json=body)).status_code == 201
            await rag.aclose()
            return str(made["handoff_id"])

        handoff_id = anyio.run(hand_off)
        assert main(["index", str(docs), "--out", str(tmp_path / "without"), "--embedder", "hash"]) == 0
        assert {c.source for c in KnowledgeIndex.load(tmp_path / "without").chunks} == {"keys.md"}
        argv = ["index", str(docs), "--out", str(tmp_path / "with"), "--embedder", "hash", "--include-drafts"]
        assert main(argv) == 0
        draft = f"_drafts/handoff-{handoff_id}.md"
        assert {c.source for c in KnowledgeIndex.load(tmp_path / "with").chunks} == {"keys.md", draft}
        log = f"sqlite:{tmp_path / 'turns.db'}"
        capsys.readouterr()
        assert main(["replay", "--turn-log", log, "--index", str(tmp_path / "with"), "--json"]) == 0
        [item] = json.loads(capsys.readouterr().out)["items"]
        assert item["verdict"] == "fixed" and item["after"]["pages"] == [draft]


class TestServeOptions:
    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (["--handoff-url", "http://127.0.0.1:9/"], "needs --handoff-drafts"),
            (["--handoff-drafts", "d"], "needs --turn-log"),
            (["--handoff-drafts", "d", "--turn-log", "sqlite:t.db", "--handoff-url", "http://x/"], "SECRET"),
            (["--handoff-drafts", "d", "--turn-log", "sqlite:t.db", "--handoff-resend-every", "-1"], "0 or a positive"),
            (
                ["--handoff-drafts", "d", "--turn-log", "sqlite:t.db", "--handoff-resend-every", "nan"],
                "0 or a positive",
            ),
            (["--handoff-drafts", "d", "--turn-log", "sqlite:t.db", "--handoff-dead-after", "0"], "dead-after"),
            (["--handoff-drafts", "d", "--turn-log", "sqlite:t.db", "--handoff-dead-after-days", "nan"], "dead-after"),
        ],
    )
    def test_bad_handoff_options_fail_first(
        self, argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Hand-off options that cannot work are one line, exit 2, before anything loads."""
        from ragloop.cli import main

        monkeypatch.delenv("RAGLOOP_HANDOFF_SECRET", raising=False)
        assert main(["serve", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err
