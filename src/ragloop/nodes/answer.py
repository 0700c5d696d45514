"""answer: number the graded context, set the outcome, stream the reply, resolve its citations.

It is the graph's finish node, so it also runs after a step cap, a deadline or a node error, and must
produce an honest answer from whatever the state holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import JudgeTruncated
from ragloop.events import Progress, Token
from ragloop.llm.protocols import Answerer
from ragloop.runner import END, emit
from ragloop.state import Citation, ContextBlock, Graded, Outcome, TurnState

__all__ = [
    "CUT_BY_TIME",
    "NOT_IN_TIME",
    "Answer",
    "Extractive",
    "build_blocks",
    "decide_outcome",
    "resolve_citations",
]

log = get_logger("ragloop.nodes.answer")
_CITE = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")


def decide_outcome(state: TurnState) -> tuple[Outcome, tuple[str, ...]]:
    """The turn's outcome and the decide queries left unanswered."""
    if state.decision is not None and state.decision.direct:
        return "direct", ()
    roots = state.roots()
    if not roots:
        return "none", (state.question,)
    answered = {q.root for q in state.queries.values() if q.status == "enough"}
    missing = tuple(r for r in roots if r not in answered)
    if not missing:
        return "context", ()
    return ("partial" if len(missing) < len(roots) else "none"), missing


def build_blocks(state: TurnState, max_blocks: int) -> tuple[ContextBlock, ...]:
    """Number the kept context: per decide query in turn (relevant before partial, best score first),
    one chunk once, at most ``max_blocks``."""
    roots = state.roots()
    per_root: dict[str, list[Graded]] = {r: [] for r in roots}
    for g in state.graded:
        root = state.queries[g.query].root if g.query in state.queries else None
        if root in per_root and g.verdict.keep:
            per_root[root].append(g)
    for items in per_root.values():
        items.sort(key=lambda g: (g.verdict.label != "relevant", -g.hit.score, g.hit.id))
    blocks: list[ContextBlock] = []
    seen: set[str] = set()
    depth = 0
    while len(blocks) < max_blocks and any(depth < len(v) for v in per_root.values()):
        for items in per_root.values():
            if depth < len(items) and len(blocks) < max_blocks and items[depth].hit.id not in seen:
                g = items[depth]
                seen.add(g.hit.id)
                chunk = g.hit.chunk
                blocks.append(
                    ContextBlock(len(blocks) + 1, chunk.text, chunk.source, chunk.title, chunk.id, g.query, chunk.url)
                )
        depth += 1
    return tuple(blocks)


def resolve_citations(text: str, blocks: Sequence[ContextBlock]) -> tuple[str, tuple[Citation, ...], list[int]]:
    """Resolve ``[n]`` and ``[n, m]`` markers; drop markers that name no block.

    Returns the cleaned text, the citations in order of first use, and the invalid numbers removed.
    """
    by_n = {b.n: b for b in blocks}
    cited: dict[int, Citation] = {}
    invalid: list[int] = []

    def fix(m: re.Match[str]) -> str:
        ns = [int(x) for x in m.group(1).split(",")]
        good = [n for n in ns if n in by_n]
        invalid.extend(n for n in ns if n not in by_n)
        for n in good:
            b = by_n[n]
            cited.setdefault(n, Citation(n, b.source, b.title, b.chunk_id, b.url))
        return "".join(f"[{n}]" for n in good)

    cleaned = _CITE.sub(fix, text)
    return cleaned, tuple(cited.values()), invalid


@runtime_checkable
class Extractive(Protocol):
    """Writes a whole reply at once, from the chosen blocks, without I/O (the offline answerer does)."""

    def compose(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
    ) -> str:
        """The reply text; ``[n]`` cites block ``n``."""
        ...


#: Said when nothing was streamed and nothing can be composed in the time left.
NOT_IN_TIME = "Sorry, I could not finish an answer in time. Please try again."
#: Appended after the tokens already streamed when the answer was cut short by the deadline.
CUT_BY_TIME = "\n\n(The answer was cut short: it ran out of time and may be incomplete.)"


