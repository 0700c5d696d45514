"""The whole pipeline: load, clean, chunk and deduplicate a folder or a BEIR corpus."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from attrs import evolve, frozen

from ragloop._log import get_logger
from ragloop.errors import InputError
from ragloop.retrievers.ingest._beir import _beir_corpus, load_beir
from ragloop.retrievers.ingest._blocks import Block, render
from ragloop.retrievers.ingest._chunk import Piece, check_limits, chunk_blocks, chunk_id
from ragloop.retrievers.ingest._files import _walk
from ragloop.retrievers.ingest._globs import FileFilter
from ragloop.retrievers.ingest._guard import (
    EMPTY_REASON,
    FILE_BUDGET,
    FileTask,
    document_blocks,
    failure_reason,
    file_size,
    parse_file,
)
from ragloop.retrievers.ingest._isolate import Budget, Failure, run_isolated
from ragloop.retrievers.ingest._tokens import Tokenizer, default_tokenizer
from ragloop.retrievers.ingest._types import (
    _WHAT_TO_PASS,
    CLEAN_BUDGET_S,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_TEXT_CHARS,
    SUFFIXES,
    Document,
    IngestResult,
    Skip,
)
from ragloop.state import Chunk

__all__ = ["Explained", "chunk_document", "document_blocks", "explain_file", "ingest_path"]

_log = get_logger("ragloop.retrievers.ingest")
#: Changes whenever the same file would give other chunks or indexed text (cached sample indexes key on it).
INGEST_VERSION = "5"


def chunk_document(
    doc: Document,
    *,
    max_tokens: int = 256,
    tokenizer: Tokenizer | None = None,
    max_chars: int | None = None,
) -> list[Chunk]:
    """Clean a document and cut it into chunks sized in the embedder's tokens.

    Sections are split at headings and each chunk carries its heading path, outermost first, and the id of its
    nearest heading (``metadata["anchor"]``; PDF chunks carry ``metadata["page"]``). A section whose indexed
    text (:func:`~ragloop.retrievers.ingest._chunk.index_text`) is longer than ``max_tokens`` is cut between
    blocks, sentences, table rows or code lines, never truncated (:mod:`ragloop.retrievers.ingest._chunk`).

    Args:
        doc: The document.
        max_tokens: Most tokens per chunk, in ``tokenizer``'s tokens (the embedder's limit: 256 for MiniLM).
        tokenizer: The embedder's tokenizer; default :func:`~ragloop.retrievers.ingest.default_tokenizer`.
        max_chars: Most characters per chunk as well (``None``: tokens only).

    Returns:
        Chunks in document order, none empty; ids are content hashes of the chunk text.

    Raises:
        ConfigError: limits that leave no room for text.
    """
    check_limits(max_tokens, max_chars)
    return _chunks(doc, document_blocks(doc), tokenizer or default_tokenizer(), max_tokens, max_chars)


def _chunks(
    doc: Document, blocks: Sequence[Block], tokenizer: Tokenizer, max_tokens: int, max_chars: int | None
) -> list[Chunk]:
    if not any(b.kind != "heading" for b in blocks):
        return []
    out = []
    pieces = chunk_blocks(blocks, tokenizer, max_tokens=max_tokens, title=doc.title, max_chars=max_chars)
    if doc.fmt == "beir" and len(pieces) > 1:
        # A corpus entry (an abstract, a passage) that fits one chunk whole stays one chunk, as BEIR scores it.
        whole = render(blocks)
        head = f"{doc.title}\n{whole}" if doc.title else whole
        fits = len(tokenizer.token_spans([head])[0]) + tokenizer.special_tokens <= max_tokens
        if fits and (max_chars is None or len(whole) <= max_chars):
            pieces = [Piece(whole, (), "", 0, tuple(b.text for b in blocks))]
    for piece in pieces:
        meta = {"anchor": piece.anchor} if piece.anchor else {}
        if piece.page:
            meta["page"] = str(piece.page)
            meta["anchor"] = f"page={piece.page}"  # the PDF open parameter: file.pdf#page=N
        out.append(
            Chunk(
                id=chunk_id(piece.text),
                text=piece.text,
                source=doc.source,
                title=doc.title,
                title_path=piece.title_path,
                doc_id=doc.id,
                metadata=tuple(meta.items()),
            )
        )
    return out


@frozen
class Explained:
    """What one file becomes (``ragloop index --explain FILE``).

    Attributes:
        path: The file.
        skip: Why it is not indexed, or ``""``.
        title: Its title.
        fmt: The format it was read as.
        encoding: The encoding it was decoded from, when text.
        cleaned: Its cleaned text (its blocks as markdown).
        chunks: Its chunks, with their token counts (the indexed text: title, heading path and text).
    """

    path: str
    skip: str
    title: str
    fmt: str
    encoding: str
    cleaned: str
    chunks: tuple[tuple[Chunk, int], ...]


def explain_file(
    path: str | os.PathLike[str],
    *,
    max_tokens: int = 256,
    tokenizer: Tokenizer | None = None,
    max_chars: int | None = None,
    budget: Budget | None = None,
    workers: int | None = 1,
) -> Explained:
    """Read, clean and chunk one file as :func:`ingest_path` would (in a worker, under ``budget``), and return
    every step's result."""
    from ragloop.retrievers.ingest._chunk import index_text

    file = Path(path).resolve()
    tok = tokenizer or default_tokenizer()
    limits = FileTask("", "", clean_budget_s=CLEAN_BUDGET_S)
    # A Sphinx source copy is read from its site's folder, so it is read as RST and names its built page.
    root = next((p.parent for p in file.parents if p.name == "_sources"), file.parent)
    item = next(_parsed([file], root, budget or FILE_BUDGET, workers, limits))
    if isinstance(item, Skip):
        return Explained(os.fspath(path), item.reason, "", "", "", "", ())
    chunks = _chunks(item, item.blocks, tok, max_tokens, max_chars)
    counts = [len(s) + tok.special_tokens for s in tok.token_spans([index_text(c) for c in chunks])]
    skip = "" if chunks else EMPTY_REASON
    return Explained(
        os.fspath(path),
        skip,
        item.title,
        item.fmt,
        item.encoding,
        render(item.blocks),
        tuple(zip(chunks, counts, strict=True)),
    )


