"""Read-only SQL sources for retrieval plans: allowlisted SQLite or Postgres, one checked SELECT at a time.

The application says which tables and columns the source may see (``allow``); :class:`SQLiteSource`
introspects those (types, primary keys, foreign keys, and the distinct values of small text columns) and
nothing else. A sub-query becomes SQL through a :class:`SQLWriter`: :class:`OfflineSQLWriter` (a few honest
patterns; anything else is refused with "cannot answer offline") or a model (structured output, see
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

import hashlib
import re
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread
from attrs import define, field, frozen

from ragloop.errors import ConfigError, QueryRefused, SourceError
from ragloop.retrievers.sources import Filters, SourceResult
from ragloop.state import Chunk, Hit

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

Param = str | int | float | None


def _frozen_types(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


def _params(value: Sequence[Param]) -> tuple[Param, ...]:
    return tuple(value)


def _frozen_values(value: Mapping[str, Sequence[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({k: tuple(v) for k, v in value.items()})


@frozen
class Table:
    """One allowlisted table as the SQL source sees it.

    Attributes:
        name: Table name.
        key: Its primary-key column (rows are cited by it), or ``""`` when it has none.
        columns: Allowlisted columns, in table order.
        types: Declared type per column (upper-cased, e.g. ``INTEGER``, ``TEXT``).
        foreign: ``(column, other_table, other_column)`` for each foreign key into another allowlisted table.
        values: Known distinct values of small text columns (for offline lookups by value).
    """

    name: str
    key: str
    columns: tuple[str, ...]
    types: Mapping[str, str] = field(factory=dict, converter=_frozen_types)
    foreign: tuple[tuple[str, str, str], ...] = ()
    values: Mapping[str, tuple[str, ...]] = field(factory=dict, converter=_frozen_values)


@frozen
class SQLSchema:
    """The allowlisted part of a database.

    Attributes:
        tables: The allowlisted tables.
        dialect: The SQL dialect (``sqlite``).
    """

    tables: tuple[Table, ...]
    dialect: str = "sqlite"

    def table(self, name: str) -> Table | None:
        """The table called ``name`` (case-insensitive), if allowlisted."""
        return next((t for t in self.tables if t.name.lower() == name.lower()), None)

    def describe(self) -> str:
        """The schema as a prompt-ready text: one line per table with its columns, key and foreign keys."""
        lines = []
        for t in self.tables:
            cols = ", ".join(f"{c} {t.types.get(c, '')}".strip() for c in t.columns)
            refs = "".join(f"; {c} references {o}.{oc}" for c, o, oc in t.foreign)
            known = "".join(
                f"; {c} is one of {', '.join(v[:12])}" for c, v in t.values.items() if len(v) <= 12 and c != t.key
            )
            lines.append(f"{t.name}({cols}); key {t.key or 'none'}{refs}{known}")
        return "\n".join(lines)


@frozen
class SQLQuery:
    """A statement a writer proposes: SQL with ``?`` placeholders and their values.

    Attributes:
        sql: The statement.
        params: One value per ``?``.
        note: How it was written (the offline pattern's name, or the model's note).
    """

    sql: str
    params: tuple[Param, ...] = field(default=(), converter=_params)
    note: str = ""


@runtime_checkable
class SQLWriter(Protocol):
    """Turns a sub-query's request into one SQL statement over a schema."""

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        """The statement; raises QueryRefused when it cannot be written (with the reason)."""
        ...


# -- checking ---------------------------------------------------------------------------------------------

#: Functions that reach outside the database or the statement (SQLite and Postgres spellings).
_FORBIDDEN_FUNCTIONS = frozenset(
    {
        "load_extension",
        "readfile",
        "writefile",
        "edit",
        "fts3_tokenizer",
        "zipfile",
        "sqlite_compileoption_get",
        "sqlite_offset",
        "pg_read_file",
        "pg_read_binary_file",
        "pg_ls_dir",
        "pg_sleep",
        "lo_import",
        "lo_export",
        "dblink",
        "set_config",
        "randomblob",
        "zeroblob",
    }
)
_AGGREGATES = ("Count", "Sum", "Avg", "Min", "Max", "GroupConcat", "ArrayAgg")


