"""How close, by meaning, a passage must come to a question before it counts as evidence — in *this* corpus.

A dense cosine means different things in different corpora. A question the bundled sample knowledge base does
not answer ("Does Lumen integrate with Salesforce?") still comes close to a page about integrations, because
every page there is about one product, while a how-to question ten python3-doc pages do not answer stays far
from all of them. One fixed threshold either refuses the python docs' answerable paraphrases or answers the
sample's outside questions, so the threshold is *measured on the corpus itself*:

- Every heading that names one document only (a page title, a section heading) is a pseudo-question whose
  answer the corpus holds, in that document (:func:`pseudo_questions`).
- Its best cosine with the chunks of **every other document** is what a question gets from this corpus when the
  corpus does not hold its answer: a leave-one-document-out *null* (:func:`calibrate_meaning`).
- The threshold (:attr:`MeaningScale.threshold`) is the ``percentile`` (90th) of those nulls, within
  [``floor``, ``ceiling``]: a passage the question's own search scores at or above it is closer to the question
  than nine uncovered topics in ten come to anything in this corpus.

The offline judges use it as evidence that transfers between corpora (``ragloop.turn.Judges.offline``): the
grader keeps such a hit, the abstention accepts it, and the answerer may quote a sentence that close though it
shares no word with the question. A scope (a tenant's filters) gets its own scale, from its own chunks only:
the local index measures it on its stored vectors (``KnowledgeIndex.meaning_scales``), the Postgres store on the
scope's rows, read when the scale is measured (``ragloop.retrievers.postgres``, ``PostgresStore.prepare_corpus``).

Figures (MiniLM, the indexes of ``bench_answers.py``, ``benchmarks/results/bench_meaning-scales.txt``): the
sample knowledge base 0.61, FastAPI's docs 0.68, HotpotQA's paragraphs 0.67, the ``pydoc`` sets' ten-page
indexes 0.40-0.53. Knowledge bases with fewer than
``min_questions`` such headings (a user's first four pages) get no scale: their judges have rules of their own.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
from attrs import frozen

from ragloop.state import Chunk

__all__ = [
    "CEILING",
    "FLOOR",
    "MAX_QUESTIONS",
    "MIN_QUESTIONS",
    "PERCENTILE",
    "MeaningScale",
    "MeaningScales",
    "calibrate_meaning",
    "heading_texts",
    "meaning_embed",
    "pseudo_questions",
]

#: The share of uncovered pseudo-questions (in percent) whose best cosine stays under the threshold.
PERCENTILE = 90.0
#: Fewest pseudo-questions a scale is measured on; fewer give none (a small knowledge base's own rules apply).
MIN_QUESTIONS = 20
#: Most pseudo-questions embedded (a deterministic sample by the hash of their text).
MAX_QUESTIONS = 256
#: The threshold is never lower: the small knowledge bases' meaning threshold (questions outside them reached at
#: most 0.36 on their best chunk; ``ragloop.llm.offline.answer._abstain.SMALL_MEANING``).
FLOOR = 0.40
#: ... nor higher (a corpus of near-copies would otherwise make meaning count for nothing, which is the same as
#: no scale, but said as a number).
CEILING = 0.85
#: Headings shorter or longer than these (characters) are not questions.
_MIN_CHARS, _MAX_CHARS = 3, 120


@frozen
class MeaningScale:
    """A corpus' dense threshold and what it was measured on (see the module docstring).

    Attributes:
        threshold: A passage whose cosine with the question reaches this counts as evidence.
        questions: How many pseudo-questions were measured.
        null_median: The median of their best cosines with other documents.
        percentile: The percentile of those cosines the threshold sits at (before clamping).
    """

    threshold: float
    questions: int
    null_median: float
    percentile: float = PERCENTILE


def meaning_embed(embedder: object) -> Callable[[Sequence[str]], npt.NDArray[np.float32]] | None:
    """What embeds the pseudo-questions of ``embedder``'s corpus in the calling thread (its ``embed_sync``), or
    ``None`` when its corpus measures no scale: a lexical hash embedder (``hash-…``: its cosines only restate
    the term overlap) or one that cannot embed in the calling thread."""
    embed = getattr(embedder, "embed_sync", None)
    if str(getattr(embedder, "name", "")).startswith("hash-") or not callable(embed):
        return None
    return cast("Callable[[Sequence[str]], npt.NDArray[np.float32]]", embed)


def _doc(chunk: Chunk) -> str:
    return chunk.doc_id or chunk.source or chunk.id


def heading_texts(chunk: Chunk) -> tuple[str, ...]:
    """The chunk's page title and section headings, whitespace collapsed: the texts a heading is kept by."""
    return tuple(" ".join(heading.split()) for heading in (chunk.title, *chunk.title_path))


