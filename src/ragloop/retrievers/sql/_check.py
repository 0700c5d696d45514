"""The check every statement passes before it runs (:func:`check_sql`): accepted only when proven safe.

In order: the text is one comment-free ``SELECT`` (or ``WITH … SELECT``, or a ``UNION`` / ``INTERSECT`` /
``EXCEPT`` of them) with positional ``?`` placeholders; every node is on an allowlist (:mod:`._allow`: functions,
operators, clauses, cast types); every table reference is resolved (:mod:`._scope`) and reads an allowlisted
table, every column named is allowlisted; the plan's filters narrow the main table; then the rewrite
(:mod:`._tenant`) turns every real table reference into a sub-query of its allowlisted columns and, for a
tenant-scoped table, of the caller's rows only. A ``LIMIT`` of at most ``max_rows`` closes the statement.

Values never enter the text: the writer's ``?`` values, the filters' values and the tenant are bound
parameters, in the order their placeholders stand in the final text.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._allow import check_nodes
from ragloop.retrievers.sql._schema import Param, SQLSchema, TenantKey, typed_value
from ragloop.retrievers.sql._scope import References, check_columns, resolve
from ragloop.retrievers.sql._tenant import Narrowing, scoped

#: Filters as a source receives them (column → allowed values).
Filters = Mapping[str, tuple[str, ...]]
#: Longest statement a writer may propose.
MAX_STATEMENT_CHARS = 20_000


def check_sql(
    sql: str,
    params: Sequence[Param],
    schema: SQLSchema,
    *,
    max_rows: int = 50,
    filters: Filters | None = None,
    tenants: Mapping[str, TenantKey] | None = None,
    tenant: str | None = None,
) -> tuple[str, tuple[Param, ...]]:
    """The statement made safe to run, with its parameters in order; QueryRefused naming the rule otherwise.

    Args:
        sql: The statement as written (``?`` placeholders).
        params: One value per ``?``.
        schema: The allowlisted schema (and its dialect).
        max_rows: The largest ``LIMIT`` the statement may keep (one is added when missing).
        filters: Column → values conditions on the main table (the outermost ``FROM``): ``column IN (…)``, values
            bound, on every reference to that table (a self-join or sub-query of it is narrowed too).
        tenants: Which tables are tenant-scoped and how their rows name the tenant.
        tenant: The caller's tenant; every reference to a scoped table sees only its rows. Required when the
            statement reads a scoped table.
    """
    from sqlglot import exp
    from sqlglot.errors import ErrorLevel, SqlglotError

    values: dict[str, Param] = {}
    nonce = secrets.token_hex(8)

    def mark(value: Param) -> Any:
        name = f"ragloop{nonce}v{len(values)}"
        values[name] = value
        return exp.Literal.string(name)

    try:
        text = _marked(sql, params, schema.dialect, mark)
        tree = _parse_one_query(text, schema.dialect)
        check_nodes(tree, schema.dialect)
        refs = resolve(tree, schema)
        check_columns(tree, refs)
        _check_limits(tree)
        narrowing = _narrowing(tree, refs, filters) if filters else {}
        _with_key(tree, refs)
        scoped(refs, schema, tenants or {}, tenant, mark, narrowing)
        limit = tree.args.get("limit")
        current = limit.expression if limit is not None else None
        if not (isinstance(current, exp.Literal) and int(current.this) <= max_rows):
            tree.set("limit", exp.Limit(expression=exp.Literal.number(max_rows)))
        out = tree.sql(dialect=schema.dialect, unsupported_level=ErrorLevel.RAISE)
    except RecursionError as exc:
        raise QueryRefused("refused (statement): the statement is nested too deeply; write it flatter") from exc
    except SqlglotError as exc:
        raise QueryRefused(f"refused (statement): it cannot be written back faithfully ({exc})") from exc
    return _unmarked(out, values, schema.dialect)


def _marked(sql: str, params: Sequence[Param], dialect: str, mark: Any) -> str:
    """The text with each ``?`` replaced by its value's marker (a string literal no writer can guess)."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    text = sql.strip().rstrip(";").strip()
    if not text:
        raise QueryRefused("refused (statement): the statement is empty")
    if len(text) > MAX_STATEMENT_CHARS:
        raise QueryRefused(
            f"refused (statement): the statement is {len(text):,} characters; at most {MAX_STATEMENT_CHARS:,}"
        )
    # Checked before parsing: sqlglot logs a warning for statements it only half understands (ATTACH, VACUUM).
    head = re.match(r"[\s(]*([A-Za-z]+)", text)
    if head is None or head.group(1).upper() not in ("SELECT", "WITH"):
        word = head.group(1).upper() if head else text[:12]
        raise QueryRefused(f"refused (statement): only a SELECT may run, and this statement starts with {word!r}")
    if "--" in text or "/*" in text:
        raise QueryRefused("refused (statement): comments are not allowed in a statement (they can hide a second one)")
    for value in params:
        if value is not None and not isinstance(value, str | int | float):
            raise QueryRefused(f"refused (placeholders): parameter {value!r} is not a string, number or null")
    try:
        tokens = sqlglot.tokenize(text, read=dialect)
    except SqlglotError as exc:
        raise QueryRefused(f"refused (statement): the statement does not parse ({str(exc).splitlines()[0]})") from exc
    if any(t.token_type.name == "SEMICOLON" for t in tokens):
        raise QueryRefused("refused (statement): exactly one statement may run, and this text holds several")
    marks = [t for t in tokens if t.token_type.name == "PLACEHOLDER"]
    if any(t.text != "?" for t in marks) or any(t.token_type.name in ("PARAMETER", "COLON") for t in tokens):
        raise QueryRefused("refused (placeholders): use positional '?' placeholders only")
    if len(marks) != len(params):
        raise QueryRefused(
            f"refused (placeholders): the statement has {len(marks)} '?' placeholder(s) but {len(params)} value(s)"
        )
    out, at = [], 0
    for token, value in zip(marks, params, strict=True):
        out += [text[at : token.start], mark(value).sql(dialect=dialect)]
        at = token.end + 1
    return "".join([*out, text[at:]])


