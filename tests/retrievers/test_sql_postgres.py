"""PostgresSQLSource against a real PostgreSQL (pgserver): the sample CRM loaded into a schema of its own."""

from __future__ import annotations

import itertools

import pytest

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.sql import FUNCTIONS, AllowedFunction, PostgresSQLSource, SQLQuery, SQLSchema
from ragloop.sample import SAMPLE_CRM_ALLOW
from tests.retrievers.conftest import load_sample_crm

pytestmark = pytest.mark.anyio
psycopg = pytest.importorskip("psycopg")
_schemas = itertools.count()


@pytest.fixture
def crm_schema(pg_url: str) -> str:
    """A fresh Postgres schema holding a copy of the sample CRM tables."""
    schema = f"crm{next(_schemas)}"
    load_sample_crm(pg_url, schema)
    return schema


@pytest.fixture
def source(pg_url: str, crm_schema: str) -> PostgresSQLSource:
    """The SQL source over that schema, offline writer."""
    return PostgresSQLSource(pg_url, SAMPLE_CRM_ALLOW, schema_name=crm_schema)


class Scripted:
    """A writer that proposes fixed SQL."""

    def __init__(self, sql: str) -> None:
        self.sql = sql

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        return SQLQuery(self.sql, ())


class TestPostgresSQLSource:
    async def test_schema_is_the_allowlist(self, source: PostgresSQLSource) -> None:
        """Keys, foreign keys and small text columns' values come from the catalog; secrets stays unseen."""
        schema = await source.schema()
        assert schema.dialect == "postgres"
        customers = schema.table("customers")
        assert customers is not None and customers.key == "id" and "Harbor Lane Bank" in customers.values["name"]
        orders = schema.table("orders")
        assert orders is not None and ("customer_id", "customers", "id") in orders.foreign
        assert "secrets" not in schema.describe()

    async def test_offline_patterns_match_sqlite(self, source: PostgresSQLSource) -> None:
        """The offline lookups give the same rows as over SQLite, cited by table and key."""
        result = await source.run("What plan is Harbor Lane Bank on", {})
        assert [r["plan"] for r in result.rows] == ["Enterprise"]
        assert result.hits[0].chunk.source.endswith("#customers/8")
        result = await source.run("What error code did the latest ticket of Bluefin Media report", {})
        assert [(r["id"], r["error_code"]) for r in result.rows] == [("1161", "E6002")]
        result = await source.run("How many urgent tickets has Bluefin Media opened", {})
        assert list(result.rows[0]) == ["count"]

    async def test_filters_bind_typed_values(self, source: PostgresSQLSource) -> None:
        """An ids filter on an integer column binds integers."""
        source.writer = Scripted("SELECT name FROM customers")
        result = await source.run("x", {"id": ("8", "25")})
        assert sorted(r["name"] for r in result.rows) == ["Harbor Lane Bank", "Zephyr Telecom"]

    async def test_writes_refused_and_transaction_read_only(self, source: PostgresSQLSource, crm_schema: str) -> None:
        """The checker refuses a DELETE; one that skipped it still fails in the read-only transaction."""
        source.writer = Scripted("DELETE FROM customers")
        with pytest.raises(QueryRefused, match="starts with 'DELETE'"):
            await source.run("x", {})
        with pytest.raises(SourceError, match="read-only transaction"):
            await source._execute(f"DELETE FROM {crm_schema}.customers", ())
        _, rows = await source._execute(f"SELECT COUNT(*) FROM {crm_schema}.customers", ())
        assert rows == [(25,)]

    async def test_other_tables_refused(self, source: PostgresSQLSource) -> None:
        """A table outside the allowlist is refused before it runs."""
        source.writer = Scripted("SELECT api_token FROM secrets")
        with pytest.raises(QueryRefused, match="'secrets' is not allowlisted"):
            await source.run("x", {})

    async def test_statement_timeout(self, source: PostgresSQLSource, crm_schema: str) -> None:
        """A statement past timeout_s is cancelled by the server and reported."""
        source.timeout_s = 0.2
        source.writer = Scripted("SELECT COUNT(*) AS n FROM tickets AS a, tickets AS b, tickets AS c, orders AS d")
        source.schema_name = crm_schema
        with pytest.raises(SourceError, match="cancelled"):
            await source.run("x", {})

    async def test_allowlist_naming_a_missing_table(self, pg_url: str, crm_schema: str) -> None:
        """An allowlist entry the schema lacks is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="'invoices' is not in schema"):
            await PostgresSQLSource(pg_url, {"invoices": ("id",)}, schema_name=crm_schema).schema()


class TestAllowlistOnPostgres:
    @pytest.mark.parametrize("fn", [f for f in FUNCTIONS if "postgres" in f.dialects], ids=lambda f: f.name)
    async def test_every_allowed_function_passes_and_runs(self, source: PostgresSQLSource, fn: AllowedFunction) -> None:
        """Each function the docs list for Postgres passes the check and runs on a real server."""
        source.writer = Scripted(f"SELECT {fn.example} AS v FROM customers")
        result = await source.run("x", {})
        assert len(result.rows) >= 1 and "v" in result.rows[0]


async def test_a_dead_database_error_keeps_the_password_out() -> None:
    """A database that is down, or a URL libpq cannot parse (it quotes it whole), is a SourceError on one line
    without the URL's password."""
    for url in ("postgresql://crm:s3cret-pw@127.0.0.1:1/crm", "postgresql://crm:s3cret-pw@[::1"):
        with pytest.raises(SourceError, match="cannot connect to the database") as caught:
            await PostgresSQLSource(url, SAMPLE_CRM_ALLOW)._connect()
        assert "s3cret-pw" not in str(caught.value) and "\n" not in str(caught.value)
