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
from ragloop.serve import Handoff, create_app, sign
from ragloop.serve._webhook import Webhook, bury, resend
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


def _park(outbox: SQLBackend, handoff_id: str, url: str, body: str, at: float, error: str) -> None:
    """A hand-off (its row) whose delivery is parked: a delivery is kept only while its hand-off exists."""
    outbox.save_handoff(handoff_id, f"t-{handoff_id}", "p", at, body)
    assert outbox.park_delivery(handoff_id, url, body, at, error)


class TestOutboxTables:
    def test_claim_settle_and_never_again(self, outbox: SQLBackend) -> None:
        """A parked delivery is claimed once (a second sender sees nothing while the claim holds), released on a
        failure, claimed again after, and never again once delivered; parking twice counts an attempt."""
        _park(outbox, "h-1", "http://x/hook", '{"a": "é"}', 10.0, "ConnectError")
        _park(outbox, "h-0", "http://x/hook", "{}", 20.0, "status 503")
        assert outbox.undelivered() == 2
        first = outbox.claim_deliveries(100.0, 10.0, 10)
        assert [c[0] for c in first] == ["h-1", "h-0"] and first[0][2] == '{"a": "é"}'  # oldest first, as stored
        assert outbox.claim_deliveries(105.0, 10.0, 10) == []  # held by the first sender
        outbox.settle_delivery("h-1", False, 106.0, "status 500")
        outbox.settle_delivery("h-0", True, 106.0)
        assert [c[0] for c in outbox.claim_deliveries(107.0, 10.0, 10)] == ["h-1"]
        assert outbox.claim_deliveries(200.0, 10.0, 10) == [("h-1", "http://x/hook", '{"a": "é"}')]
        outbox.settle_delivery("h-1", True, 201.0)
        assert outbox.claim_deliveries(500.0, 10.0, 10) == [] and outbox.undelivered() == 0
        assert _rows(outbox) == 2  # delivered rows stay a week ...
        _park(outbox, "h-2", "http://x/hook", "{}", 600.0, "ConnectError")
        assert outbox.claim_deliveries(201.0 + 7 * 86_400 + 1, 10.0, 10)[0][0] == "h-2"
        assert _rows(outbox) == 1  # ... then go; the waiting one stays

    def test_dead_after_attempts_or_age_kept_and_claimed_only_on_demand(self, outbox: SQLBackend) -> None:
        """A delivery tried N times, or first parked D ago, is marked dead once: kept (listed with its attempts
        and error), never claimed by a plain pass, claimed by a `--dead` pass; failing again it stays dead,
        delivered it is done (on main a dead URL's row was claimed on every pass, forever)."""
        _park(outbox, "h-tried", "http://x/hook", "{}", 1_000.0, "ConnectError")
        for at in (1_001.0, 1_002.0):
            assert outbox.claim_deliveries(at, 0.5, 10)
            outbox.settle_delivery("h-tried", False, at, "status 503")  # 3 attempts now
        _park(outbox, "h-old", "http://x/hook", "{}", 10.0, "ConnectError")
        _park(outbox, "h-fresh", "http://x/hook", "{}", 1_005.0, "ConnectError")
        assert outbox.bury_deliveries(1_010.0, 3, 500.0) == 2 and outbox.bury_deliveries(1_011.0, 3, 500.0) == 0
        assert outbox.undelivered() == 1 and outbox.undelivered(dead=True) == 2
        assert [c[0] for c in outbox.claim_deliveries(1_020.0, 0.5, 10)] == ["h-fresh"]
        dead = outbox.parked(dead=True)
        assert [(d.handoff_id, d.attempts, d.last_error, d.dead_at) for d in dead] == [
            ("h-old", 1, "ConnectError", 1_010.0),
            ("h-tried", 3, "status 503", 1_010.0),
        ]
        assert [d.handoff_id for d in outbox.parked()] == ["h-fresh"] and outbox.parked()[0].dead_at is None
        assert [c[0] for c in outbox.claim_deliveries(1_030.0, 0.5, 10, dead=True)] == ["h-old", "h-tried"]
        outbox.settle_delivery("h-old", False, 1_031.0, "ConnectError")
        outbox.settle_delivery("h-tried", True, 1_031.0)
        assert [d.handoff_id for d in outbox.parked(dead=True)] == ["h-old"] and outbox.undelivered(dead=True) == 1
        assert [c[0] for c in outbox.claim_deliveries(1_040.0, 0.5, 10)] == ["h-fresh"]  # still not h-old


