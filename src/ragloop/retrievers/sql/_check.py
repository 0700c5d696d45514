"""The checks every statement passes before it runs (:func:`check_sql`), with sqlglot."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._schema import Param, SQLSchema, Table

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
