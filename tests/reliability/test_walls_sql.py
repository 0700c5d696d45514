"""Hostile suite for the SQL plan sources (issue 20, item 4): the attacks that crossed the walls, each refused.

Every attack here succeeded on the code before the allowlist (the commit that added this file quotes each one's
result): ``ts_stat`` read the ``secrets`` table, a ``WITH`` query let a column outside the allowlist through,
``pg_terminate_backend`` killed another connection, ``current_setting`` / ``pg_stat_file`` / ``pg_ls_waldir``
revealed the server, a self-join or scalar sub-query escaped the plan's filter, and a doubling recursive
``WITH`` ran for seconds and took gigabytes. They run against real SQLite and a real PostgreSQL (pgserver).
"""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
import structlog
from attrs import define
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from ragloop.errors import QueryRefused, SourceError
from ragloop.retrievers.sql import PostgresSQLSource, SQLiteSource, SQLQuery, SQLSchema, check_sql
from ragloop.sample import SAMPLE_CRM_ALLOW, SAMPLE_CRM_TENANTS, sample_crm_path
from ragloop.state import Caller
from tests.reliability._support import count
from tests.retrievers.conftest import load_sample_crm, pg_server, pg_url

pytestmark = pytest.mark.anyio
psycopg = pytest.importorskip("psycopg")

__all__ = ["pg_server", "pg_url"]  # the real PostgreSQL fixtures, reused

#: Customer 8 of the sample CRM; another customer, and a name no customer has.
HLB, ZEPHYR = "Harbor Lane Bank", "Zephyr Telecom"
#: An allowlist that leaves most customer columns out (seats, region, status …).
NARROW = {**SAMPLE_CRM_ALLOW, "customers": ("id", "name", "plan")}
_schemas = itertools.count()


@define
class Scripted:
    """A writer that proposes fixed SQL, as a hostile model would."""

    sql: str
    params: Sequence[str | int] = ()

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        return SQLQuery(self.sql, tuple(self.params), note="scripted")


