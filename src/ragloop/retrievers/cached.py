"""A retriever and an embedder that remember their answers (:mod:`ragloop.caches`).

Search results are keyed by the query, the depth ``k``, the filters and the index's version, so a rebuilt
index (:attr:`~ragloop.retrievers.index.KnowledgeIndex.version`) or a synced store
(:attr:`~ragloop.retrievers.postgres.PostgresStore.version`) never serves stale hits. A retriever whose version
lives elsewhere (:class:`VersionedStore`: the Postgres store, which any replica may write) is asked for it
before each lookup, so another process's write makes the very next search miss. Query embeddings are keyed
by the embedder's name and the text. Every hit is counted on the turn's meter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ragloop.caches import Cache, cache_key
from ragloop.retrievers.base import Embedder, Retriever, search_with_filters
from ragloop.retrievers.scope import current_scope
from ragloop.state import Hit
from ragloop.usage import record_cache

__all__ = ["CachedEmbedder", "CachedRetriever", "VersionedStore"]


@runtime_checkable
class VersionedStore(Protocol):
    """A retriever shared by several processes, whose version is read from where it is kept."""

    async def check_version(self) -> str:
        """The current version, read now (the ``version`` attribute then says the same)."""
        ...


class CachedRetriever:
    """``inner`` with its search results cached under ``(query, k, filters, version())``.

    Args:
        inner: The retriever. A :class:`VersionedStore` is asked for its version before each lookup (one short
            statement against the database, instead of a whole search on a hit).
        cache: Where results go.
        version: The index's current version (read on every search, so a change invalidates at once).
    """

    def __init__(self, inner: Retriever, cache: Cache[tuple[Hit, ...]], version: Callable[[], str]) -> None:
        self.inner, self.cache, self.version = inner, cache, version

    async def search(self, query: str, k: int = 10, filters: Mapping[str, tuple[str, ...]] | None = None) -> list[Hit]:
        """The cached hits for this search, or the inner retriever's (then cached)."""
        if isinstance(self.inner, VersionedStore):
            await self.inner.check_version()
        key = cache_key("retrieval", query, k, sorted((filters or {}).items()), self.version())
        found = self.cache.get(key)
        if found is not None:
            record_cache("retrieval")
            return list(found)
        hits = await search_with_filters(self.inner, query, k, filters)
        self.cache.set(key, tuple(hits))
        return hits

    async def aclose(self) -> None:
        """Close the inner retriever, if it can be closed."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


class CachedEmbedder:
    """``inner`` with each text's vector cached under ``(inner.name, text)`` and, inside a scoped turn, its scope
    (:func:`~ragloop.retrievers.scope.current_scope`: a tenant never learns from a hit's speed that another one
    asked the same words); only the misses are embedded."""

    def __init__(self, inner: Embedder, cache: Cache[npt.NDArray[np.float32]]) -> None:
        self.inner, self.cache = inner, cache
        self.name, self.dim = inner.name, inner.dim

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """An ``(len(texts), dim)`` array: cached rows, and the inner embedder's rows for the rest."""
        scope = [[k, list(v)] for k, v in current_scope()]
        keys = [cache_key("embedding", self.name, t, *([scope] if scope else [])) for t in texts]
        rows: list[npt.NDArray[np.float32] | None] = [self.cache.get(k) for k in keys]
        missing = [i for i, row in enumerate(rows) if row is None]
        record_cache("embedding", len(texts) - len(missing))
        if missing:
            fresh = await self.inner.embed([texts[i] for i in missing])
            for i, row in zip(missing, np.asarray(fresh, dtype=np.float32), strict=True):
                rows[i] = row
                self.cache.set(keys[i], row)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([r for r in rows if r is not None]).astype(np.float32, copy=False)