def pseudo_questions(chunks: Sequence[Chunk], limit: int = MAX_QUESTIONS) -> list[tuple[str, str]]:
    """``(heading, document)`` pairs: every page title and section heading of ``chunks`` that occurs in one
    document only (a heading two pages share, "Examples", asks nothing one page answers), whitespace collapsed,
    at most ``limit`` of them, picked by the hash of their text (the same chunks give the same sample)."""
    docs: dict[str, set[str]] = {}
    for chunk in chunks:
        for text in heading_texts(chunk):
            if _MIN_CHARS <= len(text) <= _MAX_CHARS:
                docs.setdefault(text, set()).add(_doc(chunk))
    single = [(text, next(iter(owners))) for text, owners in docs.items() if len(owners) == 1]
    single.sort(key=lambda pair: hashlib.blake2b(pair[0].encode(), digest_size=8).digest())
    return single[:limit]


def calibrate_meaning(
    questions: npt.ArrayLike,
    question_docs: Sequence[str],
    vectors: npt.ArrayLike,
    docs: Sequence[str],
    *,
    percentile: float = PERCENTILE,
    min_questions: int = MIN_QUESTIONS,
    floor: float = FLOOR,
    ceiling: float = CEILING,
) -> MeaningScale | None:
    """The scale of a corpus: for each pseudo-question (a unit row of ``questions``, from the document
    ``question_docs[i]``), its best cosine with a chunk (a unit row of ``vectors``) of another document
    (``docs``); the threshold is their ``percentile``, clamped to [``floor``, ``ceiling``]. ``None`` when fewer
    than ``min_questions`` pseudo-questions have another document to be measured against."""
    q = np.asarray(questions, dtype=np.float32).reshape(len(question_docs), -1)
    v = np.asarray(vectors, dtype=np.float32).reshape(len(docs), -1)
    if len(question_docs) < min_questions or not len(docs):
        return None
    doc_ids = {d: i for i, d in enumerate(dict.fromkeys([*docs, *question_docs]))}
    chunk_doc = np.fromiter((doc_ids[d] for d in docs), dtype=np.int64, count=len(docs))
    question_doc = np.fromiter((doc_ids[d] for d in question_docs), dtype=np.int64, count=len(question_docs))
    nulls = np.full(len(question_docs), -np.inf, dtype=np.float32)
    for start in range(0, len(docs), 8192):  # bounded memory on a large corpus
        sims = q @ v[start : start + 8192].T
        own = chunk_doc[start : start + 8192][None, :] == question_doc[:, None]
        sims[own] = -np.inf
        nulls = np.maximum(nulls, sims.max(axis=1, initial=-np.inf))
    measured = nulls[np.isfinite(nulls)]
    if len(measured) < min_questions:
        return None
    at = float(np.percentile(measured, percentile))
    return MeaningScale(
        threshold=round(min(ceiling, max(floor, at)), 4),
        questions=len(measured),
        null_median=round(float(np.median(measured)), 4),
        percentile=percentile,
    )


#: Pseudo-questions per embedding call: calls this small run on an embedder's query-sized path (MiniLM's
#: single-threaded session, where the questions of a turn are embedded too), never on its bulk model.
_PER_CALL = 4