def truth(sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
    """What the sample CRM answers to ``sql`` (the ground truth of the tests)."""
    with sqlite3.connect(f"{sample_crm_path().resolve().as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(sql, tuple(params)).fetchall()


@pytest.fixture
def crm(tmp_path: Path) -> Path:
    """A private copy of the sample CRM database."""
    target = tmp_path / "crm.sqlite"
    shutil.copyfile(sample_crm_path(), target)
    return target


@pytest.fixture
def pg_crm(pg_url: str) -> str:
    """A fresh Postgres schema holding the sample CRM."""
    schema = f"walls{next(_schemas)}"
    load_sample_crm(pg_url, schema)
    return schema


@pytest.fixture(params=["sqlite", "postgres"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A factory of SQL sources over the sample CRM, in SQLite or in a real Postgres."""
    if request.param == "sqlite":
        path = tmp_path / "crm.sqlite"
        shutil.copyfile(sample_crm_path(), path)

        def sqlite_source(sql: str, params: Sequence[str | int] = (), **kwargs: Any) -> Any:
            kwargs.setdefault("allow", SAMPLE_CRM_ALLOW)
            return SQLiteSource(path, writer=Scripted(sql, params), **kwargs)

        return sqlite_source
    url = request.getfixturevalue("pg_url")
    schema = f"walls{next(_schemas)}"
    load_sample_crm(url, schema)

    def pg_source(sql: str, params: Sequence[str | int] = (), **kwargs: Any) -> Any:
        kwargs.setdefault("allow", SAMPLE_CRM_ALLOW)
        return PostgresSQLSource(url, writer=Scripted(sql, params), schema_name=schema, **kwargs)

    return pg_source


async def refused(source: Any, *, caller: Caller | None = None, filters: Any = None) -> str:
    """The one-line refusal ``source`` gives (the statement never ran)."""
    with pytest.raises(QueryRefused) as info:
        await source.run("x", filters or {}, caller=caller)
    assert source.statements == [] and "\n" not in str(info.value)
    return str(info.value)


class TestFunctionAllowlist:
    async def test_ts_stat_cannot_read_a_table_outside_the_allowlist(self, pg_url: str, pg_crm: str) -> None:
        """ts_stat() runs the query text it is given (on main it returned the secrets table's tokens): refused by
        the function allowlist, in the select list and as a table."""
        inner = f"select to_tsvector('simple', api_token) from {pg_crm}.secrets"
        for sql in (
            f"SELECT ts_stat('{inner.replace(chr(39), chr(39) * 2)}') AS w FROM customers",
            f"SELECT word FROM customers, ts_stat('{inner.replace(chr(39), chr(39) * 2)}') AS t",
        ):
            why = await refused(PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name=pg_crm))
            assert why.startswith("refused (function allowlist): ts_stat()"), why

    async def test_pg_terminate_backend_cannot_kill_another_connection(self, pg_url: str, pg_crm: str) -> None:
        """On main this statement killed another connection of the same role; now it is refused and the other
        connection lives on."""
        async with await psycopg.AsyncConnection.connect(pg_url) as victim:
            pid = victim.info.backend_pid
            sql = f"SELECT pg_terminate_backend({pid}) AS k FROM customers"
            why = await refused(PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name=pg_crm))
            assert why.startswith("refused (function allowlist): pg_terminate_backend()")
            assert await (await victim.execute("SELECT 1")).fetchone() == (1,)

    @pytest.mark.parametrize(
        ("expr", "name"),
        [
            ("current_setting('data_directory')", "current_setting()"),
            ("pg_stat_file('postgresql.conf')", "pg_stat_file()"),
            ("pg_ls_waldir()", "pg_ls_waldir()"),
            ("pg_read_file('postgresql.conf')", "pg_read_file()"),
            ("query_to_xml('select * from secrets', true, true, '')", "query_to_xml()"),
            ("set_config('search_path', 'pg_catalog', true)", "set_config()"),
            ("version()", "version()"),
            ("inet_server_addr()", "inet_server_addr()"),
            ("pg_backend_pid()", "pg_backend_pid()"),
            ("pg_sleep(5)", "pg_sleep()"),
            ("txid_current()", "txid_current()"),
            ("current_user", "current_user"),
        ],
    )
    async def test_server_settings_and_files_stay_hidden(self, pg_url: str, pg_crm: str, expr: str, name: str) -> None:
        """Functions that reveal or change the server (on main current_setting, pg_stat_file and pg_ls_waldir
        answered) are refused, the refusal naming the function."""
        sql = f"SELECT {expr} AS v FROM customers"
        why = await refused(PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name=pg_crm))
        assert why.startswith("refused (") and name.rstrip("()") in why, why

    @pytest.mark.parametrize(
        ("sql", "rule"),
        [
            ("SELECT ctid FROM customers", "(column allowlist): column 'ctid'"),
            ("SELECT c.xmin FROM customers AS c", "(column allowlist): column 'c.xmin'"),
            ("SELECT c.row_to_json FROM customers AS c", "(column allowlist): column 'c.row_to_json'"),
            ("SELECT relname FROM pg_class", "(table allowlist): table 'pg_class'"),
            ("SELECT usename FROM pg_catalog.pg_user", "qualified with a database name"),
            ("SELECT table_name FROM information_schema.tables", "qualified with a database name"),
            ("SELECT CAST('secrets' AS regclass) AS v FROM customers", "(cast allowlist)"),
            ("SELECT name FROM customers FOR UPDATE", "(clause allowlist)"),
            ("SELECT name FROM customers TABLESAMPLE SYSTEM (50)", "(clause allowlist)"),
            ("SELECT s.x FROM customers, LATERAL (SELECT 1 AS x) AS s", "(clause allowlist)"),
            ("SELECT x FROM generate_series(1, 10) AS g(x)", "generate_series()"),
            ("SELECT name FROM customers WHERE name ~ 'a'", "regexp_like()"),
            ("SELECT name FROM ONLY customers", "(clause allowlist)"),
        ],
    )
    async def test_catalogs_system_columns_and_odd_clauses(self, pg_url: str, pg_crm: str, sql: str, rule: str) -> None:
        """Catalogs, system columns, functional notation, object casts and clauses off the list are refused."""
        why = await refused(PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name=pg_crm))
        assert rule in why, why


class TestColumnAllowlist:
    async def test_a_with_query_does_not_skip_the_column_check(self, make: Any) -> None:
        """On main a statement holding a WITH query skipped the column check (Postgres returned every customer's
        seats, outside the allowlist); now the column is refused by name."""
        sql = "WITH x AS (SELECT id FROM customers) SELECT name, seats FROM customers"
        why = await refused(make(sql, allow=NARROW))
        assert why == "refused (column allowlist): column 'seats' is not allowlisted in customers"

    @pytest.mark.parametrize(
        "sql",
        [
            "SELECT name FROM customers WHERE id IN (SELECT id FROM customers WHERE seats > 10)",
            "SELECT name FROM customers AS c WHERE EXISTS (SELECT 1 FROM customers AS d WHERE d.seats > c.id)",
            "SELECT name FROM customers ORDER BY seats",
            "SELECT plan, COUNT(*) AS n FROM customers GROUP BY region",
            "SELECT t.s FROM (SELECT seats AS s FROM customers) AS t",
            "WITH x(a) AS (SELECT seats FROM customers) SELECT a FROM x",
            "SELECT name FROM customers UNION SELECT region FROM customers",
            "SELECT rank() OVER (PARTITION BY status ORDER BY id) AS r FROM customers",
            "SELECT CASE WHEN seats > 10 THEN 'big' END AS s FROM customers",
            "SELECT o.id FROM orders AS o JOIN customers AS c USING (seats)",
        ],
    )
    async def test_no_place_hides_a_column(self, make: Any, sql: str) -> None:
        """A column outside the allowlist is refused wherever it stands (sub-query, EXISTS, ORDER BY, GROUP BY,
        derived table, WITH column list, UNION, window, CASE, USING)."""
        why = await refused(make(sql, allow=NARROW))
        assert why.startswith("refused (column allowlist)") and ("seats" in why or "region" in why or "status" in why)

    async def test_star_reads_only_the_allowlist(self, make: Any) -> None:
        """``*`` through a WITH query, a derived table or a join yields only allowlisted columns."""
        for sql in (
            "WITH x AS (SELECT * FROM customers) SELECT * FROM x",
            "SELECT * FROM (SELECT * FROM customers) AS t",
            "SELECT c.* FROM customers AS c JOIN orders AS o ON o.customer_id = c.id",
        ):
            result = await make(sql, allow=NARROW, max_rows=500).run("x", {})
            assert result.rows and all(set(r) <= {"id", "name", "plan"} for r in result.rows), sql


class TestTenantOnEveryReference:
    """With ``tenants=SAMPLE_CRM_TENANTS`` and a caller of Harbor Lane Bank (customer 8), every reference to a
    customer, order or ticket sees Harbor Lane Bank's rows only."""

    caller = Caller(tenant=HLB)

    async def _rows(self, make: Any, sql: str, params: Sequence[str | int] = ()) -> list[dict[str, str]]:
        source = make(sql, params, tenants=SAMPLE_CRM_TENANTS, max_rows=500)
        return [dict(r) for r in (await source.run("x", {}, caller=self.caller)).rows]

    async def test_self_join_sees_only_the_callers_rows(self, make: Any) -> None:
        """On main a self-join returned every customer past the plan's filter; now both sides are the caller's."""
        rows = await self._rows(make, "SELECT d.name FROM customers AS c JOIN customers AS d ON d.id <> c.id")
        assert rows == []
        rows = await self._rows(make, "SELECT d.name FROM customers AS c CROSS JOIN customers AS d")
        assert [r["name"] for r in rows] == [HLB]

    async def test_scalar_subquery_counts_only_the_callers_rows(self, make: Any) -> None:
        """On main ``(SELECT COUNT(*) FROM customers)`` counted 25; now it counts the caller's one."""
        rows = await self._rows(
            make, "SELECT (SELECT COUNT(*) FROM customers) AS n, (SELECT COUNT(*) FROM orders) AS o"
        )
        assert rows == [{"n": "1", "o": str(truth("SELECT COUNT(*) FROM orders WHERE customer_id = 8")[0][0])}]

    async def test_with_queries_read_only_the_callers_rows(self, make: Any) -> None:
        """A WITH query, one named like the table it reads, and a recursive one walking every id: own rows only."""
        for sql in (
            "WITH everyone AS (SELECT id, name FROM customers) SELECT name FROM everyone",
            "WITH customers AS (SELECT id, name FROM customers) SELECT name FROM customers",
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 30) "
            "SELECT c.name FROM r JOIN customers AS c ON c.id = r.n",
        ):
            assert [r["name"] for r in await self._rows(make, sql)] == [HLB], sql

    async def test_union_sees_only_the_callers_rows(self, make: Any) -> None:
        """Both branches of a UNION (at the top or in a sub-query) are scoped."""
        rows = await self._rows(make, "SELECT customer_id FROM orders UNION SELECT customer_id FROM tickets")
        assert {r["customer_id"] for r in rows} == {"8"}
        sql = "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders UNION SELECT 25)"
        assert [r["name"] for r in await self._rows(make, sql)] == [HLB]

    async def test_exists_and_in_cannot_probe_another_tenant(self, make: Any) -> None:
        """A sub-query naming another customer finds nothing: no yes/no oracle about other tenants either."""
        sql = "SELECT id FROM orders WHERE EXISTS (SELECT 1 FROM customers WHERE name = ?)"
        assert await self._rows(make, sql, [ZEPHYR]) == []
        assert await self._rows(make, sql, [HLB])  # the caller's own name does match
        sql = "SELECT id FROM tickets WHERE customer_id IN (SELECT id FROM customers WHERE name = ?)"
        assert await self._rows(make, sql, [ZEPHYR]) == []
        sql = "SELECT COUNT(*) AS n FROM tickets WHERE customer_id = 25"
        assert await self._rows(make, sql) == [{"n": "0"}]

    async def test_a_request_without_a_tenant_is_refused(self, make: Any) -> None:
        """No caller, or a caller without a tenant, reads no tenant-scoped table: one line naming the rule."""
        for caller in (None, Caller(user="u1"), Caller(tenant="  ")):
            why = await refused(make("SELECT name FROM customers", tenants=SAMPLE_CRM_TENANTS), caller=caller)
            assert why.startswith("refused (tenant): table 'customers' holds the rows of many organisations")

    async def test_a_hostile_tenant_name_is_a_value(self, make: Any) -> None:
        """A tenant name that looks like SQL is bound, never spliced: it matches no customer."""
        source = make("SELECT name FROM customers", tenants=SAMPLE_CRM_TENANTS)
        result = await source.run("x", {}, caller=Caller(tenant="x' OR '1'='1"))
        assert result.rows == ()

    async def test_plan_filters_narrow_every_reference(self, make: Any) -> None:
        """The plan's filter on the main table narrows each reference to it (on main only the first one)."""
        source = make("SELECT d.name FROM customers AS c CROSS JOIN customers AS d")
        result = await source.run("x", {"name": (HLB,)})
        assert [r["name"] for r in result.rows] == [HLB]
        source = make("SELECT (SELECT COUNT(*) FROM customers) AS n FROM customers")
        assert [dict(r) for r in (await source.run("x", {"name": (HLB,)})).rows] == [{"n": "1"}]

    async def test_the_plan_node_hands_the_caller_to_sql_sources(self, crm: Path) -> None:
        """The plan node runs each SQL source for the turn's caller (the same wall on the plan path)."""
        from ragloop.nodes.plan import _for_turn

        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted("SELECT name FROM customers"), tenants=SAMPLE_CRM_TENANTS)
        scoped = _for_turn({"sql": source}, self.caller, {})["sql"]
        assert [r["name"] for r in (await scoped.run("x", {})).rows] == [HLB]
        anonymous = _for_turn({"sql": source}, None, {})["sql"]
        with pytest.raises(QueryRefused, match=r"refused \(tenant\)"):
            await anonymous.run("x", {})


def _measure(script: str) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter; it prints one JSON object (seconds, peak RSS growth, error)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


_RUN_ONE = """
    import asyncio, json, resource, sys, time
    from ragloop.errors import RagloopError
    from ragloop.retrievers.sql import SQLiteSource, SQLQuery
    from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path

    class Writer:
        async def write(self, request, schema):
            return SQLQuery({sql!r}, ())

    async def main():
        source = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, Writer(), timeout_s={timeout})
        await source.schema()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        try:
            await source.run("x", {{}})
            error = ""
        except RagloopError as exc:
            error = str(exc)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(json.dumps({{"seconds": time.perf_counter() - started, "grown_mb": grown / 1024, "error": error}}))

    asyncio.run(main())
"""


class TestSQLiteBounds:
    def test_doubling_with_query_stops_fast_and_small(self) -> None:
        """The doubling recursive WITH query (on main: 8.8 s and 2.9 GB of memory, then 'string or blob too
        big') stops at max_value_bytes within the timeout, growing the process by under 64 MB."""
        sql = (
            "WITH RECURSIVE r(s, n) AS (SELECT name, 0 FROM customers WHERE id = 1 UNION ALL "
            "SELECT s || s, n + 1 FROM r WHERE n < 40) SELECT length(s) AS len FROM r ORDER BY len DESC LIMIT 1"
        )
        got = _measure(_RUN_ONE.format(sql=sql, timeout=2.0))
        assert "over 1,000,000 bytes (max_value_bytes)" in got["error"]
        assert got["seconds"] < 3.0 and got["grown_mb"] < 64, got

    def test_fan_out_with_query_stops_at_its_budget_and_small(self) -> None:
        """A recursive WITH query that multiplies its rows (25 per step, forever) is interrupted by the step or
        time budget, growing the process by under 64 MB (the page cache is bounded, temp data goes to disk)."""
        sql = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT r.n + 1 FROM r, customers) SELECT n FROM r ORDER BY n"
        got = _measure(_RUN_ONE.format(sql=sql, timeout=2.0))
        assert "budget" in got["error"] and "interrupted" in got["error"]
        assert got["seconds"] < 3.0 and got["grown_mb"] < 64, got

    async def test_step_budget_bounds_a_statement_before_the_clock(self, crm: Path) -> None:
        """A cartesian product stops at max_steps, and the error says which budget it spent."""
        heavy = "SELECT COUNT(*) AS n FROM tickets AS a, tickets AS b, tickets AS c, orders AS d"
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted(heavy), max_steps=1_000_000, timeout_s=30)
        started = time.perf_counter()
        with pytest.raises(SourceError, match=r"ran past its steps budget .*1,000,000 steps"):
            await source.run("x", {})
        assert time.perf_counter() - started < 5

    async def test_sqlite_limits_are_set_by_the_source(self, crm: Path) -> None:
        """The source sets the limits and pragmas itself (the checker refuses any PRAGMA a writer proposes)."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, max_value_bytes=5_000, cache_kib=1_024)
        conn = source._connect()
        try:
            assert conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == 5_000
            assert conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
            assert conn.getlimit(sqlite3.SQLITE_LIMIT_COMPOUND_SELECT) == 20
            assert conn.execute("PRAGMA cache_size").fetchone() == (-1_024,)
        finally:
            conn.close()
        why = await refused(SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted("PRAGMA cache_size = -1000000")))
        assert "starts with 'PRAGMA'" in why

    @pytest.mark.parametrize(
        ("sql", "error"),
        [
            (" UNION ALL ".join(["SELECT id FROM customers"] * 30), "too many terms in compound SELECT"),
            ("SELECT " + " + ".join(["seats"] * 400) + " AS s FROM customers", "Expression tree is too large"),
            (
                "SELECT length(replace(replace(replace(replace(name, 'a', name), 'a', name), 'a', name), 'a', name))"
                " AS n FROM customers",
                "",
            ),
        ],
    )
    async def test_limits_stop_wide_and_deep_statements(self, crm: Path, sql: str, error: str) -> None:
        """A statement past a ``sqlite3`` limit stops with one line naming it; a growing value stays capped."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted(sql), max_value_bytes=100_000)
        if not error:
            try:
                result = await source.run("x", {})
            except SourceError as exc:
                assert "max_value_bytes" in str(exc)
            else:
                assert all(int(r["n"]) <= 100_000 for r in result.rows)
            return
        with pytest.raises(SourceError, match=error) as info:
            await source.run("x", {})
        assert "\n" not in str(info.value)

    async def test_deep_nesting_and_huge_text_are_refused(self, crm: Path) -> None:
        """A statement nested past the parser or over 20,000 characters is refused, never a crash."""
        deep = "SELECT " + "(" * 3000 + "1" + ")" * 3000 + " AS v FROM customers"
        assert "nested too deeply" in await refused(SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted(deep)))
        huge = "SELECT name FROM customers WHERE name = '" + "x" * 30_000 + "'"
        assert "at most 20,000" in await refused(SQLiteSource(crm, SAMPLE_CRM_ALLOW, Scripted(huge)))