def _parsed(
    files: Sequence[Path], root: Path, budget: Budget, workers: int | None, limits: FileTask
) -> Iterator[Document | Skip]:
    """Each file parsed and cleaned (:func:`parse_file`) in worker processes under ``budget`` (``workers=0``:
    in this process, with no time or memory budget), in order."""
    tasks = (
        FileTask(os.fspath(f), os.fspath(root), limits.max_file_bytes, limits.max_text_chars, limits.clean_budget_s)
        for f in files
    )
    if workers == 0 or sys.platform == "win32":  # the pool's pipes are POSIX descriptors
        for task in tasks:
            try:
                yield parse_file(task)
            except Exception as exc:  # noqa: BLE001 — a loader's exception is the file's skip, as in a worker
                yield failure_reason(task.path, Failure("error", f"{type(exc).__name__}: {exc}"[:500]), budget)
        return
    for task, outcome in run_isolated(parse_file, tasks, budget=budget, workers=workers, size=file_size):
        yield failure_reason(task.path, outcome, budget) if isinstance(outcome, Failure) else outcome


def _cleaned(doc: Document, budget_s: float | None) -> Document | Skip:
    """A corpus entry with its blocks, or skipped: over its cleaning budget, or empty."""
    try:
        blocks = document_blocks(doc, budget_s=budget_s)
    except InputError as exc:  # over its time budget
        return Skip(doc.source, str(exc))
    return evolve(doc, blocks=tuple(blocks)) if blocks else Skip(doc.source, EMPTY_REASON)


