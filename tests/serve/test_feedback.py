"""The turn log through the app: turn_id in every response, POST /v1/feedback scoped to the caller's API key,
the log's health in /metrics, and a dead log that costs rows, never answers."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragloop.chat import ChatRAG
from ragloop.serve import ApiKey, ServeSettings, create_app
from ragloop.turnlog import FeedbackItem, SQLiteBackend, StoredRow, TurnLog, hash_identity
from tests.serve.conftest import asgi_client, fake_rag, serving, sse_events

pytestmark = pytest.mark.anyio

KEYS = ServeSettings(api_keys=("key-alice", "key-bob"))

#: Two principals from a keys file; alice has two keys (the old one and its rotation).
PRINCIPALS = ServeSettings(
    keys=(ApiKey("alice", key="sk-alice-old"), ApiKey("alice", key="sk-alice-new"), ApiKey("bob", key="sk-bob"))
)


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class _DeadBackend(SQLiteBackend):
    def write(self, rows: Sequence[StoredRow], feedback: Sequence[FeedbackItem], **kw: Any) -> int:
        raise sqlite3.OperationalError("unable to open database file")


def _logged(tmp_path: Path) -> ChatRAG:
    rag = fake_rag()
    rag.turn_log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
    return rag


async def _ask(client: httpx.AsyncClient, key: str | None = None) -> dict[str, object]:
    r = await client.post(
        "/api/chat", json={"message": "How do I rotate an API key?"}, headers=_auth(key) if key else {}
    )
    assert r.status_code == 200
    reply: dict[str, object] = json.loads(sse_events(r.text)[-1][1])
    return reply


class TestTurnIdInResponses:
    async def test_every_endpoint_carries_the_turn_id(self, tmp_path: Path) -> None:
        """/api/chat's reply event, a chat completion's ragloop field and the last streamed chunk name the turn;
        with a turn log the reply says feedback is taken."""
        rag = _logged(tmp_path)
        body = {"messages": [{"role": "user", "content": "How do I rotate an API key?"}]}
        async with asgi_client(create_app(rag)) as client:
            reply = await _ask(client)
            once = (await client.post("/v1/chat/completions", json=body)).json()
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
        assert len(str(reply["turn_id"])) == 16 and reply["feedback"] is True
        assert len(once["ragloop"]["turn_id"]) == 16
        chunks = [json.loads(d) for _, d in sse_events(streamed.text) if d != "[DONE]"]
        assert len(next(c for c in chunks if "ragloop" in c)["ragloop"]["turn_id"]) == 16
        await rag.aclose()
        assert len(TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()) == 3

    async def test_no_feedback_flag_without_a_log(self, rag: ChatRAG) -> None:
        """Without a turn log the reply has its turn_id but does not offer feedback."""
        async with asgi_client(create_app(rag)) as client:
            reply = await _ask(client)
        assert "turn_id" in reply and "feedback" not in reply


async def _rate(client: httpx.AsyncClient, turn_id: object, key: str) -> int:
    r = await client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "up"}, headers=_auth(key))
    return r.status_code


class TestTurnIdInTheNewEndpoints:
    """The Responses API, the AI SDK stream and the MCP ask tool carry the turn id of the logged turn, and the
    principal that asked (not another) may rate it."""

    async def test_responses_once_and_streamed(self, tmp_path: Path) -> None:
        """POST /v1/responses: the response's ragloop extension names the turn, whole and in response.completed."""
        rag = _logged(tmp_path)
        body = {"model": "ragloop", "input": "How do I rotate an API key?"}
        async with asgi_client(create_app(rag, settings=PRINCIPALS)) as client:
            once = (await client.post("/v1/responses", json=body, headers=_auth("sk-alice-old"))).json()
            streamed = await client.post("/v1/responses", json={**body, "stream": True}, headers=_auth("sk-bob"))
            [completed] = [json.loads(d) for n, d in sse_events(streamed.text) if n == "response.completed"]
            turn_ids = [once["ragloop"]["turn_id"], completed["response"]["ragloop"]["turn_id"]]
            rated = [await _rate(client, turn_ids[0], "sk-bob"), await _rate(client, turn_ids[0], "sk-alice-new")]
        assert once["ragloop"]["feedback"] is True and rated == [404, 200]
        await rag.aclose()
        assert sorted(t.row.turn_id for t in TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()) == sorted(
            turn_ids
        )

    async def test_ai_sdk_data_part(self, tmp_path: Path) -> None:
        """POST /api/chat?format=ai-sdk: the data-ragloop part names the turn, which its asker may rate."""
        rag = _logged(tmp_path)
        message = {"id": "1", "role": "user", "parts": [{"type": "text", "text": "How do I rotate an API key?"}]}
        async with asgi_client(create_app(rag, settings=PRINCIPALS)) as client:
            r = await client.post("/api/chat?format=ai-sdk", json={"messages": [message]}, headers=_auth("sk-bob"))
            chunks = [json.loads(d) for _, d in sse_events(r.text) if d != "[DONE]"]
            data = next(c for c in chunks if c["type"] == "data-ragloop")["data"]
            rated = [
                await _rate(client, data["turn_id"], "sk-alice-old"),
                await _rate(client, data["turn_id"], "sk-bob"),
            ]
        assert data["feedback"] is True and rated == [404, 200]
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert turn.row.turn_id == data["turn_id"] and turn.row.principal == hash_identity("bob")

    async def test_mcp_ask(self, tmp_path: Path) -> None:
        """The MCP ask tool's structured output names the turn, logged under the key's principal."""
        from tests.serve.test_mcp import http_client

        rag = _logged(tmp_path)
        with serving(create_app(rag, settings=PRINCIPALS), lifespan="on") as url:
            async with http_client(url, "sk-alice-new") as mcp:
                answer = (await mcp.call_tool("ask", {"question": "How do I rotate an API key?"})).structured_content
            async with httpx.AsyncClient(base_url=url) as client:
                rated = [
                    await _rate(client, answer["turn_id"], "sk-bob"),
                    await _rate(client, answer["turn_id"], "sk-alice-old"),
                ]
        assert answer["feedback"] is True and rated == [404, 200]
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert turn.row.turn_id == answer["turn_id"] and turn.rating == "up"


