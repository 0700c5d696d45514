"""The builder's edits of the default graph (insert, replace) and its check of the plan sources."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ragloop.errors import ConfigError, GraphError
from ragloop.llm.planner import OfflinePlanner, Planner
from ragloop.retrievers.base import Retriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.sources import DocumentSource, LiveLookupSource, Source
from ragloop.runner import END, Node

__all__ = ["check_plan_routes", "insert_node", "plan_table", "replace_node"]


def plan_table(
    retriever: Retriever, live: Sequence[LiveSource], added: Mapping[str, Source]
) -> dict[str, Source] | None:
    """The plan node's sources by name: the turn's search as ``documents``, the live sources, the sources
    added (one named ``documents`` replaces the turn's); ``None`` when none was added (the turn does not plan)."""
    if not added:
        return None
    sources: dict[str, Source] = {"documents": DocumentSource(retriever)}
    sources.update({s.name: LiveLookupSource(s) for s in live})
    sources.update(added)
    return sources


def check_plan_routes(sources: Mapping[str, Source], planner: Planner, fallback: Planner | None) -> None:
    """Refuse a document source that the turn's planners can never send a sub-query to.

    The offline planner (alone, with no model planner in front of it) plans documents only to its one document
    source (``documents``, the turn's own search), SQL to its schema source and ids to the live sources: a
    second :class:`~ragloop.retrievers.sources.DocumentSource` would be described to nobody and never searched.

    Raises:
        ConfigError: Which source, and the two ways to make it searched.
    """
    if not isinstance(planner, OfflinePlanner) or fallback is not None:
        return  # a model planner (or one of your own) reads every source's description
    unreachable = [n for n, s in sources.items() if isinstance(s, DocumentSource) and n != planner.documents]
    if unreachable:
        name = unreachable[0]
        raise ConfigError(
            f"the plan source {name!r} is a document source, but the offline planner sends document questions "
            f"only to {planner.documents!r}, so {name!r} would never be searched: join it to the turn's search "
            f"with Turn.add_retriever({name!r}, retriever) (every query then searches both), or give the turn "
            "a model planner (Judges.openai(..., plan_model=...)) that reads each source's description"
        )


def _known(nodes: Mapping[str, Node]) -> str:
    return ", ".join(nodes)


def insert_node(
    nodes: dict[str, Node], edges: dict[str, dict[str, str]], runs: dict[str, int], after: str, name: str, node: Node
) -> None:
    """Insert ``node`` after ``after``: it takes over the routes of ``after`` that it declares."""
    where = f"insert_after({after!r}, {name!r}, …)"
    if after not in nodes:
        raise GraphError(f"{where}: the turn has no node {after!r}; its nodes: {_known(nodes)}")
    if name in nodes or name == END:
        raise GraphError(f"{where}: the name {name!r} is taken; give the new node a name of its own")
    declared = tuple(getattr(node, "routes", None) or ())
    theirs = tuple(getattr(nodes[after], "routes", ()))
    if theirs == (END,):
        raise GraphError(f"{where}: {after!r} ends the turn; nothing runs after it (insert before it instead)")
    taken = [r for r in declared if r in theirs and r != END]
    if not taken:
        raise GraphError(
            f"{where}: the node would never run: it declares none of {after!r}'s routes ({', '.join(theirs)}); "
            f"declare the routes it takes over, e.g. routes = ({theirs[0]!r},)"
        )
    for route in taken:
        edges.setdefault(name, {})[route] = edges.get(after, {}).get(route, route)
        edges.setdefault(after, {})[route] = name
    nodes[name], runs[name] = node, runs.get(after, 1)


def replace_node(nodes: dict[str, Node], edges: dict[str, dict[str, str]], name: str, node: Node) -> None:
    """Put ``node`` in ``name``'s place; keep the old node's edges for the routes the new one declares."""
    if name not in nodes:
        raise GraphError(f"replace({name!r}, …): the turn has no node {name!r}; its nodes: {_known(nodes)}")
    declared = set(getattr(node, "routes", None) or ())
    if name in edges:
        edges[name] = {r: t for r, t in edges[name].items() if r in declared}
    nodes[name] = node
