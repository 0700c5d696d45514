"""answer: take the turn's ranking, number the graded context, set the outcome, stream the reply, cite.

It orders nothing itself: the turn's ranker (:class:`~ragloop.retrievers.ranking.Ranker`, by default the
fusion and feature rerank of :class:`~ragloop.retrievers.ranking.FusionRanker`) orders the passages once
(:func:`rank`), and the blocks are the graded ones in that order.

It is the graph's finish node, so it also runs after a step cap, a deadline or a node error, and must
produce an honest answer from whatever the state holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import JudgeTruncated, error_text
from ragloop.events import Progress
from ragloop.freshness import Freshness, stale_note, stale_sources
from ragloop.llm.protocols import Answerer
from ragloop.nodes._citations import CitationGate, Numbering, resolve_citations
from ragloop.nodes._rank import rank, ranked_hits
from ragloop.nodes._verify import Verifier, say, verify_reply
from ragloop.prompt_budget import PromptBudget
from ragloop.retrievers.ranking import FusionRanker, Ranker, candidates_of
from ragloop.runner import END, emit
from ragloop.state import (
    Abstention,
    ContextBlock,
    Graded,
    Hit,
    Message,
    Outcome,
    TurnState,
)

__all__ = [
    "CUT_BY_TIME",
    "MAX_ANSWER_CHARS",
    "NOT_IN_TIME",
    "SAYS_NOT_COVERED",
    "Abstainer",
    "Answer",
    "Extractive",
    "Verifier",
    "abstain",
    "build_blocks",
    "decide_outcome",
    "note_stale",
    "question_cosines",
    "rank",
    "ranked_hits",
    "resolve_citations",
    "verify_reply",
]

log = get_logger("ragloop.nodes.answer")
#: Longest reply streamed by default (characters); the rest is cut and the cut recorded.
MAX_ANSWER_CHARS = 20_000


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
    """Number the kept context, one chunk once, at most ``max_blocks``.

    With recorded searches: context the live sources added first, then the chunks a grader kept (relevant or
    partial, or the fast path's), in the order of the turn's ranking (:func:`ranked_hits`: the ranker's order;
    a kept chunk the ranker left out is not handed on). Without (a state built by hand): per decide query in
    turn (relevant before partial, best score first).
    """
    if state.searches:
        return _ranked_blocks(state, max_blocks)
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
                blocks.append(_block(len(blocks) + 1, g.hit, g.query))
        depth += 1
    return tuple(blocks)


def _ranked_blocks(state: TurnState, max_blocks: int) -> tuple[ContextBlock, ...]:
    searched = {h.id for hits in state.searches.values() for h in hits}
    verdicts: dict[str, list[Graded]] = {}
    for g in state.graded:
        verdicts.setdefault(g.hit.id, []).append(g)
    # Live records are exact-id lookups, never in a search list: they lead.
    live = [g for g in state.graded if g.hit.id not in searched and g.verdict.keep]
    picked: list[tuple[Hit, str]] = [(g.hit, g.query) for g in live]
    for hit in ranked_hits(state):
        kept = [g for g in verdicts.get(hit.id, []) if g.verdict.keep]
        if kept:  # only graded context is handed to the answerer; the ranking orders it
            picked.append((hit, kept[0].query))
    blocks: list[ContextBlock] = []
    seen: set[str] = set()
    cosines = question_cosines(state)
    for hit, query in picked:
        if len(blocks) >= max_blocks:
            break
        if hit.id in seen:
            continue
        seen.add(hit.id)
        blocks.append(_block(len(blocks) + 1, hit, query, cosines.get(hit.id)))
    return tuple(blocks)


def question_cosines(state: TurnState) -> dict[str, float]:
    """Chunk id → its dense cosine with the question itself: the best one a search of decide's own queries
    gave it (a rewrite's or a hop's search measures another text, so it is not counted)."""
    out: dict[str, float] = {}
    for root in state.roots():
        for hit in state.searches.get(root, ()):
            cosine = hit.scores.get("dense")
            if cosine is not None and cosine > out.get(hit.id, -1.0):
                out[hit.id] = cosine
    return out


def _block(n: int, hit: Hit, query: str, cosine: float | None = None) -> ContextBlock:
    c = hit.chunk
    section = c.title_path[-1] if c.title_path and c.title_path[-1] != c.title else ""
    return ContextBlock(n, c.text, c.source, c.title, c.id, query, c.url, section, cosine)


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


@runtime_checkable
class Abstainer(Protocol):
    """Says when the passages found do not support an answer (the offline answerer does)."""

    def abstain(self, question: str, blocks: Sequence[ContextBlock], hits: Sequence[Hit]) -> Abstention | None:
        """Why ``blocks`` do not support an answer to ``question`` (``hits``: the turn's best search results,
        best first), or ``None`` when they do. Pure and fast: it runs before the answer streams."""
        ...


def abstain(abstainer: Abstainer, state: TurnState) -> None:
    """The calibrated abstention, before anything streams: when the abstainer finds that the chosen blocks do
    not support an answer, the outcome becomes ``none``, no block is handed on (so nothing is cited), and
    ``missing`` names what the knowledge base never mentions. A question of several parts whose other parts
    were answered and never name it becomes ``partial`` instead. Turns with live or planned context (exact
    records, SQL rows) are left alone; an abstainer failure leaves the outcome as it is (recorded).
    """
    if state.outcome not in ("context", "partial") or not state.blocks or state.plan is not None:
        return
    if any(lookup.accepted for lookup in state.live):
        return
    try:
        found = abstainer.abstain(state.question, state.blocks, ranked_hits(state))
    except Exception as exc:  # noqa: BLE001 — fail-open: without a verdict the reply is written as before
        state.errors.append(f"answer: abstain: {error_text(exc)}")
        return
    if found is None:
        return
    state.abstention = found
    answered = {q.root for q in state.queries.values() if q.status == "enough"}
    names = [n.casefold() for n in found.unknown]
    others = [r for r in state.roots() if r in answered and not any(n in r.casefold() for n in names)]
    if found.unknown and len(state.roots()) > 1 and others:
        state.outcome, state.missing = "partial", tuple(dict.fromkeys((*state.missing, *found.unknown)))
        return
    state.outcome, state.missing, state.blocks = "none", found.unknown, ()


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
        verifier: Optional check of the finished reply (:func:`verify_reply`): unsupported sentences dropped,
            a ``context`` outcome whose reply leaves the question's key terms uncovered downgraded to ``partial``.
        abstainer: Optional check of the chosen blocks before the reply is written (:func:`abstain`): when they
            do not support an answer, the outcome is ``none`` and nothing is cited.
        ranker: Orders the turn's passages (:class:`~ragloop.retrievers.ranking.Ranker`): the blocks are the
            graded ones in its order (:func:`rank`); by default ``default_ranking``.
        default_ranking: The built-in ranking: what a failing or late ``ranker`` is replaced by, and what a
            reply the deadline cut short is salvaged with.
        rank_timeout_s: Time limit of ``ranker`` (capped at half the time left in the turn).
        max_chars: Longest reply streamed; a longer one is cut there, with a note, and the cut recorded.
        budget: Token budgets of the answer prompt: blocks past it are left out whole (lowest ranked first),
            history oldest first with a note; what was cut goes to ``state.prompt_cuts``.
        freshness: When a cited page counts as stale (:mod:`ragloop.freshness`); a reply that cites one ends with
            a note naming it, and ``state.stale`` lists them. ``None``: no check.

    Whatever an answerer yields is checked before it is streamed: a token that is not a string is skipped
    (and recorded), and citation markers are held back until they close and keep only numbers that name a
    block (:class:`~ragloop.nodes._citations.CitationGate`), so a marker of a missing block is never shown.
    The markers stream in the client's numbers (:class:`~ragloop.nodes._citations.Numbering`): one per page,
    ``1..n`` in the order of first citation, the blocks of a page sharing its number; the final text and
    ``state.citations`` (one per page, with the sections cited) use the same numbers.
    """

    answerer: Answerer
    max_blocks: int = field(kw_only=True)
    fallback: Answerer | None = field(default=None, kw_only=True)
    extractive: Extractive | None = field(default=None, kw_only=True)
    verifier: Verifier | None = field(default=None, kw_only=True)
    abstainer: Abstainer | None = field(default=None, kw_only=True)
    ranker: Ranker | None = field(default=None, kw_only=True)
    default_ranking: FusionRanker = field(factory=FusionRanker, kw_only=True)
    rank_timeout_s: float = field(kw_only=True)
    max_chars: int = field(default=MAX_ANSWER_CHARS, kw_only=True)
    budget: PromptBudget | None = field(default=None, kw_only=True)
    freshness: Freshness | None = field(default=None, kw_only=True)
    routes: tuple[str, ...] = field(default=(END,), init=False)

    async def __call__(self, state: TurnState) -> str:
        await rank(state, self.ranker or self.default_ranking, self.default_ranking, self.rank_timeout_s)
        _choose(state, self.max_blocks, self.abstainer)
        history: Sequence[Message] = state.history
        if self.budget is not None:
            state.blocks, history, state.prompt_cuts = self.budget.fit(state.blocks, state.history)
        await emit(
            Progress(node="answer", kind="answer", message="writing the answer", data={"outcome": state.outcome})
        )
        for judge in (self.answerer, self.fallback):
            if judge is None:
                continue
            try:
                await self._stream(judge, state, history)
                break
            except Exception as exc:  # noqa: BLE001 — fail-open: the caller always gets an answer, or an honest note of the failure
                state.errors.append(f"answer: {error_text(exc)}")
                log.warning("answer.failed", error=str(exc), chars_sent=len(state.answer))
                if state.answer:
                    note = (
                        "\n\n(The answer was cut off at the model's output limit; it may be incomplete.)"
                        if isinstance(exc, JudgeTruncated)
                        else "\n\n(The answer was cut off by an error; it may be incomplete.)"
                    )
                    await say(state, note)
                    state.outcome = "partial" if state.outcome == "context" else state.outcome  # a cut reply
                    break
        else:
            if not state.answer:
                await say(state, "Sorry, I could not write an answer just now. Please try again.")
        streamed = state.answer
        if self.verifier is not None:
            await verify_reply(self.verifier, state, Numbering(state.blocks, state.cited).pages())
        _resolve(state, streamed)
        if self.freshness is not None:
            await note_stale(state, self.freshness)
        return END

    async def salvage(self, state: TurnState) -> None:
        """End a reply the deadline cut short, fast and without I/O; never repeat a streamed token.

        Tokens already streamed are kept and an honest note follows them. When none were, the reply is the
        extractive answer from the blocks already chosen (or decide's direct reply), streamed as one token;
        without an ``extractive`` composer it is an honest "could not finish in time" note, and the outcome
        says that nothing was answered.
        """
        if state.outcome is None:  # cut before it chose anything: choosing is pure and fast
            if state.ranked is None and state.searches:  # cut before its ranker answered: the built-in order
                state.ranked = tuple(self.default_ranking.order(candidates_of(state)))
            _choose(state, self.max_blocks, self.abstainer)
        if state.answer:
            await say(state, CUT_BY_TIME)
            state.outcome = "partial" if state.outcome == "context" else state.outcome  # the reply is cut short
        else:
            text = self._compose(state)
            if not text:
                state.outcome, state.missing = "none", tuple(state.roots()) or (state.question,)
                state.blocks = ()
            gate = _gate(state)  # the composed reply cites blocks: the client sees its own numbers
            await say(state, (gate.feed(text) + gate.flush()) if text else NOT_IN_TIME)
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
            state.errors.append(f"answer: salvage: {error_text(exc)}")
            return ""

    async def _stream(self, judge: Answerer, state: TurnState, history: Sequence[Message]) -> None:
        reply = state.decision.reply if state.decision is not None else None
        stream = judge.answer(
            state.question,
            state.blocks,
            state.outcome or "none",
            missing=state.missing,
            direct_reply=reply,
            history=history,
        )
        gate = _gate(state)
        skipped: set[str] = set()
        try:
            async for token in stream:
                if not isinstance(token, str):
                    if type(token).__name__ not in skipped:
                        skipped.add(type(token).__name__)
                        state.errors.append(f"answer: skipped a stream token of type {type(token).__name__}")
                    continue
                if not await self._say_capped(state, gate.feed(token)):
                    break
            else:
                await self._say_capped(state, gate.flush())
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
            if gate.dropped:
                dropped = sorted(set(gate.dropped))
                state.errors.append(f"answer: removed citations to unknown blocks {dropped} before streaming")

    async def _say_capped(self, state: TurnState, text: str) -> bool:
        """Stream ``text`` within :attr:`max_chars`; False (after a note, recorded) once the cap is reached."""
        room = self.max_chars - len(state.answer)
        if len(text) <= room:
            if text:
                await say(state, text)
            return True
        await say(state, text[: max(room, 0)])
        await say(state, f"\n\n(The answer was cut at {self.max_chars:,} characters.)")
        state.errors.append(f"answer: reply cut at the {self.max_chars:,}-character cap")
        return False


async def note_stale(state: TurnState, freshness: Freshness) -> None:
    """After the reply: the cited pages that are stale go to ``state.stale`` and the reply ends with a note."""
    chunks = {g.hit.id: g.hit.chunk for g in state.graded}
    for hits in state.searches.values():
        chunks.update((h.id, h.chunk) for h in hits if h.id not in chunks)
    state.stale = stale_sources(state.citations, chunks, freshness)
    if state.stale:
        await say(state, stale_note(state.stale))


def _choose(state: TurnState, max_blocks: int, abstainer: Abstainer | None = None) -> None:
    """Set the outcome, the unanswered queries and the numbered blocks (abstaining when they do not support an
    answer); start an empty reply with no page numbered."""
    state.outcome, state.missing = decide_outcome(state)
    state.blocks = build_blocks(state, max_blocks) if state.outcome != "direct" else ()
    if abstainer is not None:
        abstain(abstainer, state)
    state.answer, state.cited = "", []


#: A reply that opens by saying the sources do not hold the answer (the model's words or the offline ones).
SAYS_NOT_COVERED = re.compile(
    r"^\W*(?:the\s+(?:documentation|docs|knowledge\s+base|context|provided\s+(?:context|blocks|documentation)|sources?)"
    r"|I)\s+(?:does\s+not|doesn't|do\s+not|don't|did\s+not|didn't|could\s+not|couldn't|cannot|can't)\s+"
    r"(?:cover|contain|mention|find|include|say|answer)",
    re.IGNORECASE,
)


def _gate(state: TurnState) -> CitationGate:
    """The gate for what the answer streams: block markers checked, written in the client's page numbers."""
    return CitationGate((b.n for b in state.blocks), Numbering(state.blocks, state.cited))


def _resolve(state: TurnState, streamed: str | None = None) -> None:
    """Resolve the reply's citations and set the final text. The streamed text carries the client's numbers
    already (one per page, see :class:`~ragloop.nodes._citations.Numbering`); each resolves to its page, with
    the sections cited. The citations are those of ``streamed`` (what the client was shown, by default the
    reply): a page whose only citing sentence verify took back stays listed, so the numbers run ``1..n``.
    A reply that opens by saying
    the sources do not cover the question is an abstention whatever was planned: outcome ``none``, and any
    citation it made is dropped (an abstaining reply cites nothing)."""
    numbering = Numbering(state.blocks, state.cited)
    pages = numbering.pages()
    text, shown, invalid = resolve_citations(state.answer, pages)
    if streamed is not None:
        shown = resolve_citations(streamed, pages)[1]
    citations = tuple(attrs.evolve(c, sections=numbering.sections(c.n)) for c in sorted(shown, key=lambda c: c.n))
    if invalid:
        state.errors.append(f"answer: removed citations to unknown blocks {sorted(set(invalid))}")
    if state.outcome in ("context", "partial") and SAYS_NOT_COVERED.match(text):
        state.outcome, state.missing = "none", state.missing or (state.question,)
        text, citations = resolve_citations(text, ())[0], ()
    state.answer, state.citations = text.strip(), citations
