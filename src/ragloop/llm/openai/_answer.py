"""The answer judge over an OpenAI-compatible server: the streamed reply, with fenced, numbered context."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import openai
from attrs import define, field

from ragloop.errors import JudgeOutputError, JudgeTruncated
from ragloop.llm import prompts
from ragloop.llm.budget import DEFAULT_BUDGETS, DEFAULT_OUTPUT_TOKENS, CallBudget
from ragloop.llm.openai._call import ServerCompat, _cap, _Chat, _Meter, _positive, _stream_chunks
from ragloop.state import ContextBlock, Message, Outcome

__all__ = ["OpenAIAnswerer"]


@define
class OpenAIAnswerer:
    """Streams the reply, with an outcome-specific system prompt and fenced, numbered context.

    With ``outcome="direct"`` and a ``direct_reply`` from the decider, that reply is streamed as is (no call).

    Attributes:
        client: The ``openai.AsyncOpenAI`` client to call.
        model: Model name; use a capable one.
        timeout_s: Longest time for the whole stream (cut further by the turn's deadline); it also bounds
            each wait for the next chunk.
        max_history: How many earlier conversation messages to send.
        temperature: Sampling temperature; ``None`` leaves the server's default.
        max_tokens: Output cap (completion tokens); an answer that reaches it ends with
            :class:`~ragloop.errors.JudgeTruncated` after its text.
        budget: Share of the turn's remaining time the answer may use, and the reserve it leaves for the
            offline answerer.
        compat: What the server accepts (shared by the judges of one client).
    """

    client: openai.AsyncOpenAI
    model: str
    timeout_s: float = field(default=60.0, validator=_positive)
    max_history: int = 6
    temperature: float | None = 0.2
    max_tokens: int | None = field(default=DEFAULT_OUTPUT_TOKENS["answer"], validator=_cap)
    budget: CallBudget = field(factory=lambda: DEFAULT_BUDGETS["answer"])
    compat: ServerCompat = field(factory=ServerCompat)

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """Yield the reply's text as it streams. Claims cite blocks as ``[n]``.

        Leading whitespace is held back, so an answer with no text fails before its first token (and the node's
        fallback answers instead).

        Raises:
            JudgeError: the stream broke or ended early (after the tokens that did arrive).
            JudgeOutputError: a malformed stream chunk; no text at all; output withheld by a content filter.
            JudgeTruncated: the answer reached the output cap (after its text).
            JudgeTimeout: the stream ran past its budget, or a wait for a chunk past ``timeout_s``.
        """
        if outcome == "direct" and direct_reply:
            yield direct_reply
            return
        nonce = prompts.new_nonce()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": prompts.answer_system_prompt(outcome, nonce)},
            *prompts.history_messages(history, self.max_history),
            {"role": "user", "content": prompts.answer_user_prompt(question, blocks, outcome, missing, nonce)},
        ]
        chat = _Chat(
            self.client, self.model, self.timeout_s, self.temperature, self.max_tokens, self.budget, self.compat
        )
        with _Meter("answer", self.model) as meter:
            chunks = _stream_chunks(chat, "answer", messages, {}, meter)
            started = False
            finish: str | None = None
            try:
                async for chunk in chunks:
                    for choice in chunk.choices:
                        finish = choice.finish_reason or finish
                        text = choice.delta.content
                        if not text or not (started or text.strip()):
                            continue
                        started = True
                        yield text
            finally:
                await chunks.aclose()
            if not started:
                why = "withheld by a content filter" if finish == "content_filter" else "empty"
                raise JudgeOutputError(f"answer from model {self.model!r} was {why} (finish_reason={finish})")
            if finish == "content_filter":
                raise JudgeOutputError(f"answer from model {self.model!r} was cut by a content filter")
            if finish == "length":
                raise JudgeTruncated(
                    f"answer from model {self.model!r} stopped at the output cap ({self.max_tokens} tokens)"
                )
