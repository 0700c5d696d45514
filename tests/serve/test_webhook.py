"""The webhook's outbox (#34): a delivery that exhausted its retries is kept in the turn log's database (SQLite,
Postgres) and re-sent unchanged — after a later hand-off, periodically while serving, by `ragloop handoff resend` —
so a receiver that was down and comes back gets each packet exactly once, signed, with its idempotency key."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from ragloop.cli import main
from ragloop.serve import create_app, sign
from ragloop.serve._webhook import Webhook, resend
from ragloop.turnlog import SQLBackend, SQLiteBackend
from tests.retrievers.conftest import pg_server, pg_url
from tests.serve.conftest import asgi_client, serving
from tests.serve.test_handoff import SECRET, Receiver, _down_url, _handoff, _logged, _stored, _turn

__all__ = ["pg_server", "pg_url"]

pytestmark = pytest.mark.anyio
_dbs = itertools.count()


@pytest.fixture(params=["sqlite", "postgres"])
def outbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLBackend]:
    """A fresh turn-log database of each kind."""
    if request.param == "sqlite":
        b: SQLBackend = SQLiteBackend(tmp_path / "turns.db")
    else:
        import psycopg

        from ragloop.turnlog import PostgresBackend

        url = request.getfixturevalue("pg_url")
        name = f"outbox{next(_dbs)}"
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"drop database if exists {name}")
            admin.execute(f"create database {name}")
        b = PostgresBackend(url.replace("/postgres?", f"/{name}?"))
    b.open()
    yield b
    b.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _ids(rx: Receiver) -> list[str]:
    return [headers["idempotency-key"] for headers, _ in rx.got]


def _verified(rx: Receiver) -> None:
    """Every request the receiver got is signed over its exact body and keyed by its hand-off id."""
    for headers, body in rx.got:
        assert headers["x-ragloop-signature"] == sign(body, SECRET)
        assert headers["idempotency-key"] == headers["x-ragloop-handoff"] == json.loads(body)["handoff_id"]


class TestOutboxTables:
    def test_claim_settle_and_never_again(self, outbox: SQLBackend) -> None:
        """A parked delivery is claimed once (a second sender sees nothing while the claim holds), released on a
        failure, claimed again after, and never again once delivered; parking twice counts an attempt."""
        outbox.park_delivery("h-1", "http://x/hook", '{"a": "é"}', "sha256=ab", 10.0, "ConnectError")
        outbox.park_delivery("h-0", "http://x/hook", "{}", "sha256=cd", 20.0, "status 503")
        assert outbox.undelivered() == 2
        first = outbox.claim_deliveries(100.0, 10.0, 10)
        assert [c[0] for c in first] == ["h-1", "h-0"] and first[0][2] == '{"a": "é"}'  # oldest first, as stored
        assert outbox.claim_deliveries(105.0, 10.0, 10) == []  # held by the first sender
        outbox.settle_delivery("h-1", False, 106.0, "status 500")
        outbox.settle_delivery("h-0", True, 106.0)
        assert [c[0] for c in outbox.claim_deliveries(107.0, 10.0, 10)] == ["h-1"]
        assert outbox.claim_deliveries(200.0, 10.0, 10) == [("h-1", "http://x/hook", '{"a": "é"}', "sha256=ab")]
        outbox.settle_delivery("h-1", True, 201.0)
        assert outbox.claim_deliveries(500.0, 10.0, 10) == [] and outbox.undelivered() == 0
        assert _rows(outbox) == 2  # delivered rows stay a week ...
        outbox.park_delivery("h-2", "http://x/hook", "{}", "sha256=ef", 600.0, "ConnectError")
        assert outbox.claim_deliveries(201.0 + 7 * 86_400 + 1, 10.0, 10)[0][0] == "h-2"
        assert _rows(outbox) == 1  # ... then go; the waiting one stays


def _rows(outbox: SQLBackend) -> int:
    def work(conn: Any) -> int:
        cur = conn.cursor()
        cur.execute("select count(*) from ragloop_handoff_outbox")
        return int(cur.fetchone()[0])

    return int(outbox._run(False, work))


class TestDownThenBack:
    async def test_a_later_handoff_resends_the_parked_one_exactly_once(self, tmp_path: Path) -> None:
        """Through the serve endpoint: the receiver is down for the first hand-off (its delivery is parked), up
        for the second (delivered, and the first re-sent after it); `ragloop handoff resend` then finds nothing
        to send. The receiver got each hand-off exactly once, signed, with its idempotency key."""
        url = _down_url()
        rag = _logged(tmp_path)
        app = create_app(rag, handoff=_handoff(tmp_path, url, attempts=2, backoff_s=0.01, resend_every_s=0))
        made = []
        async with asgi_client(app) as client:
            first = await _turn(client, "")
            await _stored(rag, first)
            assert (await client.post("/v1/feedback", json={"turn_id": first, "rating": "down"})).status_code == 200
            made.append((await client.post("/v1/handoff", json={"turn_id": first})).json()["handoff_id"])
            assert rag.turn_log is not None
            for _ in range(500):  # the delivery gives up in the background
                if rag.turn_log.backend.undelivered() == 1:
                    break
                await anyio.sleep(0.02)
            else:
                raise AssertionError("the given-up delivery was never kept")
            with Receiver(port=_port(url)) as rx:
                second = await _turn(client, "")
                await _stored(rag, second)
                down = {"turn_id": second, "rating": "down"}
                assert (await client.post("/v1/feedback", json=down)).status_code == 200
                made.append((await client.post("/v1/handoff", json={"turn_id": second})).json()["handoff_id"])
                for _ in range(500):
                    if len(rx.got) >= 2 and rag.turn_log.backend.undelivered() == 0:
                        break
                    await anyio.sleep(0.02)
                out = io.StringIO()
                argv = ["handoff", "resend", "--turn-log", f"sqlite:{tmp_path / 'turns.db'}", "--json"]
                with contextlib.redirect_stdout(out):
                    rc = await anyio.to_thread.run_sync(main, argv)
                assert rc == 0 and json.loads(out.getvalue()) == {"delivered": 0, "failed": 0, "waiting": 0}
        await rag.aclose()
        assert sorted(_ids(rx)) == sorted(made) and len(rx.got) == 2
        _verified(rx)

    def test_resent_periodically_while_serving(self, tmp_path: Path) -> None:
        """A real server (its lifespan on) re-sends every 0.1 s: the receiver, down for the hand-off, gets the
        packet once soon after it comes back, and not again over the next periods."""
        url = _down_url()
        rag = _logged(tmp_path)
        handoff = _handoff(tmp_path, url, attempts=2, backoff_s=0.01, resend_every_s=0.1)
        app = create_app(rag, handoff=handoff)
        with serving(app, close=rag.aclose, lifespan="on") as base, httpx.Client(base_url=base, timeout=30) as client:
            r = client.post("/api/chat", json={"message": "How do I rotate an API key?"})
            turn_id = json.loads([e for e in r.text.split("\n") if e.startswith("data:")][-1][5:])["turn_id"]
            anyio.run(_stored, rag, turn_id)
            assert client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "down"}).status_code == 200
            handoff_id = client.post("/v1/handoff", json={"turn_id": turn_id}).json()["handoff_id"]
            assert rag.turn_log is not None
            backend = SQLiteBackend(tmp_path / "turns.db")
            deadline = time.monotonic() + 30
            while backend.undelivered() != 1:
                assert time.monotonic() < deadline, "the given-up delivery was never kept"
                time.sleep(0.02)
            with Receiver(port=_port(url)) as rx:
                while not rx.got:
                    assert time.monotonic() < deadline, "the kept delivery was never re-sent"
                    time.sleep(0.02)
                time.sleep(0.6)  # six more periods: nothing is sent again
                assert "ragloop_handoff_webhook_total" in client.get("/metrics").text
            backend.close()
        assert _ids(rx) == [handoff_id]
        _verified(rx)


class TestResendCommand:
    async def test_down_then_back_by_the_cli(self, tmp_path: Path) -> None:
        """`ragloop handoff resend`: exit 1 while the receiver is still down (kept, an attempt counted), exit 0
        when it is back (delivered once), then nothing left; a mistyped log path is one line and exit 2."""
        url = _down_url()
        backend = SQLiteBackend(tmp_path / "turns.db")
        hook = Webhook(_handoff(tmp_path, url, attempts=1), outbox=backend)
        assert hook.admit() and not await hook.deliver({"handoff_id": "h-00000000000000aa", "question": "é?"})
        assert hook.counts["parked"] == 1 and backend.undelivered() == 1
        log_url = f"sqlite:{tmp_path / 'turns.db'}"

        def cli(*extra: str) -> tuple[int, dict[str, Any]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["handoff", "resend", "--turn-log", log_url, "--json", "--timeout", "2", *extra])
            return rc, json.loads(out.getvalue())

        assert await anyio.to_thread.run_sync(cli) == (1, {"delivered": 0, "failed": 1, "waiting": 1})
        with Receiver(port=_port(url)) as rx:
            assert await anyio.to_thread.run_sync(cli) == (0, {"delivered": 1, "failed": 0, "waiting": 0})
            assert await anyio.to_thread.run_sync(cli) == (0, {"delivered": 0, "failed": 0, "waiting": 0})
        backend.close()
        assert _ids(rx) == ["h-00000000000000aa"] and json.loads(rx.got[0][1])["question"] == "é?"
        _verified(rx)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["handoff", "resend", "--turn-log", f"sqlite:{tmp_path / 'nope.db'}"]) == 2
        assert "no turn log at" in err.getvalue() and not (tmp_path / "nope.db").exists()

    async def test_a_dead_outbox_never_raises_in_the_server(self, tmp_path: Path) -> None:
        """The server's pass over an outbox that fails is logged and returns (0, 0); strict (the CLI) raises."""

        class Dead:
            def claim_deliveries(self, *args: Any) -> list[tuple[str, str, str, str]]:
                raise OSError("database is gone")

        async with httpx.AsyncClient() as client:
            assert await resend(Dead(), client) == (0, 0)  # type: ignore[arg-type]
            with pytest.raises(OSError):
                await resend(Dead(), client, strict=True)  # type: ignore[arg-type]


class TestKept:
    async def test_a_packet_past_max_pending_is_kept_and_resent(self, tmp_path: Path) -> None:
        """One more packet than max_pending is not sent now but parked; the next pass delivers it once."""
        backend = SQLiteBackend(tmp_path / "turns.db")
        with Receiver() as rx:
            hook = Webhook(_handoff(tmp_path, rx.url, max_pending=1), outbox=backend)
            assert hook.admit() and not hook.admit()
            await hook.keep({"handoff_id": "h-00000000000000bb"})
            hook.pending = 0  # the first delivery's slot, never used here
            assert backend.undelivered() == 1 and rx.got == []
            assert await hook.resend() == (1, 0) and await hook.resend() == (0, 0)
        backend.close()
        assert _ids(rx) == ["h-00000000000000bb"] and hook.counts["resent"] == 1
        _verified(rx)
