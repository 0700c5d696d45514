"""The knowledge base as the MCP server shows it: a search, and whole documents to read by id.

:class:`Documents` is the seam: :class:`IndexDocuments` serves a local :class:`~ragloop.retrievers.index.
KnowledgeIndex` (search, list, read); :class:`StoreDocuments` searches a Postgres store, whose documents cannot
be listed or read whole yet (a read says so). Every call takes the principal's server-side filters: a document
outside them is not listed, and reading it is the same "unknown document" as an id no one has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attrs import frozen

from ragloop.errors import ConfigError
from ragloop.retrievers.base import Retriever, search_with_filters
from ragloop.retrievers.filters import matches

if TYPE_CHECKING:
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.state import Chunk, Hit

__all__ = ["Document", "Documents", "IndexDocuments", "StoreDocuments"]

Filters = Mapping[str, tuple[str, ...]]


@frozen
class Document:
    """One document of the knowledge base.

    Attributes:
        doc_id: Its id (the chunks' ``doc_id``, or their source).
        title: Its title.
        source: Where it came from.
        url: Its link, when known.
        text: The cleaned text of its chunks, in order (empty in a listing).
    """

    doc_id: str
    title: str
    source: str
    url: str = ""
    text: str = ""


@runtime_checkable
class Documents(Protocol):
    """What the MCP ``search`` tool and the ``ragloop://doc/{id}`` resources read."""

    async def search(self, query: str, k: int, filters: Filters) -> Sequence[Hit]:
        """The ``k`` best hits among chunks matching ``filters``."""
        ...

    async def listing(self, filters: Filters, offset: int, limit: int) -> tuple[Sequence[Document], bool]:
        """Up to ``limit`` documents matching ``filters`` from ``offset`` (without text), and whether more follow."""
        ...

    async def read(self, doc_id: str, filters: Filters) -> Document | None:
        """The document with its text, or ``None`` when no chunk of it matches ``filters`` (or it does not exist)."""
        ...


def _doc_id(chunk: Chunk) -> str:
    return chunk.doc_id or chunk.source or chunk.id


class IndexDocuments:
    """The documents of a local index.

    Args:
        index: The index (as ``ragloop index`` wrote it, or :func:`ragloop.sample.sample_index`).
        mode: Retrieval mode of the search: ``hybrid``, ``bm25`` or ``dense``.
    """

    def __init__(self, index: KnowledgeIndex, mode: str = "hybrid") -> None:
        self.index = index
        self.mode = mode
        self._chunks: dict[str, list[Chunk]] = {}
        for chunk in index.chunks:
            self._chunks.setdefault(_doc_id(chunk), []).append(chunk)

    async def search(self, query: str, k: int, filters: Filters) -> Sequence[Hit]:
        """The index's search in ``mode``."""
        return await self.index.search(query, k, self.mode, filters=dict(filters) or None)  # type: ignore[arg-type]

    def _visible(self, doc_id: str, filters: Filters) -> list[Chunk]:
        return [c for c in self._chunks.get(doc_id, ()) if not filters or matches(c, filters)]

    async def listing(self, filters: Filters, offset: int, limit: int) -> tuple[Sequence[Document], bool]:
        """Documents in index order."""
        out: list[Document] = []
        seen = 0
        for doc_id in self._chunks:
            chunks = self._visible(doc_id, filters)
            if not chunks:
                continue
            if seen >= offset:
                if len(out) == limit:
                    return out, True
                first = chunks[0]
                out.append(Document(doc_id, first.title, first.source, first.url))
            seen += 1
        return out, False

    async def read(self, doc_id: str, filters: Filters) -> Document | None:
        """The visible chunks of ``doc_id``, joined."""
        chunks = self._visible(doc_id, filters)
        if not chunks:
            return None
        first = chunks[0]
        return Document(doc_id, first.title, first.source, first.url, "\n\n".join(c.text for c in chunks))


class StoreDocuments:
    """Search over a retriever such as the Postgres store; its documents cannot be listed or read whole.

    Args:
        retriever: The store (or any retriever).
    """

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    async def search(self, query: str, k: int, filters: Filters) -> Sequence[Hit]:
        """The retriever's search."""
        return await search_with_filters(self.retriever, query, k, dict(filters) or None)

    async def listing(self, filters: Filters, offset: int, limit: int) -> tuple[Sequence[Document], bool]:
        """Nothing: the store does not list its documents."""
        return (), False

    async def read(self, doc_id: str, filters: Filters) -> Document | None:
        """Refused with a line saying what works instead."""
        raise ConfigError(
            "reading whole documents needs a local index (ragloop mcp --index DIR); over a --store the search "
            "tool's hits carry each passage's text"
        )
