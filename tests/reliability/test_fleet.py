"""Issue 35: ``ragloop serve`` as a fleet — two replicas on one PostgreSQL (store, sessions, turn log), one killed.

Real processes on a real Postgres (pgserver), the OpenAI judges against ``ragloop.testing``'s scripted model (in
this process, shared by both replicas, so its recorded requests show what each turn was given). What must hold:

- a conversation (an ``/api/chat`` session, a chat-completions session, a Responses chain) started on one replica
  continues on the other with its history intact, as the model's requests and the stored rows show;
- a replica SIGKILLed with turns streaming: each cut stream ends, for its client, in a connection error and never
  after a completion marker; every acknowledged turn is stored, no session holds half a turn, no turn-log row is
  duplicated or torn, and the surviving replica's clients see no error;
- each replica's connections stay within its pools' sizes, and the documented formula keeps four replicas at
  the defaults under the server's ``max_connections``.

Nothing here is timed: the kill happens when the clients have seen tokens of the streams it cuts (an event the
test waits for), and the bounds are the pools' sizes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, stream, tool_calls, verdicts
from tests.reliability._fleet import (
    ConnectionPeaks,
    Replica,
    Seen,
    drop_database,
    fleet_database,
    question,
    stream_turn,
    tag,
)

pytestmark = pytest.mark.anyio

_names = itertools.count()
#: The answer's streamed deltas and the pause between them: a turn streams for about 2 s, long enough to be cut.
_DELTAS, _DELTA_S = 16, 0.12


def _answer(request: RecordedRequest) -> str:
    asked = tag(str(request.messages[-1]["content"])) or "none"
    return f"Answer {asked}: rotate the key, deploy it, then revoke the old one in settings [1]."


def _model(request: RecordedRequest) -> ScriptedResponse:
    """A model for the OpenAI judges: one search per question, every passage relevant, a slow cited answer."""
    if request.judge == "decide":
        return tool_calls([("search", {"query": str(request.messages[-1]["content"])})])
    if request.judge == "grade":
        return verdicts(request, "relevant")
    if request.judge == "answer":
        text = _answer(request)
        return stream(text, chunk_size=-(-len(text) // _DELTAS), token_delay_s=_DELTA_S)
    return ScriptedResponse(body={"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}]})


@contextlib.contextmanager
def _fleet_on(pg_url: str) -> Iterator[tuple[str, ScriptedOpenAIServer]]:
    """A database of its own holding the sample knowledge base, and the scripted model; the URL and the model."""
    name = f"fleet_{os.getpid()}_{next(_names)}"
    url = fleet_database(pg_url, name)
    model = ScriptedOpenAIServer(matcher=_model).start()
    try:
        yield url, model
    finally:
        model.close()
        drop_database(pg_url, name)


@pytest.fixture
def fleet(pg_url: str) -> Iterator[tuple[str, ScriptedOpenAIServer]]:
    """A fleet database and the scripted model for one test."""
    with _fleet_on(pg_url) as made:
        yield made


@pytest.fixture(scope="class")
def two_replicas(pg_server: Any) -> Iterator[tuple[str, ScriptedOpenAIServer, Replica, Replica]]:
    """A fleet database, the scripted model and replicas a and b on it, started once for a class whose tests
    each keep to conversations of their own (their own session numbers, so their own tags and stored rows)."""
    with _fleet_on(pg_server.get_uri()) as (url, model):
        env = _env(model)
        with Replica("fleet-a", url, env) as a, Replica("fleet-b", url, env) as b:
            yield url, model, a, b


def per_replica_connections() -> int:
    """The most connections one ``ragloop serve --store --sessions --turn-log`` opens at its defaults, from the
    code's own defaults: the store's pool, the session store's pool, the turn log's one connection, and the one
    connection each of the store and the session store opens outside its pool (the store's check when it
    opens, then its probe of a busy pool; the session store's probe of a busy pool, one at a time)."""
    import inspect

    from ragloop.cli._main import build_parser
    from ragloop.serve import PostgresSessionStore

    store_pool = build_parser().parse_args(["serve"]).pool_size
    session_pool = inspect.signature(PostgresSessionStore).parameters["max_connections"].default
    return int(store_pool) + int(session_pool) + 1 + 1 + 1


def _env(model: ScriptedOpenAIServer) -> dict[str, str]:
    return {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "unused", "RAGLOOP_MODEL": "m"}


def _stored(url: str) -> dict[str, list[dict[str, Any]]]:
    """Every session's stored messages, by session id."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("select id, messages::text from ragloop_sessions").fetchall()
    return {sid: [{"role": r, "content": c} for r, c in json.loads(messages)] for sid, messages in rows}


def _decide_messages(model: ScriptedOpenAIServer, asked: str) -> list[str]:
    """The contents of the messages the decide call of the question tagged ``asked`` sent the model."""
    found = [r for r in model.requests if r.path.endswith("/chat/completions") and r.judge == "decide"]
    found = [r for r in found if tag(str(r.messages[-1]["content"])) == asked]
    assert len(found) == 1, (asked, len(found))
    return [str(m.get("content")) for m in found[0].messages]


def _session_of(seen: Seen, endpoint: str) -> str | None:
    if endpoint == "responses":
        return seen.response_id
    return None if seen.reply is None else seen.reply.get("session_id")


class TestContinuation:
    """Replicas a and b are started once for the class (``two_replicas``); each test's conversations are its own."""

    @pytest.mark.parametrize(("endpoint", "session_no"), [("api-chat", 1), ("completions", 3), ("responses", 4)])
    async def test_a_conversation_started_on_one_replica_continues_on_the_other(
        self, two_replicas: tuple[str, ScriptedOpenAIServer, Replica, Replica], endpoint: str, session_no: int
    ) -> None:
        """Three turns, replicas a, b, a: each turn's model call carries every earlier question and answer of the
        conversation (made on the other replica), and the stored session holds the six messages in order."""
        url, model, a, b = two_replicas
        seen: list[Seen] = []
        session = None
        async with httpx.AsyncClient(timeout=120) as client:
            for turn, replica in enumerate((a, b, a), 1):
                client.base_url = httpx.URL(replica.url)
                one = await stream_turn(client, replica.name, endpoint, question(session_no, turn), session)
                assert one.complete and one.error is None, one
                seen.append(one)
                session = _session_of(one, endpoint) or session
        for turn in (2, 3):
            sent = _decide_messages(model, f"S{session_no:02d}T{turn}")
            for earlier in seen[: turn - 1]:
                assert earlier.question in sent, (turn, sent)
                assert "".join(earlier.tokens) in sent, (turn, sent)
        stored = [m for m in _stored(url).values() if m and m[0]["content"] == seen[0].question]
        assert len(stored) == 1
        assert [m["role"] for m in stored[0]] == ["user", "assistant"] * 3
        assert [m["content"] for m in stored[0][::2]] == [s.question for s in seen]
        assert [m["content"] for m in stored[0][1::2]] == [s.reply["text"] for s in seen if s.reply]

    async def test_a_response_id_of_one_replica_is_unknown_to_no_replica(
        self, two_replicas: tuple[str, ScriptedOpenAIServer, Replica, Replica]
    ) -> None:
        """A whole (non-streamed) response made on a is continued on b with previous_response_id, and an id no
        one made is the same 404 on both."""
        _, model, a, b = two_replicas
        async with httpx.AsyncClient(timeout=120) as client:
            first = await client.post(a.url + "/v1/responses", json={"model": "m", "input": question(2, 1)})
            rid = first.json()["id"]
            second = await client.post(
                b.url + "/v1/responses", json={"model": "m", "input": question(2, 2), "previous_response_id": rid}
            )
            made_up = rid.rsplit(".", 1)[0] + "x." + rid.rsplit(".", 1)[1]
            unknown = [
                await client.post(
                    r.url + "/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": made_up}
                )
                for r in (a, b)
            ]
        assert first.status_code == 200 and second.status_code == 200, second.text
        assert question(2, 1) in _decide_messages(model, "S02T2")
        assert [r.status_code for r in unknown] == [404, 404]
        assert unknown[0].json() == unknown[1].json()


