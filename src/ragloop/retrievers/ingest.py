"""Ingestion: load documents, clean them, cut them into chunks.

Two sources are understood: a folder of ``.md``/``.markdown``/``.txt``/``.html``/``.htm`` files, and a
BEIR corpus (``corpus.jsonl`` or ``corpus.jsonl.gz``, one ``{"_id", "title", "text"}`` object a line).
:func:`ingest_path` detects which one it was given and returns deduplicated chunks plus what it skipped
and why; nothing in a bad file (not UTF-8, binary, malformed JSON line) stops the run.

Example::

    result = ingest_path("docs/")
    print(len(result.chunks), "chunks from", result.files, "files;", len(result.skipped), "skipped")
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog
from attrs import field, frozen
from attrs.validators import in_

from ragloop.errors import InputError
from ragloop.retrievers.chunking import check_limits, chunk_id, split_long, split_sections
from ragloop.retrievers.clean import FORMATS, clean_text, clean_title, split_front_matter
from ragloop.state import Chunk

__all__ = [
    "SUFFIXES",
    "Document",
    "IngestResult",
    "Skip",
    "chunk_document",
    "clean_text",
    "ingest_path",
    "load_beir",
    "load_folder",
    "read_document",
    "split_front_matter",
]

_log = structlog.get_logger(__name__)

#: File suffixes :func:`load_folder` reads, and the format each is cleaned as.
SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html", ".htm": "html"}

_BEIR_NAMES = ("corpus.jsonl", "corpus.jsonl.gz")
_WHAT_TO_PASS = (
    "pass a folder of .md, .markdown, .txt, .html or .htm files, or a BEIR corpus "
    "(a folder containing corpus.jsonl or corpus.jsonl.gz, or that file itself)"
)
_MD_H1 = re.compile(r"^ {0,3}#[ \t]+(.+)$", re.M)
_HTML_TITLE = re.compile(r"<title\b[^>]*>(.*?)</title\s*>", re.S | re.I)
_HTML_H1 = re.compile(r"<h1\b[^>]*>(.*?)</h1\s*>", re.S | re.I)


@frozen
class Document:
    """One source document, before cleaning.

    Attributes:
        id: Stable id: the path relative to the ingested folder, or the BEIR ``_id``.
        title: Document title (front matter ``title:``, first heading, ``<title>``, BEIR title or file stem).
        text: Raw text, front matter removed.
        source: Where it came from (file path, or ``corpus-file#_id``).
        fmt: How to clean it: ``"markdown"``, ``"text"``, ``"html"`` or ``"beir"``.
    """

    id: str
    title: str
    text: str
    source: str
    fmt: str = field(validator=in_(FORMATS))


@frozen
class Skip:
    """A file or corpus line that was not ingested, and why.

    Attributes:
        path: The file (``path:line`` for a corpus line).
        reason: What is wrong with it and what to do about it.
    """

    path: str
    reason: str


@frozen
class IngestResult:
    """What :func:`ingest_path` produced.

    Attributes:
        chunks: Deduplicated chunks in document order (identical text is stored once, first occurrence kept).
        files: Documents that yielded at least one chunk (files, or BEIR corpus entries).
        skipped: ``(path, reason)`` for every file, document or corpus line left out.
        seconds: Wall-clock time the whole ingestion took.
    """

    chunks: tuple[Chunk, ...]
    files: int
    skipped: tuple[tuple[str, str], ...]
    seconds: float


# --- chunking ------------------------------------------------------------------------------------------


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


# --- loading a folder ----------------------------------------------------------------------------------


def load_folder(path: str | os.PathLike[str]) -> Iterator[Document | Skip]:
    """Read every supported file under a folder, recursively, in sorted path order.

    Hidden files and folders (names starting with ``.``) are left out. A file that cannot be read, is
    binary or is not UTF-8 comes back as a :class:`Skip` naming the file and the problem; nothing raises.
    A single supported file may be passed instead of a folder.

    Args:
        path: The folder (or one file).

    Yields:
        A :class:`Document` or a :class:`Skip` per file.
    """
    root = Path(path)
    if root.is_file():
        yield read_document(root, root.parent)
        return
    for file in _walk(root):
        yield read_document(file, root)


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            Path(dirpath) / name
            for name in filenames
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES
        )
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def read_document(path: Path, root: Path) -> Document | Skip:
    """Read one file as a :class:`Document`, or explain in a :class:`Skip` why it cannot be used.

    Args:
        path: The file; its suffix picks the format (see :data:`SUFFIXES`).
        root: The ingested folder; the document id is the path relative to it.
    """
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        return Skip(str(path), f"unsupported file type {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Skip(str(path), f"cannot read the file ({exc.strerror or exc}); check it exists and is readable")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return Skip(str(path), "UTF-16 text, not UTF-8; convert it to UTF-8 (e.g. with iconv) to index it")
    if b"\x00" in data:
        return Skip(str(path), "binary file (contains NUL bytes); only UTF-8 text files are indexed")
    try:
        raw = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Skip(
            str(path),
            f"not UTF-8 (invalid byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "convert it to UTF-8 (e.g. with iconv) to index it",
        )
    doc_id = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    title, text = _title_and_body(raw, fmt)
    # The source is the path under the ingested folder, so an index reads the same on every machine.
    return Document(id=doc_id, title=title or path.stem, text=text, source=doc_id, fmt=fmt)


def _title_and_body(raw: str, fmt: str) -> tuple[str, str]:
    """Return ``(title, body)``: the title found in the text (or ``""``) and the text without front matter."""
    if fmt in ("markdown", "beir"):
        title, body = split_front_matter(raw)
        if not title:
            match = _MD_H1.search(body)
            title = match.group(1) if match else ""
        return clean_title(title), body
    if fmt == "html":
        match = _HTML_TITLE.search(raw) or _HTML_H1.search(raw)
        return (clean_title(match.group(1)) if match else ""), raw
    return "", raw


# --- loading a BEIR corpus -----------------------------------------------------------------------------


def load_beir(path: str | os.PathLike[str], *, on_skip: Callable[[str, str], None] | None = None) -> Iterator[Document]:
    """Read a BEIR corpus: ``corpus.jsonl[.gz]``, or a folder containing one.

    Each line is a JSON object with ``_id``, ``text`` and optionally ``title``. The text is treated as
    markdown (front matter dropped, its ``title:`` used when the record has no title). A malformed line
    (not JSON, not an object, missing ``_id`` or ``text``, not UTF-8) is reported through ``on_skip`` with
    its line number and left out; so is the rest of a truncated ``.gz`` file.

    Args:
        path: The corpus file, or a folder containing ``corpus.jsonl`` or ``corpus.jsonl.gz``.
        on_skip: Called with ``(where, reason)`` for each line left out, ``where`` being ``file:line``.
            Without it, each is logged as a warning.

    Yields:
        One :class:`Document` per good line, with ``fmt="beir"``.

    Raises:
        InputError: No corpus file at ``path``.
    """
    file = _beir_corpus(Path(path))
    if file is None:
        raise InputError(f"no BEIR corpus at {os.fspath(path)!r}; {_WHAT_TO_PASS}")
    report = on_skip or _log_skip
    lineno = 0
    try:
        with _open_corpus(file) as stream:
            for lineno, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                parsed = _parse_beir_line(line, f"{file}#")
                if isinstance(parsed, str):
                    report(f"{file}:{lineno}", parsed)
                else:
                    yield parsed
    except (OSError, EOFError, zlib.error) as exc:
        report(
            f"{file}:{lineno + 1}",
            f"the corpus ends early after line {lineno} ({exc}); the file is truncated or not valid gzip",
        )


def _open_corpus(file: Path) -> gzip.GzipFile | io.BufferedReader:
    return gzip.open(file, "rb") if file.name.endswith(".gz") else file.open("rb")


def _parse_beir_line(line: bytes, source_prefix: str) -> Document | str:
    """Return the document on one corpus line, or the reason it is unusable."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (invalid byte at column {exc.start + 1}); the corpus must be UTF-8 JSON lines"
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON object"
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object with '_id' and 'text'"
    doc_id, text, title = record.get("_id"), record.get("text"), record.get("title", "")
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or str(doc_id) == "":
        return "missing or empty '_id' (a string); every corpus line needs one"
    if not isinstance(text, str):
        return f"'text' is {'missing' if text is None else type(text).__name__}, not a string"
    if not isinstance(title, str):
        title = "" if title is None else str(title)
    front_title, body = split_front_matter(text)
    return Document(
        id=str(doc_id),
        title=clean_title(title) or clean_title(front_title),
        text=body,
        source=f"{source_prefix}{doc_id}",
        fmt="beir",
    )


def _beir_corpus(path: Path) -> Path | None:
    if path.is_file():
        return path if path.name.endswith((".jsonl", ".jsonl.gz")) else None
    if path.is_dir():
        for name in _BEIR_NAMES:
            if (path / name).is_file():
                return path / name
    return None


def _log_skip(where: str, reason: str) -> None:
    _log.warning("ingest.skipped", path=where, reason=reason)


# --- the whole pipeline --------------------------------------------------------------------------------


def ingest_path(
    path: str | os.PathLike[str],
    *,
    max_chars: int = 1200,
    overlap: int = 150,
    progress: Callable[[int, int], None] | None = None,
) -> IngestResult:
    """Load, clean, chunk and deduplicate a folder of documents or a BEIR corpus.

    A folder holding ``corpus.jsonl`` or ``corpus.jsonl.gz`` (or such a file) is read as BEIR; anything
    else as a folder of documents (see :func:`load_folder`). Documents with nothing left after cleaning
    are skipped with a reason. Identical chunks (same normalised text) are stored once.

    Args:
        path: Folder, single document file, or BEIR corpus.
        max_chars: Largest chunk length in characters.
        overlap: Overlap between consecutive pieces of a long section, in characters.
        progress: Called as ``progress(done, total)`` after each document.

    Returns:
        The chunks, counts, skips and elapsed seconds.

    Raises:
        InputError: ``path`` does not exist, is an unsupported file, or a folder with no supported files.
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
        docs = list(load_beir(corpus, on_skip=lambda where, why: skipped.append((where, why))))
    elif root.is_file() and root.suffix.lower() not in SUFFIXES:
        raise InputError(f"cannot ingest {os.fspath(path)!r}: unsupported file type; {_WHAT_TO_PASS}")
    else:
        for item in load_folder(root):
            if isinstance(item, Skip):
                skipped.append((item.path, item.reason))
            else:
                docs.append(item)
        if not docs and not skipped:
            raise InputError(f"found no .md, .markdown, .txt, .html or .htm files under {os.fspath(path)!r}")

    by_id: dict[str, Chunk] = {}
    files = 0
    for done, doc in enumerate(docs, start=1):
        chunks = _chunk_cleaned(doc, clean_text(doc.text, doc.fmt), max_chars, overlap)
        if chunks:
            files += 1
            for chunk in chunks:
                by_id.setdefault(chunk.id, chunk)
        else:
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
