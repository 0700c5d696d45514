"""answer: number the graded context, set the outcome, stream the reply, resolve its citations.

It is the graph's finish node, so it also runs after a step cap, a deadline or a node error, and must
produce an honest answer from whatever the state holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import JudgeTruncated
from ragloop.events import Progress, Token
from ragloop.llm.protocols import Answerer
from ragloop.runner import END, emit
from ragloop.state import Citation, ContextBlock, Graded, Outcome, TurnState

__all__ = ["Answer", "build_blocks", "decide_outcome", "resolve_citations"]

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


@define
class Answer:
    """Streams the reply for the turn's outcome; falls back to a second answerer if the first fails.

    Attributes:
        answerer: The judge.
        fallback: Optional answerer (the offline one) used when ``answerer`` fails before any token.
        max_blocks: Most context blocks handed to the answerer.
    """

    answerer: Answerer
    fallback: Answerer | None = None
    max_blocks: int = 8
    routes: tuple[str, ...] = field(default=(END,), init=False)

    async def __call__(self, state: TurnState) -> str:
        outcome, missing = decide_outcome(state)
        state.outcome, state.missing = outcome, missing
        state.blocks = build_blocks(state, self.max_blocks) if outcome != "direct" else ()
        await emit(Progress(node="answer", kind="answer", message="writing the answer", data={"outcome": outcome}))
        parts: list[str] = []
        for judge in (self.answerer, self.fallback):
            if judge is None:
                continue
            try:
                await self._stream(judge, state, parts)
                break
            except Exception as exc:  # noqa: BLE001 — fail-open: the caller always gets an answer, or an honest note of the failure
                state.errors.append(f"answer: {type(exc).__name__}: {exc}")
                log.warning("answer.failed", error=str(exc), tokens_sent=len(parts))
                if parts:
                    note = (
                        "\n\n(The answer was cut off at the model's output limit; it may be incomplete.)"
                        if isinstance(exc, JudgeTruncated)
                        else "\n\n(The answer was cut off by an error; it may be incomplete.)"
                    )
                    parts.append(note)
                    await emit(Token(note))
                    break
        else:
            if not parts:
                text = "Sorry, I could not write an answer just now. Please try again."
                parts.append(text)
                await emit(Token(text))
        text, citations, invalid = resolve_citations("".join(parts), state.blocks)
        if invalid:
            state.errors.append(f"answer: removed citations to unknown blocks {sorted(set(invalid))}")
        state.answer, state.citations = text.strip(), citations
        return END

    async def _stream(self, judge: Answerer, state: TurnState, parts: list[str]) -> None:
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
                parts.append(token)
                await emit(Token(token))
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
