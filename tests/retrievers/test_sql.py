"""Tests for ragloop.retrievers.sql: the SQL safety list, read-only access, offline patterns, provenance."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import pytest
from attrs import define
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.sql import (
    FUNCTIONS,
    AllowedFunction,
    OfflineSQLWriter,
    SQLiteSource,
    SQLQuery,
    SQLSchema,
    check_sql,
)
from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path

pytestmark = pytest.mark.anyio


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def crm(tmp_path: Path) -> Path:
    """A private copy of the sample CRM database."""
    target = tmp_path / "crm.sqlite"
    shutil.copyfile(sample_crm_path(), target)
    return target


@define
class ScriptedWriter:
    """A writer that proposes fixed SQL, as a (misbehaving) model might."""

    sql: str
    params: Sequence[str | int] = ()

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        return SQLQuery(self.sql.replace("{request}", request), tuple(self.params), note="scripted")


async def _schema(path: Path) -> SQLSchema:
    return await SQLiteSource(path, SAMPLE_CRM_ALLOW).schema()


#: Every statement here must be refused, and the refusal must say why.
REFUSED = [
    ("DELETE FROM customers", "only a SELECT may run, and this statement starts with 'DELETE'"),
    ("INSERT INTO customers (name) VALUES ('x')", "starts with 'INSERT'"),
    ("UPDATE customers SET plan = 'Free'", "starts with 'UPDATE'"),
    ("REPLACE INTO customers (id) VALUES (1)", "starts with 'REPLACE'"),
    ("DROP TABLE customers", "starts with 'DROP'"),
    ("CREATE TABLE t (x)", "starts with 'CREATE'"),
    ("ATTACH DATABASE '/tmp/other.db' AS other", "starts with 'ATTACH'"),
    ("DETACH DATABASE other", "starts with 'DETACH'"),
    ("PRAGMA writable_schema = 1", "starts with 'PRAGMA'"),
    ("PRAGMA query_only = 0", "starts with 'PRAGMA'"),
    ("VACUUM INTO '/tmp/copy.db'", "starts with 'VACUUM'"),
    ("SELECT name FROM customers; DROP TABLE customers", "exactly one statement may run"),
    ("SELECT name FROM customers; SELECT api_token FROM secrets", "exactly one statement may run"),
    ("SELECT api_token FROM secrets", "table 'secrets' is not allowlisted"),
    ("SELECT name FROM customers WHERE id IN (SELECT customer_id FROM secrets)", "'secrets' is not allowlisted"),
    ("WITH s AS (SELECT api_token FROM secrets) SELECT api_token FROM s", "'secrets' is not allowlisted"),
    ("SELECT name FROM sqlite_master", "'sqlite_master' is not allowlisted"),
    ("SELECT name FROM other.customers", "qualified with a database name"),
    ("SELECT name FROM main.customers", "qualified with a database name"),
    ("SELECT name FROM customers -- AND plan = 'Free'", "comments are not allowed"),
    ("SELECT name FROM customers /* hidden */ WHERE id = 1", "comments are not allowed"),
    ("SELECT * FROM secrets", "table 'secrets' is not allowlisted"),
    ("SELECT name, password FROM customers", "column 'password' is not allowlisted"),
    ("SELECT c.api_token FROM customers AS c", "is not allowlisted"),
    ("SELECT load_extension('/tmp/evil.so') FROM customers", "(function allowlist): load_extension() is not allowed"),
    ("SELECT name FROM customers UNION SELECT api_token FROM secrets", "table 'secrets' is not allowlisted"),
    ("SELECT readfile('/etc/passwd') AS f FROM customers", "(function allowlist): readfile() is not allowed"),
    ("SELECT name FROM customers, json_each(?)", "1 '?' placeholder(s) but 0 value(s)"),
    ("SELECT value FROM customers, json_each('[1]')", "json_each() is not allowed"),
    ("SELECT name FROM customers, date('now', '-1 day') AS d", "(table-valued function)"),
    ("SELECT name FROM customers WHERE name REGEXP 'a'", "regexp_like() is not allowed"),
    ("SELECT name FROM customers WHERE id & 1", "(operator allowlist)"),
    ("SELECT CAST(name AS BLOB) FROM customers", "(cast allowlist)"),
    ("SELECT name FROM customers LIMIT (SELECT 5)", "(limit)"),
    ("SELECT name FROM customers WHERE name = ?", "1 '?' placeholder(s) but 0 value(s)"),
    ("SELECT name FROM customers WHERE name = :name", "positional '?' placeholders only"),
    ("SELECT 1", "reads no allowlisted table"),
    ("", "the statement is empty"),
    ("SELEC name FROM customers", "starts with 'SELEC'"),
]


class TestSafetyList:
    @pytest.mark.parametrize(("sql", "why"), REFUSED)
    async def test_refused_with_reason(self, crm: Path, sql: str, why: str) -> None:
        """The checker refuses the statement and names the rule it broke."""
        schema = await _schema(crm)
        with pytest.raises(QueryRefused, match="refused") as info:
            check_sql(sql, (), schema)
        assert why in str(info.value)

    @pytest.mark.parametrize(("sql", "why"), REFUSED)
    async def test_refused_through_the_source_and_database_unchanged(self, crm: Path, sql: str, why: str) -> None:
        """A writer proposing the statement gets a refusal; the file is byte-for-byte unchanged."""
        before = _digest(crm)
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, ScriptedWriter(sql))
        with pytest.raises(QueryRefused) as info:
            await source.run("anything", {})
        assert why in str(info.value)
        assert source.statements == []
        assert _digest(crm) == before

    async def test_limit_is_added_and_clamped(self, crm: Path) -> None:
        """Every statement gets a LIMIT of at most max_rows."""
        schema = await _schema(crm)
        assert check_sql("SELECT name FROM customers", (), schema, max_rows=7)[0].endswith("LIMIT 7")
        assert check_sql("SELECT name FROM customers LIMIT 1000", (), schema, max_rows=7)[0].endswith("LIMIT 7")
        assert check_sql("SELECT name FROM customers LIMIT 3", (), schema, max_rows=7)[0].endswith("LIMIT 3")

    async def test_key_is_added_for_citations(self, crm: Path) -> None:
        """A plain one-table select gets its key column, so each row can be cited."""
        schema = await _schema(crm)
        sql, _ = check_sql("SELECT name FROM customers WHERE plan = ?", ("Team",), schema)
        assert "customers.id" in sql

    async def test_star_expands_to_the_allowlist_only(self, crm: Path) -> None:
        """``*`` and ``t.*`` are allowed: each table reference is a sub-query of its allowlisted columns, so a star
        yields those and nothing else (here ``seats`` and the rest are left out of the allowlist)."""
        narrow = {"customers": ("id", "name", "plan")}
        for sql in (
            "SELECT * FROM customers",
            "SELECT c.* FROM customers AS c",
            "WITH x AS (SELECT * FROM customers) SELECT * FROM x",
        ):
            source = SQLiteSource(crm, narrow, ScriptedWriter(sql))
            result = await source.run("x", {})
            assert {tuple(r) for r in result.rows} == {("id", "name", "plan")}, sql
            assert len(result.rows) == 25

    async def test_allowed_shapes_pass(self, crm: Path) -> None:
        """Joins, sub-selects, CTEs over allowed tables and COUNT(*) are fine."""
        schema = await _schema(crm)
        for sql in (
            "SELECT COUNT(*) AS n FROM tickets WHERE priority = ?",
            "SELECT c.name, o.id FROM customers AS c JOIN orders AS o ON o.customer_id = c.id WHERE c.name = ?",
            "WITH t AS (SELECT customer_id FROM tickets WHERE priority = ?) SELECT name FROM customers "
            "WHERE id IN (SELECT customer_id FROM t)",
        ):
            check_sql(sql, ("x",), schema)


class TestReadOnly:
    async def test_connection_cannot_write(self, crm: Path) -> None:
        """The source's connection refuses writes: the file was opened read-only."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        conn = source._connect()
        try:
            with pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only|query_only"):
                conn.execute("DELETE FROM customers")
        finally:
            conn.close()

    async def test_every_connect_is_read_only(self, crm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Introspection and queries only ever open the database through a mode=ro URI."""
        seen: list[str] = []
        real = sqlite3.connect

        def spy(database: str, *args: object, **kwargs: object) -> sqlite3.Connection:
            seen.append(str(database))
            return real(database, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(sqlite3, "connect", spy)
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        await source.run("What plan is Harbor Lane Bank on", {})
        assert len(seen) >= 2
        assert all(uri.startswith("file:") and uri.endswith("?mode=ro") for uri in seen)

    async def test_missing_file_is_an_error_not_a_new_database(self, tmp_path: Path) -> None:
        """A missing path raises SourceError and creates no file."""
        path = tmp_path / "nope.sqlite"
        with pytest.raises(SourceError, match="cannot open"):
            await SQLiteSource(path, SAMPLE_CRM_ALLOW).schema()
        assert not path.exists()

    async def test_authorizer_blocks_reads_outside_the_allowlist(self, crm: Path) -> None:
        """Even a statement that skipped the checker cannot read a table outside the allowlist."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        with pytest.raises(QueryRefused, match=r"refused by the database"):
            source._execute("SELECT api_token FROM secrets", ())
        with pytest.raises(QueryRefused, match=r"refused by the database"):
            source._execute("SELECT name FROM sqlite_master", ())

    async def test_slow_statement_is_interrupted(self, crm: Path) -> None:
        """A statement past timeout_s is interrupted and reported as a SourceError."""
        heavy = "SELECT COUNT(*) AS n FROM tickets AS a, tickets AS b, tickets AS c, orders AS d"
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, ScriptedWriter(heavy), timeout_s=0.2)
        with pytest.raises(SourceError, match="interrupted"):
            await source.run("x", {})


