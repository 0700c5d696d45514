"""A real PostgreSQL 16 with pgvector (the ``pgserver`` wheel), one per test session."""

from __future__ import annotations

import itertools
import shutil
import sqlite3
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A running pgserver on a Unix socket in a temporary folder; stopped and removed at the end of the session.

    The folder is made with ``tempfile`` rather than pytest's ``tmp_path``: as root, pgserver runs the server
    as a separate ``pgserver`` user, and pytest keeps its own temporary root private (mode 0700), which
    another pytest process on the machine may reset at any moment.
    """
    pgserver = pytest.importorskip("pgserver")
    root = Path(tempfile.mkdtemp(prefix="ragloop-pg-"))
    root.chmod(0o755)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' RuntimeDirWarning about XDG_RUNTIME_DIR is harmless
        server = pgserver.get_server(root / "data", cleanup_mode="stop")
    try:
        yield server
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The server's ``postgresql://`` URL."""
    url: str = pg_server.get_uri()
    return url


@pytest.fixture
def collection() -> str:
    """A collection name no other test uses."""
    return f"t{next(_names)}"


#: The sample CRM's four tables (secrets included) as Postgres DDL, for a schema ``{s}``.
CRM_DDL = """
CREATE SCHEMA {s};
CREATE TABLE {s}.customers (id integer PRIMARY KEY, name text NOT NULL, plan text NOT NULL, region text NOT NULL,
    seats integer NOT NULL, status text NOT NULL, signed_up text NOT NULL, churned_on text);
CREATE TABLE {s}.orders (id text PRIMARY KEY, customer_id integer NOT NULL REFERENCES {s}.customers (id),
    plan text NOT NULL, seats integer NOT NULL, amount_usd double precision NOT NULL, status text NOT NULL,
    ordered text NOT NULL);
CREATE TABLE {s}.tickets (id integer PRIMARY KEY, customer_id integer NOT NULL REFERENCES {s}.customers (id),
    priority text NOT NULL, status text NOT NULL, opened text NOT NULL, error_code text);
CREATE TABLE {s}.secrets (customer_id integer NOT NULL, api_token text NOT NULL);
"""


def load_sample_crm(url: str, schema: str) -> None:
    """The sample CRM's four tables (secrets included) copied into a new Postgres ``schema``."""
    import psycopg

    from ragloop.sample import sample_crm_path

    src = sqlite3.connect(f"{sample_crm_path().resolve().as_uri()}?mode=ro", uri=True)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(CRM_DDL.format(s=schema))
            for table in ("customers", "orders", "tickets", "secrets"):
                rows = src.execute(f"SELECT * FROM {table}").fetchall()
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO {schema}.{table} VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)
    finally:
        src.close()
