"""The grade judge over an OpenAI-compatible server: one passage, or all of a query's passages in one call."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import openai
from attrs import define, field

from ragloop.errors import JudgeError, JudgeOutputError, JudgeTruncated
from ragloop.llm import batch_grade, prompts
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget
from ragloop.llm.guards import model_json
from ragloop.llm.openai._call import ServerCompat, _cap, _Chat, _finish_reason, _message, _positive
from ragloop.state import ContextBlock, Hit, Label, Verdict

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion

__all__ = ["OpenAIGrader", "parse_verdict"]

_LABELS: tuple[Label, ...] = ("relevant", "partial", "irrelevant")


def parse_verdict(content: str) -> Verdict:
    """Parse the grader's JSON reply into a :class:`Verdict`.

    Raises:
        JudgeOutputError: not a JSON object, or ``label`` is not relevant, partial or irrelevant.
    """
    text = content.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        obj = model_json(text)
    except ValueError as exc:
        raise JudgeOutputError(f"grader reply is not JSON: {content[:200]!r}") from exc
    label = obj.get("label") if isinstance(obj, dict) else None
    label = label.strip().lower() if isinstance(label, str) else label
    if label not in _LABELS:
        raise JudgeOutputError(
            f"grader reply has no valid label (expected relevant, partial or irrelevant): {content[:200]!r}"
        )
    reason = obj.get("reason", "")
    return Verdict(label=label, reason=reason if isinstance(reason, str) else str(reason))


def _json_schema_unsupported(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 404, 415, 422, 501):
        return False
    text = _message(exc).lower()
    return any(word in text for word in ("response_format", "json_schema", "unsupported", "not supported"))


@define
class OpenAIGrader:
    """Grades one chunk with structured output (``json_schema``), falling back to JSON mode when unsupported.

    The first time the server rejects ``json_schema`` (HTTP 400/422 naming it), the grader retries that call
    with ``{"type": "json_object"}`` and keeps using JSON mode from then on.

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; a fast, cheap one is enough.
        timeout_s: Per-request timeout in seconds.
        max_chars: Chunk text is cut to this many characters before grading.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        max_tokens: Output cap of one call (completion tokens).
        budget: Share of the turn's remaining time a call may use, and the reserve it leaves.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=15.0, validator=_positive)
    max_chars: int = field(default=2000, validator=_positive)
    temperature: float | None = 0.0
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["grade"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["grade"])
    compat: ServerCompat = field(factory=ServerCompat)
    _json_schema: bool = field(default=True, init=False)

    @property
    def uses_json_schema(self) -> bool:
        """False once the server has rejected ``json_schema`` and the grader fell back to JSON mode."""
        return self._json_schema

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Label ``hit`` for ``query``.

        Raises:
            JudgeOutputError: the reply is not a valid verdict.
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        nonce = prompts.new_nonce()
        block = ContextBlock(
            n=1,
            text=prompts.truncate(hit.text, self.max_chars),
            source=hit.chunk.source,
            title=hit.chunk.title,
            chunk_id=hit.id,
            query=query,
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.grade_system_prompt(nonce, self.max_chars)},
            {"role": "user", "content": prompts.grade_user_prompt(query, prompts.fence_blocks([block], nonce))},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        if self._json_schema:
            try:
                return await chat.complete(
                    "grade", messages, _verdict_of, response_format=dict(prompts.GRADE_RESPONSE_FORMAT)
                )
            except JudgeError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, openai.APIStatusError) and _json_schema_unsupported(cause)):
                    raise
                self._json_schema = False
        return await chat.complete("grade", messages, _verdict_of, response_format={"type": "json_object"})

    async def grade_batch(self, query: str, hits: Sequence[Hit]) -> list[Verdict | None]:
        """Label all of ``query``'s hits in one call (:mod:`ragloop.llm.batch_grade`): one verdict per hit, in
        order, ``None`` where the reply has no valid verdict for it (the node fails open for that hit alone).

        The output cap is ``max_tokens`` per hit; each hit's text is cut to ``max_chars``.

        Raises:
            JudgeOutputError: the reply holds no valid verdict at all (JudgeTruncated when cut at the cap).
            JudgeTimeout: the request timed out.
            JudgeError: the server failed after the client's retries.
        """
        if not hits:
            return []
        nonce, n = prompts.new_nonce(), len(hits)
        fenced = prompts.fence_blocks(batch_grade.batch_blocks(query, hits, self.max_chars), nonce)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": batch_grade.batch_system_prompt(nonce, self.max_chars, n)},
            {"role": "user", "content": batch_grade.batch_user_prompt(query, fenced)},
        ]
        cap = None if self.max_tokens is None else self.max_tokens * n
        chat = _Chat(self.client, self.model, self.timeout_s, self.temperature, cap, self.budget, self.compat)

        def parse(completion: ChatCompletion) -> list[Verdict | None]:
            message = completion.choices[0].message
            if message.content is None:
                refusal = getattr(message, "refusal", None)
                raise JudgeOutputError(
                    f"batch grader reply has no content{f' (refusal: {refusal!r})' if refusal else ''}"
                )
            try:
                return batch_grade.parse_verdicts(message.content, n)
            except JudgeOutputError as exc:
                if _finish_reason(completion) == "length":
                    raise JudgeTruncated(f"batch grader reply stopped at the output cap: {exc}") from exc
                raise

        if self._json_schema:
            try:
                fmt = batch_grade.batch_response_format(n)
                return await chat.complete("grade", messages, parse, response_format=fmt)
            except JudgeError as exc:
                cause = exc.__cause__
                if not (isinstance(cause, openai.APIStatusError) and _json_schema_unsupported(cause)):
                    raise
                self._json_schema = False
        return await chat.complete("grade", messages, parse, response_format={"type": "json_object"})


def _verdict_of(completion: ChatCompletion) -> Verdict:
    message = completion.choices[0].message
    if message.content is None:
        refusal = getattr(message, "refusal", None)
        raise JudgeOutputError(f"grader reply has no content{f' (refusal: {refusal!r})' if refusal else ''}")
    try:
        return parse_verdict(message.content)
    except JudgeOutputError as exc:
        if _finish_reason(completion) == "length":
            raise JudgeTruncated(f"grader reply stopped at the output cap: {exc}") from exc
        raise
