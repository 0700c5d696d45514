"""ragloop: a tiny graph runner and a default chat-turn graph for agentic retrieval-augmented generation.

The runner (:class:`Graph`) knows nothing about RAG; the chat-turn graph is built from it. Heavy parts
(numpy, faiss, openai, onnxruntime) load only when first used, so ``import ragloop`` stays fast.
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
    "ChatRAG": "ragloop.chat",
    "Reply": "ragloop.chat",
    "ReplyReady": "ragloop.chat",
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
    "ChatRAG",
    "ConfigError",
    "Correction",
    "Event",
    "Graph",
    "GraphError",
    "IndexError_",
    "InputError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeTimeout",
    "LiveSourceError",
    "Node",
    "NodeFinished",
    "NodeStarted",
    "Progress",
    "RagloopError",
    "Reply",
    "ReplyReady",
    "RetrievalError",
    "RouteError",
    "RunFinished",
    "RunResult",
    "Step",
    "Token",
    "TurnRecord",
    "TurnSettings",
    "TurnState",
    "emit",
]

__version__ = "0.1.0"