class TestInjection:
    HOSTILE = "Harbor Lane Bank'; DROP TABLE customers; --"

    async def test_offline_writer_binds_values(self, crm: Path) -> None:
        """A hostile value is never spliced: the offline writer only binds known values as parameters."""
        before = _digest(crm)
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        result = await source.run(f"What plan is {self.HOSTILE} on", {})
        assert [r["name"] for r in result.rows] == ["Harbor Lane Bank"]
        assert "DROP" not in source.statements[0]
        assert _digest(crm) == before

    async def test_model_that_splices_a_slot_value_is_refused(self, crm: Path) -> None:
        """A writer that pastes the value into the SQL text produces two statements (or a comment): refused."""
        writer = ScriptedWriter("SELECT plan FROM customers WHERE name = '{request}'")
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, writer)
        with pytest.raises(QueryRefused, match=r"comments are not allowed|exactly one statement"):
            await source.run(self.HOSTILE, {})
        assert source.statements == []

    async def test_filter_values_are_parameters(self, crm: Path) -> None:
        """A filter value with quotes matches literally (no rows), it never rewrites the statement."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, ScriptedWriter("SELECT name FROM customers"))
        result = await source.run("x", {"name": ("x' OR '1'='1",)})
        assert result.rows == ()
        assert "OR '1'='1" not in source.statements[0]

    async def test_filter_on_a_column_outside_the_allowlist(self, crm: Path) -> None:
        """A filter on a column the allowlist does not name is refused."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, ScriptedWriter("SELECT name FROM customers"))
        with pytest.raises(QueryRefused, match="filter column 'api_token'"):
            await source.run("x", {"api_token": ("t",)})