def check_sql(
    sql: str, params: Sequence[Param], schema: SQLSchema, *, max_rows: int = 50
) -> tuple[str, tuple[Param, ...]]:
    """The statement made safe to run (``LIMIT`` added, key column added for citations), or QueryRefused.

    Returns the SQL as it will run and its parameters. The refusal message names the rule broken.
    """
    from sqlglot import exp

    tree = _parse_one_select(sql, schema.dialect)
    aliases, ctes = _check_tables(tree, schema)
    _check_columns(tree, aliases, ctes)
    _check_calls(tree, params)
    tree = _with_key(tree, aliases)
    # One placeholder form, whatever was written: ``?`` in SQLite, ``%s`` in Postgres.
    tree = tree.transform(lambda node: exp.Placeholder() if isinstance(node, exp.Placeholder) else node)
    limit = tree.args.get("limit")
    current = limit.expression if limit is not None else None
    if not (isinstance(current, exp.Literal) and not current.is_string and int(current.this) <= max_rows):
        tree = tree.limit(max_rows)
    return str(tree.sql(dialect=schema.dialect)), tuple(params)


def _parse_one_select(sql: str, dialect: str) -> Any:
    """The parsed statement if the text is one comment-free SELECT; QueryRefused otherwise."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    text = sql.strip().rstrip(";").strip()
    if not text:
        raise QueryRefused("refused: the statement is empty")
    # Checked before parsing: sqlglot logs a warning for statements it only half understands (ATTACH, VACUUM).
    head = re.match(r"[\s(]*([A-Za-z]+)", text)
    if head is None or head.group(1).upper() not in ("SELECT", "WITH"):
        word = head.group(1).upper() if head else text[:12]
        raise QueryRefused(f"refused: only a SELECT may run, and this statement starts with {word!r}")
    if "--" in text or "/*" in text:
        raise QueryRefused("refused: comments are not allowed in a statement (they can hide a second one)")
    try:
        tokens = sqlglot.tokenize(text, read=dialect)
        if any(t.token_type.name == "SEMICOLON" for t in tokens):
            raise QueryRefused("refused: exactly one statement may run, and this text holds several")
        trees = [t for t in sqlglot.parse(text, read=dialect) if t is not None]
    except SqlglotError as exc:
        raise QueryRefused(f"refused: the statement does not parse ({str(exc).splitlines()[0]})") from exc
    if len(trees) != 1:
        raise QueryRefused(f"refused: exactly one statement may run, got {len(trees)}")
    tree = trees[0]
    if not isinstance(tree, exp.Select):
        raise QueryRefused(f"refused: only a single SELECT may run, got {type(tree).__name__.upper()}")
    for kind in (exp.Insert, exp.Update, exp.Delete, exp.Drop, exp.Create, exp.Alter, exp.Command, exp.Pragma):
        if tree.find(kind) is not None:
            raise QueryRefused(f"refused: the statement contains a {kind.__name__.upper()}")
    if tree.find(exp.Into) is not None:
        raise QueryRefused("refused: SELECT … INTO writes a table")
    return tree


def _check_tables(tree: Any, schema: SQLSchema) -> tuple[dict[str, Table], set[str]]:
    """Every table read is allowlisted and unqualified; returns the tables by alias and the CTE names."""
    from sqlglot import exp

    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    aliases: dict[str, Table] = {}
    for t in tree.find_all(exp.Table):
        if t.name.lower() in ctes:
            continue
        if t.args.get("db") or t.args.get("catalog"):
            raise QueryRefused(
                f"refused: table {t.sql(dialect=schema.dialect)!r} is qualified with a database name; "
                "only the allowlisted tables of this database may be read"
            )
        table = schema.table(t.name)
        if table is None:
            allowed = ", ".join(x.name for x in schema.tables)
            raise QueryRefused(f"refused: table {t.name!r} is not allowlisted; allowed: {allowed}")
        aliases[t.alias_or_name.lower()] = table
        aliases[table.name.lower()] = table
    if not aliases:
        raise QueryRefused("refused: the statement reads no allowlisted table")
    return aliases, ctes


def _check_columns(tree: Any, aliases: Mapping[str, Table], ctes: set[str]) -> None:
    """Every column named is allowlisted (or a projection alias / CTE column); no ``*`` outside COUNT(*)."""
    from sqlglot import exp

    projected = {e.alias.lower() for e in tree.find_all(exp.Alias)}
    for select in tree.find_all(exp.Select):
        if any(isinstance(e, exp.Star) for e in select.expressions):
            raise QueryRefused("refused: '*' may reach columns outside the allowlist; name the columns")
    for col in tree.find_all(exp.Column):
        name, qualifier = col.name.lower(), col.table.lower()
        if isinstance(col.this, exp.Star):
            raise QueryRefused("refused: '*' may reach columns outside the allowlist; name the columns")
        if qualifier in ctes and qualifier:
            continue
        if qualifier:
            table = aliases.get(qualifier)
            if table is None or name not in (c.lower() for c in table.columns):
                raise QueryRefused(f"refused: column {col.sql()!r} is not allowlisted")
            continue
        known = name in projected or any(name in (c.lower() for c in t.columns) for t in aliases.values())
        if not known and not ctes:
            raise QueryRefused(f"refused: column {col.name!r} is not allowlisted")


def _check_calls(tree: Any, params: Sequence[Param]) -> None:
    """No function that reaches outside the database; positional placeholders matching ``params``."""
    from sqlglot import exp

    for fn in tree.find_all(exp.Func):
        name = (fn.name if isinstance(fn, exp.Anonymous) else fn.sql_name()).lower()
        if name in _FORBIDDEN_FUNCTIONS:
            raise QueryRefused(f"refused: function {name}() is not allowed (it reaches outside the database)")
    placeholders = list(tree.find_all(exp.Placeholder))
    if any(p.name not in ("", "?") for p in placeholders):
        raise QueryRefused("refused: use positional '?' placeholders only")
    if len(placeholders) != len(params):
        raise QueryRefused(
            f"refused: the statement has {len(placeholders)} '?' placeholder(s) but {len(params)} value(s)"
        )
    for value in params:
        if value is not None and not isinstance(value, str | int | float):
            raise QueryRefused(f"refused: parameter {value!r} is not a string, number or null")


def _with_key(tree: Any, aliases: Mapping[str, Table]) -> Any:
    """A plain one-table select that does not project its table's key gets it, so its rows are citeable."""
    from sqlglot import exp

    froms = list(tree.find_all(exp.Table))
    if len(froms) != 1 or tree.args.get("group") or tree.args.get("joins") or tree.args.get("distinct"):
        return tree
    if any(tree.find(getattr(exp, a)) for a in _AGGREGATES if hasattr(exp, a)):
        return tree
    table = aliases.get(froms[0].alias_or_name.lower())
    if table is None or not table.key:
        return tree
    names = {e.alias_or_name.lower() for e in tree.expressions}
    if table.key.lower() in names:
        return tree
    return tree.select(exp.column(table.key, table=froms[0].alias_or_name))


