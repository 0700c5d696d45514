"""Tests for ragloop.retrievers.live: ticket-id signals, the SQLite ticket source, and the shipped sample data."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import ConfigError, LiveSourceError
from ragloop.retrievers.live import (
    CircuitBreaker,
    CircuitOpen,
    LiveRecord,
    LiveSource,
    SQLiteTicketSource,
    default_tickets_path,
    parse_ticket_ids,
)
from ragloop.state import Caller
from ragloop.text.ids import id_matches

REPO = Path(__file__).resolve().parents[2]
DATA = files("ragloop") / "data"


def _tickets(*args: Any, **kwargs: Any) -> SQLiteTicketSource:
    """The ticket source read as one organisation's database (these tests are about its mechanics; the tenant
    rules have their own tests)."""
    kwargs.setdefault("require_caller", False)
    return SQLiteTicketSource(*args, **kwargs)


def _copy_db(tmp_path: Path) -> Path:
    target = tmp_path / "tickets.sqlite"
    shutil.copyfile(default_tickets_path(), target)
    return target


class TestParseTicketIds:
    def test_recognised_forms(self) -> None:
        """#1234, 'ticket 1234', 'ticket #1234' and 'issue 1234' all signal a ticket id."""
        assert parse_ticket_ids("see #1234") == ("1234",)
        assert parse_ticket_ids("what happened to ticket 1201?") == ("1201",)
        assert parse_ticket_ids("Ticket #1100 is about invoices") == ("1100",)
        assert parse_ticket_ids("issue 1042 again") == ("1042",)

    def test_longer_number_is_a_different_id(self) -> None:
        """'#12345' is ticket 12345, never ticket 1234."""
        assert parse_ticket_ids("status of #12345") == ("12345",)
        assert "1234" not in parse_ticket_ids("#12345 and ticket 12340")

    def test_unique_in_order_of_appearance(self) -> None:
        """Repeated ids appear once, in the order the text first names them."""
        assert parse_ticket_ids("ticket 1233, then #1234, then #1233 again") == ("1233", "1234")

    def test_no_ids(self) -> None:
        """Text without a ticket reference does not trigger the source (plain numbers, error codes, versions)."""
        assert parse_ticket_ids("We have 1234 users, error E1002 on v3.2.0") == ()

    @given(st.integers(min_value=1, max_value=10**9), st.integers(min_value=0, max_value=9))
    def test_never_a_prefix_of_a_longer_id(self, n: int, digit: int) -> None:
        """A ticket id written with one more digit is never read as the shorter id."""
        assert parse_ticket_ids(f"about #{n}{digit} please") == (f"{n}{digit}",)
        assert parse_ticket_ids(f"about ticket {n} please") == (str(n),)