class TestPostgresBounds:
    async def test_limits_are_set_per_transaction(self, pg_url: str, pg_crm: str) -> None:
        """statement_timeout, work_mem, temp_file_limit and the tenant are SET LOCAL: in force for the statement
        (read here by a statement that skipped the checker), gone after it."""
        source = PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, schema_name=pg_crm, timeout_s=1.5, work_mem="8MB",
                                   temp_file_limit="32MB")  # fmt: skip
        read = (
            "SELECT current_setting('statement_timeout'), current_setting('work_mem'), "
            "current_setting('temp_file_limit'), current_setting('ragloop.tenant', true)"
        )
        _, rows = await source._execute(read, (), tenant=HLB)
        assert rows == [("1500ms", "8MB", "32MB", HLB)]
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            defaults = await (await conn.execute("SELECT current_setting('work_mem')")).fetchone()
        assert defaults != ("8MB",)

    async def test_a_role_granted_the_parameter_sets_temp_file_limit(self, pg_url: str, pg_crm: str) -> None:
        """temp_file_limit needs superuser; a role granted SET ON PARAMETER (Postgres 15+) sets it per transaction,
        a role without it runs anyway with its own setting, and the source stops trying (logged once)."""
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for role in ("crm_limited", "crm_plain"):
                conn.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
                conn.execute(f"GRANT USAGE ON SCHEMA {pg_crm} TO {role}")
                conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {pg_crm} TO {role}")
            conn.execute("GRANT SET ON PARAMETER temp_file_limit TO crm_limited")
        read = "SELECT current_setting('temp_file_limit')"
        granted = PostgresSQLSource(_as_role(pg_url, "crm_limited"), SAMPLE_CRM_ALLOW, schema_name=pg_crm,
                                    temp_file_limit="24MB")  # fmt: skip
        assert (await granted._execute(read, ()))[1] == [("24MB",)] and granted._temp_limit_settable
        plain = PostgresSQLSource(_as_role(pg_url, "crm_plain"), SAMPLE_CRM_ALLOW, schema_name=pg_crm,
                                  temp_file_limit="24MB")  # fmt: skip
        try:
            with capture_logs() as logs:
                first = (await plain._execute(read, ()))[1]
                second = (await plain._execute(read, ()))[1]
        finally:
            structlog.reset_defaults()  # capture_logs leaves structlog 'configured': later ragloop logs would print
        assert first == second != [("24MB",)] and plain._temp_limit_settable is False
        assert [e["event"] for e in logs] == ["sql.temp_file_limit_not_set"]

    async def test_doubling_with_query_is_cancelled(self, pg_url: str, pg_crm: str) -> None:
        """The doubling recursive WITH query stops at the statement timeout or the temp-file limit."""
        sql = (
            "WITH RECURSIVE r(s, n) AS (SELECT name, 0 FROM customers WHERE id = 1 UNION ALL "
            "SELECT s || s, n + 1 FROM r WHERE n < 40) SELECT length(s) AS len FROM r ORDER BY len DESC LIMIT 1"
        )
        source = PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name=pg_crm, timeout_s=1.0)
        started = time.perf_counter()
        with pytest.raises(SourceError, match=r"cancelled|temp_file_limit|temporary file size|memory"):
            await source.run("x", {})
        assert time.perf_counter() - started < 5


