"""The two places a turn log can live: a SQLite file (``sqlite:PATH``) or PostgreSQL (``postgresql://…``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ragloop._redact import redact
from ragloop.errors import ConfigError
from ragloop.turnlog._sql import SQLBackend

__all__ = ["PostgresBackend", "SQLiteBackend", "backend_for"]


class SQLiteBackend(SQLBackend):
    """A turn log in one SQLite file, in WAL mode (readers such as ``ragloop gaps`` never block the writer).

    Several processes may write one file: each waits up to ``busy_timeout_s`` for the write lock.

    Args:
        path: The file (created, with its tables, on the first write; never by a reader).
        busy_timeout_s: How long a write waits for another process's lock.
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 5.0) -> None:
        super().__init__(f"sqlite:{path}")
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s

    def _connect(self, *, create: bool) -> Any:
        if create:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, check_same_thread=False)
            conn.execute("pragma journal_mode=wal")
            conn.execute("pragma synchronous=normal")
            return conn
        if not self.path.is_file():
            raise ConfigError(f"no turn log at {self.where}: the file does not exist (check the path)")
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_s, check_same_thread=False)

    def _add_column(self, cur: Any, table: str, column: str, spec: str) -> None:
        cur.execute(f"pragma table_info({table})")
        if column not in {str(r[1]) for r in cur.fetchall()}:
            cur.execute(f"alter table {table} add column {column} {spec}")


class PostgresBackend(SQLBackend):
    """A turn log in PostgreSQL (``[postgres]`` extra); every replica of a service can share it.

    Args:
        url: A ``postgresql://`` URL.
        connect_timeout_s: How long a connection attempt may take.
        statement_timeout_s: How long one statement may run.
    """

    param = "%s"
    row_lock = " for share"
    json_type, json_cast = "jsonb", "::jsonb"
    float_type, blob_type = "double precision", "bytea"

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0, statement_timeout_s: float = 10.0) -> None:
        from ragloop._redact import hide_credentials

        super().__init__(hide_credentials(url, url))
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.statement_timeout_s = statement_timeout_s

    def _connect(self, *, create: bool) -> Any:
        try:
            import psycopg
        except ImportError as exc:
            hint = "a PostgreSQL turn log needs the [postgres] extra: pip install 'ragloop[postgres]'"
            raise ConfigError(hint) from exc
        conn = psycopg.connect(self.url, connect_timeout=max(1, round(self.connect_timeout_s)))
        conn.execute(f"set statement_timeout = {int(self.statement_timeout_s * 1000)}")
        conn.commit()
        return conn

    def _lock_schema(self, conn: Any) -> None:
        conn.execute("select pg_advisory_xact_lock(hashtext('ragloop:turnlog'))")


def backend_for(url: str) -> SQLBackend:
    """The backend a ``--turn-log`` URL names: ``sqlite:PATH`` or ``postgresql://…``."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("a turn log URL is sqlite:PATH or postgresql://…; got an empty value")
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:").removeprefix("//")
        if not path:
            raise ConfigError("a SQLite turn log needs a path: sqlite:turns.db or sqlite:/var/lib/ragloop/turns.db")
        return SQLiteBackend(path)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresBackend(url)
    shown = redact(url if len(url) <= 80 else url[:80] + "…")
    raise ConfigError(f"unknown turn log URL {shown!r}: use sqlite:PATH or postgresql://user@host/db")
