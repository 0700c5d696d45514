"""ragloop: a tiny graph runner and a default chat-turn graph for agentic retrieval-augmented generation.

The runner (:class:`~ragloop.runner.Graph`) knows nothing about RAG; the chat turn is built from it by
:class:`~ragloop.turn.Turn` (see :mod:`ragloop.turn`) and run by :class:`~ragloop.chat.ChatRAG`; what a
node, retriever, source or judge of your own must be is :mod:`ragloop.extend`. Heavy parts (numpy, faiss,
openai, onnxruntime) load only when first used, so ``import ragloop`` stays fast.
"""

from __future__ import annotations

from ragloop.errors import (
    ConfigError,
    GraphError,
    IndexError_,
    InputError,
    JudgeError,
    JudgeOutputError,
    JudgeTimeout,
    LiveSourceError,
    RagloopError,
    RetrievalError,
    RouteError,
)
from ragloop.events import Correction, Event, NodeFinished, NodeStarted, Progress, RunFinished, Token
from ragloop.runner import END, Graph, Node, RunResult, Step, emit

# The chat-turn API pulls in numpy, the judges and the retrievers: load it on first use.
_LAZY = {
    "BuiltTurn": "ragloop.turn",
    "ChatRAG": "ragloop.chat",
    "Chunk": "ragloop.extend",
    "Embedder": "ragloop.extend",
    "Hit": "ragloop.extend",
    "Judges": "ragloop.turn",
    "LiveSource": "ragloop.extend",
    "Reply": "ragloop.chat",
    "ReplyReady": "ragloop.chat",
    "Retriever": "ragloop.extend",
    "Turn": "ragloop.turn",
    "TurnRecord": "ragloop.turn",
    "TurnSettings": "ragloop.turn",
    "TurnState": "ragloop.state",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ragloop' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "END",
    "BuiltTurn",
    "ChatRAG",
    "Chunk",
    "ConfigError",
    "Correction",
    "Embedder",
    "Event",
    "Graph",
    "GraphError",
    "Hit",
    "IndexError_",
    "InputError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeTimeout",
    "Judges",
    "LiveSource",
    "LiveSourceError",
    "Node",
    "NodeFinished",
    "NodeStarted",
    "Progress",
    "RagloopError",
    "Reply",
    "ReplyReady",
    "RetrievalError",
    "Retriever",
    "RouteError",
    "RunFinished",
    "RunResult",
    "Step",
    "Token",
    "Turn",
    "TurnRecord",
    "TurnSettings",
    "TurnState",
    "emit",
]

__version__ = "0.1.0"
