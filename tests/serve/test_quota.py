"""Per-principal quotas: the limiter pieces, and through the app with two keys — one key's flood of sessions, turns,
MCP sessions or feedback never costs the other key anything."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError
from ragloop.serve import ApiKey, MemorySessionStore, ServeSettings, SessionQuota, create_app
from ragloop.serve._quota import KeyedRate, KeyedSessions, KeyedSlots, QuotaCounts
from ragloop.state import Decision
from ragloop.testing import FakeDecider, FakeRetriever
from ragloop.turnlog import TurnLog
from tests.serve.conftest import DOCS, asgi_client, fake_rag, sse_events

pytestmark = pytest.mark.anyio

KEYS = (ApiKey("alice", key="sk-alice-0000"), ApiKey("bob", key="sk-bob-00000"))
ALICE = {"authorization": "Bearer sk-alice-0000"}
BOB = {"authorization": "Bearer sk-bob-00000"}


class TestSessionQuota:
    @pytest.mark.parametrize(
        "bad", [{"per_owner": 0}, {"total": 0}, {"idle_s": 0}, {"idle_s": float("nan")}, {"idle_s": float("inf")}]
    )
    def test_a_limit_that_cannot_work_is_refused(self, bad: dict[str, Any]) -> None:
        """Zero caps and non-finite idle times fail when configured, naming the setting."""
        with pytest.raises(ConfigError, match=r"per_owner|idle_s"):
            SessionQuota(**bad)


class TestKeyedSlots:
    def test_one_key_cannot_take_every_slot(self) -> None:
        """A key at its share is refused as per_key while the total has room; the total refuses everyone."""
        slots = KeyedSlots(total=3, per_key=2)
        assert [slots.take("a"), slots.take("a"), slots.take("a")] == [None, None, "per_key"]
        assert slots.take("b") is None and slots.take("c") == "total"
        slots.release("a")
        assert slots.take("c") is None and slots.active == 3 and slots.held("a") == 1

    def test_releasing_a_slot_never_taken_is_a_bug_not_a_negative_count(self) -> None:
        """A release without its take raises instead of handing out a phantom slot."""
        with pytest.raises(RuntimeError):
            KeyedSlots(total=2, per_key=1).release("a")

    @given(
        st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=80), st.integers(1, 5), st.integers(1, 5)
    )
    def test_the_counts_stay_within_both_limits(self, ops: list[tuple[str, bool]], total: int, per_key: int) -> None:
        """Any order of takes and releases: no key above per_key, all of them together never above total."""
        slots, held = KeyedSlots(total=total, per_key=per_key), dict.fromkeys("abc", 0)
        for key, take in ops:
            if take:
                refused = slots.take(key)
                if refused is None:
                    held[key] += 1
                else:
                    assert held[key] == per_key if refused == "per_key" else sum(held.values()) == total
            elif held[key]:
                slots.release(key)
                held[key] -= 1
            assert all(slots.held(k) == n <= per_key for k, n in held.items()) and slots.active <= total


class TestKeyedSessionsAndRate:
    def test_sessions_are_counted_per_key_and_idle_ones_listed(self) -> None:
        """Counts per key; touch renews; idle() lists the sessions unused for idle_s; discard forgets."""
        now = [0.0]
        sessions = KeyedSessions(per_key=2, idle_s=10, clock=lambda: now[0])
        sessions.add("a", "s1")
        sessions.add("a", "s2")
        sessions.add("b", "s3")
        now[0] = 8.0
        sessions.touch("s2")
        now[0] = 11.0
        assert sessions.idle() == ["s1", "s3"] and sessions.count("a") == 2
        sessions.discard("s1")
        assert sessions.count("a") == 1 and sessions.owner("s2") == "a" and len(sessions) == 2

    def test_the_rate_is_per_key_and_says_when_to_retry(self) -> None:
        """limit events per window per key; the next is refused with the seconds until one leaves the window."""
        now = [0.0]
        rate = KeyedRate(limit=2, window_s=60, clock=lambda: now[0])
        assert rate.allow("a") is None and rate.allow("a") is None
        now[0] = 15.0
        assert rate.allow("a") == pytest.approx(45.0) and rate.allow("b") is None
        now[0] = 60.5
        assert rate.allow("a") is None

    def test_counts_add_up_per_limit_and_action(self) -> None:
        """QuotaCounts keeps one number per (limit, action)."""
        counts = QuotaCounts()
        counts.add("sessions", "evicted", 2)
        counts.add("sessions", "evicted")
        counts.add("sessions", "expired", 0)
        assert list(counts.items()) == [(("sessions", "evicted"), 3)]


def _sid(response: httpx.Response) -> str:
    if response.headers["content-type"].startswith("text/event-stream"):
        return str(json.loads(sse_events(response.text)[-1][1])["session_id"])
    return str(response.json()["ragloop"]["session_id"])


class TestThroughTheApp:
    async def test_one_keys_session_flood_leaves_another_keys_session_working(self) -> None:
        """Alice starting more sessions than her cap loses her own oldest; Bob's conversation continues with its
        history, and the evictions show in /metrics."""
        store = MemorySessionStore(quota=SessionQuota(per_owner=3))
        app = create_app(fake_rag(), settings=ServeSettings(keys=KEYS), sessions=store)
        async with asgi_client(app) as client:
            first = await client.post("/api/chat", json={"message": "bob's q", "new_session": True}, headers=BOB)
            bob = _sid(first)
            alice = [
                _sid(await client.post("/api/chat", json={"message": "q", "new_session": True}, headers=ALICE))
                for _ in range(5)
            ]
            again = await client.post("/api/chat", json={"message": "more", "session_id": bob}, headers=BOB)
            oldest = await client.post("/api/chat", json={"message": "x", "session_id": alice[0]}, headers=ALICE)
            metrics = (await client.get("/metrics", headers=BOB)).text
        assert again.status_code == 200 and _sid(again) == bob
        history = await store.load("bob", bob)
        assert history is not None and [m.content for m in history if m.role == "user"] == ["bob's q", "more"]
        assert oldest.status_code == 404 and store.sessions_of("alice") == 3
        assert 'ragloop_quota_events_total{action="evicted",limit="sessions"} 2.0' in metrics
        assert 'ragloop_quota_limit{limit="sessions_per_key"} 3.0' in metrics

    async def test_a_full_session_store_is_a_429_not_someone_elses_loss(self) -> None:
        """At the store's total a new session gets 429 sessions_full with Retry-After; the answer is not run."""
        store = MemorySessionStore(quota=SessionQuota(total=1))
        app = create_app(fake_rag(), settings=ServeSettings(keys=KEYS), sessions=store)
        async with asgi_client(app) as client:
            bob = _sid(await client.post("/api/chat", json={"message": "q", "new_session": True}, headers=BOB))
            full = await client.post("/api/chat", json={"message": "q", "new_session": True}, headers=ALICE)
            again = await client.post("/api/chat", json={"message": "q", "session_id": bob}, headers=BOB)
        assert full.status_code == 429 and full.json()["error"]["code"] == "sessions_full"
        assert int(full.headers["retry-after"]) >= 1 and "send the history yourself" in full.json()["error"]["message"]
        assert again.status_code == 200

    async def test_one_key_cannot_take_every_turn_slot(self) -> None:
        """Two keys and 4 slots: Alice's third concurrent turn is 429 key_busy (Retry-After), Bob's turn runs."""

        def decide(question: str) -> Decision:
            return Decision(queries=("slow topic" if question == "slow" else "rotate api key",), reason="t")

        retriever = FakeRetriever({**DOCS, "slow topic": DOCS["rotate api key"]}, delays={"slow topic": 30.0})
        settings = ServeSettings(keys=KEYS, max_concurrent_turns=4)
        assert settings.turns_per_key() == 2
        app = create_app(fake_rag(retriever=retriever, decide=FakeDecider(decide)), settings=settings)
        async with asgi_client(app) as client, anyio.create_task_group() as tg:

            async def slow_turn() -> None:
                await client.post("/api/chat", json={"message": "slow"}, headers=ALICE)

            for _ in range(2):
                tg.start_soon(slow_turn)
            with anyio.fail_after(10):
                while "ragloop_turns_in_flight 2.0" not in (await client.get("/metrics", headers=BOB)).text:
                    await anyio.sleep(0.02)
            third = await client.post("/api/chat", json={"message": "slow"}, headers=ALICE)
            bobs = await client.post("/api/chat", json={"message": "fast"}, headers=BOB)
            metrics = (await client.get("/metrics", headers=BOB)).text
            tg.cancel_scope.cancel()
        assert third.status_code == 429 and third.json()["error"]["code"] == "key_busy"
        assert third.headers["retry-after"] == "1" and "its share" in third.json()["error"]["message"]
        assert bobs.status_code == 200
        assert 'ragloop_quota_events_total{action="refused",limit="turn_slots_per_key"} 1.0' in metrics

    def test_the_default_share_leaves_room_for_the_other_keys(self) -> None:
        """One principal: every slot; two: half; three: a third; four or more: a quarter (rounded up)."""
        keys = tuple(ApiKey(f"p{i}", key=f"sk-key-{i:06d}") for i in range(6))
        shares = [ServeSettings(max_concurrent_turns=64, keys=keys[:n]).turns_per_key() for n in (0, 1, 2, 3, 6)]
        assert shares == [64, 64, 32, 22, 16]
        assert ServeSettings(max_concurrent_turns=8, max_turns_per_key=3).turns_per_key() == 3
        with pytest.raises(ConfigError, match="max_turns_per_key"):
            ServeSettings(max_turns_per_key=0)


