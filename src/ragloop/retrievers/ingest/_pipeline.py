"""The whole pipeline: load, clean, chunk and deduplicate a folder or a BEIR corpus."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ragloop._log import get_logger
from ragloop.errors import InputError
from ragloop.retrievers.ingest._beir import _beir_corpus, load_beir
from ragloop.retrievers.ingest._chunk import check_limits, chunk_id, split_long, split_sections
from ragloop.retrievers.ingest._clean import clean_text
from ragloop.retrievers.ingest._files import load_folder
from ragloop.retrievers.ingest._types import (
    _WHAT_TO_PASS,
    CLEAN_BUDGET_S,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    SUFFIXES,
    Document,
    IngestResult,
    Skip,
)
from ragloop.state import Chunk

# --- chunking ------------------------------------------------------------------------------------------

_log = get_logger("ragloop.retrievers.ingest")


def chunk_document(doc: Document, *, max_chars: int = 1200, overlap: int = 150) -> list[Chunk]:
    """Clean a document and cut it into chunks.

    Markdown (and HTML, whose headings become ``#`` lines) is split at headings, and each chunk carries its
    heading path, outermost first; a section longer than ``max_chars`` is split at paragraph, line,
    sentence or word boundaries, consecutive pieces overlapping by up to ``overlap`` characters. A BEIR
    document no longer than ``max_chars`` stays one chunk. Each chunk's text is a slice of the cleaned text.

    Args:
        doc: The document.
        max_chars: Largest chunk length in characters (only a single longer word is ever cut).
        overlap: Characters repeated from the end of one piece at the start of the next piece of a section.

    Returns:
        Chunks in document order, none empty, none longer than ``max_chars``; ids are content hashes of
        the chunk text (:func:`ragloop.retrievers.chunking.chunk_id`). Empty if nothing survives cleaning.

    Raises:
        ConfigError: ``max_chars < 1`` or ``overlap`` not in ``[0, max_chars)``.
    """
    check_limits(max_chars, overlap)
    return _chunk_cleaned(doc, clean_text(doc.text, doc.fmt), max_chars, overlap)


def _chunk_cleaned(doc: Document, text: str, max_chars: int, overlap: int) -> list[Chunk]:
    if not text:
        return []
    if doc.fmt == "text" or (doc.fmt == "beir" and len(text) <= max_chars):
        sections: list[tuple[tuple[str, ...], int, int]] = [((), 0, len(text))]
    else:
        sections = split_sections(text)
    chunks: list[Chunk] = []
    for title_path, start, end in sections:
        for a, b in split_long(text, start, end, max_chars, overlap):
            piece = text[a:b].strip()
            chunks.append(
                Chunk(
                    id=chunk_id(piece),
                    text=piece,
                    source=doc.source,
                    title=doc.title,
                    title_path=title_path,
                    doc_id=doc.id,
                )
            )
    return chunks


# --- the whole pipeline --------------------------------------------------------------------------------


def ingest_path(
    path: str | os.PathLike[str],
    *,
    max_chars: int = 1200,
    overlap: int = 150,
    progress: Callable[[int, int], None] | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    clean_budget_s: float | None = CLEAN_BUDGET_S,
) -> IngestResult:
    """Load, clean, chunk and deduplicate a folder of documents or a BEIR corpus.

    A folder holding ``corpus.jsonl`` or ``corpus.jsonl.gz`` (or such a file) is read as BEIR; anything
    else as a folder of documents (see :func:`load_folder`). Documents with nothing left after cleaning
    are skipped with a reason. Identical chunks (same normalised text) are stored once. Links out of the
    folder, special files, files over ``max_file_bytes``, corpus lines over ``max_line_bytes`` and documents
    whose cleaning takes longer than ``clean_budget_s`` are skipped with a reason too.

    Args:
        path: Folder, single document file, or BEIR corpus.
        max_chars: Largest chunk length in characters.
        overlap: Overlap between consecutive pieces of a long section, in characters.
        progress: Called as ``progress(done, total)`` after each document.
        max_file_bytes: Largest document file read, in bytes.
        max_line_bytes: Longest BEIR corpus line read, in bytes.
        clean_budget_s: Seconds cleaning one document may take (``None``: no limit).

    Returns:
        The chunks, counts, skips and elapsed seconds.

    Raises:
        InputError: ``path`` does not exist, is an unsupported or special file, or a folder with no supported
            files.
        ConfigError: Bad ``max_chars``/``overlap``.
    """
    started = time.perf_counter()
    check_limits(max_chars, overlap)
    root = Path(path)
    if not root.exists():
        raise InputError(f"no such file or folder: {os.fspath(path)!r}; {_WHAT_TO_PASS}")
    skipped: list[tuple[str, str]] = []
    docs: list[Document] = []
    corpus = _beir_corpus(root)
    if corpus is not None:
        docs = list(
            load_beir(corpus, on_skip=lambda where, why: skipped.append((where, why)), max_line_bytes=max_line_bytes)
        )
    elif root.is_file() and root.suffix.lower() not in SUFFIXES:
        raise InputError(f"cannot ingest {os.fspath(path)!r}: unsupported file type; {_WHAT_TO_PASS}")
    elif not root.is_file() and not root.is_dir():
        raise InputError(f"cannot ingest {os.fspath(path)!r}: not a regular file or folder; {_WHAT_TO_PASS}")
    else:
        for item in load_folder(root, max_file_bytes=max_file_bytes):
            if isinstance(item, Skip):
                skipped.append((item.path, item.reason))
            else:
                docs.append(item)
        if not docs and not skipped:
            raise InputError(f"found no .md, .markdown, .txt, .html or .htm files under {os.fspath(path)!r}")

    by_id: dict[str, Chunk] = {}
    files = 0
    for done, doc in enumerate(docs, start=1):
        try:
            cleaned: str | None = clean_text(doc.text, doc.fmt, budget_s=clean_budget_s)
        except InputError as exc:  # over its time budget
            skipped.append((doc.source, str(exc)))
            cleaned = None
        chunks = _chunk_cleaned(doc, cleaned, max_chars, overlap) if cleaned is not None else []
        if chunks:
            files += 1
            for chunk in chunks:
                by_id.setdefault(chunk.id, chunk)
        elif cleaned is not None:
            skipped.append((doc.source, "empty after cleaning (only markup, images, shortcodes or whitespace)"))
        if progress is not None:
            progress(done, len(docs))
    result = IngestResult(
        chunks=tuple(by_id.values()),
        files=files,
        skipped=tuple(skipped),
        seconds=time.perf_counter() - started,
    )
    # One record per run; the skips themselves are in the result for the caller to show.
    _log.debug("ingest.done", files=files, chunks=len(result.chunks), skipped=len(skipped), seconds=result.seconds)
    return result