class MeaningScales:
    """The :class:`MeaningScale` of any scope of one index's chunks, measured on demand.

    Heading vectors are kept (by text) once embedded, so a second scope of the same index embeds only the
    headings the first did not have; each scope's scale comes from its own chunks and headings only. A saved
    index keeps the vectors its save embedded (:meth:`headings`), so a loaded one measures its scale without
    embedding again (``known``).

    Args:
        chunks: The index's chunks, in index order (positions refer to this order); kept as given, not copied (a
            tuple, or a sequence that builds each chunk when asked: the Postgres store's keeps none).
        vectors: The stored vectors of chunk ids (the index's dense vectors).
        embed: Embeds a few short texts in the calling thread (an embedder's ``embed_sync``).
        known: Heading vectors by text, embedded earlier by the same embedder (a saved index's).
        lookup: Finds kept vectors of some heading texts before they are embedded (a store's kept headings:
            only the texts a scale asks are read); a text it does not return is embedded.
    """

    def __init__(
        self,
        chunks: Sequence[Chunk],
        vectors: Callable[[Sequence[str]], npt.NDArray[np.float32]],
        embed: Callable[[Sequence[str]], npt.NDArray[np.float32]],
        known: Mapping[str, npt.NDArray[np.float32]] | None = None,
        lookup: Callable[[Sequence[str]], Mapping[str, npt.NDArray[np.float32]]] | None = None,
    ) -> None:
        self._chunks, self._vectors, self._embed, self._lookup = chunks, vectors, embed, lookup
        self._headings: dict[str, npt.NDArray[np.float32]] = dict(known or {})
        self._lock = threading.Lock()
        #: Headings embedded here (not known, not looked up): what a store's sync has to keep.
        self.embedded: set[str] = set()

    def measure_headings(self, positions: Sequence[int] | None = None) -> None:
        """Embed the headings the scale of the chunks at ``positions`` (every chunk: ``None``) asks, as
        calling the scales would, without measuring it (what a save or a store's sync keeps)."""
        chunks = self._chunks if positions is None else [self._chunks[i] for i in positions]
        asked = pseudo_questions(chunks)
        if len(asked) >= MIN_QUESTIONS:
            self._heading_vectors([t for t, _ in asked])

    def headings(self) -> dict[str, npt.NDArray[np.float32]]:
        """The vectors of this index's headings embedded so far (or known from before), by text. A heading no
        chunk has any more (``known`` from an index before an update) is left out."""
        present = {text for c in self._chunks for text in heading_texts(c)}
        with self._lock:
            return {t: v for t, v in self._headings.items() if t in present}

    def _heading_vectors(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        with self._lock:
            todo = [t for t in dict.fromkeys(texts) if t not in self._headings]
        if todo and self._lookup is not None:
            found = self._lookup(todo)
            with self._lock:
                self._headings.update((t, np.asarray(found[t], dtype=np.float32)) for t in todo if t in found)
            todo = [t for t in todo if t not in found]
        for start in range(0, len(todo), _PER_CALL):
            part = todo[start : start + _PER_CALL]
            got = np.asarray(self._embed(part), dtype=np.float32)
            with self._lock:
                self._headings.update(zip(part, got, strict=True))
                self.embedded.update(part)
        with self._lock:
            return np.stack([self._headings[t] for t in texts])

    def __call__(self, positions: Sequence[int] | None = None) -> MeaningScale | None:
        """The scale of the chunks at ``positions`` (every chunk: ``None``), or ``None`` when they hold too few
        headings to measure one."""
        chunks = self._chunks if positions is None else [self._chunks[i] for i in positions]
        asked = pseudo_questions(chunks)
        if len(asked) < MIN_QUESTIONS:
            return None
        return calibrate_meaning(
            self._heading_vectors([t for t, _ in asked]),
            [d for _, d in asked],
            self._vectors([c.id for c in chunks]),
            [_doc(c) for c in chunks],
        )
