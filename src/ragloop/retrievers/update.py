"""Updating an index in place, document by document, reusing the embeddings of unchanged chunks.

Documents are compared by :func:`document_hash` (their chunks' ids, content hashes, URLs and metadata, in
order); a chunk's :func:`content_hash` covers the exact text that is embedded
(:func:`~ragloop.retrievers.index.index_text`: title, heading path and text), so a chunk with the same
content hash may reuse a stored vector and nothing else may. The same rules drive the local
:func:`update_index` and :meth:`ragloop.retrievers.postgres.PostgresStore.sync`.

The local index rebuilds BM25 and the faiss index from the merged vectors (cheap); only new or edited
chunks go through the embedder (the expensive part).

**Scopes** (:class:`~ragloop.retrievers.scope.Scope`): an update owns the documents of one scope (a tenant's
``--meta tenant=acme``) and adds, changes and removes only those; every other scope's chunks are kept exactly
as they were. **Removals are guarded**: a run that would remove more than :data:`MAX_REMOVED_SHARE` of its
scope's documents (the symptom of a wrong or half-empty folder) raises :class:`~ragloop.errors.PruneRefused`
before anything is written, unless ``prune=True``; :func:`plan_update` (and ``dry_run=True`` on the store)
says what a run would do without doing it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
from attrs import field, frozen

from ragloop.errors import PruneRefused
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.embed import Progress
from ragloop.retrievers.index import KnowledgeIndex, index_text
from ragloop.retrievers.scope import Scope
from ragloop.state import Chunk

__all__ = [
    "MAX_REMOVED_SHARE",
    "DocumentDiff",
    "SyncSummary",
    "check_removals",
    "content_hash",
    "diff_documents",
    "document_hash",
    "group_documents",
    "plan_update",
    "update_index",
]

#: The largest share of a scope's stored documents that one run may remove without ``prune`` (``--prune``):
#: more than this is refused, since a wrong path or a half-copied folder looks exactly like a mass deletion.
MAX_REMOVED_SHARE = 0.2


def content_hash(chunk: Chunk) -> str:
    """The hash of exactly what is embedded for ``chunk`` (equal hashes may share one vector)."""
    return hashlib.sha256(index_text(chunk).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def document_hash(chunks: Sequence[Chunk]) -> str:
    """The hash of one document as indexed: its chunks' ids, content hashes, URLs and metadata, in order."""
    h = hashlib.sha256()
    for c in chunks:
        row = [c.id, content_hash(c), c.source, c.url, [list(kv) for kv in c.metadata]]
        h.update(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def group_documents(chunks: Iterable[Chunk]) -> dict[str, list[Chunk]]:
    """Chunks grouped by ``doc_id``, in their given order (a repeated chunk id within a document kept once)."""
    docs: dict[str, list[Chunk]] = {}
    seen: set[tuple[str, str]] = set()
    for c in chunks:
        if (c.doc_id, c.id) not in seen:
            seen.add((c.doc_id, c.id))
            docs.setdefault(c.doc_id, []).append(c)
    return docs


@frozen
class DocumentDiff:
    """Which documents an update touches.

    Attributes:
        added: New document ids.
        changed: Ids whose hash differs.
        removed: Stored ids that are gone.
        unchanged: Ids with the same hash.
    """

    added: tuple[str, ...]
    changed: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]


def diff_documents(
    new: Mapping[str, Sequence[Chunk]], stored: Mapping[str, str], *, delete_missing: bool = True
) -> DocumentDiff:
    """Compare new documents with stored document hashes (pure; every output sorted)."""
    hashes = {d: document_hash(cs) for d, cs in new.items()}
    return DocumentDiff(
        added=tuple(sorted(d for d in hashes if d not in stored)),
        changed=tuple(sorted(d for d, h in hashes.items() if d in stored and stored[d] != h)),
        removed=tuple(sorted(d for d in stored if d not in hashes)) if delete_missing else (),
        unchanged=tuple(sorted(d for d, h in hashes.items() if stored.get(d) == h)),
    )


