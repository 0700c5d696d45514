"""retrieve: run every pending query concurrently, merge the hits, take the fast path when it is safe."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import anyio
import attrs
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import StoreBusy, error_text
from ragloop.events import Progress
from ragloop.policy import ANSWER, EDGES, GRADE, RETRIEVE
from ragloop.retrievers.base import Retriever, search_with_filters
from ragloop.runner import emit
from ragloop.state import Graded, Hit, TurnState, Verdict
from ragloop.text.ids import missing_ids
from ragloop.text.novelty import content_key

__all__ = ["Retrieve", "content_key", "merge_budget", "merge_hits", "queued", "waited_out"]

log = get_logger("ragloop.nodes.retrieve")


def merge_budget(n_queries: int, *, per_query: int, total: int) -> int:
    """How many merged hits to keep: a query's share, growing with the square root of the query count.

    One query keeps ``per_query``; more queries keep more, but sub-linearly and never above ``total``, so a
    many-topic question cannot flood the answer's context.
    """
    if n_queries <= 0:
        return 0
    return min(total, max(per_query, round(per_query * math.sqrt(n_queries))))


def merge_hits(results: Mapping[str, Sequence[Hit]], *, budget: int) -> list[Hit]:
    """Merge per-query hits: deduplicate by content, keep the best copy, sort, cap by ``budget``.

    Pure and order-independent. Each kept hit lists every query that found any copy of it
    (``queries``, sorted) and the query whose copy won (``best_query``; ties broken by query text, then
    chunk id). The cap interleaves queries by rank, so every query keeps its best hits before any query
    gets a second one; the result is then sorted by score (ties by chunk id).
    """
    best: dict[str, tuple[Hit, str]] = {}
    finders: dict[str, set[str]] = {}
    rank_of: dict[str, tuple[int, str]] = {}
    for query in sorted(results):
        for rank, hit in enumerate(sorted(results[query], key=lambda h: (-h.score, h.id))):
            key = content_key(hit.text)
            finders.setdefault(key, set()).add(query)
            current = best.get(key)
            if current is None or (-hit.score, query, hit.id) < (-current[0].score, current[1], current[0].id):
                best[key] = (hit, query)
            if key not in rank_of or (rank, query) < rank_of[key]:
                rank_of[key] = (rank, query)
    ordered = sorted(best, key=lambda k: (rank_of[k], -best[k][0].score, best[k][0].id))
    kept = ordered[: max(budget, 0)]
    merged = [attrs.evolve(best[k][0], queries=tuple(sorted(finders[k])), best_query=best[k][1]) for k in kept]
    return sorted(merged, key=lambda h: (-h.score, h.id))


def _plain(text: str) -> str:
    return " ".join(text.split()).rstrip(" .?!").casefold()


def _needs_anchor(state: TurnState, pending: Sequence[str]) -> bool:
    """Whether the first retrieve also searches the question as asked: decide split or reworded it (expanded
    an abbreviation, dropped small talk), and the question stands alone (no conversation, no page to resolve
    "it" or "this page" against; then decide's resolved query is the better anchor)."""
    if state.searches or state.history or state.page.url or state.page.title or not pending:
        return False
    return _plain(state.question) not in {_plain(q) for q in pending}


# The first pause before a search that found the store busy queues again (it doubles each time).
_REQUEUE_PAUSE_S = 0.05


def waited_out(exc: BaseException) -> bool:
    """Whether a search failed for want of time (a busy store, a timeout), not because its store is down.

    A group (hybrid search runs two tasks) counts when every error in it does.
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(waited_out(e) for e in exc.exceptions)
    return isinstance(exc, StoreBusy | TimeoutError)


def queued(exc: BaseException) -> bool:
    """Whether a search failed only waiting for a connection to a store that answers (it ran no statement), so
    queueing it again costs the store nothing. A group counts when every error in it does."""
    if isinstance(exc, BaseExceptionGroup):
        return all(queued(e) for e in exc.exceptions)
    return isinstance(exc, StoreBusy) and exc.queued


def _describe(exc: BaseException) -> str:
    """``"Type: short message"`` of the error itself, not of the task group wrapping it (hybrid search runs two
    tasks)."""
    return error_text(exc)


@define
class Retrieve:
    """Runs the pending queries concurrently and merges their hits.

    Attributes:
        retriever: Where to search.
        k: Hits per query.
        per_query_budget: Merged hits kept for one query (see :func:`merge_budget`).
        total_budget: Most merged hits kept, however many queries.
        timeout_s: Time limit per query; a slow query is recorded as failed, the others go on. A query that
            found every connection of its store in use (:class:`~ragloop.errors.StoreBusy`, queued) searches
            again while the turn's deadline leaves twice this much: a busy store is waited for within the turn.
        max_concurrency: Queries searched at once.
        fast_path_confidence: Confidence a hit needs to count for the fast path.
        fast_path_min_hits: One query with at least this many hits at ``fast_path_confidence`` skips grading,
            and the answer sees only those hits.
    """

    retriever: Retriever
    k: int = field(kw_only=True)
    per_query_budget: int = field(kw_only=True)
    total_budget: int = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    max_concurrency: int = field(kw_only=True)
    fast_path_confidence: float = field(kw_only=True)
    fast_path_min_hits: int = field(kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[RETRIEVE], init=False)

    async def __call__(self, state: TurnState) -> str:
        pending = [q for q in state.pending if q in state.queries]
        state.pending = []
        await emit(Progress(node="retrieve", kind="search", message="searching…", data={"queries": pending}))
        started = time.perf_counter()
        results: dict[str, list[Hit]] = {}
        limiter = anyio.CapacityLimiter(max(1, self.max_concurrency))
        busy: set[str] = set()  # failed waiting (a timeout, a busy store), not because the store is down

        async def one(query: str) -> None:
            async with limiter:
                try:
                    found = await self._patient_search(state, query)
                except TimeoutError:
                    state.queries[query].error = f"timed out after {self.timeout_s}s"
                    busy.add(query)
                except Exception as exc:  # noqa: BLE001 — fail-open: one failing query never cancels its siblings
                    state.queries[query].error = _describe(exc)
                    if waited_out(exc):
                        busy.add(query)
                else:
                    state.searches[query] = found
                    results[query] = [h for h in found if h.id not in state.shown]
            if state.queries[query].error:
                state.queries[query].status = "failed"
                log.warning("query.failed", query=query, error=state.queries[query].error)

        async def anchor(question: str) -> None:
            # The question as asked, searched beside decide's queries: the final ranking fuses its list too, so
            # a split or a rewording never loses what one search of the question would have found. Not graded.
            async with limiter:
                try:
                    with anyio.fail_after(self.timeout_s):
                        state.searches[question] = await self._search(state, question)
                except Exception as exc:  # noqa: BLE001 — fail-open: the parts' own searches still count
                    state.errors.append(f"retrieve: the question's own search failed: {_describe(exc)}")

        async with anyio.create_task_group() as tg:
            for query in pending:
                tg.start_soon(one, query)
            if _needs_anchor(state, pending):
                tg.start_soon(anchor, state.question)

        budget = merge_budget(len(results), per_query=self.per_query_budget, total=self.total_budget)
        merged = merge_hits(results, budget=budget)
        state.shown.update(h.id for h in merged)
        for query in results:
            state.queries[query].hits = [h for h in merged if query in h.queries]
        seconds = time.perf_counter() - started
        await emit(
            Progress(
                node="retrieve",
                kind="retrieved",
                message=f"found {len(merged)} passages in {seconds:.2f}s",
                data={
                    "hits": {q: len(state.queries[q].hits) for q in pending},
                    "failed": [q for q in pending if state.queries[q].status == "failed"],
                    "busy": [q for q in pending if state.queries[q].status == "failed" and q in busy],
                },
            )
        )
        confident = self._fast_path(state, pending)
        if confident:
            only = state.queries[pending[0]]
            only.status = "enough"
            only.hits = confident
            state.fast_path = True
            state.graded.extend(
                Graded(only.text, h, Verdict("relevant", reason="fast path: high-confidence hit", score=h.confidence))
                for h in confident
            )
            return ANSWER
        return GRADE

    async def _patient_search(self, state: TurnState, query: str) -> list[Hit]:
        """One query's search under ``timeout_s``; one that waited out a busy store (every connection in use)
        queues again while :meth:`_time_for_another` (raises what the last attempt raised).

        Between tries it pauses, 0.05 s doubling up to a quarter of ``timeout_s``: a real pool waits
        for a connection before it gives up, but a store that refuses at once must not spin a core until the
        deadline.
        """
        pause = _REQUEUE_PAUSE_S
        while True:
            try:
                with anyio.fail_after(self.timeout_s):
                    return await self._search(state, query)
            except Exception as exc:
                if not (queued(exc) and self._time_for_another()):
                    raise
            await anyio.sleep(pause)
            pause = min(2 * pause, max(_REQUEUE_PAUSE_S, self.timeout_s / 4))

    def _time_for_another(self) -> bool:
        """Whether a search that waited out a busy store may queue again: the turn's deadline (the runner's, the
        server's) leaves room for another whole search and as much again for the rest of the turn."""
        left = anyio.current_effective_deadline() - anyio.current_time()
        return not math.isinf(left) and left > 2 * self.timeout_s  # no deadline: nothing bounds the queueing

    async def _search(self, state: TurnState, query: str) -> list[Hit]:
        return await search_with_filters(self.retriever, query, self.k, state.filters)

    def _fast_path(self, state: TurnState, pending: list[str]) -> list[Hit]:
        """The hits the fast path keeps (empty: grade as usual).

        Only a turn's first and only query qualifies, when its best ``fast_path_min_hits`` hits all reach
        ``fast_path_confidence``; the answer then sees only the confident hits, never the weaker tail.
        A hit that does not name an exact id the query asks about (ticket ``#1234``, ``E1002``) never counts:
        such a question needs grading and, maybe, a live source.
        """
        if len(pending) != 1 or state.graded or len(state.queries) != 1:
            return []
        query = pending[0]
        hits = [h for h in state.queries[query].hits if not missing_ids(query, h.text)]
        confident = [h for h in hits if h.confidence >= self.fast_path_confidence]
        top = sorted(hits, key=lambda h: -h.confidence)[: self.fast_path_min_hits]
        if len(top) < self.fast_path_min_hits or any(h.confidence < self.fast_path_confidence for h in top):
            return []
        return confident
