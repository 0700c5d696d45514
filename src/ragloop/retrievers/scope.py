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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

import attrs
from attrs import field, frozen

from ragloop.errors import ConfigError
from ragloop.state import Chunk

__all__ = ["Scope"]


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
