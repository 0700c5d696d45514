"""The rewrite judge over an OpenAI-compatible server: one new query from another angle."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import openai
from attrs import define, field

from ragloop.errors import JudgeOutputError, JudgeTruncated
from ragloop.llm import prompts
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget
from ragloop.llm.guards import query_problem
from ragloop.llm.openai._call import ServerCompat, _cap, _Chat, _finish_reason, _normal, _positive

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIRewriter", "clean_query"]

_LABEL_PREFIX = re.compile(
    r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?(?:(?:new|rewritten|alternative|search)\s+)?(?:query|search)\s*[:：-]\s*",
    re.IGNORECASE,
)
_QUOTES = "\"'`“”‘’«»"


def clean_query(text: str) -> str:
    """The first non-blank line of a model reply, without list bullets, ``Query:`` labels or quotes."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _LABEL_PREFIX.sub("", line).strip()
    line = re.sub(r"^(?:[-*•]\s+|\d+[.)]\s+)", "", line).rstrip(". ")
    while len(line) >= 2 and line[0] in _QUOTES and line[-1] in _QUOTES:
        line = line[1:-1].strip()
    return line.strip(_QUOTES + " ").rstrip(".")


@define
class OpenAIRewriter:
    """Rewrites a failed query from a substantially different angle, built from the original question.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; a fast, cheap one is enough.
        timeout_s: Per-request timeout in seconds.
        temperature: Sampling temperature; a little above zero helps the new angle differ.
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    temperature: float | None = 0.3
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["rewrite"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["rewrite"])
    compat: ServerCompat = field(factory=ServerCompat)

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """Return one new query.

        Raises:
            JudgeOutputError: the reply is empty, cut at the output cap, not a usable query (too long,
                unprintable, markup or tool syntax: see :func:`~ragloop.llm.guards.query_problem`), or repeats
                a tried query.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        tried_all = list(dict.fromkeys([*tried, failed_query]))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.rewrite_system_prompt()},
            {"role": "user", "content": prompts.rewrite_user_prompt(question, failed_query, tried_all)},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        return await chat.complete("rewrite", messages, lambda c: self._query(c, tried_all))

    def _query(self, completion: ChatCompletion, tried: Sequence[str]) -> str:
        raw = completion.choices[0].message.content or ""
        if _finish_reason(completion) == "length":
            raise JudgeTruncated(
                f"rewriter: model {self.model!r} stopped at the output cap ({self.max_tokens} tokens): {raw[:80]!r}"
            )
        query = clean_query(raw)
        if not query:
            raise JudgeOutputError(f"rewriter: model {self.model!r} returned an empty query")
        problem = query_problem(query)
        if problem is not None:
            raise JudgeOutputError(f"rewriter: rejected {query[:80]!r}: {problem}")
        if _normal(query) in {_normal(q) for q in tried}:
            raise JudgeOutputError(f"rewriter: model {self.model!r} repeated an already tried query {query!r}")
        return query
