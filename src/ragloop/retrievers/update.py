"""Updating an index in place, document by document, reusing the embeddings of unchanged chunks.

Documents are compared by :func:`document_hash` (their chunks' ids, content hashes, URLs and metadata, in
order); a chunk's :func:`content_hash` covers the exact text that is embedded
(:func:`~ragloop.retrievers.index.index_text`: title, heading path and text), so a chunk with the same
content hash may reuse a stored vector and nothing else may. The same rules drive the local
:func:`update_index` and :meth:`ragloop.retrievers.postgres.PostgresStore.sync`.

The local index rebuilds BM25 and the faiss index from the merged vectors (cheap); only new or edited
chunks go through the embedder (the expensive part).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence

import anyio
import numpy as np
import numpy.typing as npt
from attrs import frozen

from ragloop.retrievers.base import Embedder
from ragloop.retrievers.embed import Progress
from ragloop.retrievers.index import KnowledgeIndex, index_text
from ragloop.state import Chunk

__all__ = [
    "DocumentDiff",
    "SyncSummary",
    "content_hash",
    "diff_documents",
    "document_hash",
    "group_documents",
    "update_index",
]


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
        chunks: Chunks in the index afterwards.
        seconds: Wall-clock time.
    """

    added: int
    changed: int
    removed: int
    unchanged: int
    embedded: int
    reused: int
    chunks: int
    seconds: float

    def line(self) -> str:
        """One human-readable line."""
        return (
            f"documents: {self.added} added, {self.changed} changed, {self.removed} removed, "
            f"{self.unchanged} unchanged; chunks: {self.embedded} embedded, {self.reused} reused, "
            f"{self.chunks} in the index ({self.seconds:.1f}s)"
        )

    def as_dict(self) -> dict[str, int | float]:
        """The counts as a dict (for ``--json`` and benchmarks)."""
        return {
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "embedded": self.embedded,
            "reused": self.reused,
            "chunks": self.chunks,
            "seconds": self.seconds,
        }


def _embed(embedder: Embedder, texts: Sequence[str], progress: Progress | None) -> npt.NDArray[np.float32]:
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    embed_sync = getattr(embedder, "embed_sync", None)
    if embed_sync is not None:
        return np.asarray(embed_sync(list(texts), progress=progress), dtype=np.float32)

    async def run() -> npt.NDArray[np.float32]:
        return np.asarray(await embedder.embed(list(texts)), dtype=np.float32)

    return anyio.run(run)


def update_index(
    old: KnowledgeIndex, chunks: Iterable[Chunk], *, progress: Progress | None = None
) -> tuple[KnowledgeIndex, SyncSummary]:
    """A new index over ``chunks`` that reuses ``old``'s vectors for every unchanged chunk.

    Args:
        old: The index as it stands (its embedder embeds what is new).
        chunks: Every chunk the index should hold now (as :func:`ragloop.retrievers.ingest.ingest_path`
            returns them).
        progress: ``progress(done, total)`` while embedding.

    Returns:
        The new index (not yet saved) and what changed.
    """
    started = time.perf_counter()
    new = KnowledgeIndex._dedupe(chunks)
    before = {d: document_hash(cs) for d, cs in group_documents(old.chunks).items()}
    diff = diff_documents(group_documents(new), before)
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
    )
    summary = SyncSummary(
        added=len(diff.added),
        changed=len(diff.changed),
        removed=len(diff.removed),
        unchanged=len(diff.unchanged),
        embedded=len(fresh),
        reused=len(reuse),
        chunks=len(new),
        seconds=time.perf_counter() - started,
    )
    return index, summary
