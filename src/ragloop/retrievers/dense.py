"""Dense vector search with faiss, addressed by chunk id.

:class:`DenseIndex` stores unit vectors under chunk ids. Below ``hnsw_threshold`` vectors it is an exact
inner-product index (``IndexFlatIP``); at or above it, an approximate HNSW graph (``IndexHNSWFlat`` with
inner product), both inside an ``IndexIDMap2`` keyed by int64 ids derived from the chunk ids. Inner product
of unit vectors is the cosine.

Serving-path searches run with one OpenMP thread: on a small machine a multi-threaded single-query search
is many times slower than a single-threaded one. :class:`DenseRetriever` embeds the query and searches in a
worker thread (``anyio.to_thread``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
import faiss
import numpy as np
import numpy.typing as npt

from ragloop.errors import ConfigError, IndexError_, RetrievalError
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.filters import FilterKey, Filters, check_filter_keys, filter_key, matches, metadata_keys
from ragloop.state import Chunk, Hit

__all__ = ["DenseIndex", "DenseRetriever", "chunk_int_id", "cosine_confidence"]


def chunk_int_id(chunk_id: str) -> int:
    """The stable non-negative int64 faiss id of a chunk id (first 63 bits of its blake2b digest)."""
    digest = hashlib.blake2b(chunk_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def cosine_confidence(cosine: float, low: float, high: float) -> float:
    """Map a cosine to [0, 1]: 0 at or below ``low``, 1 at or above ``high``, linear between."""
    if high <= low:
        return 1.0 if cosine >= high else 0.0
    return float(min(1.0, max(0.0, (cosine - low) / (high - low))))


class DenseIndex:
    """Unit vectors under chunk ids; exact search when small, HNSW when large.

    Args:
        dim: Vector dimension.
        hnsw_threshold: Size at which the index becomes HNSW (checked on every :meth:`add`); exact below.
        hnsw_m: HNSW graph degree.
        ef_construction: HNSW build-time beam width.
        ef_search: HNSW search-time beam width (raised to ``k`` when a search asks for more).
    """

    def __init__(
        self,
        dim: int,
        *,
        hnsw_threshold: int = 50_000,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 64,
    ) -> None:
        if dim < 1:
            raise ConfigError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.hnsw_threshold = hnsw_threshold
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self._index: Any = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._hnsw = False
        self._ids: dict[int, str] = {}
        # HNSW cannot remove vectors; deleted ids are tombstoned and filtered at search time.
        self._tombstones: set[int] = set()

    @property
    def kind(self) -> str:
        """``"flat"`` (exact) or ``"hnsw"`` (approximate)."""
        return "hnsw" if self._hnsw else "flat"

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, chunk_id: object) -> bool:
        return isinstance(chunk_id, str) and chunk_int_id(chunk_id) in self._ids

    def chunk_ids(self) -> list[str]:
        """The stored chunk ids, in faiss storage order (deleted ones left out)."""
        ids = faiss.vector_to_array(self._index.id_map)
        return [self._ids[int(i)] for i in ids if int(i) in self._ids]

    def _new_hnsw(self) -> Any:
        inner = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = self.ef_construction
        inner.hnsw.efSearch = self.ef_search
        return faiss.IndexIDMap2(inner)

    def add(self, chunk_ids: Sequence[str], vectors: npt.ArrayLike) -> None:
        """Add (or replace) vectors under ``chunk_ids``; becomes HNSW once the size reaches the threshold.

        Raises:
            ConfigError: the vectors have the wrong shape, or two different chunk ids hash to one int id.
        """
        vecs = np.ascontiguousarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape != (len(chunk_ids), self.dim):
            raise ConfigError(
                f"expected vectors of shape ({len(chunk_ids)}, {self.dim}), got {vecs.shape}; the embedder's "
                "dim must match the index's"
            )
        int_ids = np.fromiter((chunk_int_id(c) for c in chunk_ids), dtype=np.int64, count=len(chunk_ids))
        new: dict[int, str] = {}
        for cid, iid in zip(chunk_ids, int_ids.tolist(), strict=True):
            known = self._ids.get(iid, new.get(iid))
            if known is not None and known != cid:
                raise ConfigError(f"chunk ids {known!r} and {cid!r} collide on faiss id {iid}; rename one")
            new[iid] = cid
        present = [i for i in new if i in self._ids]
        if present:
            self.delete(self._ids[i] for i in present)
        # Keep only the last vector of ids repeated within this call.
        last = {iid: pos for pos, iid in enumerate(int_ids.tolist())}
        keep = np.fromiter(sorted(last.values()), dtype=np.int64)
        vecs, int_ids = vecs[keep], int_ids[keep]
        if self._hnsw and not self._tombstones.isdisjoint(new):
            self.compact()  # a re-added id must not resurrect its tombstoned old vector
        if not self._hnsw and len(self._ids) + len(int_ids) >= self.hnsw_threshold:
            self._upgrade()
        self._index.add_with_ids(vecs, int_ids)
        self._ids.update(new)

    def _upgrade(self) -> None:
        old = self._index
        hnsw = self._new_hnsw()
        if old.ntotal:
            ids = faiss.vector_to_array(old.id_map).astype(np.int64)
            vecs = old.index.reconstruct_n(0, old.ntotal)
            hnsw.add_with_ids(vecs, ids)
        self._index = hnsw
        self._hnsw = True

    def delete(self, chunk_ids: Iterable[str]) -> int:
        """Remove the vectors of ``chunk_ids`` (unknown ids are ignored); returns how many were removed."""
        iids = [chunk_int_id(c) for c in chunk_ids]
        iids = [i for i in iids if i in self._ids]
        for i in iids:
            del self._ids[i]
        if not iids:
            return 0
        if self._hnsw:
            self._tombstones.update(iids)
        else:
            self._index.remove_ids(np.asarray(iids, dtype=np.int64))
        return len(iids)

    def vectors(self, chunk_ids: Sequence[str]) -> npt.NDArray[np.float32]:
        """The stored vectors of ``chunk_ids`` (rows of zeros for unknown ids)."""
        out = np.zeros((len(chunk_ids), self.dim), dtype=np.float32)
        for row, cid in enumerate(chunk_ids):
            iid = chunk_int_id(cid)
            if iid in self._ids:
                out[row] = self._index.reconstruct(iid)
        return out

    def search_sync(self, queries: npt.ArrayLike, k: int) -> list[list[tuple[str, float]]]:
        """Top-``k`` ``(chunk_id, cosine)`` per query row, best first and equal cosines by chunk id (the order
        the Postgres store gives), with one OpenMP thread."""
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.shape[1] != self.dim:
            raise RetrievalError(f"query vectors have dim {q.shape[1]}, the index has {self.dim}")
        if k < 1 or not self._ids:
            return [[] for _ in range(len(q))]
        faiss.omp_set_num_threads(1)  # per calling thread: the serving path stays single-threaded
        # One row past k tells whether a tie straddles the k-th place; faiss orders ties its own way, so the
        # rows are re-sorted, and fetched again wider while the row past the last kept one still ties.
        want = min(k + len(self._tombstones) + 1, self._index.ntotal)
        while True:
            rows = self._search_rows(q, want)
            if want >= self._index.ntotal or all(len(r) <= k or r[k][1] < r[k - 1][1] for r in rows):
                break
            want = min(2 * want, self._index.ntotal)
        return [sorted(r, key=lambda hit: (-hit[1], hit[0]))[:k] for r in rows]

    def _search_rows(self, q: npt.NDArray[np.float32], want: int) -> list[list[tuple[str, float]]]:
        """faiss's ``want`` nearest rows per query, deleted ids left out, in faiss's order."""
        params = None
        if self._hnsw:
            params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, want))  # type: ignore[attr-defined]
        scores, ids = self._index.search(q, want, params=params)
        return [
            [
                (self._ids[i], float(s))
                for s, i in zip(srow.tolist(), irow.tolist(), strict=True)
                if i >= 0 and i not in self._tombstones and i in self._ids
            ]
            for srow, irow in zip(scores, ids, strict=True)
        ]

    def compact(self) -> None:
        """Rebuild an HNSW index without its deleted vectors (a no-op for the exact index)."""
        if not self._hnsw or not self._tombstones:
            return
        old = self._index
        ids = faiss.vector_to_array(old.id_map).astype(np.int64)
        keep = np.asarray([i not in self._tombstones for i in ids.tolist()], dtype=bool)
        vecs = old.index.reconstruct_n(0, old.ntotal)[keep]
        self._index = self._new_hnsw()
        self._index.add_with_ids(np.ascontiguousarray(vecs), ids[keep])
        self._tombstones.clear()

    def save(self, directory: Path) -> list[Path]:
        """Write ``dense.faiss`` (faiss's own format) and ``dense.json`` into ``directory``; returns them."""
        self.compact()
        index_path = directory / "dense.faiss"
        meta_path = directory / "dense.json"
        faiss.write_index(self._index, str(index_path))
        ids = faiss.vector_to_array(self._index.id_map).tolist()
        meta = {
            "dim": self.dim,
            "kind": self.kind,
            "hnsw_threshold": self.hnsw_threshold,
            "hnsw_m": self.hnsw_m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "chunk_ids": [self._ids[i] for i in ids],
        }
        meta_path.write_text(json.dumps(meta), encoding="utf-8")
        return [index_path, meta_path]

    @classmethod
    def load(cls, directory: Path) -> DenseIndex:
        """Read an index written by :meth:`save`.

        Raises:
            IndexError_: a file is missing or unreadable.
        """
        try:
            meta = json.loads((directory / "dense.json").read_text(encoding="utf-8"))
            raw: Any = faiss.read_index(str(directory / "dense.faiss"))
        except (OSError, ValueError, RuntimeError) as exc:
            raise IndexError_(
                f"cannot read the dense index in {directory}: {exc}; rebuild it with `ragloop index`"
            ) from exc
        self = cls(
            int(meta["dim"]),
            hnsw_threshold=int(meta["hnsw_threshold"]),
            hnsw_m=int(meta["hnsw_m"]),
            ef_construction=int(meta["ef_construction"]),
            ef_search=int(meta["ef_search"]),
        )
        self._index = raw
        self._hnsw = meta["kind"] == "hnsw"
        ids = faiss.vector_to_array(raw.id_map).tolist()
        if len(ids) != len(meta["chunk_ids"]):
            raise IndexError_(f"dense index in {directory} is inconsistent; rebuild it with `ragloop index`")
        self._ids = dict(zip(ids, meta["chunk_ids"], strict=True))
        return self


class DenseRetriever:
    """Embeds the query and searches a :class:`DenseIndex`; a :class:`~ragloop.retrievers.base.Retriever`.

    ``Hit.score`` and ``Hit.scores["dense"]`` are the cosine; ``Hit.confidence`` maps the cosine linearly
    from ``low`` (0) to ``high`` (1). The defaults suit MiniLM, where unrelated texts sit near 0.0–0.2 and
    clear paraphrases above 0.6.

    Args:
        index: The vectors.
        embedder: Must be the embedder the index was built with.
        chunks: Chunk id → chunk.
        low: Cosine at and below which confidence is 0.
        high: Cosine at and above which confidence is 1.
        name: Key used in ``Hit.ranks``/``Hit.scores``.
    """

    def __init__(
        self,
        index: DenseIndex,
        embedder: Embedder,
        chunks: Mapping[str, Chunk],
        *,
        low: float = 0.25,
        high: float = 0.65,
        name: str = "dense",
    ) -> None:
        if embedder.dim != index.dim:
            raise ConfigError(f"embedder {embedder.name!r} has dim {embedder.dim}, the index has {index.dim}")
        self.index = index
        self.embedder = embedder
        self.chunks = chunks
        self.low = low
        self.high = high
        self.name = name
        self._subsets: dict[FilterKey, tuple[list[str], npt.NDArray[np.float32]]] = {}
        self._keys: frozenset[str] | None = None
        self._keys_read = False

    def metadata_keys(self) -> frozenset[str] | None:
        """Every metadata key of the indexed chunks (a filter on another key is refused); ``None``: no chunks."""
        if not self._keys_read:
            self._keys, self._keys_read = metadata_keys(self.chunks.values()), True
        return self._keys

    async def embed_query(self, query: str) -> npt.NDArray[np.float32]:
        """The query's unit vector."""
        vecs = np.asarray(await self.embedder.embed([query]), dtype=np.float32)
        return np.ascontiguousarray(vecs[0], dtype=np.float32)

    async def search_vector(self, vector: npt.NDArray[np.float32], k: int = 10) -> list[Hit]:
        """Search with an already embedded query."""
        rows = await anyio.to_thread.run_sync(self.index.search_sync, vector, k)
        return self._hits(rows[0])

    def _hits(self, rows: Sequence[tuple[str, float]]) -> list[Hit]:
        """Hits from ``(chunk_id, cosine)`` rows, ranked in the given order (ids without a chunk are skipped)."""
        return [
            Hit(
                chunk=self.chunks[cid],
                score=cos,
                confidence=cosine_confidence(cos, self.low, self.high),
                ranks={self.name: rank},
                scores={self.name: cos},
            )
            for rank, (cid, cos) in enumerate(rows, start=1)
            if cid in self.chunks
        ]

    async def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """Return at most ``k`` hits by cosine, best first, among chunks matching ``filters``.

        Raises:
            UnknownFilterKey: a filter key that no chunk has.
        """
        check_filter_keys(filters, self.metadata_keys())
        vector = await self.embed_query(query)
        if not filters:
            return await self.search_vector(vector, k)
        return self._hits(await anyio.to_thread.run_sync(self.search_filtered, vector, k, filters))

    def subset(self, filters: Filters) -> tuple[list[str], npt.NDArray[np.float32]]:
        """The ids of the chunks matching ``filters`` and their vectors (cached per filter)."""
        key = filter_key(filters)
        found = self._subsets.get(key)
        if found is None:
            ids = [cid for cid in self.index.chunk_ids() if cid in self.chunks and matches(self.chunks[cid], filters)]
            found = (ids, self.index.vectors(ids))
            if len(self._subsets) >= 16:
                self._subsets.clear()
            self._subsets[key] = found
        return found

    def search_filtered(self, vector: npt.NDArray[np.float32], k: int, filters: Filters) -> list[tuple[str, float]]:
        """Exact top-``k`` ``(chunk_id, cosine)`` among the chunks matching ``filters`` (ties by id)."""
        ids, vecs = self.subset(filters)
        if not ids or k < 1:
            return []
        cos = vecs @ np.asarray(vector, dtype=np.float32)
        kk = min(k, len(ids))
        top = np.argpartition(-cos, kk - 1)[:kk].tolist()
        order = sorted(top, key=lambda i: (-float(cos[i]), ids[i]))
        return [(ids[i], float(cos[i])) for i in order]
