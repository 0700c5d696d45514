"""Lexical search: BM25 with ``bm25s`` (numpy core), English stopwords and an optional stemmer.

:class:`BM25Index` tokenises (lower-case ``\\w\\w+`` words, English stopwords dropped, Snowball English
stemming via PyStemmer when ``stem=True``), scores with bm25s's precomputed sparse matrix, and saves with
bm25s's own pickle-free format (``.npy`` arrays + JSON) plus a small JSON of its own.

:class:`BM25Retriever` wraps it as a :class:`~ragloop.retrievers.base.Retriever`. Its ``confidence`` is the
BM25 score divided by the query's *best possible* score in this corpus — the sum, over the query's terms,
of the highest score each term reaches in any chunk — times the share of query terms the corpus knows. A
chunk that matches every query term as strongly as any chunk does scores 1; one that matches only common
words scores near 0.

**Statistics per scope.** Given the text each chunk was indexed with (``text_of``), a filtered search scores
with the statistics of the chunks the filters let it find — their IDF, mean length and best possible scores —
from a BM25 index over just those chunks, built on the first search of that scope and kept for the next ones
(:data:`MAX_SCOPES` of them). A tenant's scores, ranks and confidences are then what they would be in an index
of its own: no other tenant's documents move them, or can be read back from them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
import bm25s
import numpy as np
import numpy.typing as npt
from bm25s.stopwords import STOPWORDS_EN

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.filters import FilterKey, Filters, check_filter_keys, filter_key, matches, metadata_keys
from ragloop.state import Chunk, Hit
from ragloop.text import has_snowball, stem, tokenize

__all__ = ["MAX_SCOPES", "BM25Index", "BM25Retriever", "Tokenizer"]

#: Scopes whose own BM25 index a :class:`BM25Retriever` keeps (least recently used dropped first).
MAX_SCOPES = 32


class Tokenizer:
    """Lower-case words of two or more characters, English stopwords removed, optionally stemmed.

    The words and the stemmer are :mod:`ragloop.text`'s (``tokenize(identifiers=False)``, ``stem(keep_ids=False)``);
    the stopwords are bm25s's English list. Both settings are what every saved index was built with, so its
    retrieval results do not change.

    Args:
        stem: Apply the Snowball English stemmer (PyStemmer).
        stopwords: Drop English stopwords (bm25s's list).
    """

    def __init__(self, *, stem: bool = True, stopwords: bool = True) -> None:
        if stem and not has_snowball():
            raise ConfigError("stemming needs PyStemmer: pip install PyStemmer (or pass stem=False)")
        self.stem = stem
        self.stopwords = stopwords
        self._stop = frozenset(STOPWORDS_EN) if stopwords else frozenset()

    def __call__(self, text: str) -> list[str]:
        words = [w for w in tokenize(text, identifiers=False) if w not in self._stop]
        if self.stem:
            words = [stem(w, keep_ids=False) for w in words]
        return words

    def config(self) -> dict[str, Any]:
        """The settings, as saved next to the index."""
        return {"stem": self.stem, "stopwords": self.stopwords}


class BM25Index:
    """A BM25 index over texts addressed by chunk id.

    Args:
        k1: Term-frequency saturation.
        b: Length normalisation.
        stem: Stem words (Snowball English).
        stopwords: Drop English stopwords.
    """

    def __init__(self, *, k1: float = 1.2, b: float = 0.75, stem: bool = True, stopwords: bool = True) -> None:
        self.k1 = k1
        self.b = b
        self.tokenizer = Tokenizer(stem=stem, stopwords=stopwords)
        self.chunk_ids: list[str] = []
        self._bm25: Any = None
        self._term_max: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def build(self, chunk_ids: Sequence[str], texts: Sequence[str]) -> None:
        """Index ``texts`` under ``chunk_ids`` (replacing any previous content)."""
        if len(chunk_ids) != len(texts):
            raise ConfigError(f"{len(chunk_ids)} ids for {len(texts)} texts")
        model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        corpus = [self.tokenizer(t) for t in texts]
        # bm25s divides by the mean length: a corpus without a single term is kept as "empty".
        has_terms = any(corpus)
        if has_terms:
            model.index(corpus, show_progress=False)
        self._bm25 = model if has_terms else None
        self.chunk_ids = list(chunk_ids)
        self._term_max = self._compute_term_max()

    def _compute_term_max(self) -> npt.NDArray[np.float32]:
        if self._bm25 is None:
            return np.zeros(0, dtype=np.float32)
        data = np.asarray(self._bm25.scores["data"], dtype=np.float32)
        indptr = np.asarray(self._bm25.scores["indptr"])
        out = np.zeros(len(indptr) - 1, dtype=np.float32)
        nonempty = indptr[1:] > indptr[:-1]
        if data.size:
            out[nonempty] = np.maximum.reduceat(data, indptr[:-1][nonempty])
        return out

    def _term_ids(self, query: str) -> tuple[list[int], int]:
        vocab: Mapping[str, int] = self._bm25.vocab_dict
        tokens = self.tokenizer(query)
        ids = [vocab[t] for t in tokens if t in vocab and t != ""]
        return ids, len(tokens)

    def scores(self, query: str) -> tuple[npt.NDArray[np.float32], float]:
        """BM25 score of every chunk for ``query`` and the query's best possible score (0 if none)."""
        if self._bm25 is None:
            return np.zeros(len(self.chunk_ids), dtype=np.float32), 0.0
        ids, n_tokens = self._term_ids(query)
        if not ids:
            return np.zeros(len(self.chunk_ids), dtype=np.float32), 0.0
        scores = np.asarray(self._bm25.get_scores_from_ids(ids), dtype=np.float32)
        best = float(self._term_max[ids].sum())
        # Query words the corpus never saw count as unmatched: scale the ceiling up by the unknown share.
        best *= n_tokens / len(ids)
        return scores, best

    def search_sync(self, query: str, k: int) -> list[tuple[str, float, float]]:
        """Top-``k`` ``(chunk_id, score, normalised score)`` with a positive score, best first."""
        return self.top(*self.scores(query), k)

    def top(self, scores: npt.NDArray[np.float32], best: float, k: int) -> list[tuple[str, float, float]]:
        """Top-``k`` of a score vector from :meth:`scores` (ties by position), as in :meth:`search_sync`."""
        if best <= 0 or k < 1:
            return []
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.lexsort((top, -scores[top]))]
        return [
            (self.chunk_ids[i], float(scores[i]), min(1.0, float(scores[i]) / best))
            for i in top.tolist()
            if scores[i] > 0
        ]

    def save(self, directory: Path) -> list[Path]:
        """Write the index into ``directory/bm25`` (bm25s's ``.npy`` + JSON files); returns the files."""
        target = directory / "bm25"
        target.mkdir(parents=True, exist_ok=True)
        meta = {
            "k1": self.k1,
            "b": self.b,
            "tokenizer": self.tokenizer.config(),
            "chunk_ids": self.chunk_ids,
            "empty": self._bm25 is None,
        }
        (target / "ragloop.json").write_text(json.dumps(meta), encoding="utf-8")
        if self._bm25 is not None:
            self._bm25.save(str(target), show_progress=False)
        return sorted(p for p in target.iterdir() if p.is_file())

    @classmethod
    def load(cls, directory: Path) -> BM25Index:
        """Read an index written by :meth:`save` (no pickle).

        Raises:
            IndexError_: a file is missing or unreadable.
        """
        target = directory / "bm25"
        try:
            meta = json.loads((target / "ragloop.json").read_text(encoding="utf-8"))
            self = cls(k1=meta["k1"], b=meta["b"], **meta["tokenizer"])
            self.chunk_ids = list(meta["chunk_ids"])
            if not meta["empty"]:
                self._bm25 = bm25s.BM25.load(str(target), show_progress=False, allow_pickle=False)
        except (OSError, ValueError, KeyError) as exc:
            raise IndexError_(
                f"cannot read the BM25 index in {target}: {exc}; rebuild it with `ragloop index`"
            ) from exc
        self._term_max = self._compute_term_max()
        return self