class TestKill:
    async def test_a_replica_killed_mid_stream_loses_no_acknowledged_turn(
        self, fleet: tuple[str, ScriptedOpenAIServer]
    ) -> None:
        """24 clients on two replicas (/api/chat and chat-completions sessions, Responses chains, AI SDK streams,
        turns alternating the replicas); a is SIGKILLed once 4 of its streams of second or third turns have shown
        tokens. Every stream it cut ends in a connection error with no completion marker; each client retries once
        on b and finishes; b's clients see no error; every acknowledged turn is stored in order, no session holds
        half a turn, the turn log holds each turn at most once and whole; each replica stays within its pools."""
        url, model = fleet
        env = _env(model)
        endpoints = ("api-chat", "completions", "responses", "ai-sdk")
        n_clients, turns = 24, 3
        log: list[Seen] = []
        retried: list[tuple[Seen, Seen]] = []
        streaming_on_a: set[int] = set()
        killed = anyio.Event()
        with ConnectionPeaks(url) as peaks, Replica("fleet-a", url, env) as a, Replica("fleet-b", url, env) as b:

            async def watch_a(client_id: int, seen: Seen) -> None:
                while not killed.is_set() and seen.replica == "fleet-a":
                    if seen.tokens:
                        streaming_on_a.add(client_id)
                        return
                    await anyio.sleep(0.01)

            async def one_client(i: int) -> None:
                endpoint = endpoints[i % len(endpoints)]
                session = None
                async with httpx.AsyncClient(timeout=120) as client:
                    for turn in range(1, turns + 1):
                        home = (a, b)[(i + turn) % 2]
                        target = b if killed.is_set() else home
                        client.base_url = httpx.URL(target.url)
                        seen = Seen(target.name, question(i, turn))
                        async with anyio.create_task_group() as tg:
                            if target is a:
                                tg.start_soon(watch_a, i, seen)
                            await stream_turn(client, target.name, endpoint, seen.question, session, seen)
                            tg.cancel_scope.cancel()
                        log.append(seen)
                        if seen.error is not None and target is a:
                            client.base_url = httpx.URL(b.url)
                            again = await stream_turn(client, b.name, endpoint, seen.question, session)
                            retried.append((seen, again))
                            log.append(again)
                            seen = again
                        session = _session_of(seen, endpoint) or session

            async def killer() -> None:
                while len(streaming_on_a) < 4:
                    await anyio.sleep(0.01)
                a.kill()
                killed.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(killer)
                async with anyio.create_task_group() as clients:
                    for i in range(n_clients):
                        clients.start_soon(one_client, i)
                tg.cancel_scope.cancel()
            assert b.stop() == 0, b.stderr()
        cut = [s for s, _ in retried]
        assert len(cut) >= 4, [(s.replica, s.error) for s in log]
        for s in cut:  # a cut stream is an error the client sees, never a reply that claims to be complete
            assert not s.complete and s.reply is None, s
            assert s.error in ("RemoteProtocolError", "ReadError", "ConnectError"), s
        on_b = [s for s in log if s.replica == "fleet-b"]
        assert on_b and all(s.error is None and s.complete for s in on_b), [s for s in on_b if s.error]
        acked = [s for s in log if s.complete]
        assert len(acked) == n_clients * turns  # every turn, retried or not, was answered in the end
        self._sessions_hold_every_acknowledged_turn(url, acked)
        self._turn_log_is_whole(url, on_b)
        for name in ("fleet-a", "fleet-b"):
            assert 0 < peaks.peak.get(name, 0) <= per_replica_connections(), peaks.peak

    def _sessions_hold_every_acknowledged_turn(self, url: str, acked: list[Seen]) -> None:
        by_session: dict[str, list[Seen]] = {}
        for s in acked:
            assert s.reply is not None
            if s.endpoint == "ai-sdk":
                continue  # the AI SDK's client sends its history itself: no session
            # A Responses turn names its session in its id: resp_<session>.<random>.
            sid = s.reply.get("session_id") or (s.response_id or "")[len("resp_") :].rsplit(".", 1)[0]
            by_session.setdefault(sid, []).append(s)
        stored = _stored(url)
        for sid, messages in stored.items():
            roles = [m["role"] for m in messages]
            assert roles == ["user", "assistant"] * (len(roles) // 2), (sid, roles)  # never half a turn
            assert all(m["content"] for m in messages), sid
        assert "" not in by_session
        for sid, turns in by_session.items():
            pairs = list(zip(stored[sid][::2], stored[sid][1::2], strict=True))
            wanted = [(s.question, s.reply["text"]) for s in turns if s.reply]
            got = [(q["content"], r["content"]) for q, r in pairs]
            it = iter(got)
            assert all(w in it for w in wanted), (sid, wanted, got)  # in order; a cut turn may sit once more

    def _turn_log_is_whole(self, url: str, on_b: list[Seen]) -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("select turn_id, outcome, question, data::text from ragloop_turns").fetchall()
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids))
        for turn_id, outcome, asked, record in rows:
            assert outcome and asked and json.loads(record), turn_id  # whole rows only
        for s in on_b:  # the surviving replica flushed its log when it stopped
            assert s.reply is not None and s.reply["turn_id"] in ids, s


class TestConnectionBudget:
    def test_four_replicas_at_the_defaults_fit_under_max_connections(self, pg_url: str) -> None:
        """docs/serving.md's formula at the defaults: 4 replicas x (pool 10 + sessions 10 + turn log 1 + the
        store's check or probe 1 + the session store's probe 1) = 92 connections at most, under the server's
        max_connections less its superuser reserve (100 - 3)."""
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            limit = int(conn.execute("show max_connections").fetchone()[0])  # type: ignore[index]
            reserved = int(conn.execute("show superuser_reserved_connections").fetchone()[0])  # type: ignore[index]
        assert per_replica_connections() == 23
        assert 4 * per_replica_connections() <= limit - reserved, (limit, reserved)
