"""A grader that remembers its verdicts (:mod:`ragloop.caches`).

A verdict is keyed by the query, the SHA-256 of the passage's text, the grading model and the turn's scope
(:func:`~ragloop.retrievers.scope.current_scope`: an offline grader's statistics are the scope's, so a verdict
given under one tenant's statistics is never handed to another): the same passage graded for the same query by
the same model in the same scope is not graded again. Fail-open verdicts are never stored (they say
the grader failed, not what it thought). For a query graded in one call, only the passages the cache misses are
sent (:class:`~ragloop.llm.protocols.BatchGrader`); when every passage hits, no call is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from ragloop.caches import Cache, cache_key, content_hash
from ragloop.llm.protocols import BatchGrader, Grader
from ragloop.retrievers.scope import current_scope
from ragloop.state import Hit, Verdict
from ragloop.usage import record_cache

__all__ = ["CachedGrader"]


class CachedGrader:
    """``inner`` with its verdicts cached under ``(query, content hash, model, scope)``.

    Args:
        inner: The grader (batch-capable or not; a plain one is called per missed passage, concurrently).
        cache: Where verdicts go.
        model: The grading model's name (default: ``inner.model``, or its class name).
    """

    def __init__(self, inner: Grader, cache: Cache[Verdict], model: str | None = None) -> None:
        self.inner, self.cache = inner, cache
        self.model = model or str(getattr(inner, "model", type(inner).__name__))

    def _key(self, query: str, hit: Hit) -> str:
        scope = [[k, list(v)] for k, v in current_scope()]
        return cache_key("grade", query, content_hash(hit.text), self.model, *([scope] if scope else []))

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """The cached verdict, or the inner grader's (stored unless it failed open)."""
        key = self._key(query, hit)
        found = self.cache.get(key)
        if found is not None:
            record_cache("grade")
            return found
        verdict = await self.inner.grade(query, hit)
        if not verdict.fail_open:
            self.cache.set(key, verdict)
        return verdict

    async def grade_batch(self, query: str, hits: Sequence[Hit]) -> list[Verdict | None]:
        """Cached verdicts, and one inner call for the passages the cache missed."""
        keys = [self._key(query, h) for h in hits]
        out: list[Verdict | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, v in enumerate(out) if v is None]
        record_cache("grade", len(hits) - len(missing))
        if not missing:
            return out
        todo = [hits[i] for i in missing]
        if isinstance(self.inner, BatchGrader):
            fresh = list(await self.inner.grade_batch(query, todo))
        else:
            fresh = [None] * len(todo)

            async def one(j: int) -> None:
                try:
                    fresh[j] = await self.inner.grade(query, todo[j])
                except Exception:  # noqa: BLE001 — no verdict for this passage: the node fails open for it alone
                    fresh[j] = None

            async with anyio.create_task_group() as tg:
                for j in range(len(todo)):
                    tg.start_soon(one, j)
        for i, verdict in zip(missing, fresh, strict=False):
            out[i] = verdict
            if verdict is not None and not verdict.fail_open:
                self.cache.set(keys[i], verdict)
        return out
