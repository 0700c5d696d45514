"""Metadata filters: equality and set membership on chunk metadata.

A filter maps a metadata key to the values a chunk may have there: ``{"tenant": "acme"}`` (equality) or
``{"version": ["1.0", "1.1"]}`` (membership). Every key must match (AND); a chunk without the key never
matches. :func:`normalize_filters` turns what a caller passes into the canonical form
``{key: (value, …)}`` that every retriever takes; :func:`matches` is the local test, and the Postgres store
translates the same form into ``metadata->>key = ANY(values)``.

A filter key that no indexed chunk has is almost always a misspelling (``tenat``) and would silently match
nothing: :func:`check_filter_keys` refuses it with :class:`~ragloop.errors.UnknownFilterKey`, naming the keys
that exist. Retrievers that know their chunks' keys say so with ``metadata_keys()`` (:class:`KnowsKeys`); the
local retrievers, the local index and the Postgres store do, and :func:`check_retriever_filters` asks any of
them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, runtime_checkable

from ragloop.errors import ConfigError, UnknownFilterKey
from ragloop.state import Chunk

__all__ = [
    "FilterKey",
    "Filters",
    "FiltersArg",
    "KnowsKeys",
    "check_filter_keys",
    "check_retriever_filters",
    "filter_key",
    "matches",
    "matches_metadata",
    "metadata_keys",
    "normalize_filters",
]

#: Canonical filters: key → allowed values (sorted, distinct, at least one).
Filters = Mapping[str, tuple[str, ...]]
#: What callers may pass: key → one value or a collection of values.
FiltersArg = Mapping[str, str | int | bool | Collection[str | int | bool]]
#: Canonical filters as a hashable key (for caches of per-filter work).
FilterKey = tuple[tuple[str, tuple[str, ...]], ...]


def filter_key(filters: Filters) -> FilterKey:
    """``filters`` as a hashable key, the same for equal filters whatever their order."""
    return tuple(sorted(filters.items()))


def _value(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int):
        return str(value)
    raise ConfigError(f"filter {key!r}: values must be strings (or ints/bools), got {type(value).__name__}")


def normalize_filters(filters: FiltersArg | None) -> dict[str, tuple[str, ...]]:
    """The canonical form of ``filters`` (empty for ``None``).

    Raises:
        ConfigError: a key is empty or not a string, a value is not a string/int/bool, or a set is empty.
    """
    if not filters:
        return {}
    if not isinstance(filters, Mapping):
        raise ConfigError(f"filters must be a mapping like {{'tenant': 'acme'}}, got {type(filters).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for key, raw in filters.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"filter keys must be non-empty strings, got {key!r}")
        if isinstance(raw, str | int | bool):
            values: tuple[str, ...] = (_value(key, raw),)
        elif isinstance(raw, Collection):
            values = tuple(sorted({_value(key, v) for v in raw}))
        else:
            raise ConfigError(f"filter {key!r}: pass a value or a list of values, got {type(raw).__name__}")
        if not values:
            raise ConfigError(f"filter {key!r} has an empty set of values, which matches nothing; drop the key")
        out[key] = values
    return out


def matches(chunk: Chunk, filters: Filters) -> bool:
    """True when the chunk's metadata has, for every filter key, one of the allowed values."""
    if not filters:
        return True
    return matches_metadata(dict(chunk.metadata), filters)


def matches_metadata(meta: Mapping[str, str], filters: Filters) -> bool:
    """:func:`matches` on a chunk's metadata as a mapping (what a search with ``filters`` can find)."""
    return all(meta.get(key) in values for key, values in filters.items())


def metadata_keys(chunks: Iterable[Chunk]) -> frozenset[str] | None:
    """Every metadata key that at least one of ``chunks`` has; ``None`` when there are no chunks."""
    keys: set[str] = set()
    seen = False
    for c in chunks:
        seen = True
        keys.update(key for key, _ in c.metadata)
    return frozenset(keys) if seen else None


@runtime_checkable
class KnowsKeys(Protocol):
    """A retriever that knows which metadata keys its chunks have (so that filters can be checked)."""

    def metadata_keys(self) -> frozenset[str] | None:
        """The keys, or ``None`` when not known (then filters are not checked)."""
        ...


def check_filter_keys(filters: Filters | None, known: Collection[str] | None) -> None:
    """Refuse a filter on a key that no chunk has (``known``: the keys that exist, empty when the chunks have
    no metadata at all; ``None``: not known, e.g. an empty index, which finds nothing anyway).

    Raises:
        UnknownFilterKey: a key is not in ``known``; the message lists the known keys.
    """
    if not filters or known is None:
        return
    unknown = sorted(k for k in filters if k not in known)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        what = "filter key" if len(unknown) == 1 else "filter keys"
        listed = ", ".join(sorted(known)) or "none (the indexed chunks have no metadata)"
        raise UnknownFilterKey(f"unknown {what} {names}: no indexed chunk has it; known keys: {listed}")


def check_retriever_filters(retriever: object, filters: Filters | None) -> None:
    """:func:`check_filter_keys` against ``retriever.metadata_keys()`` when the retriever knows its keys."""
    if filters and isinstance(retriever, KnowsKeys):
        check_filter_keys(filters, retriever.metadata_keys())