# -- offline writer ---------------------------------------------------------------------------------------

_BEYOND = re.compile(
    r"\b(?:last|this|next|past|previous)\s+(?:day|week|month|quarter|year)s?\b|\byesterday\b|\btoday\b|"
    r"\bsince\b|\bbetween\b|\bbefore\b|\bafter\b|\bmore than\b|\bless than\b|\bat least\b|\bat most\b|"
    r"\btop\s+\d+|\baverage\b|\btotal\b|\bsum of\b|\bmost\b|\bfewest\b|\bper\b",
    re.IGNORECASE,
)
_COUNT = re.compile(r"\bhow many\b|\bnumber of\b|\bcount\b", re.IGNORECASE)
_LATEST = re.compile(r"\b(?:latest|newest|most recent|last)\b", re.IGNORECASE)
_OLDEST = re.compile(r"\b(?:oldest|earliest|first)\b", re.IGNORECASE)
_DATE_NAMES = ("created", "opened", "date", "signup", "ordered", "updated")


def _singular(name: str) -> str:
    return name[:-1] if name.endswith("s") else name


def _word_at(text: str, phrase: str) -> int:
    m = re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE)
    return m.start() if m else -1


@frozen
class _Cond:
    table: Table
    column: str
    value: Param
    at: int


@define
class OfflineSQLWriter:
    """Writes SQL without a model, for a few honest patterns; refuses everything else.

    Patterns: a row by its key (``order ORD-1042``, ``customer 17``); rows by known column values named in
    the request (``Harbor Lane Bank``, ``Enterprise``, ``urgent``), across a foreign key when the value
    lives in another table; ``how many …`` counts; ``latest`` / ``oldest`` by the table's date column.
    Date ranges, comparisons, totals and rankings are refused: "cannot answer offline".
    """

    async def write(self, request: str, schema: SQLSchema) -> SQLQuery:
        """The statement for ``request``; QueryRefused with the reason when no pattern applies."""
        return self.write_sync(request, schema)

    def write_sync(self, request: str, schema: SQLSchema) -> SQLQuery:
        """Synchronous :meth:`write`."""
        beyond = _BEYOND.search(request)
        if beyond:
            raise QueryRefused(
                f"cannot answer offline: {beyond.group(0)!r} needs a date range, comparison or total, which the "
                "offline SQL patterns do not write; configure a model to answer this part"
            )
        conds = self._conditions(request, schema)
        target = self._target(request, schema, conds)
        if target is None:
            raise QueryRefused(
                "cannot answer offline: the request names no table "
                f"({', '.join(t.name for t in schema.tables)}) and no known value to look up"
            )
        count = bool(_COUNT.search(request))
        order = self._order(request, target)
        if not conds and not count and not order:
            raise QueryRefused(
                f"cannot answer offline: the request names no id or known value of {target.name} to look up"
            )
        where: list[str] = []
        params: list[Param] = []
        by_table: dict[str, list[_Cond]] = {}
        for c in sorted(conds, key=lambda c: c.at):
            by_table.setdefault(c.table.name, []).append(c)
        for name, cs in by_table.items():
            clause = " AND ".join(f"{c.column} = ?" for c in cs)
            values = [c.value for c in cs]
            if name == target.name:
                where.append(" AND ".join(f"{target.name}.{c.column} = ?" for c in cs))
                params += values
                continue
            link = self._link(target, cs[0].table)
            if link is None:
                raise QueryRefused(
                    f"cannot answer offline: {cs[0].value!r} is a value of {name}, which no foreign key links to "
                    f"{target.name}"
                )
            mine, other, theirs = link
            where.append(f"{target.name}.{mine} IN (SELECT {theirs} FROM {other} WHERE {clause})")
            params += values
        select = "COUNT(*) AS count" if count else ", ".join(f"{target.name}.{c}" for c in target.columns)
        sql = f"SELECT {select} FROM {target.name}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        pattern = "count" if count else "lookup"
        if order and not count:
            column, direction = order
            sql += f" ORDER BY {target.name}.{column} {direction} LIMIT 1"
            pattern = "latest" if direction == "DESC" else "oldest"
        return SQLQuery(sql, tuple(params), note=f"offline pattern: {pattern}")

    def _conditions(self, request: str, schema: SQLSchema) -> list[_Cond]:
        conds: list[_Cond] = []
        taken: list[tuple[int, int]] = []
        candidates: list[tuple[int, int, Table, str, Param]] = []
        for t in schema.tables:
            for column, values in t.values.items():
                for v in values:
                    if len(v) >= 2:
                        at = _word_at(request, v)
                        if at >= 0:
                            candidates.append((at, len(v), t, column, v))
            if t.key and t.types.get(t.key, "").startswith("INT"):
                for m in re.finditer(rf"\b{re.escape(_singular(t.name))}s?\s*(?:id\s*)?#?\s*(\d+)\b", request, re.I):
                    candidates.append((m.start(1), len(m.group(1)), t, t.key, int(m.group(1))))
        # Longest match first, so "Harbor Lane Bank" wins over a shorter value inside it.
        for at, length, t, column, value in sorted(candidates, key=lambda c: (-c[1], c[0])):
            if any(at < end and start < at + length for start, end in taken):
                continue
            taken.append((at, at + length))
            conds.append(_Cond(t, column, value, at))
        return conds

    def _target(self, request: str, schema: SQLSchema, conds: list[_Cond]) -> Table | None:
        named = [
            (pos, t)
            for t in schema.tables
            for pos in (_word_at(request, t.name), _word_at(request, _singular(t.name)))
            if pos >= 0 and not any(c.at <= pos < c.at + len(str(c.value)) for c in conds)
        ]
        asked = re.search(r"\b(?:which|what|list|show|how many|number of)\s+(?:\w+\s+){0,2}?(\w+)", request, re.I)
        if asked:
            word = asked.group(1).lower()
            for t in schema.tables:
                if word in (t.name.lower(), _singular(t.name).lower()):
                    return t
        if named:
            return min(named, key=lambda p: p[0])[1]
        keyed = [c for c in conds if c.column == c.table.key]
        if keyed:
            return keyed[0].table
        return conds[0].table if conds else None

    def _order(self, request: str, table: Table) -> tuple[str, str] | None:
        direction = "DESC" if _LATEST.search(request) else "ASC" if _OLDEST.search(request) else None
        if direction is None:
            return None
        column = next((c for c in table.columns if any(d in c.lower() for d in _DATE_NAMES)), None)
        return (column, direction) if column else None

    def _link(self, target: Table, other: Table) -> tuple[str, str, str] | None:
        for column, ref_table, ref_column in target.foreign:
            if ref_table == other.name:
                return column, other.name, ref_column
        for column, ref_table, ref_column in other.foreign:
            if ref_table == target.name:
                return ref_column, other.name, column
        return None


