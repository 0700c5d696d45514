"""The four judgment seams of a chat turn.

Nodes own the orchestration (parallelism, fail-open, attempt tracking); judges only judge. Each Protocol
has an OpenAI-compatible implementation (:mod:`ragloop.llm.openai`) and an offline one
(:mod:`ragloop.llm.offline`). Judges raise :class:`~ragloop.errors.JudgeError` (or a subclass) on failure;
nodes decide what a failure means (the grade node fails open, for example).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from ragloop.state import ContextBlock, Decision, Hit, Message, Outcome, PageContext, Verdict

__all__ = ["Answerer", "BatchGrader", "Bridger", "Decider", "Grader", "Rewriter"]


@runtime_checkable
class Decider(Protocol):
    """Decides whether a question needs a search, and with which standalone queries."""

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Return a direct reply, or one standalone query per topic of the question."""
        ...


@runtime_checkable
class Grader(Protocol):
    """Grades one retrieved chunk against the query that found it."""

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Return ``relevant``, ``partial`` or ``irrelevant`` with a short reason."""
        ...


@runtime_checkable
class BatchGrader(Protocol):
    """Grades all of one query's chunks in one judgment (one model call instead of one per chunk)."""

    async def grade_batch(self, query: str, hits: Sequence[Hit]) -> Sequence[Verdict | None]:
        """One verdict per hit, in order; ``None`` where the judge gave no valid verdict for that hit."""
        ...


@runtime_checkable
class Rewriter(Protocol):
    """Rewrites a failed query from a substantially different angle."""

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """Return a new query built from the original question that repeats none of ``tried``."""
        ...


@runtime_checkable
class Bridger(Protocol):
    """Proposes a second-hop query when the relevant context leaves part of the question unanswered."""

    async def follow_up(self, question: str, found: Sequence[str], tried: Sequence[str]) -> str | None:
        """A follow-up query built from ``found`` (relevant passages), or ``None`` when none is needed."""
        ...


@runtime_checkable
class Answerer(Protocol):
    """Writes the reply, streamed token by token."""

    def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """Stream the reply. Claims cite blocks as ``[n]``; ``missing`` lists unanswered queries."""
        ...