class TestSQLiteTicketSource:
    def test_is_a_live_source(self) -> None:
        """The ticket source satisfies the LiveSource protocol."""
        assert isinstance(SQLiteTicketSource(), LiveSource)

    def test_bad_config(self) -> None:
        """A zero concurrency limit is refused with a ConfigError."""
        with pytest.raises(ConfigError, match="max_concurrency"):
            SQLiteTicketSource(max_concurrency=0)

    @pytest.mark.anyio
    async def test_exact_id_lookup(self) -> None:
        """Looking up #1234 returns ticket 1234 only, with its fields; its neighbour #1233 is not returned."""
        async with _tickets() as source:
            records = await source.lookup("status of #1234?", ["1234"])
        assert [r.id for r in records] == ["1234"]
        record = records[0]
        assert record.source == "tickets"
        assert record.title.startswith("Ticket #1234: ")
        assert record.fields["status"] == "open"
        assert record.fields["product_area"] == "sso"
        assert "E2002" in record.text
        assert record.url is not None and record.url.endswith("/1234")

    @pytest.mark.anyio
    async def test_several_ids_keep_request_order(self) -> None:
        """Several ids come back in the order requested; '#'-prefixed ids are accepted too."""
        async with _tickets() as source:
            records = await source.lookup("", ["1234", "#1233", "1042"])
        assert [r.id for r in records] == ["1234", "1233", "1042"]
        assert records[1].fields["status"] == "solved" and records[1].fields["resolution"]

    @pytest.mark.anyio
    async def test_unknown_id_is_empty(self) -> None:
        """An id the database lacks (a gap, or out of range) returns no records and no error."""
        async with _tickets() as source:
            assert await source.lookup("#1050", ["1050"]) == []
            assert await source.lookup("#99999", ["99999"]) == []

    @pytest.mark.anyio
    async def test_related_neighbours_have_other_ids(self) -> None:
        """With related=True, neighbours come after the exact match and an id matcher rejects them all."""
        async with _tickets(related=True, related_limit=2) as source:
            records = await source.lookup("#1234", ["1234"])
            unknown = await source.lookup("ticket 1299 SAML sign-in fails", ["1299"])
        assert records[0].id == "1234"
        assert len(records) == 3
        assert [r for r in records[1:] if id_matches("1234", r.id)] == []
        assert unknown and not any(id_matches("1299", r.id) for r in unknown)
        assert all("SAML" in r.title for r in unknown)

    @pytest.mark.anyio
    async def test_lazy_connection(self) -> None:
        """No connection is opened by construction or signal detection; the first lookup opens one, reused."""
        source = _tickets()
        assert source.signals("ticket #1234") == ("1234",)
        assert source.connects == 0
        await source.lookup("#1234", ["1234"])
        await source.lookup("#1233", ["1233"])
        assert source.connects == 1
        await source.aclose()
        await source.aclose()
        await source.lookup("#1233", ["1233"])
        assert source.connects == 2
        await source.aclose()

    @pytest.mark.anyio
    async def test_missing_file(self, tmp_path: Path) -> None:
        """A missing database raises LiveSourceError naming the path."""
        async with _tickets(tmp_path / "nope.sqlite") as source:
            with pytest.raises(LiveSourceError, match=r"nope\.sqlite does not exist"):
                await source.lookup("#1234", ["1234"])
        assert source.errors == 1

    @pytest.mark.anyio
    async def test_reconnects_after_corrupt_file(self, tmp_path: Path) -> None:
        """A corrupt file fails with LiveSourceError; once the file is repaired the next lookup reconnects."""
        path = tmp_path / "tickets.sqlite"
        path.write_bytes(b"this is not a database" * 100)
        async with _tickets(path) as source:
            with pytest.raises(LiveSourceError, match="could not be read"):
                await source.lookup("#1234", ["1234"])
            shutil.copyfile(default_tickets_path(), path)
            records = await source.lookup("#1234", ["1234"])
        assert [r.id for r in records] == ["1234"]
        assert source.connects == 2

    @pytest.mark.anyio
    async def test_reconnects_after_connection_closed_underneath(self) -> None:
        """A connection closed behind the source's back fails once, then a fresh connection is opened."""
        async with _tickets() as source:
            await source.lookup("#1234", ["1234"])
            for conn in source._idle:  # simulate the connection dying underneath
                conn.close()
            with pytest.raises(LiveSourceError):
                await source.lookup("#1234", ["1234"])
            assert [r.id for r in await source.lookup("#1234", ["1234"])] == ["1234"]
        assert source.connects == 2

    @pytest.mark.anyio
    async def test_locked_database_times_out_then_recovers(self, tmp_path: Path) -> None:
        """A database locked by a writer fails the lookup within the deadline; after unlock it works again."""
        path = _copy_db(tmp_path)
        writer = sqlite3.connect(path, isolation_level=None)
        try:
            writer.execute("BEGIN EXCLUSIVE")
            async with _tickets(path, timeout_s=0.3) as source:
                with anyio.fail_after(5):
                    with pytest.raises(LiveSourceError):
                        await source.lookup("#1234", ["1234"])
                writer.execute("ROLLBACK")
                assert [r.id for r in await source.lookup("#1234", ["1234"])] == ["1234"]
        finally:
            writer.close()

    @pytest.mark.anyio
    async def test_concurrency_limit_holds(self) -> None:
        """50 concurrent lookups never run more than max_concurrency database calls at once, all correct."""
        ids = [str(i) for i in range(1180, 1230)]
        results: dict[str, Sequence[LiveRecord]] = {}
        async with _tickets(max_concurrency=3) as source:

            async def one(tid: str) -> None:
                results[tid] = await source.lookup(f"#{tid}", [tid])

            async with anyio.create_task_group() as tg:
                for tid in ids:
                    tg.start_soon(one, tid)
        assert 1 <= source.max_in_flight <= 3
        assert source.connects <= 3
        assert source.lookups == 50
        assert all([r.id for r in results[t]] == ([] if t == "1199" else [t]) for t in ids)

    @pytest.mark.anyio
    async def test_database_is_opened_read_only(self, tmp_path: Path) -> None:
        """The source cannot modify the database it serves."""
        path = _copy_db(tmp_path)
        async with _tickets(path) as source:
            await source.lookup("#1234", ["1234"])
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                source._idle[0].execute("DELETE FROM tickets")