def _rows(outbox: SQLBackend) -> int:
    def work(conn: Any) -> int:
        cur = conn.cursor()
        cur.execute("select count(*) from ragloop_handoff_outbox")
        return int(cur.fetchone()[0])

    return int(outbox._run(False, work))


_none_left = {"delivered": 0, "failed": 0, "waiting": 0, "dead": 0, "marked_dead": 0}


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ragloop handoff resend` signs with the server's secret."""
    monkeypatch.setenv("RAGLOOP_HANDOFF_SECRET", SECRET.decode())


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
                assert rc == 0 and json.loads(out.getvalue()) == _none_left
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
        backend.save_handoff("h-00000000000000aa", "t1", "p", 1.0, "{}")  # a delivery is kept for a hand-off
        assert hook.admit() and not await hook.deliver({"handoff_id": "h-00000000000000aa", "question": "é?"})
        assert hook.counts["parked"] == 1 and backend.undelivered() == 1
        log_url = f"sqlite:{tmp_path / 'turns.db'}"

        def cli(*extra: str) -> tuple[int, dict[str, Any]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["handoff", "resend", "--turn-log", log_url, "--json", "--timeout", "2", *extra])
            return rc, json.loads(out.getvalue())

        failing = {**_none_left, "failed": 1, "waiting": 1}
        assert await anyio.to_thread.run_sync(cli) == (1, failing)
        with Receiver(port=_port(url)) as rx:
            assert await anyio.to_thread.run_sync(cli) == (0, {**_none_left, "delivered": 1})
            assert await anyio.to_thread.run_sync(cli) == (0, _none_left)
        backend.close()
        assert _ids(rx) == ["h-00000000000000aa"] and json.loads(rx.got[0][1])["question"] == "é?"
        _verified(rx)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["handoff", "resend", "--turn-log", f"sqlite:{tmp_path / 'nope.db'}"]) == 2
        assert "no turn log at" in err.getvalue() and not (tmp_path / "nope.db").exists()

    @pytest.mark.parametrize("command", [["list"], ["list", "--dead"], ["resend"]])
    def test_an_unreadable_log_is_one_line_without_its_password(
        self, command: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A turn log whose server is not there: one line on stderr, exit 2, and the URL's password hidden (before:
        the password in clear and the driver's two-line message)."""
        monkeypatch.setenv("RAGLOOP_HANDOFF_SECRET", "s" * 16)
        url = f"postgresql://bot:hunter2pw@/turns?host={tmp_path / 'no-server'}"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["handoff", *command, "--turn-log", url]) == 2
        text = err.getvalue()
        assert "cannot be read" in text and "hunter2pw" not in text and "***@" in text, text
        assert text.count("\n") == 1, text

    async def test_a_dead_outbox_never_raises_in_the_server(self, tmp_path: Path) -> None:
        """The server's pass over an outbox that fails is logged and returns (0, 0); strict (the CLI) raises."""

        class Dead:
            def claim_deliveries(self, *args: Any, **kw: Any) -> list[tuple[str, str, str]]:
                raise OSError("database is gone")

            def bury_deliveries(self, *args: Any) -> int:
                raise OSError("database is gone")

        async with httpx.AsyncClient() as client:
            assert await resend(Dead(), client, SECRET) == (0, 0)  # type: ignore[arg-type]
            assert await bury(Dead()) == 0  # type: ignore[arg-type]
            with pytest.raises(OSError):
                await resend(Dead(), client, SECRET, strict=True)  # type: ignore[arg-type]
            with pytest.raises(OSError):
                await bury(Dead(), strict=True)  # type: ignore[arg-type]


class TestKept:
    async def test_a_packet_past_max_pending_is_kept_and_resent(self, tmp_path: Path) -> None:
        """One more packet than max_pending is not sent now but parked; the next pass delivers it once."""
        backend = SQLiteBackend(tmp_path / "turns.db")
        with Receiver() as rx:
            hook = Webhook(_handoff(tmp_path, rx.url, max_pending=1), outbox=backend)
            assert hook.admit() and not hook.admit()
            backend.save_handoff("h-00000000000000bb", "t1", "p", 1.0, "{}")
            await hook.keep({"handoff_id": "h-00000000000000bb"})
            hook.pending = 0  # the first delivery's slot, never used here
            assert backend.undelivered() == 1 and rx.got == []
            assert await hook.resend() == (1, 0) and await hook.resend() == (0, 0)
        backend.close()
        assert _ids(rx) == ["h-00000000000000bb"] and hook.counts["resent"] == 1
        _verified(rx)


class TestRotatedSecret:
    async def test_parked_with_secret_a_resent_after_a_restart_with_b_verifies_with_b(self, tmp_path: Path) -> None:
        """Parked under secret A, re-sent by a server restarted with secret B: the receiver (which now holds B)
        verifies it, same body and idempotency key (on main the stored A signature was re-sent and rejected);
        the CLI signs with its RAGLOOP_HANDOFF_SECRET the same way."""
        url = _down_url()
        backend = SQLiteBackend(tmp_path / "turns.db")
        before = Webhook(Handoff(tmp_path, url=url, secret=b"secret-A-0123456789", attempts=1), outbox=backend)
        backend.save_handoff("h-00000000000000cc", "t1", "p", 1.0, "{}")
        assert before.admit() and not await before.deliver({"handoff_id": "h-00000000000000cc", "q": "é"})
        backend.close()
        backend = SQLiteBackend(tmp_path / "turns.db")  # the restart
        after = Webhook(Handoff(tmp_path, url=url, secret=b"secret-B-0123456789"), outbox=backend)
        with Receiver(port=_port(url)) as rx:
            assert await after.resend() == (1, 0)
        ((headers, body),) = rx.got
        assert headers["x-ragloop-signature"] == sign(body, b"secret-B-0123456789")
        assert headers["x-ragloop-signature"] != sign(body, b"secret-A-0123456789")
        assert headers["idempotency-key"] == "h-00000000000000cc" and json.loads(body) == {
            "handoff_id": "h-00000000000000cc", "q": "é"
        }  # fmt: skip
        backend.close()

    def test_the_cli_needs_the_secret(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without RAGLOOP_HANDOFF_SECRET `ragloop handoff resend` says what to set, exit 2, nothing sent."""
        SQLiteBackend(tmp_path / "turns.db").open()
        monkeypatch.delenv("RAGLOOP_HANDOFF_SECRET")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["handoff", "resend", "--turn-log", f"sqlite:{tmp_path / 'turns.db'}"]) == 2
        assert "RAGLOOP_HANDOFF_SECRET" in err.getvalue()


def _cli(*argv: str) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, json.loads(out.getvalue())


class TestDeadDeliveries:
    def test_a_dead_url_is_given_up_counted_and_not_resent_while_serving(self, tmp_path: Path) -> None:
        """A real server re-sending every 0.05 s to a URL that stays down, dead after 3 attempts: the row is
        marked dead once (``result="dead"`` in /metrics), kept, and when the receiver comes back a plain pass
        no longer sends it; `ragloop handoff list --dead` lists it and `ragloop handoff resend --dead` delivers
        it on demand, signed, once (on main it was claimed and re-sent on every pass, forever)."""
        url = _down_url()
        rag = _logged(tmp_path)
        handoff = _handoff(
            tmp_path, url, attempts=1, backoff_s=0.01, resend_every_s=0.05, dead_after_attempts=3, timeout_s=1.0
        )
        app = create_app(rag, handoff=handoff)
        log_url = f"sqlite:{tmp_path / 'turns.db'}"
        with serving(app, close=rag.aclose, lifespan="on") as base, httpx.Client(base_url=base, timeout=30) as client:
            r = client.post("/api/chat", json={"message": "How do I rotate an API key?"})
            turn_id = json.loads([e for e in r.text.split("\n") if e.startswith("data:")][-1][5:])["turn_id"]
            anyio.run(_stored, rag, turn_id)
            assert client.post("/v1/feedback", json={"turn_id": turn_id, "rating": "down"}).status_code == 200
            handoff_id = client.post("/v1/handoff", json={"turn_id": turn_id}).json()["handoff_id"]
            backend = SQLiteBackend(tmp_path / "turns.db")
            deadline = time.monotonic() + 60
            while backend.undelivered(dead=True) != 1:
                assert time.monotonic() < deadline, "the delivery to a dead URL was never marked dead"
                time.sleep(0.05)
            assert 'ragloop_handoff_webhook_total{result="dead"} 1.0' in client.get("/metrics").text
            with Receiver(port=_port(url)) as rx:
                time.sleep(0.5)  # ten more periods with the receiver up: a dead one is not re-sent
                assert rx.got == []
                rc, listed = _cli("handoff", "list", "--turn-log", log_url, "--dead", "--json")
                assert rc == 0 and [(d["handoff_id"], d["attempts"]) for d in listed] == [(handoff_id, 3)]
                assert listed[0]["dead_since"] and listed[0]["last_error"]
                rc, out = _cli("handoff", "resend", "--turn-log", log_url, "--dead", "--json")
                assert (rc, out["delivered"], out["dead"]) == (0, 1, 0)
            assert _cli("handoff", "list", "--turn-log", log_url, "--dead", "--json") == (0, [])
            backend.close()
        assert _ids(rx) == [handoff_id]
        _verified(rx)

    def test_metrics_count_the_rows_another_process_parked_or_marked(self, tmp_path: Path) -> None:
        """``ragloop_handoff_outbox_rows{state}`` is read from the database on each re-send pass: a delivery that
        another process (a replica, the CLI) parked and marked dead is counted by this server, whose own
        ``result="dead"`` counter stays 0 (on e4077ec only that counter existed, so the CLI's marks never showed)."""
        rag = _logged(tmp_path)
        handoff = _handoff(tmp_path, _down_url(), attempts=1, backoff_s=0.01, resend_every_s=0.05, timeout_s=1.0)
        app = create_app(rag, handoff=handoff)
        with serving(app, close=rag.aclose, lifespan="on") as base, httpx.Client(base_url=base, timeout=30) as client:
            other = SQLiteBackend(tmp_path / "turns.db")
            _park(other, "h-00000000000000aa", "http://127.0.0.1:9/hook", "{}", time.time() - 10 * 86_400, "x")
            _park(other, "h-00000000000000bb", "http://127.0.0.1:9/hook", "{}", time.time(), "x")
            assert other.bury_deliveries(time.time(), 1000, 3 * 86_400) == 1
            deadline = time.monotonic() + 60
            while 'ragloop_handoff_outbox_rows{state="dead"} 1.0' not in (text := client.get("/metrics").text):
                assert time.monotonic() < deadline, "the outbox rows never reached /metrics"
                time.sleep(0.05)
            assert 'ragloop_handoff_outbox_rows{state="waiting"} 1.0' in text
            assert 'ragloop_handoff_webhook_total{result="dead"} 0.0' in text
            other.close()

    async def test_the_cli_marks_dead_by_age_and_lists(self, tmp_path: Path) -> None:
        """`ragloop handoff resend --dead-after-days` marks a delivery kept longer dead before the pass (not
        sent), says so, and `handoff list` (waiting) no longer shows it."""
        backend = SQLiteBackend(tmp_path / "turns.db")
        _park(backend, "h-00000000000000dd", "http://user:pw@127.0.0.1:9/hook", "{}", time.time() - 5 * 86_400, "x")
        log_url = f"sqlite:{tmp_path / 'turns.db'}"
        rc, waiting = await anyio.to_thread.run_sync(_cli, "handoff", "list", "--turn-log", log_url, "--json")
        assert rc == 0 and [w["handoff_id"] for w in waiting] == ["h-00000000000000dd"]
        assert "pw" not in waiting[0]["url"]
        rc, out = await anyio.to_thread.run_sync(
            _cli, "handoff", "resend", "--turn-log", log_url, "--json", "--dead-after-days", "2"
        )
        assert rc == 0 and out == {**_none_left, "dead": 1, "marked_dead": 1}
        assert await anyio.to_thread.run_sync(_cli, "handoff", "list", "--turn-log", log_url, "--json") == (0, [])
        backend.close()

    def test_an_outbox_of_the_first_layout_gains_the_dead_column(self, tmp_path: Path) -> None:
        """A log whose outbox was made before dead deliveries (no ``dead_at``) is upgraded on its first
        writable open, its waiting row kept."""
        import sqlite3

        backend = SQLiteBackend(tmp_path / "turns.db")
        backend.open()
        backend.close()
        conn = sqlite3.connect(tmp_path / "turns.db")
        conn.execute("drop table ragloop_handoff_outbox")
        conn.execute(
            "create table ragloop_handoff_outbox (handoff_id text primary key, url text not null, body text not "
            "null, signature text not null, failed_at real not null, attempts integer not null, last_error text, "
            "claimed_until real, delivered_at real)"
        )
        conn.execute(
            "insert into ragloop_handoff_outbox values ('h-1', 'http://x/', '{}', 'sha256=ab', 1, 1, 'e', null, null)"
        )
        conn.execute(
            "insert into ragloop_handoffs (handoff_id, turn_id, principal, at, packet) "
            "values ('h-1', 't1', 'p', 1, '{}')"
        )
        conn.commit()
        conn.close()
        backend = SQLiteBackend(tmp_path / "turns.db")
        assert backend.undelivered() == 1 and backend.claim_deliveries(2.0, 1.0, 5) == [("h-1", "http://x/", "{}")]
        backend.close()
