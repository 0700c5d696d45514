"""decide: answer directly, or turn the question into standalone search queries."""

from __future__ import annotations

from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import error_text
from ragloop.events import Progress
from ragloop.llm.protocols import Decider
from ragloop.policy import ANSWER, DECIDE, EDGES, RETRIEVE
from ragloop.runner import emit
from ragloop.state import Decision, QueryState, TurnState
from ragloop.text.novelty import content_key

__all__ = ["Decide", "unique_queries"]

log = get_logger("ragloop.nodes.decide")


def unique_queries(queries: tuple[str, ...] | list[str], limit: int) -> list[str]:
    """Drop blank and duplicate (case/punctuation-insensitive) queries, keep order, cap at ``limit``."""
    seen: set[str] = set()
    out: list[str] = []
    for q in queries:
        text, key = " ".join(q.split()), content_key(q)
        if key and key not in seen:
            seen.add(key)
            out.append(text)
    return out[:limit]


@define
class Decide:
    """Asks the decider whether to search; a decider failure falls back to searching the question itself.

    Attributes:
        decider: The judge.
        max_queries: Most queries one turn may start (no tool storms).
        fallback: Optional second decider (e.g. the offline one) tried when ``decider`` fails.
    """

    decider: Decider
    max_queries: int = field(kw_only=True)
    fallback: Decider | None = field(default=None, kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[DECIDE], init=False)

    async def __call__(self, state: TurnState) -> str:
        decision = await self._decide(state)
        queries = unique_queries(decision.queries, self.max_queries)
        if decision.reply is None and not queries:
            queries = unique_queries([state.question], 1)
        if decision.reply is not None:
            state.decision = Decision(reply=decision.reply, reason=decision.reason or "no search needed")
            await emit(Progress(node="decide", kind="direct", message="no search needed"))
            return ANSWER
        if len(queries) < len(decision.queries):
            log.info("queries.capped", asked=len(decision.queries), kept=len(queries))
        state.decision = Decision(queries=tuple(queries), reason=decision.reason)
        for q in queries:
            state.queries[q] = QueryState(text=q, root=q)
        state.pending = list(queries)
        await emit(
            Progress(node="decide", kind="queries", message=f"{len(queries)} search(es)", data={"queries": queries})
        )
        return RETRIEVE

    async def _decide(self, state: TurnState) -> Decision:
        for judge in (self.decider, self.fallback):
            if judge is None:
                continue
            try:
                return await judge.decide(state.question, state.history, state.page)
            except Exception as exc:  # noqa: BLE001 — fail-open: any decider failure falls back; the turn must still answer
                state.errors.append(f"decide: {error_text(exc)}")
                log.warning("decide.failed", error=str(exc))
        # Both judges failed: searching the question as asked is the honest default.
        return Decision(queries=(state.question,), reason="decider failed; searching the question as asked")
