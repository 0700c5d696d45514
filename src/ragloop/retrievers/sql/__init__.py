"""Read-only SQL sources for retrieval plans: allowlisted SQLite or Postgres, one checked SELECT at a time.

The application says which tables and columns the source may see (``allow``); :class:`SQLiteSource`
introspects those (types, primary keys, foreign keys, and the distinct values of small text columns) and
nothing else. A sub-query becomes SQL through a :class:`SQLWriter`: :class:`OfflineSQLWriter` (the common shapes
of an ordinary question — values, date ranges, comparisons, counts, totals, rankings, one-hop joins; anything else
is refused with "cannot answer offline" and what it could not write) or a model (structured output, see
:mod:`ragloop.llm.openai_planner`). Whatever wrote it, the statement passes :func:`check_sql` before it runs:

- one statement, and it must be a ``SELECT`` (``WITH … SELECT`` included);
- no comments; no ``ATTACH``, ``PRAGMA``, ``VACUUM`` or writes of any kind (they are not SELECTs);
- only allowlisted tables (unqualified: no ``other_db.table``) and allowlisted columns, no ``*`` outside
  ``COUNT(*)``, no functions that reach outside the database (``load_extension``, ``readfile`` …);
- values as ``?`` parameters (their count must match); a ``LIMIT`` of at most ``max_rows`` is added.

It then runs on a connection opened from a ``file:…?mode=ro`` URI (the file is never opened writable, and a
missing file is an error, never a new empty database), with ``PRAGMA query_only``, an authorizer that denies
every read outside the allowlist (a second lock behind the parser), and a progress handler that interrupts a
statement past ``timeout_s``. Rows come back as hits with their provenance (table and key), so an answer
cites a row like a passage.

:class:`PostgresSQLSource` runs the same checks in the Postgres dialect, each statement in a ``READ ONLY``
transaction with ``statement_timeout`` (and ``search_path`` pinned to its schema), rolled back afterwards.
"""

from __future__ import annotations

from ragloop.retrievers.sql._check import check_sql
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._postgres import PostgresSQLSource
from ragloop.retrievers.sql._schema import Param as Param  # the type of a bound value (was public here)
from ragloop.retrievers.sql._schema import SQLQuery, SQLSchema, SQLWriter, Table
from ragloop.retrievers.sql._sqlite import SQLiteSource

__all__ = [
    "OfflineSQLWriter",
    "PostgresSQLSource",
    "SQLQuery",
    "SQLSchema",
    "SQLWriter",
    "SQLiteSource",
    "Table",
    "check_sql",
]