def check_removals(
    removed: int, stored: int, *, scope: Scope, where: str, prune: bool = False, max_share: float = MAX_REMOVED_SHARE
) -> None:
    """Refuse a run that would remove more than ``max_share`` of its scope's ``stored`` documents (pure).

    Raises:
        PruneRefused: too many removals and no ``prune``; the message says how to look and how to go ahead.
    """
    if prune or not removed or removed <= max_share * stored:
        return
    raise PruneRefused(
        f"refusing to remove {removed} of {stored} documents ({removed / stored:.0%}) of scope {scope.describe()} "
        f"in {where}: more than the {max_share:.0%} one run may remove; nothing was changed. Check the folder "
        "(a wrong path?), preview with --dry-run, then pass --prune (prune=True) to remove them"
    )


@frozen
class SyncSummary:
    """What an update did.

    Attributes:
        added: Documents added.
        changed: Documents whose chunks were replaced.
        removed: Documents deleted.
        unchanged: Documents left as they were.
        embedded: Chunks that went through the embedder.
        reused: Chunks of added or changed documents (or, locally, of every document) whose stored
            embedding was reused.
        chunks: Chunks in the index afterwards (for a dry run: now).
        seconds: Wall-clock time.
        scope: The scope the run owned.
        dry_run: Nothing was written: the counts say what the run would do.
        added_ids: The added document ids.
        changed_ids: The changed document ids.
        removed_ids: The removed document ids.
        refusal: For a dry run, why the real run would be refused (too many removals without ``prune``).
        adopted: Added documents that were stored without a scope (indexed before scopes, with the scope's
            metadata) and moved into this scope rather than copied.
    """

    added: int
    changed: int
    removed: int
    unchanged: int
    embedded: int
    reused: int
    chunks: int
    seconds: float
    scope: Scope = field(factory=Scope)
    dry_run: bool = False
    added_ids: tuple[str, ...] = ()
    changed_ids: tuple[str, ...] = ()
    removed_ids: tuple[str, ...] = ()
    refusal: str = ""
    adopted: int = 0

    @classmethod
    def of(cls, diff: DocumentDiff, **counts: Any) -> SyncSummary:
        """A summary of ``diff`` (its document ids kept) with the chunk counts and the rest as keywords."""
        return cls(
            added=len(diff.added),
            changed=len(diff.changed),
            removed=len(diff.removed),
            unchanged=len(diff.unchanged),
            added_ids=diff.added,
            changed_ids=diff.changed,
            removed_ids=diff.removed,
            **counts,
        )

    def line(self) -> str:
        """One human-readable line (for a dry run: what would be done, and that nothing was written)."""
        moved = f" ({self.adopted} of them indexed before scopes, moved into this one)" if self.adopted else ""
        if self.dry_run:
            return (
                f"dry run, nothing written: documents: {self.added} to add{moved}, {self.changed} to change, "
                f"{self.removed} to remove, {self.unchanged} unchanged; chunks: {self.embedded} to embed, "
                f"{self.reused} reused, {self.chunks} in the index now"
            )
        return (
            f"documents: {self.added} added{moved}, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged} unchanged; chunks: {self.embedded} embedded, {self.reused} reused, "
            f"{self.chunks} in the index ({self.seconds:.1f}s)"
        )

    def as_dict(self) -> dict[str, Any]:
        """The counts as a dict (for ``--json`` and benchmarks); the scope, and for a dry run the ids too."""
        out: dict[str, Any] = {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "embedded": self.embedded,
            "reused": self.reused,
            "chunks": self.chunks,
            "seconds": self.seconds,
            "scope": dict(self.scope.pairs),
            "adopted": self.adopted,
        }
        if self.dry_run:
            out.update(dry_run=True, added_ids=list(self.added_ids), changed_ids=list(self.changed_ids))
            out["refusal"] = self.refusal or None
        out["removed_ids"] = list(self.removed_ids)
        return out


def _embed(embedder: Embedder, texts: Sequence[str], progress: Progress | None) -> npt.NDArray[np.float32]:
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    embed_sync = getattr(embedder, "embed_sync", None)
    if embed_sync is not None:
        return np.asarray(embed_sync(list(texts), progress=progress), dtype=np.float32)

    async def run() -> npt.NDArray[np.float32]:
        return np.asarray(await embedder.embed(list(texts)), dtype=np.float32)

    return anyio.run(run)