# -- the source -------------------------------------------------------------------------------------------

# sqlite3 authorizer action codes (stable across SQLite versions).
_OK, _DENY = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_RECURSIVE = getattr(sqlite3, "SQLITE_RECURSIVE", 33)


def _allowed(value: Mapping[str, Sequence[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({k: tuple(v) for k, v in value.items()})


@define
class SQLiteSource:
    """A SQLite database as a plan source: allowlisted, read-only, one checked SELECT per sub-query.

    Attributes:
        path: The database file (must exist; it is only ever opened read-only).
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        name: The source name plans use.
        description: What a planner reads (the schema is appended).
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: Statement time limit; a statement past it is interrupted.
        max_concurrency: Statements running at once.
        value_limit: A text column with at most this many distinct values has them loaded (offline lookups).
        statements: Every statement that ran, in order (for tests and the record).
    """

    path: Path = field(converter=Path)
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    max_concurrency: int = field(default=4, kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)
    _limiter: anyio.CapacityLimiter = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0 or self.max_concurrency < 1:
            raise ConfigError("max_rows and max_concurrency must be at least 1 and timeout_s positive")
        self._limiter = anyio.CapacityLimiter(self.max_concurrency)

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use. Raises ConfigError for an allowlist entry the
        database lacks, SourceError when the database cannot be opened."""
        if self._schema is None:
            self._schema = await anyio.to_thread.run_sync(self._introspect, limiter=self._limiter)
        return self._schema

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Write, check and run one statement for ``query``; filters become ``column IN (?, …)`` conditions.

        Raises:
            QueryRefused: the writer could not write it, or the check refused it (message says why).
            SourceError: the database failed or the statement timed out.
        """
        schema = await self.schema()
        written = await self.writer.write(query, schema)
        sql, params = _apply_filters(written, filters, schema)
        sql, params = check_sql(sql, params, schema, max_rows=self.max_rows)
        self.statements.append(sql)
        started = time.perf_counter()
        columns, rows = await anyio.to_thread.run_sync(self._execute, sql, params, limiter=self._limiter)
        seconds = time.perf_counter() - started
        return _rows_result(self.name, self.path.name, sql, params, columns, rows, schema, written.note, seconds)

    # -- internals ----------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # mode=ro: never writable, and a missing file fails instead of creating an empty database.
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=self.timeout_s)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: cannot open {self.path} read-only ({exc}); check the path") from exc
        return conn

    def _introspect(self) -> SQLSchema:
        conn = self._connect()
        try:
            tables: list[Table] = []
            for name, wanted in self.allow.items():
                info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (name,)).fetchall()
                if not info:
                    raise ConfigError(f"{self.name}: allowlisted table {name!r} is not in {self.path}")
                types = {row[0]: str(row[1]).upper() for row in info}
                missing = [c for c in wanted if c not in types]
                if missing:
                    raise ConfigError(f"{self.name}: table {name!r} has no column(s) {missing}; fix the allowlist")
                columns = tuple(c for c in types if c in wanted)
                key = next((row[0] for row in info if row[2] == 1 and row[0] in wanted), "")
                foreign = tuple(
                    (row[3], row[2], row[4])
                    for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)).fetchall()
                    if row[2] in self.allow and row[3] in wanted and row[4] in self.allow[row[2]]
                )
                values: dict[str, tuple[str, ...]] = {}
                for column in columns:
                    if "CHAR" not in types[column] and "TEXT" not in types[column]:
                        continue
                    found = conn.execute(
                        f'SELECT DISTINCT "{column}" FROM "{name}" WHERE "{column}" IS NOT NULL LIMIT ?',
                        (self.value_limit + 1,),
                    ).fetchall()
                    if len(found) <= self.value_limit:
                        values[column] = tuple(sorted(str(r[0]) for r in found))
                tables.append(Table(name, key, columns, types, foreign, values))
            return SQLSchema(tuple(tables))
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema of {self.path} ({exc})") from exc
        finally:
            conn.close()

    def _authorizer(self, action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
        if action == sqlite3.SQLITE_READ:
            allowed = self.allow.get(arg1 or "")
            # A read of no particular column (COUNT(*)) comes with no database name.
            return _OK if allowed is not None and (not arg2 or arg2 in allowed) and db in ("main", None) else _DENY
        if action == sqlite3.SQLITE_FUNCTION:
            return _DENY if (arg2 or "").lower() in _FORBIDDEN_FUNCTIONS else _OK
        return _OK if action in _ALLOWED_ACTIONS or action == _RECURSIVE else _DENY

    def _execute(self, sql: str, params: tuple[Param, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
        conn = self._connect()
        deadline = time.monotonic() + self.timeout_s
        conn.set_authorizer(self._authorizer)
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        try:
            cursor = conn.execute(sql, params)
            rows = cursor.fetchmany(self.max_rows)
            columns = [d[0] for d in cursor.description or ()]
            return columns, rows
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise SourceError(
                    f"{self.name}: the statement ran past {self.timeout_s}s and was interrupted; narrow the query"
                ) from exc
            if "not authorized" in str(exc):
                raise QueryRefused(f"refused by the database: {exc} (outside the allowlist)") from exc
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        except sqlite3.Error as exc:
            if "prohibited" in str(exc):
                raise QueryRefused(f"refused by the database: {exc} (outside the allowlist)") from exc
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        finally:
            conn.close()


def _apply_filters(written: SQLQuery, filters: Filters, schema: SQLSchema) -> tuple[str, tuple[Param, ...]]:
    """The written statement with each filter as ``column IN (?, …)`` on its main table (values bound)."""
    if not filters:
        return written.sql, written.params
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(written.sql, read=schema.dialect)
    except sqlglot.errors.SqlglotError as exc:
        raise QueryRefused(f"refused: the statement does not parse ({exc})") from exc
    froms = list(tree.find_all(exp.Table)) if isinstance(tree, exp.Select) else []
    if not isinstance(tree, exp.Select) or not froms:
        raise QueryRefused("refused: filters need a SELECT over one allowlisted table")
    main = froms[0]
    table = schema.table(main.name)
    params = list(written.params)
    for column, values in filters.items():
        if table is None or column.lower() not in (c.lower() for c in table.columns):
            raise QueryRefused(f"refused: filter column {column!r} is not an allowlisted column of {main.name!r}")
        if not values:
            raise QueryRefused(f"refused: filter {column!r} has no values")
        marks = [exp.Placeholder() for _ in values]
        tree = tree.where(exp.column(column, table=main.alias_or_name).isin(*marks))
        params += [_typed(v, table.types.get(column, "")) for v in values]
    return tree.sql(dialect=schema.dialect), tuple(params)


def _rows_result(  # noqa: PLR0913 - one call site per source, all keyword-free positional data
    name: str,
    label: str,
    sql: str,
    params: tuple[Param, ...],
    columns: list[str],
    rows: list[tuple[Any, ...]],
    schema: SQLSchema,
    note: str,
    seconds: float,
) -> SourceResult:
    """Rows as citeable hits (``<label>#<table>/<key>``) plus their fields, and the statement for the record."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read=schema.dialect)
    first = next(tree.find_all(exp.Table), None)
    table = schema.table(first.name) if first is not None else None
    table_name = table.name if table else "query"
    key = table.key if table and table.key in columns else ""
    shown = sql
    for p in params:  # for the record only: the statement ran with bound parameters
        shown = shown.replace("?", repr(p), 1)
    digest = hashlib.sha256(f"{sql}|{params}".encode()).hexdigest()[:10]
    hits: list[Hit] = []
    out_rows: list[dict[str, str]] = []
    for i, row in enumerate(rows):
        fields = {c: "" if v is None else str(v) for c, v in zip(columns, row, strict=True)}
        out_rows.append(fields)
        ref = f"{table_name}/{fields[key]}" if key else f"{table_name}/{digest}#{i + 1}"
        body = "; ".join(f"{c.replace('_', ' ')}: {v}" for c, v in fields.items() if v and c != key)
        what = f"{table_name} {key} {fields[key]}" if key else f"{table_name} result {i + 1}"
        chunk = Chunk(
            id=f"{name}:{ref}",
            text=f"{what} — {body}.",
            source=f"{label}#{ref}",
            title=f"{name}: {what}",
            doc_id=f"{name}:{table_name}",
        )
        hits.append(Hit(chunk, score=1.0, confidence=1.0))
    return SourceResult(hits=hits, rows=out_rows, detail=f"{shown} ({note}; {len(rows)} row(s), {seconds:.3f}s)")


def _typed(value: str, declared: str) -> Param:
    if declared.startswith("INT") and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return value


# -- Postgres ---------------------------------------------------------------------------------------------

_PG_COLUMNS = """
SELECT c.table_name, c.column_name, c.data_type
FROM information_schema.columns c
WHERE c.table_schema = %s AND c.table_name = ANY(%s)
ORDER BY c.table_name, c.ordinal_position
"""
_PG_KEYS = """
SELECT tc.table_name, tc.constraint_type, kcu.column_name, ccu.table_name, ccu.column_name
FROM information_schema.table_constraints tc
JOIN information_schema.key_column_usage kcu
  ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema
JOIN information_schema.constraint_column_usage ccu
  ON ccu.constraint_name = tc.constraint_name AND ccu.table_schema = tc.table_schema
WHERE tc.table_schema = %s AND tc.table_name = ANY(%s) AND tc.constraint_type IN ('PRIMARY KEY', 'FOREIGN KEY')
"""


def _pg_type(data_type: str) -> str:
    kind = data_type.lower()
    if "int" in kind:
        return "INTEGER"
    if "char" in kind or kind == "text":
        return "TEXT"
    return kind.upper()


def _pg_text(sql: str) -> str:
    """A checked Postgres statement ready for psycopg: every literal ``%`` doubled, ``%s`` placeholders kept."""
    import sqlglot

    tokens = list(sqlglot.tokenize(sql, read="postgres"))
    out: list[str] = []
    at = 0
    for i, token in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        placeholder = (
            token.token_type.name == "MOD" and nxt is not None and nxt.text == "s" and nxt.start == token.end + 1
        )
        if token.token_type.name == "STRING" or (token.token_type.name == "MOD" and not placeholder):
            out.append(sql[at : token.start])
            out.append(sql[token.start : token.end + 1].replace("%", "%%"))
            at = token.end + 1
    out.append(sql[at:])
    return "".join(out)


@define
class PostgresSQLSource:
    """A PostgreSQL database as a plan source: allowlisted, one checked SELECT per sub-query, read-only.

    The same checks as :class:`SQLiteSource` (the Postgres dialect of :func:`check_sql`); each statement runs
    on its own connection inside a ``READ ONLY`` transaction with ``statement_timeout`` set, then rolls back.
    Postgres has no per-statement authorizer: give the source a role that can only ``SELECT`` the allowlisted
    tables as the second lock. Needs the ``[postgres]`` extra (psycopg 3).

    Attributes:
        url: ``postgresql://`` connection URL.
        allow: The tables the source may read, each with its allowed columns.
        writer: Turns a sub-query into SQL (default: :class:`OfflineSQLWriter`).
        name: The source name plans use.
        description: What a planner reads.
        schema_name: The Postgres schema the tables live in.
        max_rows: The ``LIMIT`` every statement gets.
        timeout_s: ``statement_timeout`` of every statement.
        value_limit: A text column with at most this many distinct values has them loaded.
        statements: Every statement that ran, in order.
    """

    url: str
    allow: Mapping[str, tuple[str, ...]] = field(converter=_allowed)
    writer: SQLWriter = field(factory=OfflineSQLWriter)
    name: str = field(default="sql", kw_only=True)
    description: str = field(default="a SQL database of customers, orders and tickets", kw_only=True)
    schema_name: str = field(default="public", kw_only=True)
    max_rows: int = field(default=50, kw_only=True)
    timeout_s: float = field(default=2.0, kw_only=True)
    value_limit: int = field(default=200, kw_only=True)
    statements: list[str] = field(factory=list, init=False)
    _schema: SQLSchema | None = field(default=None, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.allow:
            raise ConfigError("allow must name at least one table, e.g. {'customers': ['id', 'name']}")
        if self.max_rows < 1 or self.timeout_s <= 0:
            raise ConfigError("max_rows must be at least 1 and timeout_s positive")

    async def schema(self) -> SQLSchema:
        """The allowlisted schema, introspected on first use (ConfigError for an allowlist entry it lacks)."""
        if self._schema is None:
            self._schema = await self._introspect()
        return self._schema

    async def run(self, query: str, filters: Filters) -> SourceResult:
        """Write, check and run one statement for ``query`` (see :meth:`SQLiteSource.run`)."""
        schema = await self.schema()
        written = await self.writer.write(query, schema)
        sql, params = _apply_filters(written, filters, schema)
        sql, params = check_sql(sql, params, schema, max_rows=self.max_rows)
        self.statements.append(sql)
        started = time.perf_counter()
        columns, rows = await self._execute(_pg_text(sql), params)
        label = self.url.rsplit("/", 1)[-1].split("?", 1)[0] or "postgres"
        return _rows_result(
            self.name, label, sql, params, columns, rows, schema, written.note, time.perf_counter() - started
        )

    async def _connect(self) -> Any:
        import psycopg

        try:
            conn = await psycopg.AsyncConnection.connect(self.url, autocommit=False)
            await conn.set_read_only(True)
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: cannot connect to the database ({exc}); check the url") from exc
        return conn

    async def _execute(self, sql: str, params: tuple[Param, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
        import psycopg

        conn = await self._connect()
        try:
            async with conn.cursor() as cur:
                await cur.execute(f"SET LOCAL statement_timeout = {int(self.timeout_s * 1000)}")
                await cur.execute(
                    psycopg.sql.SQL("SET LOCAL search_path = {}").format(psycopg.sql.Identifier(self.schema_name))
                )
                await cur.execute(sql, params)
                rows = await cur.fetchmany(self.max_rows)
                columns = [d.name for d in cur.description or ()]
            return columns, list(rows)
        except psycopg.errors.QueryCanceled as exc:
            raise SourceError(
                f"{self.name}: the statement ran past {self.timeout_s}s and was cancelled; narrow the query"
            ) from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            raise QueryRefused(f"refused by the database: {exc}") from exc
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: the statement failed: {exc}") from exc
        finally:
            await conn.rollback()
            await conn.close()

    async def _introspect(self) -> SQLSchema:
        import psycopg

        conn = await self._connect()
        names = list(self.allow)
        try:
            async with conn.cursor() as cur:
                await cur.execute(_PG_COLUMNS, (self.schema_name, names))
                found: dict[str, dict[str, str]] = {}
                for table, column, data_type in await cur.fetchall():
                    found.setdefault(table, {})[column] = _pg_type(data_type)
                await cur.execute(_PG_KEYS, (self.schema_name, names))
                constraints = await cur.fetchall()
                tables = []
                for name, wanted in self.allow.items():
                    types = found.get(name)
                    if not types:
                        raise ConfigError(
                            f"{self.name}: allowlisted table {name!r} is not in schema {self.schema_name!r}"
                        )
                    missing = [c for c in wanted if c not in types]
                    if missing:
                        raise ConfigError(f"{self.name}: table {name!r} has no column(s) {missing}; fix the allowlist")
                    columns = tuple(c for c in types if c in wanted)
                    key = next(
                        (c[2] for c in constraints if c[0] == name and c[1] == "PRIMARY KEY" and c[2] in wanted), ""
                    )
                    foreign = tuple(
                        (c[2], c[3], c[4])
                        for c in constraints
                        if c[0] == name
                        and c[1] == "FOREIGN KEY"
                        and c[2] in wanted
                        and c[4] in self.allow.get(c[3], ())
                    )
                    values: dict[str, tuple[str, ...]] = {}
                    for column in columns:
                        if types[column] != "TEXT":
                            continue
                        await cur.execute(
                            psycopg.sql.SQL("SELECT DISTINCT {c} FROM {s}.{t} WHERE {c} IS NOT NULL LIMIT %s").format(
                                c=psycopg.sql.Identifier(column),
                                s=psycopg.sql.Identifier(self.schema_name),
                                t=psycopg.sql.Identifier(name),
                            ),
                            (self.value_limit + 1,),
                        )
                        distinct = await cur.fetchall()
                        if len(distinct) <= self.value_limit:
                            values[column] = tuple(sorted(str(r[0]) for r in distinct))
                    tables.append(Table(name, key, columns, types, foreign, values))
            return SQLSchema(tuple(tables), dialect="postgres")
        except psycopg.Error as exc:
            raise SourceError(f"{self.name}: cannot read the schema ({exc})") from exc
        finally:
            await conn.rollback()
            await conn.close()
