"""Caches for a chat turn, behind one small protocol, with an in-memory TTL/LRU default.

A turn can skip work it has done before: the embedding of a query, a search (keyed by query, depth, filters
and the index's version, so a rebuilt index or a synced store misses), a grade (keyed by query, the passage's
content hash and the grading model), and, when the application opts in, a whole reply. :class:`Caches` holds
one :class:`Cache` per kind; the wrappers that use them are :class:`~ragloop.retrievers.cached.CachedRetriever`,
:class:`~ragloop.retrievers.cached.CachedEmbedder` and :class:`~ragloop.llm.cached.CachedGrader`. Each hit is
counted on the turn's usage meter (:func:`ragloop.usage.record_cache`), so the decision record says which
caches a turn hit (``TurnRecord.cache_hits``).

Any object with ``get``, ``set`` and ``clear`` is a cache (Redis, memcached …); values are whatever the
wrapper stores (hits, vectors, verdicts), kept as they are, so an external cache must serialise them itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from attrs import define, field

from ragloop.errors import ConfigError

__all__ = ["Cache", "Caches", "MemoryCache", "cache_key", "content_hash"]

V = TypeVar("V")


@runtime_checkable
class Cache(Protocol[V]):
    """A key-value cache: string keys, values kept as given."""

    def get(self, key: str) -> V | None:
        """The value stored under ``key``, or ``None`` (missing or expired)."""
        ...

    def set(self, key: str, value: V) -> None:
        """Store ``value`` under ``key``."""
        ...

    def clear(self) -> None:
        """Drop everything."""
        ...


class MemoryCache(Generic[V]):
    """An in-process LRU cache whose entries expire ``ttl_s`` seconds after they were stored.

    Args:
        max_items: Most entries kept; storing one more evicts the least recently used.
        ttl_s: Seconds an entry lives (``None``: until evicted).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self, max_items: int = 1024, ttl_s: float | None = 3600.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_items < 1 or (ttl_s is not None and ttl_s <= 0):
            raise ConfigError(f"MemoryCache needs max_items >= 1 and ttl_s > 0 (or None); got {max_items}, {ttl_s}")
        self.max_items, self.ttl_s, self._clock = max_items, ttl_s, clock
        self._items: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> V | None:
        """The live value under ``key`` (and mark it recently used), or ``None``."""
        with self._lock:
            found = self._items.get(key)
            if found is None:
                return None
            expires, value = found
            if expires <= self._clock():
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return value

    def set(self, key: str, value: V) -> None:
        """Store ``value``; evict the least recently used entry past ``max_items``."""
        expires = float("inf") if self.ttl_s is None else self._clock() + self.ttl_s
        with self._lock:
            self._items[key] = (expires, value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._items.clear()


def cache_key(*parts: Any) -> str:
    """A stable key for ``parts`` (JSON-serialisable values): the SHA-256 of their canonical JSON."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def content_hash(text: str) -> str:
    """The SHA-256 of a passage's text (grades key on it, not on the chunk id, so an edited passage misses)."""
    return hashlib.sha256(text.encode()).hexdigest()


@define
class Caches:
    """The caches a chat uses; ``None`` turns one off.

    Attributes:
        embeddings: Query embeddings, by embedder and text.
        retrieval: Search results, by query, depth, filters and index version.
        grades: Verdicts, by query, passage content hash and grading model (fail-open verdicts never stored).
        replies: Whole replies to a question without history, by question, page, filters and index version;
            off by default (an answer can go stale in ways no key sees, e.g. a live source's data).
    """

    embeddings: Cache[Any] | None = field(factory=MemoryCache)
    retrieval: Cache[Any] | None = field(factory=MemoryCache)
    grades: Cache[Any] | None = field(factory=lambda: MemoryCache(max_items=8192))
    replies: Cache[Any] | None = None

    def clear(self) -> None:
        """Empty every cache."""
        for cache in (self.embeddings, self.retrieval, self.grades, self.replies):
            if cache is not None:
                cache.clear()
