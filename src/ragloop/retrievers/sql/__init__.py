"""Read-only SQL sources for retrieval plans: allowlisted SQLite or Postgres, one checked SELECT at a time.

The application says which tables and columns the source may see (``allow``) and, for a database shared by
many organisations, which tables are tenant-scoped (``tenants``). :class:`SQLiteSource` introspects the
allowlist (types, primary keys, foreign keys, and the distinct values of small text columns) and nothing else.
A sub-query becomes SQL through a :class:`SQLWriter`: :class:`OfflineSQLWriter` (the common shapes of an
ordinary question — values, date ranges, comparisons, counts, totals, rankings, one-hop joins; anything else is
refused with "cannot answer offline" and what it could not write) or a model (structured output, see
:mod:`ragloop.llm.openai`). Whatever wrote it, the statement passes :func:`check_sql`, which accepts
only what it can prove safe:

- one comment-free ``SELECT`` (``WITH … SELECT`` and ``UNION`` / ``INTERSECT`` / ``EXCEPT`` of them included),
  values as positional ``?`` parameters;
- every node on an allowlist: the functions of :data:`FUNCTIONS` (aggregates, string, date, math, conditional,
  ranking), the operators and clauses of :data:`OPERATORS`, casts to plain types; anything else (``ts_stat``,
  ``pg_terminate_backend``, ``current_setting``, ``pg_stat_file``, table functions, ``LATERAL``, ``FOR UPDATE``
  …) is refused;
- every table reference (in ``FROM``, joins, ``WITH`` queries, sub-queries, ``EXISTS``, set operations) reads an
  allowlisted, unqualified table, and every column named is allowlisted;
- then each real table reference becomes ``(SELECT <allowlisted columns> FROM table WHERE <tenant>) AS alias``,
  so ``*`` and whatever the check missed see only allowlisted columns, and every reference to a tenant-scoped
  table (a self-join, a scalar sub-query, a second ``WITH`` query) only the caller's rows; a ``LIMIT`` of at
  most ``max_rows`` is added.

Each refusal is one line: ``refused (<rule>): …`` naming the function, column or table.

SQLite statements run on a connection opened from a ``file:…?mode=ro`` URI (never writable; a missing file is
an error, never a new empty database), with ``PRAGMA query_only``, an authorizer that denies reads and
functions outside the allowlist (a second lock behind the parser), ``sqlite3`` limits (value and statement
length, columns, expression depth, compound terms) and a progress handler that interrupts a statement past
``timeout_s`` or ``max_steps``. :class:`PostgresSQLSource` runs the same checks in the Postgres dialect, each
statement in a ``READ ONLY`` transaction with ``statement_timeout``, ``work_mem`` and ``temp_file_limit`` set
by ``SET LOCAL`` (and the caller's tenant for row-level security), rolled back afterwards. Rows come back as
hits with their provenance (table and key), so an answer cites a row like a passage.
"""

from __future__ import annotations

from ragloop.retrievers.sql._allow import FUNCTIONS, OPERATORS, AllowedFunction
from ragloop.retrievers.sql._check import check_sql
from ragloop.retrievers.sql._offline import OfflineSQLWriter
from ragloop.retrievers.sql._postgres import PostgresSQLSource
from ragloop.retrievers.sql._rows import ForCaller
from ragloop.retrievers.sql._schema import Param as Param  # the type of a bound value (was public here)
from ragloop.retrievers.sql._schema import SQLQuery, SQLSchema, SQLWriter, Table, TenantKey
from ragloop.retrievers.sql._sqlite import SQLiteSource

__all__ = [
    "FUNCTIONS",
    "OPERATORS",
    "AllowedFunction",
    "ForCaller",
    "OfflineSQLWriter",
    "PostgresSQLSource",
    "SQLQuery",
    "SQLSchema",
    "SQLWriter",
    "SQLiteSource",
    "Table",
    "TenantKey",
    "check_sql",
]
