"""Retrieval planners: the judgment seam that turns a question into a :class:`~ragloop.plan.Plan`.

A :class:`Planner` returns a plan, or ``None`` when the question needs no structured source (the turn then
goes to ``decide`` as it always did). :class:`OfflinePlanner` plans without a model:

1. **Decomposition.** The question is split into clauses (the offline decider's topic splitter).
2. **Routing.** A clause that names a database entity — a value of a many-valued text column (a customer's
   name, an order id), a key (``order 17``), or asks about a table (``which customers``, ``how many
   tickets``) — goes to the SQL source; the others go to the documents. No data clause: no plan.
3. **Bridge.** A document clause that points back at a data clause's answer (``that plan``, ``this error
   code``, ``their region``: a demonstrative followed by a column name) depends on the data clause, and the
   column's value fills the clause (``how much does {plan} plan cost``). A data clause about tickets also gets
   a live ticket lookup of the ids the SQL finds, when a live source of that name is configured.

The model planner lives in :mod:`ragloop.llm.openai` (``OpenAIPlanner``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attrs import define, field

from ragloop.plan import Plan, Slot, SubQuery
from ragloop.state import Message
from ragloop.usage import LLMCall, record_call

if TYPE_CHECKING:
    from ragloop.retrievers.sql import SQLSchema

__all__ = ["ENTITY_VALUES", "OfflinePlanner", "Planner", "SchemaSource"]


@runtime_checkable
class Planner(Protocol):
    """Plans retrieval for a question across the configured sources."""

    @property
    def name(self) -> str:
        """Recorded as the plan's author (``offline``, or the model name)."""
        ...

    async def plan(self, question: str, history: Sequence[Message]) -> Plan | None:
        """A plan, or ``None`` when no structured source is needed (the decide route handles it)."""
        ...


@runtime_checkable
class SchemaSource(Protocol):
    """A source that can describe its schema (the SQL source)."""

    name: str

    async def schema(self) -> SQLSchema:
        """The allowlisted schema."""
        ...


_ASKS = re.compile(r"\b(?:which|list|show|how many|number of|count)\b", re.IGNORECASE)
_REFERENT = re.compile(r"\b(?:that|this|those|these|their|its|the same)\s+([a-z]+(?:\s+[a-z]+)?)", re.IGNORECASE)
#: A text column with more distinct values than this names entities (customers, orders), not categories.
ENTITY_VALUES = 12


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _has(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE) is not None


@define
class OfflinePlanner:
    """Plans with rules: clauses naming database entities go to SQL, the rest to documents, bridged by slots.

    Attributes:
        sql: The SQL source (its schema is read on first use); ``None``: never plans (returns ``None``).
        documents: Name of the document source.
        live: Names of live sources that can look up the ids of a table's rows (``tickets``), keyed by table.
        name: Recorded as the planner.
    """

    sql: SchemaSource | None = None
    documents: str = "documents"
    live: dict[str, str] = field(factory=dict)
    name: str = "offline"

    async def plan(self, question: str, history: Sequence[Message] = ()) -> Plan | None:
        """A plan when some clause needs the database, else ``None``."""
        started = time.perf_counter()
        if self.sql is None:
            return None
        schema = await self.sql.schema()
        result = self.plan_sync(question, schema)
        record_call(LLMCall(judge="plan", model="offline", seconds=time.perf_counter() - started))
        return result

    def plan_sync(self, question: str, schema: SQLSchema) -> Plan | None:
        """Synchronous :meth:`plan` over a known schema."""
        from ragloop.llm.offline.decide import split_topics

        assert self.sql is not None
        clauses = [" ".join(c.split()) for c in split_topics(question) if c.strip()]
        data = [self._is_data(c, schema) for c in clauses]
        if not any(data):
            return None
        columns = {c.lower() for t in schema.tables for c in t.columns}
        subs: list[SubQuery] = []
        last_sql: str | None = None
        n_sql = n_docs = 0
        for clause, is_data in zip(clauses, data, strict=True):
            if is_data:
                n_sql += 1
                last_sql = f"sql{n_sql}"
                subs.append(SubQuery(last_sql, self.sql.name, clause, purpose="look the facts up in the database"))
                for table, source in self.live.items():
                    if _has(clause, table) or _has(clause, _singular(table)):
                        key = next((t.key for t in schema.tables if t.name == table and t.key), "")
                        if key:
                            subs.append(
                                SubQuery(
                                    f"{source}{n_sql}",
                                    source,
                                    f"{table} found by {last_sql}",
                                    filters={"ids": "{ids}"},
                                    depends_on=(last_sql,),
                                    purpose=f"read the {table} the database names",
                                    slots=(Slot("ids", last_sql, key),),
                                )
                            )
                continue
            n_docs += 1
            query, slot = self._bridge(clause, columns)
            if slot is not None and last_sql is not None:
                subs.append(
                    SubQuery(
                        f"docs{n_docs}",
                        self.documents,
                        query,
                        depends_on=(last_sql,),
                        purpose=f"explain using the {slot} the database returned",
                        slots=(Slot(slot, last_sql, slot),),
                    )
                )
            else:
                subs.append(SubQuery(f"docs{n_docs}", self.documents, clause, purpose="search the help center"))
        deps = any(q.depends_on for q in subs)
        intent = "database facts, then the documents about them" if deps else "database facts and documents"
        notes = "cite rows for facts about customers, orders and tickets; passages for how things work"
        return Plan(tuple(subs), intent=intent, notes=notes)

    def _is_data(self, clause: str, schema: SQLSchema) -> bool:
        for t in schema.tables:
            if _ASKS.search(clause) and (_has(clause, t.name) or _has(clause, _singular(t.name))):
                return True
            # An id of a table a live source serves (ticket #1234) is the live node's job, as before.
            int_key = bool(t.key) and t.types.get(t.key, "").startswith("INT") and t.name not in self.live
            if int_key and re.search(rf"\b{re.escape(_singular(t.name))}\s*(?:id\s*)?#?\s*\d+\b", clause, re.I):
                return True
            entities = [v for c, vs in t.values.items() if c == t.key or len(vs) > ENTITY_VALUES for v in vs]
            if any(len(v) >= 3 and _has(clause, v) for v in entities):
                return True
        return False

    def _bridge(self, clause: str, columns: set[str]) -> tuple[str, str | None]:
        """The clause with its back-reference replaced by a slot (``that plan`` → ``{plan} plan``), and the
        slot's column; the clause unchanged and ``None`` when it points at no column."""
        for m in _REFERENT.finditer(clause):
            words = m.group(1).lower().split()
            for candidate in ("_".join(words), words[0], _singular(words[0])):
                if candidate in columns:
                    phrase = " ".join(words) if candidate == "_".join(words) else words[0]
                    start = m.start()
                    end = m.start(1) + len(phrase)
                    return f"{clause[:start]}{{{candidate}}} {phrase}{clause[end:]}", candidate
        return clause, None