def _as_role(url: str, role: str, database: str | None = None) -> str:
    parts = urlsplit(url)
    host = parts.netloc.split("@", 1)[-1]
    path = f"/{database}" if database else parts.path
    return urlunsplit((parts.scheme, f"{role}:@{host}", path, parts.query, parts.fragment))


@pytest.fixture
def rls(pg_url: str) -> Iterator[tuple[str, str]]:
    """The second lock, set up as docs/planning.md says: a database holding the CRM, a read-only role granted
    the allowlisted columns only, row-level security on the tenant tables keyed by ``ragloop.tenant``, and
    ``set_config`` / ``pg_terminate_backend`` revoked from PUBLIC. Yields (admin URL, reader URL)."""
    name = f"walls_rls{next(_schemas)}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
        conn.execute("DO $$ BEGIN CREATE ROLE crm_reader LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    admin = _as_role(pg_url, "postgres", name)
    load_sample_crm(admin, "crm")
    recipe = (Path(__file__).parents[2] / "docs" / "planning.md").read_text(encoding="utf-8")
    script = recipe.split("<!-- rls-recipe -->")[1].split("```sql")[1].split("```")[0]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(script)
    try:
        yield admin, _as_role(pg_url, "crm_reader", name)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


class TestRowLevelSecurity:
    async def test_a_forged_statement_sees_only_the_tenants_rows(self, rls: tuple[str, str]) -> None:
        """A statement that bypassed the checker entirely, run as the reader role for Harbor Lane Bank, still
        sees only Harbor Lane Bank's customers, orders and tickets, and none of the secrets table."""
        _, reader = rls
        source = PostgresSQLSource(reader, SAMPLE_CRM_ALLOW, schema_name="crm", tenants=SAMPLE_CRM_TENANTS)
        _, rows = await source._execute("SELECT d.name FROM customers AS c CROSS JOIN customers AS d", (), tenant=HLB)
        assert rows == [(HLB,)]
        _, rows = await source._execute("SELECT (SELECT COUNT(*) FROM orders), (SELECT COUNT(*) FROM tickets)", (),
                                        tenant=HLB)  # fmt: skip
        own = truth("SELECT (SELECT COUNT(*) FROM orders WHERE customer_id = 8), "
                    "(SELECT COUNT(*) FROM tickets WHERE customer_id = 8)")  # fmt: skip
        assert rows == own
        _, rows = await source._execute("SELECT COUNT(*) FROM customers", (), tenant=None)
        assert rows == [(0,)]  # no tenant set: no rows at all
        with pytest.raises(QueryRefused, match="permission denied"):
            await source._execute("SELECT api_token FROM secrets", (), tenant=HLB)

    async def test_a_forged_statement_cannot_switch_tenant_or_kill(self, rls: tuple[str, str]) -> None:
        """The reader cannot re-point the tenant setting (set_config revoked) nor signal another connection of
        its role (pg_terminate_backend revoked): both fail with permission denied."""
        _, reader = rls
        source = PostgresSQLSource(reader, SAMPLE_CRM_ALLOW, schema_name="crm", tenants=SAMPLE_CRM_TENANTS)
        switch = "SELECT set_config('ragloop.tenant', 'Zephyr Telecom', true), name FROM customers"
        with pytest.raises(QueryRefused, match="permission denied for function set_config"):
            await source._execute(switch, (), tenant=HLB)
        async with await psycopg.AsyncConnection.connect(reader) as victim:
            with pytest.raises(QueryRefused, match="permission denied for function pg_terminate_backend"):
                await source._execute(f"SELECT pg_terminate_backend({victim.info.backend_pid})", (), tenant=HLB)
            assert await (await victim.execute("SELECT 1")).fetchone() == (1,)

    async def test_checked_statements_run_under_both_locks(self, rls: tuple[str, str]) -> None:
        """Through the checker, as the reader role: the caller's rows, as without row-level security; a role
        that may not set temp_file_limit runs anyway (the role's own setting stands)."""
        _, reader = rls
        sql = "SELECT c.name, COUNT(o.id) AS n FROM customers AS c LEFT JOIN orders AS o ON o.customer_id = c.id " \
              "GROUP BY c.name"  # fmt: skip
        source = PostgresSQLSource(
            reader, SAMPLE_CRM_ALLOW, Scripted(sql), schema_name="crm", tenants=SAMPLE_CRM_TENANTS
        )
        result = await source.run("x", {}, caller=Caller(tenant=HLB))
        own = truth("SELECT COUNT(*) FROM orders WHERE customer_id = 8")[0][0]
        assert [dict(r) for r in result.rows] == [{"name": HLB, "n": str(own)}]
        assert source._temp_limit_settable is False


#: The grammar's columns per table (a few of each kind).
_COLUMNS = {
    "customers": ("id", "name", "plan", "seats"),
    "orders": ("id", "customer_id", "plan", "amount_usd"),
    "tickets": ("id", "customer_id", "priority", "status"),
}
_TABLES = sorted(_COLUMNS)
#: Random tenants: real customers, a name no customer has, and one that looks like SQL.
_TENANTS = st.sampled_from([HLB, ZEPHYR, "Bluefin Media", "Acorn Logistics", "Nobody Ltd", "x' OR '1'='1"])


def _owner(alias: str, table: str) -> str:
    """The expression naming the customer a row belongs to."""
    return f"{alias}.id" if table == "customers" else f"{alias}.customer_id"


@st.composite
def _predicate(draw: st.DrawFn, alias: str, table: str, names: Iterator[str], depth: int) -> str:
    n = draw(st.integers(0, 30))
    kinds = ["compare"] + (["in", "exists", "probe", "scalar"] if depth > 0 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "compare":
        return f"{alias}.id > {n}" if table != "orders" else f"{alias}.amount_usd > {n * 100}"
    other, s = draw(st.sampled_from(_TABLES)), next(names)
    inner = draw(_select(other, names, depth - 1, columns=1, alias=s)) if draw(st.booleans()) else ""
    if kind == "in":
        return (
            f"{_owner(alias, table)} IN (SELECT {_owner(s, other)} FROM {other} AS {s})"
            if not inner
            else (f"{alias}.id IN ({inner})")
        )
    if kind == "exists":
        return f"EXISTS (SELECT 1 FROM {other} AS {s} WHERE {_owner(s, other)} = {_owner(alias, table)})"
    if kind == "probe":  # a yes/no question about some row, maybe another tenant's
        return f"EXISTS (SELECT 1 FROM {other} AS {s} WHERE {s}.id = {n})"
    return f"(SELECT COUNT(*) FROM {other} AS {s}) > {n % 3}"


@st.composite
def _select(draw: st.DrawFn, table: str, names: Iterator[str], depth: int, *, columns: int = 0, alias: str = "") -> str:
    a = alias or next(names)
    picked = [f"{a}.{c}" for c in draw(st.lists(st.sampled_from(_COLUMNS[table]), min_size=1, max_size=3))]
    joins = ""
    if depth > 0 and draw(st.booleans()):
        other, b = draw(st.sampled_from(_TABLES)), next(names)
        if draw(st.booleans()):
            joins = f" JOIN {other} AS {b} ON {_owner(b, other)} = {_owner(a, table)}"
        else:
            joins = f" CROSS JOIN {other} AS {b}"
        picked.append(f"{b}.{draw(st.sampled_from(_COLUMNS[other]))}")
    if depth > 0 and draw(st.booleans()):
        other, s = draw(st.sampled_from(_TABLES)), next(names)
        picked.append(f"(SELECT COUNT(*) FROM {other} AS {s})")
    if columns:
        picked = [f"{a}.id"]
    where = f" WHERE {draw(_predicate(a, table, names, depth))}" if draw(st.booleans()) else ""
    shown = ", ".join(f"{p} AS c{i}" for i, p in enumerate(picked))
    return f"SELECT {shown} FROM {table} AS {a}{joins}{where}"


@st.composite
def crm_statements(draw: st.DrawFn) -> str:
    """A random statement over the sample CRM: joins, self-joins, sub-queries (IN, EXISTS, scalar), WITH queries
    (one named like a table), derived tables and unions, nested up to two levels."""
    names = (f"t{i}" for i in itertools.count())
    body = draw(_select(draw(st.sampled_from(_TABLES)), names, 2))
    shape = draw(st.sampled_from(["plain", "with", "with_shadow", "derived", "union"]))
    if shape == "with":
        return f"WITH q AS ({body}) SELECT q.* FROM q"
    if shape == "with_shadow":
        return f"WITH customers AS ({body}) SELECT customers.* FROM customers"
    if shape == "derived":
        return f"SELECT d.* FROM ({body}) AS d"
    if shape == "union":
        other = draw(_select(draw(st.sampled_from(_TABLES)), names, 1, columns=1))
        first = draw(_select(draw(st.sampled_from(_TABLES)), names, 1, columns=1))
        return f"{first} UNION ALL {other}"
    return body


@pytest.fixture(scope="session")
def tenant_dbs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``tenant → path`` of a copy of the sample CRM holding only that tenant's rows (built on first use)."""
    root = tmp_path_factory.mktemp("tenant-dbs")
    built: dict[str, Path] = {}

    def db(tenant: str) -> Path:
        if tenant not in built:
            path = root / f"t{len(built)}.sqlite"
            shutil.copyfile(sample_crm_path(), path)
            with sqlite3.connect(path) as conn:
                own = "SELECT id FROM customers WHERE name = ?"
                conn.execute(f"DELETE FROM orders WHERE customer_id NOT IN ({own})", (tenant,))
                conn.execute(f"DELETE FROM tickets WHERE customer_id NOT IN ({own})", (tenant,))
                conn.execute("DELETE FROM secrets")
                conn.execute("DELETE FROM customers WHERE name IS NOT ?", (tenant,))
            built[tenant] = path
        return built[tenant]

    return db


class TestNoTenantReadsAnother:
    @given(crm_statements(), _TENANTS)
    def test_rows_are_those_of_a_database_holding_only_the_tenant(self, tenant_dbs: Any, sql: str, tenant: str) -> None:
        """For random tenants and random statements of joins, sub-queries, WITH queries and unions, the rows a
        tenant gets from the shared database are exactly the rows the same statement returns from a copy holding
        only that tenant's rows: never another tenant's row, nor a count or probe that depends on one."""
        full = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, tenants=SAMPLE_CRM_TENANTS, max_rows=5_000)
        alone = SQLiteSource(tenant_dbs(tenant), SAMPLE_CRM_ALLOW, max_rows=5_000)
        schema = _crm_schema()
        got_sql, got_params = check_sql(sql, (), schema, max_rows=5_000, tenants=SAMPLE_CRM_TENANTS, tenant=tenant)
        want_sql, want_params = check_sql(sql, (), schema, max_rows=5_000)
        try:
            want = Counter(alone._execute(want_sql, want_params)[1])
        except SourceError:
            with pytest.raises(SourceError):
                full._execute(got_sql, got_params)
            return
        assert Counter(full._execute(got_sql, got_params)[1]) == want, sql
        count("walls_sql_property_examples")


@functools.cache
def _crm_schema() -> SQLSchema:
    return anyio.run(SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW).schema)