class TestSchema:
    async def test_only_the_allowlist_is_seen(self, crm: Path) -> None:
        """Introspection sees allowlisted tables and columns, keys and foreign keys; never the secrets table."""
        schema = await _schema(crm)
        assert [t.name for t in schema.tables] == ["customers", "orders", "tickets"]
        customers = schema.table("customers")
        assert customers is not None and customers.key == "id"
        assert "Harbor Lane Bank" in customers.values["name"]
        orders = schema.table("orders")
        assert orders is not None and ("customer_id", "customers", "id") in orders.foreign
        assert "secrets" not in schema.describe() and "api_token" not in schema.describe()

    async def test_allowlist_naming_a_missing_table_or_column(self, crm: Path) -> None:
        """An allowlist entry the database lacks is a ConfigError naming it."""
        with pytest.raises(ConfigError, match="'invoices' is not in"):
            await SQLiteSource(crm, {"invoices": ("id",)}).schema()
        with pytest.raises(ConfigError, match=r"no column\(s\) \['email'\]"):
            await SQLiteSource(crm, {"customers": ("id", "email")}).schema()

    def test_empty_allowlist(self, crm: Path) -> None:
        """An empty allowlist is a configuration error."""
        with pytest.raises(ConfigError, match="allow must name at least one table"):
            SQLiteSource(crm, {})


