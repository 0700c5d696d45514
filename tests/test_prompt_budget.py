"""Prompt budgets: token counting (the model's tokenizer, or the calibrated estimate), blocks cut whole,
history dropped oldest first with a note, and the record saying what was cut."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from ragloop.nodes.answer import Answer
from ragloop.prompt_budget import BLOCK_OVERHEAD_TOKENS, PromptBudget, history_note
from ragloop.state import ContextBlock, Graded, Message, Outcome, TurnState, Verdict
from ragloop.testing import make_hit
from ragloop.text.tokens import DEFAULT_CHARS_PER_TOKEN, CharEstimate, TokenCounter, TokenizersCounter
from tests.strategies import with_queries

pytestmark = pytest.mark.anyio

CALIBRATION = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "token_calibration.json"


def _block(n: int, chars: int) -> ContextBlock:
    return ContextBlock(n=n, text="x" * chars, chunk_id=f"c{n}")


class TestCounting:
    def test_estimate_is_a_ceiling_division(self) -> None:
        """The estimate rounds up, so a budget never undercounts a short text to zero."""
        est = CharEstimate(4.0)
        assert (est.count(""), est.count("abc"), est.count("abcd"), est.count("abcde")) == (0, 1, 1, 2)
        assert est.name == "chars/4" and isinstance(est, TokenCounter)

    def test_default_ratio_is_the_committed_calibration(self) -> None:
        """The default characters per token is what benchmarks/calibrate_tokens.py measured with SmolLM2's
        tokenizer, and plain chunk text has more characters per token than that (so passages are overcounted)."""
        report = json.loads(CALIBRATION.read_text())
        groups = report["groups"]
        assert round(groups["overall"]["chars_per_token"], 1) == DEFAULT_CHARS_PER_TOKEN
        assert groups["chunks"]["chars_per_token"] > DEFAULT_CHARS_PER_TOKEN
        assert groups["chunks"]["estimate_error_pct_median"] > 0

    def test_a_tokenizer_counts_its_own_tokens(self) -> None:
        """With the model's tokenizer the count is its encoding's length, not an estimate."""
        vocab = {"[UNK]": 0, "keys": 1, "expire": 2}
        tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = Whitespace()  # type: ignore[assignment]
        counter = TokenizersCounter(tok, name="toy")
        assert counter.count("keys expire after a very long time") == 7
        assert counter.name == "toy" and isinstance(counter, TokenCounter)


class TestFit:
    def test_blocks_are_cut_whole_lowest_ranked_first(self) -> None:
        """Blocks past the budget are left out whole, and the record names them."""
        budget = PromptBudget(context_tokens=2 * (100 + BLOCK_OVERHEAD_TOKENS), counter=CharEstimate(1.0))
        blocks = [_block(1, 100), _block(2, 100), _block(3, 100)]
        kept, history, cuts = budget.fit(blocks, ())
        assert [b.n for b in kept] == [1, 2]
        assert cuts.blocks_cut == ("c3",) and cuts.context_tokens == 2 * (100 + BLOCK_OVERHEAD_TOKENS)
        assert history == () and cuts.history_dropped == 0

    def test_the_first_block_is_always_kept(self) -> None:
        """A budget smaller than the best block still sends that block."""
        kept, _, cuts = PromptBudget(context_tokens=10, counter=CharEstimate(1.0)).fit([_block(1, 500)], ())
        assert [b.n for b in kept] == [1] and cuts.blocks_cut == ()

    def test_history_dropped_oldest_first_with_a_note(self) -> None:
        """The newest messages that fit are kept in order, behind a note saying how many were left out."""
        history = [Message("user" if i % 2 == 0 else "assistant", f"m{i} " + "y" * 96) for i in range(6)]
        budget = PromptBudget(history_tokens=2 * 103, counter=CharEstimate(1.0))  # 99 chars + 4 framing each
        _, kept, cuts = budget.fit([], history)
        assert kept[0] == history_note(4) and "4 earliest messages" in kept[0].content
        assert [m.content[:2] for m in kept[1:]] == ["m4", "m5"]
        assert cuts.history_dropped == 4 and cuts.history_tokens == 2 * 103

    def test_nothing_cut_within_budget(self) -> None:
        """Under the budget everything goes, and the record says nothing was cut."""
        kept, history, cuts = PromptBudget().fit([_block(1, 50)], [Message("user", "hello")])
        assert len(kept) == 1 and history == (Message("user", "hello"),)
        assert cuts.blocks_cut == () and cuts.history_dropped == 0 and cuts.counter == "chars/3.2"


class Recording:
    """An answerer that remembers the blocks and history it was given."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.history: list[Message] = []

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
        self.blocks, self.history = [b.n for b in blocks], list(history)
        yield "ok " + " ".join(f"[{b.n}]" for b in blocks)


class TestAnswerNode:
    async def test_budget_reaches_the_answerer_and_the_state(self) -> None:
        """The answerer gets only what fits; the state's blocks (what citations resolve against) and prompt_cuts
        say the same."""
        state = with_queries("a")
        state.queries["a"].status = "enough"
        for i in range(4):
            state.graded.append(Graded("a", make_hit(f"text {i} " + "z" * 200, chunk_id=f"h{i}"), Verdict("relevant")))
        state.history = tuple(Message("user", "w" * 400) for _ in range(3))
        answerer = Recording()
        budget = PromptBudget(context_tokens=2 * 260, history_tokens=450, counter=CharEstimate(1.0))
        await Answer(answerer, max_blocks=8, rank_timeout_s=10.0, budget=budget)(state)
        assert answerer.blocks == [1, 2] and [b.n for b in state.blocks] == [1, 2]
        assert state.prompt_cuts is not None and len(state.prompt_cuts.blocks_cut) == 2
        assert state.prompt_cuts.history_dropped == 2 and answerer.history[0] == history_note(2)
        assert "[3]" not in state.answer

    async def test_no_budget_sends_everything(self) -> None:
        """Without a budget nothing is cut and nothing recorded."""
        state = TurnState(question="q")
        state.history = (Message("user", "hi"),)
        answerer = Recording()
        await Answer(answerer, max_blocks=8, rank_timeout_s=10.0)(state)
        assert answerer.history == [Message("user", "hi")] and state.prompt_cuts is None
