"""The allowlisted schema as the SQL sources see it, a written statement, and the writer Protocol."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from attrs import field, frozen

Param = str | int | float | None


def typed_value(value: str, declared: str) -> Param:
    """A text value bound as an integer when its column is declared one (``"8"`` for an ``INTEGER`` key)."""
    text = str(value).strip()
    if declared.upper().startswith("INT") and re.fullmatch(r"-?\d+", text):
        return int(text)
    return value


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
        dialect: The SQL dialect (``sqlite`` or ``postgres``).
        namespace: The schema the tables live in (Postgres), named in every table the rewrite reads; ``""``: none.
    """

    tables: tuple[Table, ...]
    dialect: str = "sqlite"
    namespace: str = ""

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


def _via(value: Sequence[str]) -> tuple[str, ...]:
    via = tuple(value)
    if via and len(via) != 3:
        raise ValueError(f"via must be (table, key column, tenant column), got {via!r}")
    return via


@frozen
class TenantKey:
    """How the rows of one table name their tenant (the organisation a caller belongs to).

    ``TenantKey("name")``: the table's ``name`` column holds the tenant. ``TenantKey("customer_id", via=("customers",
    "id", "name"))``: ``customer_id`` holds a ``customers.id`` whose ``customers.name`` is the tenant. Neither column
    needs to be allowlisted.

    Attributes:
        column: The column of the table compared with the tenant (or with ``via``'s key).
        via: ``(table, key column, tenant column)`` when ``column`` is a key into another table; empty otherwise.
    """

    column: str
    via: tuple[str, ...] = field(default=(), converter=_via)

    def columns(self, table: str) -> dict[str, tuple[str, ...]]:
        """The columns this key reads, by table (``table`` is the scoped table itself)."""
        found: dict[str, tuple[str, ...]] = {table: (self.column,)}
        if self.via:
            other, key, column = self.via
            found[other] = (*found.get(other, ()), key, column)
        return found


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


def _allowed(value: Mapping[str, Sequence[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({k: tuple(v) for k, v in value.items()})
