"""rewrite: a new angle for each short query, never a repeat; after the cap, an honest no_context."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import error_text
from ragloop.events import Progress
from ragloop.llm.guards import query_problem
from ragloop.llm.protocols import Rewriter
from ragloop.policy import EDGES, REWRITE, RoutingPolicy, can_rewrite, next_step, short_queries
from ragloop.retrievers.base import Embedder
from ragloop.runner import emit
from ragloop.state import QueryState, RewriteAttempt, TurnState
from ragloop.text.novelty import is_near_duplicate

__all__ = ["Rewrite", "novelty_problem"]

log = get_logger("ragloop.nodes.rewrite")


def novelty_problem(candidate: str, tried: Sequence[str], *, threshold: float = 0.6) -> str | None:
    """Why ``candidate`` is not a new query (empty, or a near-duplicate of a tried one), or ``None``."""
    if not candidate.strip():
        return "empty rewrite"
    if is_near_duplicate(candidate, tried, threshold=threshold):
        return "near-duplicate of a tried query"
    return None


@define
class Rewrite:
    """Rewrites each short query from a different angle, up to the policy's ``max_attempts`` per decide query.

    Attributes:
        rewriter: The judge.
        policy: Rewrites allowed per decide query (after that the query is ``no_context``) and where the
            turn goes next.
        overlap_threshold: Normalised-term overlap at or above which a rewrite counts as a repeat.
        embedder: Optional; when given, a rewrite whose embedding cosine to a tried query reaches
            ``cosine_threshold`` is also a repeat.
        cosine_threshold: See ``embedder``.
        timeout_s: Time limit per rewrite.
    """

    rewriter: Rewriter
    policy: RoutingPolicy = field(kw_only=True)
    overlap_threshold: float = field(kw_only=True)
    cosine_threshold: float = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    embedder: Embedder | None = field(default=None, kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[REWRITE], init=False)

    async def __call__(self, state: TurnState) -> str:
        short = short_queries(state)
        tried = list(state.queries)

        async def one(q: QueryState) -> None:
            if not can_rewrite(q, self.policy):
                q.status = "no_context"
                return
            try:
                with anyio.fail_after(self.timeout_s):
                    candidate = " ".join((await self.rewriter.rewrite(state.question, q.text, tried)).split())
                problem = novelty_problem(candidate, tried, threshold=self.overlap_threshold)
                if problem is None:  # length, printable text, no markup or tool syntax
                    problem = query_problem(candidate)
                if problem is None and self.embedder is not None:
                    problem = await self._semantic_repeat(candidate, tried)
            except Exception as exc:  # noqa: BLE001 — fail-open: a failed rewrite ends this query's search, honestly
                candidate, problem = "", f"rewriter failed: {error_text(exc)}"
            state.rewrites.append(
                RewriteAttempt(q.text, q.root, q.attempt + 1, candidate, problem is None, problem or "new angle")
            )
            if problem is not None or candidate in state.queries:
                log.info("rewrite.rejected", query=q.text, candidate=candidate, reason=problem)
                q.status = "no_context"
                return
            q.status = "rewritten"
            state.queries[candidate] = QueryState(text=candidate, root=q.root, attempt=q.attempt + 1)
            state.pending.append(candidate)

        async with anyio.create_task_group() as tg:
            for q in short:
                tg.start_soon(one, q)
        await emit(
            Progress(
                node="rewrite",
                kind="rewrite",
                message=f"trying {len(state.pending)} new angle(s)" if state.pending else "no new angle left",
                data={"queries": list(state.pending)},
            )
        )
        return next_step(state, self.policy, after=REWRITE)

    async def _semantic_repeat(self, candidate: str, tried: Sequence[str]) -> str | None:
        import numpy as np

        assert self.embedder is not None
        vectors = await self.embedder.embed([candidate, *tried])
        cosines = np.asarray(vectors[1:]) @ np.asarray(vectors[0])
        if len(cosines) and float(cosines.max()) >= self.cosine_threshold:
            return f"semantic repeat of a tried query (cosine {float(cosines.max()):.2f})"
        return None