def ingest_path(  # noqa: PLR0913 — keyword-only limits, each with its default (STYLE habit 7)
    path: str | os.PathLike[str],
    *,
    max_tokens: int = 256,
    tokenizer: Tokenizer | None = None,
    max_chars: int | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_line_bytes: int = MAX_LINE_BYTES,
    clean_budget_s: float | None = CLEAN_BUDGET_S,
    max_text_chars: int = MAX_TEXT_CHARS,
    budget: Budget | None = None,
    workers: int | None = None,
) -> IngestResult:
    """Load, clean, chunk and deduplicate a folder of documents or a BEIR corpus.

    A folder holding ``corpus.jsonl`` or ``corpus.jsonl.gz`` (or such a file) is read as BEIR; anything
    else as a folder of documents (see :func:`load_folder`). Every file is accounted for: it yields chunks, or
    is skipped with a reason (unsupported type, too large, binary, unreadable, outside the folder, empty after
    cleaning, a loader's extra not installed, over its time or memory budget, its loader failed or crashed),
    or was left out by ``include``/``exclude`` (counted in ``excluded``), or is hidden (counted in
    ``hidden``). Identical chunks (same normalised text) are stored once.

    Files are read and cleaned in worker processes (:mod:`ragloop.retrievers.ingest._isolate`), each under
    ``budget``: a file that overruns it, makes its loader raise, or kills its worker (a native crash) is one
    skip, and the run goes on. Results come back in path order, so the chunks do not depend on ``workers``.

    Args:
        path: Folder, single document file, or BEIR corpus.
        max_tokens: Most tokens per chunk, in the embedder's tokens (see :func:`chunk_document`).
        tokenizer: The embedder's tokenizer (``MiniLMEmbedder().tokenizer``); default
            :func:`~ragloop.retrievers.ingest.default_tokenizer`.
        max_chars: Most characters per chunk as well (``None``: tokens only).
        include: Globs of files to read, relative to the folder (none: all; see :class:`FileFilter`).
        exclude: Globs of files to leave out.
        progress: Called as ``progress(done, total)`` after each document.
        max_file_bytes: Largest document file read, in bytes.
        max_line_bytes: Longest BEIR corpus line read, in bytes.
        clean_budget_s: Seconds cleaning one document may take (``None``: no limit).
        max_text_chars: Most characters of text one file may produce (a larger one is skipped).
        budget: Wall time and memory one file may spend in its worker (default ``FILE_BUDGET``: 30 s plus 10 s
            per MB of the file, 512 MB).
        workers: Worker processes (default: one per core this process may use; ``0``, and always on Windows:
            read in this process, without the time and memory budgets).

    Returns:
        The chunks, counts, skips and elapsed seconds.

    Raises:
        InputError: ``path`` does not exist, is an unsupported or special file, or a folder with no files.
        ConfigError: Bad limits.
    """
    started = time.perf_counter()
    check_limits(max_tokens, max_chars)
    tok = tokenizer or default_tokenizer()
    root = Path(path)
    if not root.exists():
        raise InputError(f"no such file or folder: {os.fspath(path)!r}; {_WHAT_TO_PASS}")
    skipped: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    select = FileFilter(include, exclude)
    by_id: dict[str, Chunk] = {}
    files = 0

    def add(doc: Document, blocks: Sequence[Block]) -> None:
        nonlocal files
        chunks = _chunks(doc, blocks, tok, max_tokens, max_chars)
        if chunks:
            files += 1
            for chunk in chunks:
                by_id.setdefault(chunk.id, chunk)
        else:
            skipped.append((doc.source, EMPTY_REASON))
        warnings.extend((doc.source, w) for w in doc.warnings)

    corpus = _beir_corpus(root)
    if corpus is not None:
        docs = list(
            load_beir(corpus, on_skip=lambda where, why: skipped.append((where, why)), max_line_bytes=max_line_bytes)
        )
        outcomes: Iterator[Document | Skip] = (_cleaned(doc, clean_budget_s) for doc in docs)
        total = len(docs)
    elif root.is_file() and root.suffix.lower() not in SUFFIXES:
        raise InputError(f"cannot ingest {os.fspath(path)!r}: unsupported file type; {_WHAT_TO_PASS}")
    elif not root.is_file() and not root.is_dir():
        raise InputError(f"cannot ingest {os.fspath(path)!r}: not a regular file or folder; {_WHAT_TO_PASS}")
    else:
        base = root.resolve().parent if root.is_file() else root
        items: list[Path | Skip] = [root.resolve()] if root.is_file() else _walk(root, select)
        if not items:
            raise InputError(f"found no files to read under {os.fspath(path)!r} ({select.excluded} excluded)")
        limits = FileTask("", "", max_file_bytes, max_text_chars, clean_budget_s)
        parsed = _parsed([i for i in items if isinstance(i, Path)], base, budget or FILE_BUDGET, workers, limits)
        outcomes = (item if isinstance(item, Skip) else next(parsed) for item in items)
        total = len(items)
    for done, outcome in enumerate(outcomes, start=1):
        if isinstance(outcome, Skip):
            skipped.append((outcome.path, outcome.reason))
        else:
            add(outcome, outcome.blocks)
        if progress is not None:
            progress(done, total)
    result = IngestResult(
        chunks=tuple(by_id.values()),
        files=files,
        skipped=tuple(skipped),
        seconds=time.perf_counter() - started,
        excluded=select.excluded,
        hidden=select.hidden,
        warnings=tuple(warnings),
    )
    # One record per run; the skips themselves are in the result for the caller to show.
    _log.debug("ingest.done", files=files, chunks=len(result.chunks), skipped=len(skipped), seconds=result.seconds)
    return result