def plan_update(
    old: KnowledgeIndex, chunks: Iterable[Chunk], *, scope: Scope | Mapping[str, str] | None = None
) -> tuple[list[Chunk], DocumentDiff, int, frozenset[str]]:
    """What :func:`update_index` would do, without embedding anything (pure).

    Returns:
        The scope's new chunks (as the index stores them: :meth:`Scope.apply`), the diff against the documents
        the index holds under that scope, how many documents it holds there, and the added documents that the
        index holds without a scope but with the scope's metadata (indexed with the same ``--meta`` before
        scopes existed): the update moves those into the scope instead of keeping a second copy.
    """
    scoped = Scope.of(scope)
    new = KnowledgeIndex._dedupe(scoped.apply(chunks))
    mine = [c for c in old.chunks if old.scope_of(c.id) == scoped]
    before = {d: document_hash(cs) for d, cs in group_documents(mine).items()}
    diff = diff_documents(group_documents(new), before)
    adopted: frozenset[str] = frozenset()
    if scoped.pairs:
        added, pairs = set(diff.added), dict(scoped.pairs)
        adopted = frozenset(
            c.doc_id
            for c in old.chunks
            if c.doc_id in added and not old.scope_of(c.id).pairs and pairs.items() <= c.meta().items()
        )
    return new, diff, len(before), adopted


def update_index(
    old: KnowledgeIndex,
    chunks: Iterable[Chunk],
    *,
    scope: Scope | Mapping[str, str] | None = None,
    prune: bool = False,
    max_removed: float = MAX_REMOVED_SHARE,
    progress: Progress | None = None,
) -> tuple[KnowledgeIndex, SyncSummary]:
    """A new index in which ``scope``'s documents are exactly ``chunks``' and every other scope's are kept.

    Vectors of unchanged chunks (same content hash, in any scope) are reused; only new text is embedded.

    Args:
        old: The index as it stands (its embedder embeds what is new).
        chunks: Every chunk the scope should hold now (as :func:`ragloop.retrievers.ingest.ingest_path`
            returns them).
        scope: The scope this update owns (``None``: the documents indexed without one).
        prune: Allow removing more than ``max_removed`` of the scope's documents.
        max_removed: The share of the scope's documents that may be removed without ``prune``.
        progress: ``progress(done, total)`` while embedding.

    Returns:
        The new index (not yet saved) and what changed.

    Raises:
        PruneRefused: the update would remove more than ``max_removed`` of the scope and ``prune`` is off.
    """
    started = time.perf_counter()
    scoped = Scope.of(scope)
    mine, diff, stored, adopted = plan_update(old, chunks, scope=scoped)
    check_removals(len(diff.removed), stored, scope=scoped, where="the index", prune=prune, max_share=max_removed)
    kept = [
        c
        for c in old.chunks
        if old.scope_of(c.id) != scoped and not (c.doc_id in adopted and not old.scope_of(c.id).pairs)
    ]
    new = KnowledgeIndex._dedupe([*kept, *mine])
    scopes = {c.id: old.scope_of(c.id) for c in kept} | {c.id: scoped for c in mine}
    old_ids = {content_hash(c): c.id for c in old.chunks}
    hashes = [content_hash(c) for c in new]
    reuse = [i for i, h in enumerate(hashes) if h in old_ids]
    fresh = [i for i, h in enumerate(hashes) if h not in old_ids]
    vectors = np.zeros((len(new), old.embedder.dim), dtype=np.float32)
    if reuse:
        vectors[reuse] = old.dense.vectors([old_ids[hashes[i]] for i in reuse])
    if fresh:
        vectors[fresh] = _embed(old.embedder, [index_text(new[i]) for i in fresh], progress)
    index = KnowledgeIndex._assemble(
        new,
        vectors,
        old.embedder,
        hnsw_threshold=old.dense.hnsw_threshold,
        stem=old.bm25.tokenizer.stem,
        scopes=scopes,
        headings=old._known_heading_vectors(),  # a heading's vector depends on its text alone, like a chunk's
    )
    summary = SyncSummary.of(
        diff,
        embedded=len(fresh),
        reused=len(reuse),
        chunks=len(new),
        seconds=time.perf_counter() - started,
        scope=scoped,
        adopted=len(adopted),
    )
    return index, summary
