"""Protocols of the retrieval layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ragloop.state import Hit

__all__ = ["Embedder", "Retriever", "search_with_filters"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into float32 unit vectors of a fixed dimension."""

    #: Stable name recorded in index manifests (a different name at load time is an error).
    name: str
    #: Vector dimension.
    dim: int

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return an ``(len(texts), dim)`` float32 array of L2-normalised rows."""
        ...


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a query with scored hits."""

    async def search(
        self, query: str, k: int = 10, filters: Mapping[str, tuple[str, ...]] | None = None
    ) -> Sequence[Hit]:
        """Return at most ``k`` hits, best first, among chunks whose metadata matches ``filters``.

        ``filters`` maps a metadata key to its allowed values (see :mod:`ragloop.retrievers.filters`).
        """
        ...


async def search_with_filters(
    retriever: Retriever, query: str, k: int, filters: Mapping[str, tuple[str, ...]] | None
) -> list[Hit]:
    """``retriever.search(query, k)``, passing ``filters`` only when there are some, so that retrievers written
    before filters (``search(query, k)``) keep working."""
    if filters:
        return list(await retriever.search(query, k, filters=filters))
    return list(await retriever.search(query, k))
