"""Prompt budgets: how many tokens of context blocks and of conversation history the answer prompt may carry.

:meth:`PromptBudget.fit` keeps the context blocks in rank order while they fit (each block counted with its
fence markers, title and source; blocks are cut whole, never mid-text, and the first is always kept) and the
most recent history messages while they fit (dropped oldest first; when any were dropped, a short note at the
head of the history tells the model so). What it cut is a :class:`~ragloop.state.PromptCuts`, which the turn's
decision record carries. Tokens are counted by a :class:`~ragloop.text.tokens.TokenCounter`: the model's own
tokenizer when the application passes it, the calibrated character estimate otherwise. Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import field, frozen

from ragloop.state import ContextBlock, Message, PromptCuts
from ragloop.text.tokens import CharEstimate, TokenCounter

__all__ = ["BLOCK_OVERHEAD_TOKENS", "PromptBudget", "history_note"]

#: Tokens a block's fence markers (two lines with id, nonce, source and title) add beyond its text: measured
#: with SmolLM2's tokenizer on the sample's answer prompts, about 30.
BLOCK_OVERHEAD_TOKENS = 30


def history_note(dropped: int) -> Message:
    """The note that stands in for ``dropped`` earlier messages."""
    noun = "message" if dropped == 1 else "messages"
    return Message(
        role="user",
        content=f"(Note: the {dropped} earliest {noun} of this conversation were left out to fit the prompt budget.)",
    )


def _non_negative(instance: object, attribute: object, value: int | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"PromptBudget: token budgets must be >= 0 (or None), got {value!r}")


@frozen
class PromptBudget:
    """Token budgets of the answer prompt.

    Attributes:
        context_tokens: Most tokens of context blocks (``None``: no limit).
        history_tokens: Most tokens of earlier conversation messages (``None``: no limit).
        counter: How tokens are counted.
    """

    context_tokens: int | None = field(default=4000, validator=_non_negative)
    history_tokens: int | None = field(default=1500, validator=_non_negative)
    counter: TokenCounter = field(factory=CharEstimate, eq=False)

    def block_tokens(self, block: ContextBlock) -> int:
        """Tokens one block takes in the prompt: its text, title and source, and the fence markers."""
        return self.counter.count(block.text) + self.counter.count(block.title + block.source) + BLOCK_OVERHEAD_TOKENS

    def fit(
        self, blocks: Sequence[ContextBlock], history: Sequence[Message]
    ) -> tuple[tuple[ContextBlock, ...], tuple[Message, ...], PromptCuts]:
        """The blocks and history that fit, and what was cut."""
        kept_blocks: list[ContextBlock] = []
        used = 0
        for block in blocks:
            cost = self.block_tokens(block)
            if kept_blocks and self.context_tokens is not None and used + cost > self.context_tokens:
                break
            kept_blocks.append(block)
            used += cost
        cut_blocks = tuple(b.chunk_id or str(b.n) for b in blocks[len(kept_blocks) :])
        kept_history: list[Message] = []
        history_used = 0
        for message in reversed(history):
            cost = self.counter.count(message.content) + 4  # role and message framing
            if self.history_tokens is not None and history_used + cost > self.history_tokens:
                break
            kept_history.append(message)
            history_used += cost
        kept_history.reverse()
        dropped = len(history) - len(kept_history)
        if dropped:
            kept_history.insert(0, history_note(dropped))
        cuts = PromptCuts(
            counter=self.counter.name,
            context_tokens=used,
            history_tokens=history_used,
            blocks_cut=cut_blocks,
            history_dropped=dropped,
        )
        return tuple(kept_blocks), tuple(kept_history), cuts
