"""The default chat turn: its settings, its nodes, its graph and its decision record.

``decide → retrieve → grade → live → rewrite → retrieve … → answer``; any node or judge can be swapped by
building the nodes yourself and passing them to :class:`ragloop.Graph` (see :func:`default_nodes`).
"""

from __future__ import annotations

from ragloop.turn.record import (
    CallRecord,
    DecisionRecord,
    GradeRecord,
    QueryRecord,
    TokenCounts,
    TurnRecord,
    turn_record,
)
from ragloop.turn.settings import TurnSettings
from ragloop.turn.wiring import build_graph, default_nodes

__all__ = [
    "CallRecord",
    "DecisionRecord",
    "GradeRecord",
    "QueryRecord",
    "TokenCounts",
    "TurnRecord",
    "TurnSettings",
    "build_graph",
    "default_nodes",
    "turn_record",
]
