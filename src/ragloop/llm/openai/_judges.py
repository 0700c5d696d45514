"""The four OpenAI-compatible judges built together over one client (:class:`OpenAIJudges`)."""

from __future__ import annotations

from collections.abc import Mapping

import openai
from attrs import frozen

from ragloop.errors import ConfigError
from ragloop.llm.budget import DEFAULT_OUTPUT_TOKENS
from ragloop.llm.openai._answer import OpenAIAnswerer
from ragloop.llm.openai._call import ServerCompat
from ragloop.llm.openai._decide import DecideMode, OpenAIDecider
from ragloop.llm.openai._grade import OpenAIGrader
from ragloop.llm.openai._rewrite import OpenAIRewriter

__all__ = ["OpenAIJudges"]


@frozen
class OpenAIJudges:
    """The four OpenAI-compatible judges, sharing one client.

    Attributes:
        decider: Decide step (fast model).
        grader: Grade step (fast model).
        rewriter: Rewrite step (fast model).
        answerer: Answer step (capable model).
    """

    decider: OpenAIDecider
    grader: OpenAIGrader
    rewriter: OpenAIRewriter
    answerer: OpenAIAnswerer

    @classmethod
    def create(  # noqa: PLR0913 (keyword-only knobs of one builder)
        cls,
        client: openai.AsyncOpenAI,
        *,
        fast_model: str,
        answer_model: str,
        timeout_s: float = 20.0,
        answer_timeout_s: float | None = None,
        glossary: Mapping[str, str] | None = None,
        grade_max_chars: int = 2000,
        decide_mode: DecideMode = "auto",
        max_tokens: Mapping[str, int | None] | None = None,
    ) -> OpenAIJudges:
        """Build all four judges: ``fast_model`` decides, grades and rewrites; ``answer_model`` answers.

        Args:
            client: The ``openai.AsyncOpenAI`` client (built, configured and closed by the caller).
            fast_model: A cheap, fast model for decide, grade and rewrite.
            answer_model: A capable model for the streamed answer.
            timeout_s: Per-request timeout for decide, grade and rewrite.
            answer_timeout_s: Per-request timeout for answer (per chunk while streaming); default 3x
                ``timeout_s``.
            glossary: Abbreviation → expansion for the decider.
            grade_max_chars: Chunk text budget for the grader.
            decide_mode: ``auto``, ``tools`` or ``json`` (see :class:`OpenAIDecider`).
            max_tokens: Output caps by judge name (``decide``, ``grade``, ``rewrite``, ``answer``) over
                :data:`~ragloop.llm.budget.DEFAULT_OUTPUT_TOKENS`; ``None`` sends no cap for that judge.

        Raises:
            ConfigError: ``max_tokens`` names an unknown judge.
        """
        caps: dict[str, int | None] = dict(DEFAULT_OUTPUT_TOKENS)
        unknown = sorted(set(max_tokens or {}) - set(caps))
        if unknown:
            raise ConfigError(f"max_tokens names unknown judges {unknown}; known: {', '.join(sorted(caps))}")
        caps.update(max_tokens or {})
        compat = ServerCompat()
        return cls(
            decider=OpenAIDecider(
                client,
                fast_model,
                timeout_s=timeout_s,
                glossary=dict(glossary or {}),
                mode=decide_mode,
                max_tokens=caps["decide"],
                compat=compat,
            ),
            grader=OpenAIGrader(
                client,
                fast_model,
                timeout_s=timeout_s,
                max_chars=grade_max_chars,
                max_tokens=caps["grade"],
                compat=compat,
            ),
            rewriter=OpenAIRewriter(client, fast_model, timeout_s=timeout_s, max_tokens=caps["rewrite"], compat=compat),
            answerer=OpenAIAnswerer(
                client,
                answer_model,
                timeout_s=answer_timeout_s or 3 * timeout_s,
                max_tokens=caps["answer"],
                compat=compat,
            ),
        )
