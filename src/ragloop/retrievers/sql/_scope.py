"""Which table each reference of a statement reads, and whether every column it names is allowlisted.

:func:`resolve` sorts every table reference into a reference to a ``WITH`` query (visible where SQL makes it
visible: the query that holds the ``WITH``, and later queries of the same ``WITH``; the query itself too when
``RECURSIVE``) or to a real table, which must be allowlisted. The rewrite then renames every ``WITH`` query to
a name of its own, so what the database resolves is what this module resolved: a reference it took for a
``WITH`` query can only ever reach one, and a real table is always a real table.

:func:`check_columns` refuses a column no table reference of the statement allows, with the rule and the column
named. It is the early, readable check; the structural one is the rewrite (each real table becomes a sub-query
that exposes only its allowlisted columns), so a column the database would resolve elsewhere fails there too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from attrs import define, field

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._schema import SQLSchema, Table


@define
class References:
    """The table references of one statement, sorted.

    Attributes:
        real: Each reference to a real table, with the allowlisted table it reads.
        cte_refs: Each reference to a ``WITH`` query, with the ``WITH`` query it reads.
        ctes: Every ``WITH`` query of the statement, outermost first.
    """

    real: list[tuple[Any, Table]] = field(factory=list)
    cte_refs: list[tuple[Any, Any]] = field(factory=list)
    ctes: list[Any] = field(factory=list)

    @property
    def cte_of(self) -> dict[int, Any]:
        """``id(reference)`` → the ``WITH`` query it reads."""
        return {id(ref): cte for ref, cte in self.cte_refs}


def resolve(tree: Any, schema: SQLSchema) -> References:
    """Sort the references of ``tree``; QueryRefused for a table outside the allowlist or a table function."""
    from sqlglot import exp

    refs = References()
    for with_ in tree.find_all(exp.With):
        names = [c.alias.lower() for c in with_.expressions]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise QueryRefused(f"refused (statement): WITH names {twice[0]!r} twice")
        refs.ctes.extend(with_.expressions)
    for ref in tree.find_all(exp.Table):
        if not isinstance(ref.parent, exp.From | exp.Join):
            raise QueryRefused(f"refused (table allowlist): {ref.sql()[:60]!r} may only appear in FROM or JOIN")
        if not isinstance(ref.this, exp.Identifier):
            raise QueryRefused(
                f"refused (table-valued function): {ref.sql(dialect=schema.dialect)[:60]!r} reads a function as a "
                "table; read the allowlisted tables"
            )
        cte = _cte_for(ref)
        if cte is not None:
            refs.cte_refs.append((ref, cte))
            continue
        table = schema.table(ref.name)
        if table is None:
            allowed = ", ".join(t.name for t in schema.tables)
            raise QueryRefused(f"refused (table allowlist): table {ref.name!r} is not allowlisted; allowed: {allowed}")
        refs.real.append((ref, table))
    if not refs.real:
        raise QueryRefused("refused (table allowlist): the statement reads no allowlisted table")
    return refs


def _cte_for(ref: Any) -> Any:
    """The ``WITH`` query ``ref`` names where it stands, or None for a real table (innermost ``WITH`` first)."""
    from sqlglot import exp

    name = ref.name.lower()
    child, node, via = ref, ref.parent, None
    while node is not None:
        if isinstance(node, exp.With):
            via = child
        else:
            with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
            if isinstance(with_, exp.With):
                ctes = list(with_.expressions)
                if child is with_:
                    at = next(i for i, c in enumerate(ctes) if c is via)
                    ctes = ctes[: at + 1] if with_.args.get("recursive") else ctes[:at]
                for cte in reversed(ctes):
                    if cte.alias.lower() == name:
                        return cte
        child, node = node, node.parent
    return None


def check_columns(tree: Any, refs: References) -> None:
    """Refuse a column that no table reference of the statement allows (rule ``column allowlist``)."""
    from sqlglot import exp

    by_alias, known = _bindings(tree, refs)
    unknown_ok = any(n is None for names in by_alias.values() for n in names)
    real = {id(ref): table for ref, table in refs.real}
    for join in tree.find_all(exp.Join):
        table = real.get(id(join.this))
        for ident in join.args.get("using") or ():
            name = ident.name.lower()
            if (table is not None and name not in (c.lower() for c in table.columns)) or name not in known:
                raise QueryRefused(f"refused (column allowlist): column {ident.name!r} of USING is not allowlisted")
    tables = ", ".join(sorted({t.name for _, t in refs.real}))
    for col in tree.find_all(exp.Column):
        _check_column(col, by_alias, known if not unknown_ok else None, tables)


def _bindings(tree: Any, refs: References) -> tuple[dict[str, list[frozenset[str] | None]], set[str]]:
    """Each alias → the column sets it may name (``None``: unknown), and every column name the statement knows."""
    from sqlglot import exp

    outputs = _Outputs(refs)
    by_alias: dict[str, list[frozenset[str] | None]] = {}
    for ref, table in refs.real:
        by_alias.setdefault(ref.alias_or_name.lower(), []).append(frozenset(c.lower() for c in table.columns))
    for ref, cte in refs.cte_refs:
        by_alias.setdefault(ref.alias_or_name.lower(), []).append(outputs.of(cte))
    for sub in tree.find_all(exp.Subquery):
        if sub.alias and isinstance(sub.parent, exp.From | exp.Join):
            by_alias.setdefault(sub.alias.lower(), []).append(outputs.of(sub))
    known: set[str] = {a.alias.lower() for a in tree.find_all(exp.Alias)}
    for cte in refs.ctes:
        known.update(c.name.lower() for c in cte.args["alias"].columns)
    for names in by_alias.values():
        for n in names:
            known.update(n or ())
    return by_alias, known


def _check_column(
    col: Any, by_alias: dict[str, list[frozenset[str] | None]], known: set[str] | None, tables: str
) -> None:
    from sqlglot import exp

    qualifier = col.table.lower()
    if isinstance(col.this, exp.Star):
        if qualifier not in by_alias:
            raise QueryRefused(f"refused (column allowlist): {col.sql()!r} names no table of this statement")
        return
    name = col.name.lower()
    if qualifier:
        bound = by_alias.get(qualifier)
        if bound is None:
            raise QueryRefused(f"refused (column allowlist): {col.sql()!r}: {col.table!r} is no table or alias here")
        if not any(n is None or name in n for n in bound):
            raise QueryRefused(f"refused (column allowlist): column {col.sql()!r} is not allowlisted")
    elif known is not None and name not in known:
        raise QueryRefused(f"refused (column allowlist): column {col.name!r} is not allowlisted in {tables}")


@define
class _Outputs:
    """The column names a query yields (``None`` when they cannot be known), ``*`` expanded where it can be."""

    refs: References
    _seen: dict[int, frozenset[str] | None] = field(factory=dict)

    def of(self, node: Any) -> frozenset[str] | None:
        from sqlglot import exp

        key = id(node)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = None  # a recursive WITH query reads itself: unknown while it is being worked out
        if isinstance(node, exp.CTE):
            listed = [c.name.lower() for c in node.args["alias"].columns]
            found = frozenset(listed) if listed else self.of(node.this)
        elif isinstance(node, exp.Subquery | exp.SetOperation):
            found = self.of(node.this)
        elif isinstance(node, exp.Select):
            found = self._select(node)
        else:
            found = None
        self._seen[key] = found
        return found

    def _select(self, select: Any) -> frozenset[str] | None:
        from sqlglot import exp

        names: set[str] = set()
        for e in select.expressions:
            if isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star)):
                qualifier = e.table.lower() if isinstance(e, exp.Column) else ""
                for alias, columns in self._sources(select):
                    if qualifier and alias != qualifier:
                        continue
                    if columns is None:
                        return None
                    names.update(columns)
            else:
                names.add(e.alias_or_name.lower())
        return frozenset(names)

    def _sources(self, select: Any) -> Iterator[tuple[str, frozenset[str] | None]]:
        from sqlglot import exp

        real = {id(ref): table for ref, table in self.refs.real}
        cte_of = self.refs.cte_of
        parts = [select.args.get("from_"), *(select.args.get("joins") or [])]
        for part in parts:
            source = part.this if part is not None else None
            if isinstance(source, exp.Table):
                if id(source) in real:
                    yield source.alias_or_name.lower(), frozenset(c.lower() for c in real[id(source)].columns)
                elif id(source) in cte_of:
                    yield source.alias_or_name.lower(), self.of(cte_of[id(source)])
            elif isinstance(source, exp.Subquery):
                yield source.alias.lower(), self.of(source)
