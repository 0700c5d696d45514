"""Draw a graph's declared routes as a Mermaid flowchart (what :meth:`ragloop.runner.Graph.to_mermaid` returns).

Kept out of the runner so the runner stays small; it takes plain names, so it imports nothing of ragloop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["flowchart"]


def flowchart(start: str, routes: Mapping[str, Iterable[str]], *, end: str = "END") -> str:
    """A ``flowchart TD`` with the start, then each node's routes in sorted order.

    Args:
        start: The first node's name.
        routes: Node name → the names it may return, in the order the nodes should be drawn.
        end: The name that ends a run (drawn as ``END([end])``).
    """
    lines = ["flowchart TD", f"    START([start]) --> {start}"]
    for name, targets in routes.items():
        lines += [f"    {name} --> {'END([end])' if t == end else t}" for t in sorted(targets)]
    return "\n".join(lines)