class TestFeedbackEndpoint:
    async def test_own_turn_rated_other_key_gets_404(self, tmp_path: Path) -> None:
        """Alice rates her turn (200, stored); Bob rating Alice's turn and anyone rating an unknown id get 404."""
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag, settings=KEYS)) as client:
            turn_id = (await _ask(client, "key-alice"))["turn_id"]
            mine = await client.post(
                "/v1/feedback",
                json={"turn_id": turn_id, "rating": "down", "comment": "outdated"},
                headers=_auth("key-alice"),
            )
            theirs = await client.post(
                "/v1/feedback", json={"turn_id": turn_id, "rating": "up"}, headers=_auth("key-bob")
            )
            unknown = await client.post(
                "/v1/feedback", json={"turn_id": "nope", "rating": "up"}, headers=_auth("key-alice")
            )
            anonymous = await client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "up"})
            metrics = (await client.get("/metrics", headers=_auth("key-alice"))).text
        assert mine.status_code == 200 and mine.json() == {"status": "recorded", "turn_id": turn_id, "rating": "down"}
        assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "unknown_turn"
        assert unknown.status_code == 404 and anonymous.status_code == 401
        assert 'ragloop_feedback_total{result="recorded"} 1.0' in metrics
        assert 'ragloop_feedback_total{result="unknown_turn"} 2.0' in metrics
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert (turn.rating, turn.comment) == ("down", "outdated")
        assert "key-alice" not in turn.row.principal  # the key itself is never stored

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"rating": "up"}, "turn_id"),
            ({"turn_id": "t", "rating": "meh"}, "rating"),
            ({"turn_id": "t", "rating": "up", "comment": 3}, "comment"),
            ({"turn_id": "t", "rating": "up", "stars": 5}, "stars"),
            ({"turn_id": "t", "rating": "up", "comment": "x" * 3000}, "comment"),
        ],
    )
    async def test_bad_body_is_400_naming_the_field(self, tmp_path: Path, body: dict[str, object], param: str) -> None:
        """A missing or bad field, or one the endpoint does not know, is a 400 naming it."""
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/feedback", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
        await rag.aclose()

    async def test_no_turn_log_is_404_saying_so(self, rag: ChatRAG) -> None:
        """A server without a turn log answers 404 with the option that turns it on."""
        async with asgi_client(create_app(rag)) as client:
            r = await client.post("/v1/feedback", json={"turn_id": "t", "rating": "up"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "no_turn_log" and "--turn-log" in r.text


class TestFeedbackScopedToPrincipals:
    async def test_the_turn_is_logged_under_the_keys_principal(self, tmp_path: Path) -> None:
        """A turn is logged under the principal its key names (hashed), not under the key: a rotated key of the
        same principal may rate it."""
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag, settings=PRINCIPALS)) as client:
            turn_id = (await _ask(client, "sk-alice-old"))["turn_id"]
            rated = await client.post(
                "/v1/feedback", json={"turn_id": turn_id, "rating": "up"}, headers=_auth("sk-alice-new")
            )
        assert rated.status_code == 200
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert turn.row.principal == hash_identity("alice") and turn.rating == "up"

    async def test_a_foreign_turn_is_the_same_404_as_an_unknown_one(self, tmp_path: Path) -> None:
        """Bob rating alice's turn gets the status, headers and body of a turn id no one has (the id aside)."""
        rag = _logged(tmp_path)
        async with asgi_client(create_app(rag, settings=PRINCIPALS)) as client:
            turn_id = str((await _ask(client, "sk-alice-old"))["turn_id"])
            unknown_id = "0" * len(turn_id)
            theirs = await client.post(
                "/v1/feedback", json={"turn_id": turn_id, "rating": "down"}, headers=_auth("sk-bob")
            )
            unknown = await client.post(
                "/v1/feedback", json={"turn_id": unknown_id, "rating": "down"}, headers=_auth("sk-bob")
            )
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.text.replace(turn_id, unknown_id) == unknown.text
        assert dict(theirs.headers) == dict(unknown.headers)
        await rag.aclose()
        [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert turn.rating is None


class TestDeadTurnLog:
    async def test_answers_keep_coming_and_metrics_count_the_loss(self, tmp_path: Path) -> None:
        """With a turn log that cannot write, chats still answer 200, /metrics counts the lost rows, and feedback
        on a turn is a 503 (not a 500, not a silent success)."""
        rag = fake_rag()
        log = TurnLog(_DeadBackend(tmp_path / "turns.db"))
        rag.turn_log = log
        async with asgi_client(create_app(rag)) as client:
            first = await _ask(client)
            await _ask(client)
            await log.flush()
            metrics = (await client.get("/metrics")).text
            rated = await client.post("/v1/feedback", json={"turn_id": first["turn_id"], "rating": "up"})
        assert "ragloop_turn_log_write_errors_total 2.0" in metrics
        assert "ragloop_turn_log_rows_written_total 0.0" in metrics and "ragloop_turn_log_queued 0.0" in metrics
        assert rated.status_code == 503 and rated.json()["error"]["code"] == "turn_log_unavailable"
        assert "unable to open" not in rated.text
        await rag.aclose()