class BM25Retriever:
    """A :class:`~ragloop.retrievers.base.Retriever` over a :class:`BM25Index`.

    ``Hit.score`` and ``Hit.scores["bm25"]`` are the raw BM25 score; ``Hit.confidence`` is the score over
    the query's best possible score (see the module docstring).

    Args:
        index: The BM25 index.
        chunks: Chunk id → chunk.
        name: Key used in ``Hit.ranks``/``Hit.scores``.
        text_of: The text each chunk was indexed with; given, a filtered search scores with the statistics of
            the chunks its filters find (see the module docstring); ``None``: with the whole index's.
    """

    def __init__(
        self,
        index: BM25Index,
        chunks: Mapping[str, Chunk],
        *,
        name: str = "bm25",
        text_of: Callable[[Chunk], str] | None = None,
    ) -> None:
        self.index = index
        self.chunks = chunks
        self.name = name
        self.text_of = text_of
        self._masks: dict[FilterKey, npt.NDArray[np.float32]] = {}
        self._scoped: OrderedDict[bytes, tuple[npt.NDArray[np.intp], BM25Index]] = OrderedDict()
        self._scoped_lock = threading.Lock()
        self._keys: frozenset[str] | None = None
        self._keys_read = False

    def metadata_keys(self) -> frozenset[str] | None:
        """Every metadata key of the indexed chunks (a filter on another key is refused); ``None``: no chunks."""
        if not self._keys_read:
            self._keys, self._keys_read = metadata_keys(self.chunks.values()), True
        return self._keys

    def search_sync(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """:meth:`search`, in the calling thread.

        Raises:
            UnknownFilterKey: a filter key that no chunk has.
        """
        if not filters:
            return self.to_hits(self.index.search_sync(query, k))
        check_filter_keys(filters, self.metadata_keys())
        scores, best = self.scores(query, filters)
        return self.to_hits(self.index.top(scores, best, k))

    def scores(self, query: str, filters: Filters | None) -> tuple[npt.NDArray[np.float32], float]:
        """Every index position's BM25 score for ``query`` among the chunks matching ``filters`` (0 for the
        others) and the query's best possible score there, with that scope's statistics when ``text_of`` is
        given (the whole index's otherwise)."""
        scores, best = self.index.scores(query) if not filters else self._scope_scores(query, filters)
        return scores, best

    def _scope_scores(self, query: str, filters: Filters) -> tuple[npt.NDArray[np.float32], float]:
        mask = self.mask(filters)
        if self.text_of is None or bool(mask.all()):
            scores, best = self.index.scores(query)
            return scores * mask, best
        positions, sub = self.scope_index(mask)
        out = np.zeros(len(self.index), dtype=np.float32)
        sub_scores, best = sub.scores(query)
        out[positions] = sub_scores
        return out, best

    def scope_index(self, mask: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.intp], BM25Index]:
        """The index positions ``mask`` keeps and a BM25 index over just those chunks (built once, then kept)."""
        positions = np.flatnonzero(mask)
        sig = hashlib.blake2b(positions.astype(np.int64).tobytes(), digest_size=16).digest()
        with self._scoped_lock:
            found = self._scoped.get(sig)
            if found is not None:
                self._scoped.move_to_end(sig)
                return found
        assert self.text_of is not None
        ids = [self.index.chunk_ids[i] for i in positions.tolist()]
        tok = self.index.tokenizer
        sub = BM25Index(k1=self.index.k1, b=self.index.b, stem=tok.stem, stopwords=tok.stopwords)
        sub.build(ids, [self.text_of(self.chunks[cid]) for cid in ids])
        with self._scoped_lock:
            self._scoped[sig] = (positions, sub)
            while len(self._scoped) > MAX_SCOPES:
                self._scoped.popitem(last=False)
        return positions, sub

    def mask(self, filters: Filters) -> npt.NDArray[np.float32]:
        """1.0 for the index positions whose chunk matches ``filters``, 0.0 elsewhere (cached per filter)."""
        key = filter_key(filters)
        found = self._masks.get(key)
        if found is None:
            found = np.fromiter(
                (matches(self.chunks[cid], filters) for cid in self.index.chunk_ids),
                dtype=np.float32,
                count=len(self.index.chunk_ids),
            )
            if len(self._masks) >= 64:
                self._masks.clear()
            self._masks[key] = found
        return found

    def to_hits(self, rows: Sequence[tuple[str, float, float]]) -> list[Hit]:
        """Hits from ``(chunk_id, score, confidence)`` rows, ranked in the given order."""
        return [
            Hit(
                chunk=self.chunks[cid],
                score=score,
                confidence=conf,
                ranks={self.name: rank},
                scores={self.name: score},
            )
            for rank, (cid, score, conf) in enumerate(rows, start=1)
        ]

    async def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """Return at most ``k`` hits with a positive BM25 score, best first, among chunks matching ``filters``."""
        return await anyio.to_thread.run_sync(self.search_sync, query, k, filters)
