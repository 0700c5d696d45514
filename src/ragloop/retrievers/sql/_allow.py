"""What a statement may contain: the allowlists of functions, operators, clauses and cast types.

:func:`check_nodes` walks every node of a parsed statement and refuses the first one no list names. Nothing is
allowed for being absent from a denylist: a function, operator or clause sqlglot knows and these lists do not
name is refused, and so is every function sqlglot does not know (``ts_stat``, ``pg_terminate_backend``,
``current_setting``, ``pg_stat_file`` …). Each refusal is one line naming its rule and the offender.

:data:`FUNCTIONS` is the one list of functions: what the docs print, what the checker allows (the sqlglot node
kinds its examples parse to, per dialect) and what the tests run on real SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from ragloop.errors import QueryRefused

_BOTH = ("sqlite", "postgres")


@frozen
class AllowedFunction:
    """One function a statement may call.

    Attributes:
        name: Its SQL name.
        category: ``aggregate``, ``string``, ``date``, ``math``, ``conditional`` or ``window``.
        dialects: The dialects it is allowed in.
        example: A call over the sample CRM's columns (the checker allows what this parses to).
    """

    name: str
    category: str
    dialects: tuple[str, ...]
    example: str


def _f(name: str, category: str, example: str, dialects: tuple[str, ...] = _BOTH) -> AllowedFunction:
    return AllowedFunction(name, category, dialects, example)


#: Every function a statement may call. Anything else is refused ("function allowlist").
FUNCTIONS: tuple[AllowedFunction, ...] = (
    _f("count", "aggregate", "count(DISTINCT plan)"),
    _f("sum", "aggregate", "sum(seats)"),
    _f("avg", "aggregate", "avg(seats)"),
    _f("min", "aggregate", "min(seats)"),
    _f("max", "aggregate", "max(seats)"),
    _f("total", "aggregate", "total(seats)", ("sqlite",)),
    _f("group_concat", "aggregate", "group_concat(name, ', ')", ("sqlite",)),
    _f("string_agg", "aggregate", "string_agg(name, ', ')", ("postgres",)),
    _f("lower", "string", "lower(name)"),
    _f("upper", "string", "upper(name)"),
    _f("length", "string", "length(name)"),
    _f("substr", "string", "substr(name, 1, 3)"),
    _f("substring", "string", "substring(name, 1, 3)"),
    _f("trim", "string", "trim(name)"),
    _f("ltrim", "string", "ltrim(name)"),
    _f("rtrim", "string", "rtrim(name)"),
    _f("replace", "string", "replace(name, ' ', '-')"),
    _f("instr", "string", "instr(name, 'a')", ("sqlite",)),
    _f("strpos", "string", "strpos(name, 'a')", ("postgres",)),
    _f("position", "string", "position('a' IN name)", ("postgres",)),
    _f("concat", "string", "concat(name, ' ', plan)", ("postgres",)),
    _f("left", "string", "left(name, 3)", ("postgres",)),
    _f("right", "string", "right(name, 3)", ("postgres",)),
    _f("split_part", "string", "split_part(name, ' ', 1)", ("postgres",)),
    _f("initcap", "string", "initcap(name)", ("postgres",)),
    _f("date", "date", "date(signed_up, '-1 month')", ("sqlite",)),
    _f("time", "date", "time('now')", ("sqlite",)),
    _f("datetime", "date", "datetime(signed_up, 'start of month')", ("sqlite",)),
    _f("julianday", "date", "julianday('now') - julianday(signed_up)", ("sqlite",)),
    _f("strftime", "date", "strftime('%Y-%m', signed_up)", ("sqlite",)),
    _f("unixepoch", "date", "unixepoch(signed_up)", ("sqlite",)),
    _f("current_date", "date", "current_date"),
    _f("current_timestamp", "date", "current_timestamp"),
    _f("now", "date", "now()", ("postgres",)),
    _f("extract", "date", "extract(YEAR FROM CAST(signed_up AS DATE))", ("postgres",)),
    _f("date_part", "date", "date_part('year', CAST(signed_up AS DATE))", ("postgres",)),
    _f("date_trunc", "date", "date_trunc('month', CAST(signed_up AS DATE))", ("postgres",)),
    _f("to_char", "date", "to_char(CAST(signed_up AS DATE), 'YYYY-MM')", ("postgres",)),
    _f("age", "date", "age(CAST(signed_up AS DATE))", ("postgres",)),
    _f("make_date", "date", "make_date(2024, 1, 31)", ("postgres",)),
    _f("abs", "math", "abs(seats - 10)"),
    _f("round", "math", "round(seats / 3.0, 2)"),
    _f("floor", "math", "floor(seats / 3.0)"),
    _f("ceil", "math", "ceil(seats / 3.0)"),
    _f("sign", "math", "sign(seats - 10)"),
    _f("mod", "math", "mod(seats, 7)"),
    _f("power", "math", "power(seats, 2)"),
    _f("sqrt", "math", "sqrt(seats)"),
    _f("ln", "math", "ln(seats)"),
    _f("exp", "math", "exp(1)"),
    _f("trunc", "math", "trunc(seats / 3.0)", ("postgres",)),
    _f("cast", "conditional", "CAST(seats AS TEXT)"),
    _f("coalesce", "conditional", "coalesce(churned_on, signed_up)"),
    _f("ifnull", "conditional", "ifnull(churned_on, '')", ("sqlite",)),
    _f("nullif", "conditional", "nullif(status, 'active')"),
    _f("iif", "conditional", "iif(seats > 10, 'big', 'small')", ("sqlite",)),
    _f("case", "conditional", "CASE WHEN seats > 10 THEN 'big' ELSE 'small' END"),
    _f("greatest", "conditional", "greatest(seats, 10)", ("postgres",)),
    _f("least", "conditional", "least(seats, 10)", ("postgres",)),
    _f("row_number", "window", "row_number() OVER (PARTITION BY plan ORDER BY seats DESC)"),
    _f("rank", "window", "rank() OVER (ORDER BY seats DESC)"),
    _f("dense_rank", "window", "dense_rank() OVER (ORDER BY seats DESC)"),
)

#: The operators and clauses a statement may use (the docs print this line).
OPERATORS = (
    "= <> != < <= > >= AND OR NOT + - * / % || LIKE ILIKE GLOB ESCAPE IN BETWEEN IS [NOT] NULL, IS [NOT] DISTINCT "
    "FROM, EXISTS, CASE, CAST (to number, text, date, time, boolean); SELECT [DISTINCT] FROM, JOIN (INNER, LEFT, "
    "RIGHT, FULL, CROSS, NATURAL; ON, USING), WHERE, GROUP BY, HAVING, ORDER BY, LIMIT, OFFSET, WITH [RECURSIVE], "
    "UNION, INTERSECT, EXCEPT, sub-queries, OVER (PARTITION BY … ORDER BY … [ROWS …]), FILTER (WHERE …)"
)

#: Structural node kinds (clauses, operators, values): the non-function part of the grammar.
_STRUCTURE = (
    "Select", "Union", "Intersect", "Except", "Subquery", "With", "CTE", "TableAlias", "From", "Join", "Table",
    "Identifier", "Column", "Star", "Alias", "Where", "Group", "Having", "Order", "Ordered", "Limit", "Offset",
    "Distinct", "Literal", "Null", "Boolean", "Paren", "Tuple", "In", "Between", "Exists", "Is", "Not", "Neg",
    "And", "Or", "EQ", "NEQ", "GT", "GTE", "LT", "LTE", "NullSafeEQ", "NullSafeNEQ", "Add", "Sub", "Mul", "Div",
    "Mod", "DPipe", "Like", "ILike", "Glob", "Escape", "Case", "If", "Cast", "DataType", "DataTypeParam",
    "Interval", "Var", "Window", "WindowSpec", "Filter", "Placeholder",
)  # fmt: skip

#: Types a CAST may name.
_CAST_TYPES = frozenset(
    {
        "INT", "TINYINT", "SMALLINT", "BIGINT", "INTEGER", "FLOAT", "DOUBLE", "DECIMAL", "TEXT", "VARCHAR", "CHAR",
        "NCHAR", "NVARCHAR", "DATE", "TIME", "TIMESTAMP", "TIMESTAMPTZ", "DATETIME", "BOOLEAN", "REAL", "NUMERIC",
    }
)  # fmt: skip

#: The arguments each node kind may carry; any other non-empty argument is refused (``FOR UPDATE``, ``INTO``,
#: ``TABLESAMPLE``, ``LATERAL``, schema-qualified names …).
_ARGS: Mapping[str, frozenset[str]] = {
    "Select": frozenset({"with_", "expressions", "distinct", "from_", "joins", "where", "group", "having", "order",
                         "limit", "offset"}),
    "Union": frozenset({"with_", "this", "expression", "distinct", "order", "limit", "offset"}),
    "Table": frozenset({"this", "alias"}),
    "Join": frozenset({"this", "on", "using", "side", "kind", "method"}),
    "Star": frozenset(),
    "Column": frozenset({"this", "table"}),
    "Subquery": frozenset({"this", "alias"}),
    "With": frozenset({"expressions", "recursive"}),
    "CTE": frozenset({"this", "alias"}),
    "Window": frozenset({"this", "partition_by", "order", "spec", "over"}),
}  # fmt: skip
_ARGS = {**_ARGS, "Intersect": _ARGS["Union"], "Except": _ARGS["Union"]}

_CASTS = "cast to a number, text, date, time or boolean type"
_USE = "use aggregates, string, date, math, conditional or ranking functions (docs/planning.md lists them)"


@functools.cache
def _allowed(dialect: str) -> tuple[frozenset[type], frozenset[str]]:
    """The function node kinds and the unknown-to-sqlglot function names ``dialect`` allows (from the examples)."""
    import sqlglot
    from sqlglot import exp

    kinds: set[type] = set()
    names: set[str] = set()
    for fn in FUNCTIONS:
        if dialect not in fn.dialects:
            continue
        for node in sqlglot.parse_one(f"SELECT {fn.example}", read=dialect).expressions[0].walk():
            if isinstance(node, exp.Anonymous):
                names.add(str(node.name).lower())
            elif isinstance(node, exp.Func):
                kinds.add(type(node))
    return frozenset(kinds), frozenset(names)


def function_name(node: Any, dialect: str) -> str:
    """The SQL name of a function node, as the dialect spells it."""
    from sqlglot import exp

    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    try:
        written = str(node.sql(dialect=dialect))
    except Exception:  # noqa: BLE001 - only for the message: fall back on sqlglot's own name
        written = ""
    head = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", written)
    return (head.group(1) if head else str(node.sql_name())).lower()


def check_nodes(tree: Any, dialect: str) -> None:
    """Refuse the first node of ``tree`` outside the allowlists (function, operator, clause, cast type)."""
    from sqlglot import exp

    kinds, names = _allowed(dialect)
    structure = frozenset(getattr(exp, n) for n in _STRUCTURE if hasattr(exp, n))
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            if function_name(node, dialect) not in names:
                raise QueryRefused(_not_allowed(node, dialect))
        elif type(node) in kinds:
            pass
        elif type(node) not in structure:
            raise QueryRefused(_not_allowed(node, dialect))
        _check_special(node, dialect)
        allowed_args = _ARGS.get(type(node).__name__)
        if allowed_args is not None:
            extra = sorted(k for k, v in node.args.items() if v not in (None, [], False) and k not in allowed_args)
            if extra:
                what = type(node).__name__.upper()
                raise QueryRefused(f"refused (clause allowlist): {what} with {', '.join(extra)} is not allowed")


def _check_special(node: Any, dialect: str) -> None:
    from sqlglot import exp

    if isinstance(node, exp.Table | exp.Column) and (node.args.get("db") or node.args.get("catalog")):
        raise QueryRefused(
            f"refused (table allowlist): {node.sql(dialect=dialect)!r} is qualified with a database name; only the "
            "allowlisted tables of this database may be read"
        )

    if isinstance(node, exp.Join) and str(node.args.get("method") or "").upper() not in ("", "NATURAL"):
        raise QueryRefused(f"refused (clause allowlist): a {node.args['method']} join is not allowed")
    if isinstance(node, exp.DataType):
        name = node.this.name if isinstance(node.this, exp.DataType.Type) else str(node.this)
        if name.upper() not in _CAST_TYPES:
            raise QueryRefused(
                f"refused (cast allowlist): CAST to {node.sql(dialect=dialect)!r} is not allowed; {_CASTS}"
            )
    if isinstance(node, exp.Var) and not isinstance(
        node.parent, exp.Interval | exp.Extract | exp.TimestampTrunc | exp.DateTrunc | exp.WindowSpec
    ):
        raise QueryRefused(f"refused (operator allowlist): {node.sql()!r} is not a column, value or allowed keyword")


def _not_allowed(node: Any, dialect: str) -> str:
    from sqlglot import exp

    parent: Any = node.parent
    if isinstance(parent, exp.Cast) and id(parent.args.get("to")) == id(node):
        written: str = node.sql(dialect=dialect)
        return f"refused (cast allowlist): CAST to {written!r} is not allowed; {_CASTS}"
    if isinstance(node, exp.Func):
        return f"refused (function allowlist): {function_name(node, dialect)}() is not allowed; {_USE}"
    if isinstance(node, exp.Binary | exp.Unary | exp.Predicate):
        return (
            f"refused (operator allowlist): {type(node).__name__.upper()} in {node.sql()[:60]!r} is not allowed; "
            "use comparisons, arithmetic, ||, LIKE, IN, BETWEEN, IS, EXISTS, CASE"
        )
    return f"refused (clause allowlist): {type(node).__name__.upper()} ({node.sql()[:60]!r}) is not allowed"