_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
_MCP = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


class TestMcpSessions:
    async def test_an_initialize_flood_from_one_key_leaves_room_for_another(self) -> None:
        """With the default settings, 1,001 initializes from Alice (past the old server-wide cap of 1,000) get
        429 once she holds her 100; Bob still initializes. A DELETE frees one of Alice's."""
        app = create_app(fake_rag(), settings=ServeSettings(keys=KEYS))
        async with app.router.lifespan_context(app), asgi_client(app) as client:
            statuses: list[int] = []
            opened: list[str] = []
            for _ in range(1_001):
                r = await client.post("/mcp", json=_INIT, headers={**_MCP, **ALICE})
                statuses.append(r.status_code)
                if r.status_code == 200:
                    opened.append(r.headers["mcp-session-id"])
            bob = await client.post("/mcp", json=_INIT, headers={**_MCP, **BOB})
            gone = await client.delete("/mcp", headers={**_MCP, **ALICE, "mcp-session-id": opened[0]})
            after = await client.post("/mcp", json=_INIT, headers={**_MCP, **ALICE})
            metrics = (await client.get("/metrics", headers=BOB)).text
        assert bob.status_code == 200 and bob.headers.get("mcp-session-id")
        assert statuses.count(200) == 100 and set(statuses) == {200, 429}
        assert gone.status_code == 200 and after.status_code == 200
        assert 'ragloop_quota_events_total{action="refused",limit="mcp_sessions_per_key"} 901.0' in metrics


