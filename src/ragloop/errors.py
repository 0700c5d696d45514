"""Errors raised by ragloop.

Every error derives from :class:`RagloopError`, and every message says what to do about it::

    RagloopError
    ├── GraphError            a graph is wired wrong (unknown start/finish/route names)
    │   └── RouteError        a node returned a name it did not declare in ``routes``
    ├── ConfigError           bad constructor arguments or settings
    ├── InputError            a question, history or page context the caller passed is unusable
    │   └── UnknownFilterKey  a filter names a metadata key that no indexed chunk has
    ├── IndexError_           an index directory is missing, corrupt or built with another embedder
    ├── PruneRefused          an index run would remove more of its scope than it may without ``prune``
    ├── RetrievalError        a retriever or embedder failed
    │   ├── StoreUnavailable  the knowledge store's database cannot be reached (down, refused, unreachable)
    │   └── StoreBusy         the store's database answers, but no connection to it came within the deadline
    ├── LiveSourceError       a live source (ticket system, catalogue, …) failed
    ├── PlanError             a retrieval plan is invalid (unknown source, cycle, dangling dependency, …)
    ├── SourceError           a plan source (documents, SQL, live) failed
    │   └── QueryRefused      a generated query was refused before it ran (a write, another table, …)
    ├── TurnLogError          the turn log could not be read or written (feedback, ``ragloop gaps``)
    └── JudgeError            an LLM or offline judge failed; nodes fail open on it
        ├── JudgeTimeout      the call ran past its timeout (after the SDK's retries)
        └── JudgeOutputError  the model's output could not be parsed (bad JSON, bad tool arguments)
            ├── JudgeTruncated the output stopped at the output cap (finish_reason "length")
            └── ToolsDropped  a question that needs a search answered in plain text: the tools were dropped
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
    "JudgeTruncated",
    "LiveSourceError",
    "PlanError",
    "PruneRefused",
    "QueryRefused",
    "RagloopError",
    "RetrievalError",
    "RouteError",
    "SourceError",
    "StoreBusy",
    "StoreUnavailable",
    "ToolsDropped",
    "TurnLogError",
    "UnknownFilterKey",
    "error_text",
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


class UnknownFilterKey(InputError):
    """A filter names a metadata key that no indexed chunk has (a misspelling): the message lists the known keys.

    A known key with a value no chunk has is not an error; it matches nothing.
    """


class IndexError_(RagloopError):
    """An index directory is missing, corrupt, or was built with a different embedder."""


class PruneRefused(RagloopError):
    """An index run would remove more than its allowed share of its scope's documents; nothing was changed.

    Check the folder (a wrong path looks like a mass deletion), preview with a dry run, then allow the removal
    (``--prune`` on the command line, ``prune=True`` in Python).
    """


class RetrievalError(RagloopError):
    """A retriever or embedder failed."""


class StoreUnavailable(RetrievalError):
    """The knowledge store's database cannot be reached: it is down, refuses connections or does not answer.

    Distinct from a search that merely failed or ran past its timeout: a service should answer it with "the
    knowledge base is unavailable" (HTTP 503), never with "found nothing".
    """


class StoreBusy(RetrievalError):
    """The knowledge store's database answers, but no connection to it came free within the caller's deadline.

    Every pooled connection was in use (or the server refused one more: its connection limit is reached) for as
    long as the search could wait. Not an outage: a service should answer it with "the knowledge base is busy,
    retry shortly" (HTTP 503 with ``Retry-After``), never with "unavailable" or "found nothing". Raise the pool
    size (``pool_size``, ``--pool-size``), add database capacity, or send fewer turns at once.

    Args:
        message: What was busy and what to do.
        queued: The call waited for a connection and got none (it never ran a statement): trying again later
            costs the server nothing. ``False``: a statement ran past its timeout.
    """

    def __init__(self, message: str, *, queued: bool = True) -> None:
        super().__init__(message)
        self.queued = queued


class LiveSourceError(RagloopError):
    """A live source (ticket system, module catalogue, …) failed."""


class PlanError(RagloopError):
    """A retrieval plan is invalid; the message lists every problem found."""


class SourceError(RagloopError):
    """A plan source (document search, SQL database, live source) failed."""


class QueryRefused(SourceError):
    """A generated query was refused before it ran; the message says which rule it broke."""


class TurnLogError(RagloopError):
    """The turn log could not be read or written (a turn never fails on it: only feedback and reports do)."""


class JudgeError(RagloopError):
    """A judge (LLM or offline) failed. Nodes fail open on this error."""


class JudgeTimeout(JudgeError):
    """A judge call ran past its timeout, after the client's retries."""


class JudgeOutputError(JudgeError):
    """A judge's output could not be parsed: malformed JSON or tool-call arguments, empty choices."""


class JudgeTruncated(JudgeOutputError):
    """A judge's output stopped at its output cap (``finish_reason="length"``); what arrived may be incomplete."""


class ToolsDropped(JudgeOutputError):
    """The model answered a question that needs a search in plain text although the ``search`` tool was
    offered: the server probably dropped the tools (a chat template without tool support)."""


_SILENT = {"TimeoutError": "timed out", "CancelledError": "cancelled", "Cancelled": "cancelled"}


def error_text(exc: BaseException, max_chars: int = 300) -> str:
    """``exc`` as the decision record shows it: ``Type: short message``, on one line and at most ``max_chars``.

    A group holding one exception is unwrapped (a task group around one failing call); an exception without a
    message says what it is (``TimeoutError: timed out``) rather than ``TimeoutError: ``.
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    name = type(exc).__name__
    message = " ".join(str(exc).split()) or _SILENT.get(name, "(no message)")
    if len(message) > max_chars:
        message = message[: max_chars - 1].rstrip() + "…"
    return f"{name}: {message}"
