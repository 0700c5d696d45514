"""The default chat turn, assembled in one place: its settings, judges, builder, graph and decision record.

``[plan →] decide → retrieve → grade → live → rewrite → retrieve … → answer``. :class:`Turn` builds it from a
retriever and its :class:`Judges` (or from an index, a Postgres store or the sample), lets you insert, replace
and add (``insert_after``, ``replace``, ``add_source``) and validates it once into a :class:`BuiltTurn` whose
graph cannot change; ``ChatRAG(turn.build())`` runs it. The edges live in ``ragloop.policy.EDGES``; the extension
contract (what a node, a retriever or a judge must be) is :mod:`ragloop.extend`.

Its names are imported from here; the modules behind them are private: ``_settings`` (:class:`TurnSettings`),
``_judges`` (:class:`Judges`), ``_builder`` (:class:`Turn`, :class:`BuiltTurn`), ``_options`` (the
constructors' keywords), ``_wiring`` (:func:`default_nodes`, :func:`build_graph`) and ``_record``
(:class:`TurnRecord` and :func:`turn_record`). One module is public: ``request`` (what a turn starts from:
:func:`~ragloop.turn.request.turn_state`).
"""

from __future__ import annotations

from ragloop.turn._builder import BuiltTurn, Turn
from ragloop.turn._judges import Judges, PlanModel
from ragloop.turn._options import IndexOptions, RetrieverOptions, StoreOptions, TurnWiring
from ragloop.turn._record import (
    CallRecord,
    DecisionRecord,
    GradeRecord,
    QueryRecord,
    TokenCounts,
    TurnRecord,
    turn_record,
)
from ragloop.turn._settings import TurnSettings
from ragloop.turn._wiring import build_graph, default_nodes

__all__ = [
    "BuiltTurn",
    "CallRecord",
    "DecisionRecord",
    "GradeRecord",
    "IndexOptions",
    "Judges",
    "PlanModel",
    "QueryRecord",
    "RetrieverOptions",
    "StoreOptions",
    "TokenCounts",
    "Turn",
    "TurnRecord",
    "TurnSettings",
    "TurnWiring",
    "build_graph",
    "default_nodes",
    "turn_record",
]