class TestFeedbackRate:
    async def test_one_key_flooding_feedback_is_refused_and_another_key_still_rates(self, tmp_path: Path) -> None:
        """With the default settings Alice's 61st rating within a minute is 429 feedback_rate (Retry-After), no
        row is written for it, and Bob's rating of his own turn is recorded."""
        rag = fake_rag()
        rag.turn_log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
        async with asgi_client(create_app(rag, settings=ServeSettings(keys=KEYS))) as client:
            turns = {}
            for name, key in (("alice", ALICE), ("bob", BOB)):
                r = await client.post("/api/chat", json={"message": "How do I rotate an API key?"}, headers=key)
                turns[name] = json.loads(sse_events(r.text)[-1][1])["turn_id"]
            rated = [
                await client.post(
                    "/v1/feedback",
                    json={"turn_id": turns["alice"], "rating": "up" if i < 60 else "down", "comment": f"c{i}"},
                    headers=ALICE,
                )
                for i in range(61)
            ]
            bobs = await client.post("/v1/feedback", json={"turn_id": turns["bob"], "rating": "down"}, headers=BOB)
        await rag.aclose()
        assert [r.status_code for r in rated] == [200] * 60 + [429]
        assert rated[-1].json()["error"]["code"] == "feedback_rate" and int(rated[-1].headers["retry-after"]) >= 1
        assert bobs.status_code == 200
        with sqlite3.connect(tmp_path / "turns.db") as conn:
            # a turn keeps its latest rating: the 60th accepted one stands, the refused 61st wrote nothing
            assert conn.execute("select count(*) from ragloop_feedback").fetchone()[0] == 2
            stored = conn.execute("select rating, comment from ragloop_feedback where turn_id = ?", (turns["alice"],))
            assert stored.fetchone() == ("up", "c59")