class TestOfflineWriter:
    async def _run(self, crm: Path, request: str) -> tuple[str, list[dict[str, str]]]:
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        result = await source.run(request, {})
        return source.statements[-1], [dict(r) for r in result.rows]

    async def test_lookup_by_known_value(self, crm: Path) -> None:
        """A customer's name selects that customer's row; the row is cited by table and key."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW)
        result = await source.run("What plan is Harbor Lane Bank on", {})
        assert [r["plan"] for r in result.rows] == ["Enterprise"]
        assert result.hits[0].chunk.source == "crm.sqlite#customers/8"
        assert "plan: Enterprise" in result.hits[0].text

    async def test_lookup_by_key(self, crm: Path) -> None:
        """An order id selects the order."""
        _, rows = await self._run(crm, "What did order ORD-1042 buy")
        assert [(r["id"], r["plan"]) for r in rows] == [("ORD-1042", "Business")]
        _, rows = await self._run(crm, "customer 8")
        assert [r["name"] for r in rows] == ["Harbor Lane Bank"]

    async def test_count_across_a_foreign_key(self, crm: Path) -> None:
        """'How many urgent tickets has X' counts tickets of the customer named, through the foreign key."""
        sql, rows = await self._run(crm, "How many urgent tickets has Bluefin Media opened")
        expected = (
            sqlite3.connect(crm)
            .execute("SELECT COUNT(*) FROM tickets WHERE priority = 'urgent' AND customer_id = 2")
            .fetchone()[0]
        )
        assert "COUNT(*)" in sql and rows == [{"count": str(expected)}]

    async def test_latest(self, crm: Path) -> None:
        """'latest ticket of X' orders by the date column and keeps one row."""
        _, rows = await self._run(crm, "What error code did the latest ticket of Bluefin Media report")
        assert [(r["id"], r["error_code"]) for r in rows] == [("1161", "E6002")]

    @pytest.mark.parametrize(
        ("request_text", "why"),
        [
            ("How many tickets per customer", "'per' asks for a breakdown"),
            ("Which customers are not on Enterprise", "'not' asks for a breakdown, a percentage or a negation"),
            ("What percentage of customers churned", "'percentage'"),
            ("Which Enterprise customers opened P1 tickets this month", "'P1' is not a value the database holds"),
            ("Tell me about orders", "names no id or known value of orders"),
            ("What is the weather", "names no table"),
            ("orders with more than 3 widgets", "no numeric column of orders or a linked table is named by 'widgets'"),
            ("Top 3 customers by happiness", "ranks on something no numeric column of customers names"),
        ],
    )
    async def test_cannot_answer_offline(self, crm: Path, request_text: str, why: str) -> None:
        """Requests beyond the shapes are refused with 'cannot answer offline' and the precise reason."""
        schema = await _schema(crm)
        with pytest.raises(QueryRefused, match="cannot answer offline") as info:
            OfflineSQLWriter().write_sync(request_text, schema)
        assert why in str(info.value)


TODAY = date(2024, 10, 15)


def _rows(crm: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    return sqlite3.connect(crm).execute(sql, params).fetchall()


class TestOfflineShapes:
    """Ordinary questions the offline writer answers, each checked against hand-written SQL on the same file."""

    async def _run(self, crm: Path, request: str) -> tuple[str, list[dict[str, str]]]:
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, OfflineSQLWriter(today=lambda: TODAY))
        result = await source.run(request, {})
        return source.statements[-1], [dict(r) for r in result.rows]

    async def test_last_quarter(self, crm: Path) -> None:
        """'churned last quarter' is a half-open range on churned_on over the previous calendar quarter."""
        sql, rows = await self._run(crm, "Which customers churned last quarter")
        want = _rows(crm, "SELECT id FROM customers WHERE churned_on >= '2024-07-01' AND churned_on < '2024-10-01'")
        assert sorted(int(r["id"]) for r in rows) == sorted(i for (i,) in want) and want
        assert "churned_on >= ?" in sql and "churned_on < ?" in sql

    async def test_this_month_across_a_foreign_key_with_values(self, crm: Path) -> None:
        """'Which Enterprise customers opened urgent tickets this month' joins tickets by the foreign key, on
        the date column the verb names."""
        sql, rows = await self._run(crm, "Which Enterprise customers opened urgent tickets this month")
        want = _rows(
            crm,
            "SELECT id FROM customers WHERE plan = 'Enterprise' AND id IN (SELECT customer_id FROM tickets "
            "WHERE priority = 'urgent' AND opened >= '2024-10-01' AND opened < '2024-11-01')",
        )
        assert sorted(int(r["id"]) for r in rows) == sorted(i for (i,) in want)
        assert "tickets.opened >= ?" in sql

    async def test_count_in_a_named_month(self, crm: Path) -> None:
        """'How many tickets were opened in March 2024' counts over that month."""
        _, rows = await self._run(crm, "How many tickets were opened in March 2024")
        (want,) = _rows(crm, "SELECT COUNT(*) FROM tickets WHERE opened >= '2024-03-01' AND opened < '2024-04-01'")
        assert rows == [{"count": str(want[0])}]

    async def test_numeric_comparisons(self, crm: Path) -> None:
        """'more than 300 seats', 'over $5,000' and 'between 10 and 20 seats' compare the column they name."""
        _, rows = await self._run(crm, "customers with more than 300 seats")
        assert sorted(int(r["id"]) for r in rows) == sorted(
            i for (i,) in _rows(crm, "SELECT id FROM customers WHERE seats > 300")
        )
        _, rows = await self._run(crm, "orders over $10,000")
        want = _rows(crm, "SELECT id FROM orders WHERE amount_usd > 10000")
        assert sorted(r["id"] for r in rows) == sorted(i for (i,) in want)
        _, rows = await self._run(crm, "orders between 10 and 20 seats")
        assert len(rows) == len(_rows(crm, "SELECT id FROM orders WHERE seats BETWEEN 10 AND 20"))

    async def test_counts_of_related_rows(self, crm: Path) -> None:
        """'customers with more than 12 tickets' compares a count of related rows (GROUP BY … HAVING)."""
        sql, rows = await self._run(crm, "customers with more than 12 tickets")
        want = _rows(crm, "SELECT customer_id FROM tickets GROUP BY customer_id HAVING COUNT(*) > 12")
        assert sorted(int(r["id"]) for r in rows) == sorted(i for (i,) in want) and "HAVING COUNT(*) > ?" in sql

    async def test_rankings(self, crm: Path) -> None:
        """'Top 5 customers by seats' and 'the customer with the most tickets' order and limit."""
        _, rows = await self._run(crm, "Top 5 customers by seats")
        want = _rows(crm, "SELECT id FROM customers ORDER BY seats DESC LIMIT 5")
        assert [int(r["id"]) for r in rows] == [i for (i,) in want]
        _, rows = await self._run(crm, "Which customer has the most tickets")
        (top,) = _rows(crm, "SELECT customer_id FROM tickets GROUP BY customer_id ORDER BY COUNT(*) DESC LIMIT 1")
        assert [int(r["id"]) for r in rows] == [top[0]]

    async def test_totals_and_averages(self, crm: Path) -> None:
        """'total amount of orders' and 'average seats of customers' aggregate the column they name."""
        _, rows = await self._run(crm, "What is the total amount of orders")
        assert float(rows[0]["sum_amount_usd"]) == _rows(crm, "SELECT SUM(amount_usd) FROM orders")[0][0]
        _, rows = await self._run(crm, "average seats of customers")
        assert float(rows[0]["avg_seats"]) == pytest.approx(_rows(crm, "SELECT AVG(seats) FROM customers")[0][0])

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(
            st.sampled_from(
                [
                    "which",
                    "how many",
                    "top 3",
                    "customers",
                    "orders",
                    "tickets",
                    "Enterprise",
                    "urgent",
                    "open",
                    "this month",
                    "last quarter",
                    "in 2024",
                    "more than 5",
                    "over $1,000",
                    "seats",
                    "by seats",
                    "the most",
                    "opened",
                    "churned",
                    "signed up",
                    "total amount",
                    "average",
                    "latest",
                    "Harbor Lane Bank",
                    "ORD-1042",
                    "customer 8",
                    "between 10 and 20",
                    "since 2024-03-01",
                    "with",
                    "and",
                    "of",
                ]
            ),
            min_size=1,
            max_size=8,
        ).map(" ".join)
    )
    async def test_every_statement_passes_the_check_or_is_refused(self, request_text: str) -> None:
        """Whatever the words: the writer refuses with 'cannot answer offline', or writes a statement that the
        statement check accepts and that runs on the read-only source."""
        source = SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, OfflineSQLWriter(today=lambda: TODAY))
        try:
            await source.run(request_text, {})
        except QueryRefused as exc:
            assert str(exc).startswith("cannot answer offline"), (request_text, str(exc))


class TestAllowlist:
    @pytest.mark.parametrize("fn", [f for f in FUNCTIONS if "sqlite" in f.dialects], ids=lambda f: f.name)
    async def test_every_allowed_function_passes_and_runs(self, crm: Path, fn: AllowedFunction) -> None:
        """Each function the docs list for SQLite passes the check and runs on the real database, authorizer on."""
        source = SQLiteSource(crm, SAMPLE_CRM_ALLOW, ScriptedWriter(f"SELECT {fn.example} AS v FROM customers"))
        result = await source.run("x", {})
        assert len(result.rows) >= 1 and "v" in result.rows[0]

    @pytest.mark.parametrize(
        "sql",
        [
            "SELECT typeof(name) AS t FROM customers",
            "SELECT hex(name) AS t FROM customers",
            "SELECT randomblob(10) AS t FROM customers",
            "SELECT sqlite_version() AS t FROM customers",
            "SELECT printf('%.*c', 100000000, 'x') AS t FROM customers",
            "SELECT quote(name) AS t FROM customers",
        ],
    )
    async def test_a_function_off_the_list_is_refused_by_name(self, crm: Path, sql: str) -> None:
        """A function the allowlist does not name is refused, the refusal naming the rule and the function."""
        schema = await _schema(crm)
        name = sql.split("SELECT ", 1)[1].split("(", 1)[0]
        with pytest.raises(QueryRefused, match=r"^refused \((function|clause) allowlist\)") as info:
            check_sql(sql, (), schema)
        assert f"{name}()" in str(info.value)
        assert "\n" not in str(info.value)

    async def test_the_documented_lists_are_the_checked_ones(self) -> None:
        """docs/planning.md names every allowed function (the docs and the check read one list)."""
        docs = (Path(__file__).parents[2] / "docs" / "planning.md").read_text(encoding="utf-8")
        missing = [f.name for f in FUNCTIONS if f"`{f.name}`" not in docs]
        assert not missing