class TestCallerScope:
    @pytest.mark.anyio
    async def test_a_caller_sees_only_their_organisations_tickets(self) -> None:
        """#1234 belongs to Cedar & Finch Architects: they see it, another organisation gets nothing."""
        async with SQLiteTicketSource() as source:
            own = await source.lookup("#1234", ["1234"], caller=Caller(tenant="Cedar & Finch Architects"))
            other = await source.lookup("#1234", ["1234"], caller=Caller(tenant="Granite Peak Outdoors"))
        assert [r.id for r in own] == ["1234"] and list(other) == []

    @pytest.mark.anyio
    @pytest.mark.parametrize("caller", [None, Caller(user="u1"), Caller(tenant=""), Caller(tenant="   ")])
    async def test_no_tenant_no_tickets(self, caller: Caller | None) -> None:
        """By default a lookup that names no organisation is refused, and the error says what to pass."""
        async with SQLiteTicketSource() as source:
            with pytest.raises(LiveSourceError, match=r"shown only to their organisation.*Caller\(tenant=") as info:
                await source.lookup("#1234", ["1234"], caller=caller)
        assert "\n" not in str(info.value) and source.lookups == 0

    @pytest.mark.anyio
    async def test_related_tickets_stay_in_the_organisation(self) -> None:
        """Related tickets come from the caller's organisation only."""
        caller = Caller(tenant="Cedar & Finch Architects")
        async with SQLiteTicketSource(related=True, related_limit=5) as source:
            records = await source.lookup("#1234", ["1234"], caller=caller)
        assert records and all(r.fields["customer"] == "Cedar & Finch Architects" for r in records)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TestCircuitBreaker:
    def test_opens_after_the_threshold_and_probes_after_the_cooldown(self) -> None:
        """Closed → open after 3 failures in a row → after the cooldown one probe; success closes it."""
        clock = FakeClock()
        breaker = CircuitBreaker(threshold=3, cooldown_s=1.0, clock=clock)
        for _ in range(3):
            assert breaker.admit() is False
            breaker.failed(False)
        assert breaker.state == "open"
        with pytest.raises(CircuitOpen, match="failed 3 time"):
            breaker.admit()
        clock.now += 1.0
        assert breaker.admit() is True  # the probe
        with pytest.raises(CircuitOpen, match="a probe is running"):
            breaker.admit()
        breaker.succeeded(True)
        assert breaker.state == "closed" and breaker.failures == 0 and breaker.admit() is False

    def test_a_failed_probe_doubles_the_cooldown(self) -> None:
        """A failed probe opens the breaker again for twice as long, at most max_cooldown_s."""
        clock = FakeClock()
        breaker = CircuitBreaker(threshold=1, cooldown_s=1.0, max_cooldown_s=3.0, clock=clock)
        breaker.failed(False)
        for wait in (1.0, 2.0, 3.0, 3.0):
            clock.now += wait - 0.01
            with pytest.raises(CircuitOpen):
                breaker.admit()
            clock.now += 0.01
            assert breaker.admit() is True
            breaker.failed(True)
        assert breaker.opened == 5

    def test_a_success_resets_the_count(self) -> None:
        """Failures must come in a row: a success in between resets the count."""
        breaker = CircuitBreaker(threshold=2)
        breaker.failed(False)
        breaker.succeeded(False)
        breaker.failed(False)
        assert breaker.state == "closed"

    def test_a_cancelled_probe_lets_the_next_call_probe(self) -> None:
        """A probe cancelled by its caller proves nothing: the next call is the probe."""
        clock = FakeClock()
        breaker = CircuitBreaker(threshold=1, cooldown_s=1.0, clock=clock)
        breaker.failed(False)
        clock.now += 1.0
        assert breaker.admit() is True
        breaker.cancelled(True)
        assert breaker.admit() is True

    @given(st.lists(st.sampled_from(["ok", "fail", "tick"]), max_size=60))
    def test_never_two_probes_at_once(self, events: list[str]) -> None:
        """Whatever happens, at most one call is let through while the breaker is not closed."""
        clock = FakeClock()
        breaker = CircuitBreaker(threshold=2, cooldown_s=1.0, clock=clock)
        probing = False
        for event in events:
            if event == "tick":
                clock.now += 0.7
                continue
            try:
                probe = breaker.admit()
            except CircuitOpen:
                continue
            assert not (probe and probing)
            probing = probing or probe
            if event == "ok":
                breaker.succeeded(probe)
            else:
                breaker.failed(probe)
            if probe:
                probing = False

    def test_bad_config(self) -> None:
        """A threshold below 1 or a cooldown that is not positive is a ConfigError."""
        with pytest.raises(ConfigError):
            CircuitBreaker(threshold=0)
        with pytest.raises(ConfigError):
            CircuitBreaker(cooldown_s=0)


