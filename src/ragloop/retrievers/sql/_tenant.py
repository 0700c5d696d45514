"""The rewrite that makes the allowlist and the tenant structural: every table reference becomes a sub-query.

Each reference to a real table, wherever it stands (``FROM``, a ``JOIN``, a ``WITH`` query, a sub-query in
``WHERE`` / ``SELECT`` / ``EXISTS`` / ``IN``, either side of a ``UNION``), is replaced by::

    (SELECT <allowlisted columns> FROM <table> AS ragloop_rows WHERE <tenant predicate>) AS <its alias>

so the rest of the statement can see only allowlisted columns, and of a tenant-scoped table only the caller's
rows: a self-join, a scalar sub-query or a second ``WITH`` query reads the same filtered rows as the first
reference. Every ``WITH`` query is renamed (``ragloop_cte_<n>``) and its references point at the new name, so no
``WITH`` query can stand in for a real table, nor a real table for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ragloop.errors import QueryRefused
from ragloop.retrievers.sql._schema import Param, SQLSchema, Table, TenantKey, typed_value
from ragloop.retrievers.sql._scope import References

#: A bound value's stand-in in the tree: a string literal the final pass turns back into a placeholder.
Marker = Callable[[Param], Any]
#: Extra conditions per table (lower-cased name): ``(column, values)`` pairs, each ``column IN (values)``.
Narrowing = Mapping[str, tuple[tuple[str, tuple[Param, ...]], ...]]


def scoped(
    refs: References,
    schema: SQLSchema,
    tenants: Mapping[str, TenantKey],
    tenant: str | None,
    mark: Marker,
    narrowing: Narrowing,
) -> None:
    """Rename the ``WITH`` queries and wrap every real table reference (in place), with the tenant predicate
    and ``narrowing``'s conditions of its table. QueryRefused (rule ``tenant``) when a tenant-scoped table is
    read and no tenant is given."""
    from sqlglot import exp

    scoped_tables = {name.lower(): key for name, key in tenants.items()}
    if tenant is None or not str(tenant).strip():
        hit = sorted({t.name for _, t in refs.real if t.name.lower() in scoped_tables})
        if hit:
            raise QueryRefused(
                f"refused (tenant): table {hit[0]!r} holds the rows of many organisations and this request names "
                "none; pass caller=Caller(tenant=...)"
            )
    names = {id(cte): f"ragloop_cte_{i}" for i, cte in enumerate(refs.ctes)}
    for cte in refs.ctes:
        cte.args["alias"].set("this", exp.to_identifier(names[id(cte)]))
    for ref, cte in refs.cte_refs:
        alias = ref.args.get("alias") or exp.TableAlias(this=ref.this.copy())
        ref.set("this", exp.to_identifier(names[id(cte)]))
        ref.set("alias", alias)
    for ref, table in refs.real:
        key = scoped_tables.get(table.name.lower())
        ref.replace(_wrapped(ref, table, key, tenant, schema, mark, narrowing.get(table.name.lower(), ())))


def _wrapped(
    ref: Any,
    table: Table,
    key: TenantKey | None,
    tenant: str | None,
    schema: SQLSchema,
    mark: Marker,
    conditions: tuple[tuple[str, tuple[Param, ...]], ...],
) -> Any:
    """``(SELECT <allowlisted columns> FROM table AS ragloop_rows [WHERE tenant AND …]) AS <alias>``."""
    from sqlglot import exp

    inner = _table(table.name, schema.namespace, "ragloop_rows")
    select = exp.select(*(exp.column(c, table="ragloop_rows", quoted=True) for c in table.columns)).from_(inner)
    if key is not None:
        select = select.where(_predicate(key, table, tenant, schema, mark))
    for column, values in conditions:
        select = select.where(exp.column(column, table="ragloop_rows", quoted=True).isin(*(mark(v) for v in values)))
    alias = ref.args.get("alias")
    alias = alias.copy() if alias is not None else exp.TableAlias(this=ref.this.copy())
    return exp.Subquery(this=select, alias=alias)


def _predicate(key: TenantKey, table: Table, tenant: str | None, schema: SQLSchema, mark: Marker) -> Any:
    from sqlglot import exp

    assert tenant is not None  # refused above otherwise
    column = exp.column(key.column, table="ragloop_rows", quoted=True)
    if not key.via:
        return column.eq(mark(typed_value(tenant, table.types.get(key.column, ""))))
    other, other_key, other_column = key.via
    known = schema.table(other)
    declared = known.types.get(other_column, "") if known is not None else ""
    lookup = (
        exp.select(exp.column(other_key, table="ragloop_tenant", quoted=True))
        .from_(_table(other, schema.namespace, "ragloop_tenant"))
        .where(exp.column(other_column, table="ragloop_tenant", quoted=True).eq(mark(typed_value(tenant, declared))))
    )
    return column.isin(query=lookup)


def _table(name: str, namespace: str, alias: str) -> Any:
    from sqlglot import exp

    return exp.Table(
        this=exp.to_identifier(name, quoted=True),
        db=exp.to_identifier(namespace, quoted=True) if namespace else None,
        alias=exp.TableAlias(this=exp.to_identifier(alias)),
    )


def check_tenants(tenants: Mapping[str, TenantKey], allow: Mapping[str, tuple[str, ...]], where: str) -> None:
    """ConfigError unless every tenant-scoped table is allowlisted (a scope on a table nobody reads is a typo)."""
    from ragloop.errors import ConfigError

    unknown = sorted(set(tenants) - set(allow))
    if unknown:
        raise ConfigError(f"{where}: tenants names {unknown}, which the allowlist does not; scope allowlisted tables")