@define
class Answer:
    """Streams the reply for the turn's outcome; falls back to a second answerer if the first fails.

    It is the graph's finish node. When it overruns the turn's deadline and grace, the runner cancels it and
    calls :meth:`salvage`, which ends the reply from what is already there: the tokens already streamed plus
    an honest note, or, when nothing was streamed yet, ``extractive``'s answer from the chosen blocks.

    Attributes:
        answerer: The judge.
        max_blocks: Most context blocks handed to the answerer.
        fallback: Optional answerer (the offline one) used when ``answerer`` fails before any token.
        extractive: Optional fast, I/O-free composer (the offline answerer) for :meth:`salvage`.
    """

    answerer: Answerer
    max_blocks: int = field(kw_only=True)
    fallback: Answerer | None = field(default=None, kw_only=True)
    extractive: Extractive | None = field(default=None, kw_only=True)
    routes: tuple[str, ...] = field(default=(END,), init=False)

    async def __call__(self, state: TurnState) -> str:
        _choose(state, self.max_blocks)
        await emit(
            Progress(node="answer", kind="answer", message="writing the answer", data={"outcome": state.outcome})
        )
        for judge in (self.answerer, self.fallback):
            if judge is None:
                continue
            try:
                await self._stream(judge, state)
                break
            except Exception as exc:  # noqa: BLE001 — fail-open: the caller always gets an answer, or an honest note of the failure
                state.errors.append(f"answer: {type(exc).__name__}: {exc}")
                log.warning("answer.failed", error=str(exc), chars_sent=len(state.answer))
                if state.answer:
                    note = (
                        "\n\n(The answer was cut off at the model's output limit; it may be incomplete.)"
                        if isinstance(exc, JudgeTruncated)
                        else "\n\n(The answer was cut off by an error; it may be incomplete.)"
                    )
                    await _say(state, note)
                    break
        else:
            if not state.answer:
                await _say(state, "Sorry, I could not write an answer just now. Please try again.")
        _resolve(state)
        return END

    async def salvage(self, state: TurnState) -> None:
        """End a reply the deadline cut short, fast and without I/O; never repeat a streamed token.

        Tokens already streamed are kept and an honest note follows them. When none were, the reply is the
        extractive answer from the blocks already chosen (or decide's direct reply), streamed as one token;
        without an ``extractive`` composer it is an honest "could not finish in time" note, and the outcome
        says that nothing was answered.
        """
        if state.outcome is None:  # cut before it chose anything: choosing is pure and fast
            _choose(state, self.max_blocks)
        if state.answer:
            await _say(state, CUT_BY_TIME)
        else:
            text = self._compose(state)
            if not text:
                state.outcome, state.missing = "none", tuple(state.roots()) or (state.question,)
                state.blocks = ()
            await _say(state, text or NOT_IN_TIME)
        _resolve(state)

    def _compose(self, state: TurnState) -> str:
        reply = state.decision.reply if state.decision is not None else None
        if state.outcome == "direct" and reply:
            return reply
        if self.extractive is None:
            return ""
        try:
            return self.extractive.compose(
                state.question, state.blocks, state.outcome or "none", missing=state.missing, direct_reply=reply
            )
        except Exception as exc:  # noqa: BLE001 — fail-open: salvage must still end the reply, with the note
            state.errors.append(f"answer: salvage: {type(exc).__name__}: {exc}")
            return ""

    async def _stream(self, judge: Answerer, state: TurnState) -> None:
        reply = state.decision.reply if state.decision is not None else None
        stream = judge.answer(
            state.question,
            state.blocks,
            state.outcome or "none",
            missing=state.missing,
            direct_reply=reply,
            history=state.history,
        )
        try:
            async for token in stream:
                await _say(state, token)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


def _choose(state: TurnState, max_blocks: int) -> None:
    """Set the outcome, the unanswered queries and the numbered blocks; start an empty reply."""
    state.outcome, state.missing = decide_outcome(state)
    state.blocks = build_blocks(state, max_blocks) if state.outcome != "direct" else ()
    state.answer = ""


async def _say(state: TurnState, text: str) -> None:
    """Stream ``text`` and add it to the reply (first, so a salvage after a cancelled emit never repeats it)."""
    state.answer += text
    await emit(Token(text))


def _resolve(state: TurnState) -> None:
    """Resolve the reply's citations against the blocks and set the final text."""
    text, citations, invalid = resolve_citations(state.answer, state.blocks)
    if invalid:
        state.errors.append(f"answer: removed citations to unknown blocks {sorted(set(invalid))}")
    state.answer, state.citations = text.strip(), citations