def _unmarked(sql: str, values: Mapping[str, Param], dialect: str) -> tuple[str, tuple[Param, ...]]:
    """Each marker turned back into a placeholder (``?``, or ``%s`` in Postgres), the values in text order."""
    import sqlglot

    placeholder = "%s" if dialect == "postgres" else "?"
    out: list[str] = []
    bound: list[Param] = []
    at = 0
    for token in sqlglot.tokenize(sql, read=dialect):
        if token.token_type.name == "STRING" and token.text in values:
            out += [sql[at : token.start], placeholder]
            bound.append(values[token.text])
            at = token.end + 1
    return "".join([*out, sql[at:]]), tuple(bound)


def _parse_one_query(text: str, dialect: str) -> Any:
    """The parsed statement if the text is one SELECT (or a set operation of SELECTs); QueryRefused otherwise."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        trees = [t for t in sqlglot.parse(text, read=dialect) if t is not None]
    except SqlglotError as exc:
        raise QueryRefused(f"refused (statement): the statement does not parse ({str(exc).splitlines()[0]})") from exc
    if len(trees) != 1:
        raise QueryRefused(f"refused (statement): exactly one statement may run, got {len(trees)}")
    tree = trees[0]
    if not isinstance(tree, exp.Select | exp.SetOperation):
        raise QueryRefused(f"refused (statement): only a SELECT may run, got {type(tree).__name__.upper()}")
    return tree


def _check_limits(tree: Any) -> None:
    from sqlglot import exp

    for node in tree.find_all(exp.Limit, exp.Offset):
        value = node.expression
        if not (isinstance(value, exp.Literal) and not value.is_string and re.fullmatch(r"\d+", str(value.this))):
            raise QueryRefused(f"refused (limit): {node.sql()!r}: LIMIT and OFFSET take whole numbers")


def _narrowing(tree: Any, refs: References, filters: Filters) -> Narrowing:
    """The filters as conditions on the main table (the outermost FROM), for every reference to it."""
    from sqlglot import exp

    from_: Any = tree.args.get("from_") if isinstance(tree, exp.Select) else None
    source = from_.this if from_ is not None else None
    table = next((t for r, t in refs.real if r is source), None)
    if table is None:
        raise QueryRefused("refused (filters): filters need a SELECT whose FROM is an allowlisted table")
    conditions: list[tuple[str, tuple[Param, ...]]] = []
    for column, wanted in filters.items():
        name = next((c for c in table.columns if c.lower() == column.lower()), None)
        if name is None:
            raise QueryRefused(
                f"refused (filters): filter column {column!r} is not an allowlisted column of {table.name!r}"
            )
        if not wanted:
            raise QueryRefused(f"refused (filters): filter {column!r} has no values")
        conditions.append((name, tuple(typed_value(v, table.types.get(name, "")) for v in wanted)))
    return {table.name.lower(): tuple(conditions)}


_AGGREGATES = ("Count", "Sum", "Avg", "Min", "Max", "GroupConcat")


def _with_key(tree: Any, refs: References) -> None:
    """A plain one-table SELECT that does not project its table's key gets it, so its rows are citeable."""
    from sqlglot import exp

    if not isinstance(tree, exp.Select) or len(refs.real) != 1 or refs.cte_refs:
        return
    if tree.args.get("group") or tree.args.get("joins") or tree.args.get("distinct"):
        return
    if any(tree.find(getattr(exp, a)) for a in _AGGREGATES) or tree.find(exp.Window):
        return
    ref, table = refs.real[0]
    if not table.key or tree.args.get("from_") is None or tree.args["from_"].this is not ref:
        return
    names = {e.alias_or_name.lower() for e in tree.expressions}
    if table.key.lower() in names or any(isinstance(e, exp.Star) for e in tree.expressions):
        return
    tree.select(exp.column(table.key, table=ref.alias_or_name), copy=False)
