"""rewrite: a new angle for each short query, never a repeat; after the cap, an honest no_context."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.events import Progress
from ragloop.llm.guards import query_problem
from ragloop.llm.protocols import Rewriter
from ragloop.retrievers.base import Embedder
from ragloop.runner import emit
from ragloop.state import QueryState, TurnState
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
    """Rewrites each short query from a different angle, up to ``max_attempts`` per decide query.

    Attributes:
        rewriter: The judge.
        max_attempts: Rewrites allowed per decide query; after that the query is ``no_context``.
        overlap_threshold: Normalised-term overlap at or above which a rewrite counts as a repeat.
        embedder: Optional; when given, a rewrite whose embedding cosine to a tried query reaches
            ``cosine_threshold`` is also a repeat.
        cosine_threshold: See ``embedder``.
        timeout_s: Time limit per rewrite.
    """

    rewriter: Rewriter
    max_attempts: int = 2
    overlap_threshold: float = 0.6
    embedder: Embedder | None = None
    cosine_threshold: float = 0.95
    timeout_s: float = 10.0
    routes: tuple[str, ...] = field(default=("retrieve", "answer"), init=False)

    async def __call__(self, state: TurnState) -> str:
        short = [q for q in state.queries.values() if q.status in ("short", "failed") and not q.hop]
        tried = list(state.queries)

        async def one(q: QueryState) -> None:
            if q.attempt >= self.max_attempts:
                q.status = "no_context"
                return
            entry: dict[str, object] = {"from": q.text, "root": q.root, "attempt": q.attempt + 1}
            try:
                with anyio.fail_after(self.timeout_s):
                    candidate = " ".join((await self.rewriter.rewrite(state.question, q.text, tried)).split())
                problem = novelty_problem(candidate, tried, threshold=self.overlap_threshold)
                if problem is None:  # length, printable text, no markup or tool syntax
                    problem = query_problem(candidate)
                if problem is None and self.embedder is not None:
                    problem = await self._semantic_repeat(candidate, tried)
            except Exception as exc:  # noqa: BLE001 — fail-open: a failed rewrite ends this query's search, honestly
                candidate, problem = "", f"rewriter failed: {type(exc).__name__}: {exc}"
            entry.update(to=candidate, accepted=problem is None, reason=problem or "new angle")
            state.rewrites.append(entry)
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
        return "retrieve" if state.pending else "answer"

    async def _semantic_repeat(self, candidate: str, tried: Sequence[str]) -> str | None:
        import numpy as np

        assert self.embedder is not None
        vectors = await self.embedder.embed([candidate, *tried])
        cosines = np.asarray(vectors[1:]) @ np.asarray(vectors[0])
        if len(cosines) and float(cosines.max()) >= self.cosine_threshold:
            return f"semantic repeat of a tried query (cosine {float(cosines.max()):.2f})"
        return None
