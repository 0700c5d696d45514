"""What one index run owns: its scope.

Several folders share one collection (a store) or one index folder: one per tenant, product version or team.
Each run of ``ragloop index`` names its **scope**, the metadata pairs that mark its documents (by default its
``--meta`` values, or ``--scope KEY=VALUE`` explicitly), and it adds, changes and removes documents of that
scope only. Every document belongs to exactly one scope, the one it was indexed under, and is identified by
``(scope, doc_id)``: ``guide.md`` indexed for ``tenant=acme`` and for ``tenant=globex`` are two documents, and
a run without ``--meta`` owns only the documents indexed without it (the empty scope), never everyone's.

:meth:`Scope.apply` gives a run's chunks what that means on disk: the scope's pairs in their metadata (so a
filter on ``tenant`` finds them) and, for a non-empty scope, chunk ids qualified by the scope, so that the same
text in two scopes is two chunks.

:class:`Corpus` is the other side of the same wall: every chunk's text with its metadata, so that what a turn
derives from the corpus (term statistics, the mined glossary, calibration) can be computed over the chunks a
caller's filters let it find (:meth:`Corpus.visible`), never over another tenant's. :func:`turn_scope` installs
the running turn's filters (its scope) in a context variable, for what derives or caches knowledge per scope
(the scoped judges, the grade and embedding caches) to read with :func:`current_scope`.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
from attrs import define, field, frozen

from ragloop.errors import ConfigError
from ragloop.retrievers.filters import FilterKey, Filters, filter_key, matches_metadata
from ragloop.retrievers.meaning import MeaningScale
from ragloop.state import Chunk

__all__ = ["Corpus", "RunningScope", "Scope", "current_scope", "running_scope", "turn_scope"]


def _pairs(value: Iterable[tuple[str, str]] | Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    out: dict[str, str] = {}
    for key, val in items:
        if not isinstance(key, str) or not key.strip() or not isinstance(val, str):
            raise ConfigError(f"a scope is KEY=VALUE pairs of strings (e.g. tenant=acme), got {key!r}={val!r}")
        if key in out and out[key] != val:
            raise ConfigError(f"a scope has one value per key; {key!r} is given as {out[key]!r} and {val!r}")
        out[key] = val
    return tuple(sorted(out.items()))


@frozen
class Scope:
    """The metadata pairs that mark one index run's documents; ``Scope()`` is the empty (unscoped) scope.

    Attributes:
        pairs: ``(key, value)`` pairs, sorted by key, one value per key.
    """

    pairs: tuple[tuple[str, str], ...] = field(default=(), converter=_pairs)

    @classmethod
    def of(cls, value: Scope | Mapping[str, str] | None) -> Scope:
        """``value`` as a scope (``None`` and ``{}`` are the empty scope)."""
        if isinstance(value, Scope):
            return value
        return cls(value or ())

    @property
    def label(self) -> str:
        """The scope as stored with its documents: ``""`` for the empty scope, else canonical JSON."""
        if not self.pairs:
            return ""
        return json.dumps(dict(self.pairs), ensure_ascii=False, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_label(cls, label: str) -> Scope:
        """The scope whose :attr:`label` is ``label``."""
        if not label:
            return cls()
        value = json.loads(label)
        if not isinstance(value, dict):
            raise ConfigError(f"not a scope label: {label!r}")
        return cls(value)

    def describe(self) -> str:
        """``tenant=acme, version=2``, or ``(no scope)``: how messages name the scope."""
        return ", ".join(f"{k}={v}" for k, v in self.pairs) if self.pairs else "(no scope)"

    def filters(self) -> dict[str, tuple[str, ...]]:
        """The scope as search filters: only the chunks of documents carrying every pair."""
        return {k: (v,) for k, v in self.pairs}

    @property
    def _suffix(self) -> str:
        return "~" + hashlib.sha256(self.label.encode("utf-8", "surrogatepass")).hexdigest()[:8]

    def chunk_id(self, chunk_id: str) -> str:
        """``chunk_id`` qualified by this scope (unchanged for the empty scope or when already qualified)."""
        if not self.pairs or chunk_id.endswith(self._suffix):
            return chunk_id
        return chunk_id + self._suffix

    def apply(self, chunks: Iterable[Chunk]) -> list[Chunk]:
        """The chunks as this scope stores them: its pairs in their metadata (over any other value the
        front matter gave a scope key), their ids qualified."""
        if not self.pairs:
            return list(chunks)
        pairs = dict(self.pairs)
        return [attrs.evolve(c, id=self.chunk_id(c.id), metadata={**c.meta(), **pairs}) for c in chunks]


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _mappings(value: Iterable[Mapping[str, str]]) -> tuple[Mapping[str, str], ...]:
    return tuple(value)


@frozen(eq=False)
class Corpus:
    """Every chunk's text and metadata, in one order: what corpus statistics are computed from, per scope.

    Attributes:
        texts: The chunk texts.
        metadata: Each chunk's metadata (same order as ``texts``).
        meaning: The dense threshold of the chunks at some positions (all of them: ``None``), when the corpus
            can measure one (an index's :meth:`~ragloop.retrievers.index.KnowledgeIndex.meaning_scales`, a
            Postgres store's :meth:`~ragloop.retrievers.postgres.PostgresStore.prepare_corpus`; see
            :mod:`ragloop.retrievers.meaning`); ``None``: the judges go without.
    """

    texts: tuple[str, ...] = field(converter=_strings)
    metadata: tuple[Mapping[str, str], ...] = field(converter=_mappings, repr=False)
    meaning: Callable[[Sequence[int] | None], MeaningScale | None] | None = field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.texts) != len(self.metadata):
            raise ConfigError(f"a corpus needs one metadata per text, got {len(self.texts)} and {len(self.metadata)}")

    @classmethod
    def of(
        cls, chunks: Iterable[Chunk], meaning: Callable[[Sequence[int] | None], MeaningScale | None] | None = None
    ) -> Corpus:
        """The corpus of ``chunks`` (their texts and metadata), with ``meaning`` when given."""
        listed = list(chunks)
        return cls(tuple(c.text for c in listed), tuple(dict(c.metadata) for c in listed), meaning)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> Corpus:
        """A corpus of texts without metadata (every filter hides all of it, no filter shows all of it)."""
        listed = tuple(texts)
        return cls(listed, tuple({} for _ in listed))

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def has_metadata(self) -> bool:
        """True when some chunk has metadata (only then can a filter show part of the corpus)."""
        return any(self.metadata)

    def visible(self, filters: Filters | None) -> tuple[int, ...]:
        """Positions of the chunks a search with ``filters`` can find (all of them without filters)."""
        if not filters:
            return tuple(range(len(self.texts)))
        return tuple(i for i, meta in enumerate(self.metadata) if matches_metadata(meta, filters))

    def texts_at(self, positions: Sequence[int]) -> list[str]:
        """The texts at ``positions``, in that order."""
        return [self.texts[i] for i in positions]


@define(eq=False)
class RunningScope:
    """The running turn's scope (its filters) and what was resolved for it during the turn.

    Attributes:
        filters: The turn's filters, canonical.
        key: The same as a hashable key (``()``: no filters).
        resolved: Per-turn memo of what scoped components looked up (keyed by their ``id``).
    """

    filters: Filters
    key: FilterKey
    resolved: dict[int, Any] = field(factory=dict)


_running: contextvars.ContextVar[RunningScope | None] = contextvars.ContextVar("ragloop_scope", default=None)


@contextlib.contextmanager
def turn_scope(filters: Filters | None) -> Iterator[RunningScope]:
    """Install ``filters`` as the scope of the code (and its child tasks and threads) run inside the block."""
    running = RunningScope(dict(filters or {}), filter_key(filters or {}))
    token = _running.set(running)
    try:
        yield running
    finally:
        _running.reset(token)


def running_scope() -> RunningScope | None:
    """The running turn's scope, or ``None`` outside a turn."""
    return _running.get()


def current_scope() -> FilterKey:
    """The running turn's scope as a hashable key: ``()`` without filters or outside a turn."""
    running = _running.get()
    return running.key if running is not None else ()
