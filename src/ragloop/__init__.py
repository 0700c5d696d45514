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
from ragloop.events import Event, NodeFinished, NodeStarted, Progress, RunFinished, Token
from ragloop.runner import END, Graph, Node, RunResult, Step, emit

__all__ = [
    "END",
    "ConfigError",
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
    "RetrievalError",
    "RouteError",
    "RunFinished",
    "RunResult",
    "Step",
    "Token",
    "emit",
]

__version__ = "0.1.0"