class TestSampleData:
    def test_ticket_database_ships(self) -> None:
        """The packaged ticket database has at least 200 tickets, all fields filled, resolutions when solved."""
        path = Path(str(DATA / "tickets.sqlite"))
        assert path == default_tickets_path() and path.is_file()
        with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
            count, missing = conn.execute(
                "SELECT count(*), sum(summary = '' OR body = '' OR customer = '') FROM tickets"
            ).fetchone()
            unresolved = conn.execute(
                "SELECT count(*) FROM tickets WHERE status = 'solved' AND resolution IS NULL"
            ).fetchone()[0]
        conn.close()
        assert count >= 200 and missing == 0 and unresolved == 0

    def test_generator_reproduces_shipped_database(self, tmp_path: Path) -> None:
        """scripts/build_sample_tickets.py rebuilds exactly the rows that ship (seeded, deterministic)."""
        script = REPO / "scripts" / "build_sample_tickets.py"
        if not script.is_file():
            pytest.skip("scripts/ not present (installed package)")
        spec = importlib.util.spec_from_file_location("build_sample_tickets", script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.build(tmp_path / "t.sqlite")

        def rows(p: Path) -> list[tuple[object, ...]]:
            conn = sqlite3.connect(p)
            try:
                return conn.execute("SELECT * FROM tickets ORDER BY id").fetchall()
            finally:
                conn.close()

        assert rows(tmp_path / "t.sqlite") == rows(default_tickets_path())

    def test_knowledge_base_ships(self) -> None:
        """At least 30 markdown pages ship, each with a title in front matter and a level-one heading."""
        pages = [p for p in (DATA / "sample_kb").iterdir() if p.name.endswith(".md")]
        assert len(pages) >= 30
        for page in pages:
            text = page.read_text(encoding="utf-8")
            assert text.startswith("---\ntitle: "), page.name
            assert "\n# " in text, page.name

    def test_sample_questions_point_at_real_pages(self) -> None:
        """Every sample question is well-formed and its expected sources are shipped pages."""
        pages = {p.name for p in (DATA / "sample_kb").iterdir()}
        lines = (DATA / "sample_questions.jsonl").read_text(encoding="utf-8").splitlines()
        questions = [json.loads(line) for line in lines if line.strip()]
        assert len(questions) >= 20
        assert len({q["id"] for q in questions}) == len(questions)
        for q in questions:
            assert q["question"] and q["kind"]
            assert set(q["expected_sources"]) <= pages, q["id"]
