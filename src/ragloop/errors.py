"""Errors raised by ragloop.

Every error derives from :class:`RagloopError`, and every message says what to do about it::

    RagloopError
    ├── GraphError            a graph is wired wrong (unknown start/finish/route names)
    │   └── RouteError        a node returned a name it did not declare in ``routes``
    ├── ConfigError           bad constructor arguments or settings
    ├── InputError            a question, history or page context the caller passed is unusable
    ├── IndexError_           an index directory is missing, corrupt or built with another embedder
    ├── RetrievalError        a retriever or embedder failed
    ├── LiveSourceError       a live source (ticket system, catalogue, …) failed
    └── JudgeError            an LLM or offline judge failed; nodes fail open on it
        ├── JudgeTimeout      the call ran past its timeout (after the SDK's retries)
        └── JudgeOutputError  the model's output could not be parsed (bad JSON, bad tool arguments)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "GraphError",
    "IndexError_",
    "InputError",
    "JudgeError",
    "JudgeOutputError",
    "JudgeTimeout",
    "LiveSourceError",
    "RagloopError",
    "RetrievalError",
    "RouteError",
]


class RagloopError(Exception):
    """Root of every error ragloop raises on purpose."""


class GraphError(RagloopError):
    """A graph is wired wrong: an unknown start, finish or route name."""


class RouteError(GraphError):
    """A node returned a next-node name it did not declare in its ``routes``."""


class ConfigError(RagloopError):
    """Bad constructor arguments or settings."""


class InputError(RagloopError, ValueError):
    """A question, history or page context the caller passed is unusable."""


class IndexError_(RagloopError):
    """An index directory is missing, corrupt, or was built with a different embedder."""


class RetrievalError(RagloopError):
    """A retriever or embedder failed."""


class LiveSourceError(RagloopError):
    """A live source (ticket system, module catalogue, …) failed."""


class JudgeError(RagloopError):
    """A judge (LLM or offline) failed. Nodes fail open on this error."""


class JudgeTimeout(JudgeError):
    """A judge call ran past its timeout, after the client's retries."""


class JudgeOutputError(JudgeError):
    """A judge's output could not be parsed: malformed JSON or tool-call arguments, empty choices."""
