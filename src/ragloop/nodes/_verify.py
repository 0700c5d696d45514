"""The answer's verify step: one pass over the finished reply; what it removes it takes back out loud."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from ragloop.errors import error_text
from ragloop.events import Correction, Token
from ragloop.runner import emit
from ragloop.state import ContextBlock, TurnState, Verification

__all__ = ["Verifier", "say", "verify_reply"]


async def say(state: TurnState, text: str) -> None:
    """Stream ``text`` and add it to the reply (first, so a salvage after a cancelled emit never repeats it)."""
    state.answer += text
    await emit(Token(text))


@runtime_checkable
class Verifier(Protocol):
    """Checks a finished reply against its blocks and the question (the offline verifier does)."""

    async def verify(self, question: str, reply: str, blocks: Sequence[ContextBlock]) -> Verification:
        """Which cited sentences the blocks do not support, and which key terms the reply leaves uncovered."""
        ...


async def verify_reply(verifier: Verifier, state: TurnState, blocks: Sequence[ContextBlock] | None = None) -> None:
    """The bounded verify step: one pass over the finished reply, no extra retrieval, recorded.

    ``blocks`` are what the reply's numbers name (the answer node passes its pages: the client's numbers, each
    page's cited blocks joined); by default the turn's blocks.

    Sentences the blocks they cite do not support are dropped from the final text; they were already streamed,
    so a :class:`~ragloop.events.Correction` event names them and the reply ends with a note that quotes them;
    a ``context`` outcome whose reply leaves key terms of the question uncovered becomes ``partial``, with
    those terms as what is missing, and the reply says so. A verifier failure leaves the reply as it is.
    """
    if state.outcome not in ("context", "partial") or not state.blocks or not state.answer:
        return
    try:
        found = await verifier.verify(state.question, state.answer, state.blocks if blocks is None else blocks)
    except Exception as exc:  # noqa: BLE001 — fail-open: an unverified reply is still the reply
        state.errors.append(f"answer: verify: {error_text(exc)}")
        return
    if found.unsupported:
        await _take_back(state, found.unsupported, "not supported by the cited passages")
    if state.outcome == "context" and found.uncovered:
        state.outcome, state.missing = "partial", found.uncovered
        found = attrs.evolve(found, downgraded=True)
        named = ", ".join(f"“{t}”" for t in found.uncovered)
        await say(state, f"\n\nThe passages I found don't mention {named}, so this may not answer all of it.")
    state.verification = found


async def _take_back(state: TurnState, sentences: Sequence[str], reason: str) -> None:
    """Remove streamed ``sentences`` from the reply, never silently: a :class:`~ragloop.events.Correction`
    event names them, and the reply ends with a note saying that streamed words were taken back and why (it
    streams as tokens too). The note does not repeat the removed claims."""
    for sentence in sentences:
        state.answer = _drop_sentence(state.answer, sentence)
    n = len(sentences)
    what = "a sentence" if n == 1 else f"{n} sentences"
    was = "was" if n == 1 else "were"
    note = f"\n\n(Correction: {what} shown while this answer was streaming {was} removed, {reason}.)"
    await emit(Correction(removed=tuple(sentences), reason=reason, note=note.strip()))
    await say(state, note)


def _drop_sentence(text: str, sentence: str) -> str:
    """``text`` without ``sentence`` and the citation markers right after it."""
    words = [re.escape(w) for w in sentence.split()]
    pattern = re.compile(r"\s*" + r"\s+".join(words) + r"(?:\s*\[\d+(?:\s*,\s*\d+)*\])*")
    return pattern.sub("", text, count=1).strip()
