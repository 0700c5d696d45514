"""The values that flow through a chat turn, and the turn state itself.

Read its modules in order (``_values``, ``_records``, ``_turn``) to follow a turn: the caller's
:class:`Message` history and :class:`PageContext` → decide's :class:`Decision` → retrieval :class:`Hit` s (with
provenance) → grader :class:`Verdict` s → numbered :class:`ContextBlock` s → the :data:`Outcome` and the streamed
answer.

Values are frozen attrs classes (tuples, not lists); :class:`TurnState` is the one mutable object a turn
shares between nodes. Each of its fields says which node writes it.
"""

from __future__ import annotations

from ragloop.state._records import (
    Abstention,
    Citation,
    CitedSection,
    HopAttempt,
    LiveLookup,
    PromptCuts,
    RewriteAttempt,
    StaleSource,
    Verification,
)
from ragloop.state._turn import TurnState
from ragloop.state._values import (
    Caller,
    Chunk,
    ContextBlock,
    Decision,
    Graded,
    Hit,
    Label,
    Message,
    Outcome,
    PageContext,
    QueryState,
    QueryStatus,
    Verdict,
)

__all__ = [
    "Abstention",
    "Caller",
    "Chunk",
    "Citation",
    "CitedSection",
    "ContextBlock",
    "Decision",
    "Graded",
    "Hit",
    "HopAttempt",
    "Label",
    "LiveLookup",
    "Message",
    "Outcome",
    "PageContext",
    "PromptCuts",
    "QueryState",
    "QueryStatus",
    "RewriteAttempt",
    "StaleSource",
    "TurnState",
    "Verdict",
    "Verification",
]
