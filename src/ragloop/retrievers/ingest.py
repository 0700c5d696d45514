"""Ingestion: load documents, clean them, cut them into chunks.

Two sources are understood: a folder of ``.md``/``.markdown``/``.txt``/``.html``/``.htm`` files, and a
BEIR corpus (``corpus.jsonl`` or ``corpus.jsonl.gz``, one ``{"_id", "title", "text"}`` object a line).
:func:`ingest_path` detects which one it was given and returns deduplicated chunks plus what it skipped
and why; nothing in a bad file (not UTF-8, binary, malformed JSON line) stops the run.

Hostile input stays contained: ingestion never leaves the folder it was given (a link out of it is refused, a
linked folder is not followed), reads regular files only (FIFOs and devices are refused from ``os.stat``,
before any open), caps bytes per file and per corpus line while streaming (a gzip bomb is read no further
than the cap), gives undecodable file names safe ids, and skips a document whose cleaning overruns its time
budget. Every refusal is a :class:`Skip` with its reason, counted in the result.

Example::

    result = ingest_path("docs/")
    print(len(result.chunks), "chunks from", result.files, "files;", len(result.skipped), "skipped")
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import stat
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from attrs import field, frozen
from attrs.validators import in_

from ragloop._log import get_logger
from ragloop.errors import InputError
from ragloop.retrievers.chunking import check_limits, chunk_id, split_long, split_sections
from ragloop.retrievers.clean import FORMATS, clean_text, clean_title, element_text, split_front_matter
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
    "safe_name",
    "skip_kinds",
    "split_front_matter",
]

_log = get_logger(__name__)

#: File suffixes :func:`load_folder` reads, and the format each is cleaned as.
SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".html": "html", ".htm": "html"}

_BEIR_NAMES = ("corpus.jsonl", "corpus.jsonl.gz")
_WHAT_TO_PASS = (
    "pass a folder of .md, .markdown, .txt, .html or .htm files, or a BEIR corpus "
    "(a folder containing corpus.jsonl or corpus.jsonl.gz, or that file itself)"
)
_MD_H1 = re.compile(r"^ {0,3}#[ \t]+(.+)$", re.M)

#: Largest document file read, in bytes; a larger file is skipped with its size in the reason.
MAX_FILE_BYTES = 16 << 20
#: Largest line of a BEIR corpus, in bytes (read in pieces, so a bomb inflating to one huge line stays small).
MAX_LINE_BYTES = 16 << 20
#: Seconds cleaning one document may take before it is skipped: a backstop, since cleaning is linear
#: (``benchmarks/bench_clean.py``) and files stop at :data:`MAX_FILE_BYTES`.
CLEAN_BUDGET_S = 60.0
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_KIND_END = re.compile(r" \(|;|:")


def safe_name(text: str) -> str:
    """``text`` made safe to store and print: bytes that are not UTF-8 (a file name's surrogate escapes, lone
    surrogates) and control or bidi characters become ``\\xNN`` / ``\\uNNNN`` escapes; anything else is kept."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _UNSAFE_CHARS.sub(lambda m: ascii(m.group(0))[1:-1], text)


def skip_kinds(skipped: Iterable[tuple[str, str]]) -> list[tuple[str, int]]:
    """Count skips by kind (a reason's words before its first ``" ("``, ``;`` or ``:``), most common first."""
    counts = Counter(_KIND_END.split(why, maxsplit=1)[0].strip() for _, why in skipped)
    return counts.most_common()


class _Refused(Exception):
    """A file that is not read, and why (becomes a :class:`Skip`)."""


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


def load_folder(path: str | os.PathLike[str], *, max_file_bytes: int = MAX_FILE_BYTES) -> Iterator[Document | Skip]:
    """Read every supported file under a folder, recursively, in sorted path order.

    Hidden files and folders (names starting with ``.``) are left out. A file that cannot be read, is
    binary, is not UTF-8, is larger than ``max_file_bytes``, is not a regular file (FIFO, device, socket) or
    is a symbolic link leading out of the folder comes back as a :class:`Skip` naming the file and the
    problem; so does a linked folder (never followed). Nothing raises. A single supported file may be passed
    instead of a folder.

    Args:
        path: The folder (or one file).
        max_file_bytes: Largest file read.

    Yields:
        A :class:`Document` or a :class:`Skip` per file.
    """
    root = Path(path)
    if root.is_file():
        real = root.resolve()  # a file named by the caller is read even through a link
        yield read_document(real, real.parent, max_file_bytes=max_file_bytes)
        return
    for item in _walk(root):
        yield item if isinstance(item, Skip) else read_document(item, root, max_file_bytes=max_file_bytes)


def _walk(root: Path) -> list[Path | Skip]:
    found: list[tuple[str, Path | Skip]] = []

    def unreadable(exc: OSError) -> None:
        where = safe_name(os.fspath(exc.filename or root))
        found.append((where, Skip(where, f"cannot list the folder ({exc.strerror or exc}); check its permissions")))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        here = Path(dirpath)
        for name in sorted(dirnames):
            if not name.startswith(".") and (here / name).is_symlink():
                where = safe_name(os.fspath(here / name))
                found.append(
                    (
                        safe_name((here / name).relative_to(root).as_posix()),
                        Skip(where, "linked folder, not followed; move or copy it inside to index it"),
                    )
                )
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            (safe_name((here / name).relative_to(root).as_posix()), here / name)
            for name in filenames
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES
        )
    found.sort(key=lambda pair: pair[0])
    return [item for _, item in found]


def _read_inside(path: Path, root: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file that is inside ``root`` once links are resolved.

    The file is classified from ``os.stat`` before it is opened (a FIFO or device is never opened), opened
    without following a link and without blocking, checked again on the open descriptor, and read no further
    than ``max_bytes + 1``.

    Raises:
        _Refused: the file is not read, with the reason.
    """
    try:
        info = os.lstat(path)
        real = path
        if stat.S_ISLNK(info.st_mode):
            try:
                real = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:
                raise _Refused("broken symbolic link (or a loop); fix or remove the link") from exc
            if not real.is_relative_to(root.resolve()):
                raise _Refused(
                    f"symbolic link out of the folder (to {safe_name(os.fspath(real))!r}); "
                    "copy the file into the folder to index it"
                )
            info = os.stat(real)
        _check_regular(info.st_mode, info.st_size, max_bytes)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(real, flags)
    except OSError as exc:
        raise _Refused(f"cannot read the file ({exc.strerror or exc}); check it exists and is readable") from exc
    with os.fdopen(fd, "rb") as fh:
        opened = os.fstat(fh.fileno())
        _check_regular(opened.st_mode, opened.st_size, max_bytes)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _Refused(f"too large (over {max_bytes:,} bytes); split it into smaller files to index it")
    return data


def _check_regular(mode: int, size: int, max_bytes: int) -> None:
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a folder"
            if stat.S_ISDIR(mode)
            else "special"
        )
        raise _Refused(f"not a regular file ({kind}); only regular files are read")
    if size > max_bytes:
        raise _Refused(f"too large ({size:,} bytes, over {max_bytes:,}); split it into smaller files to index it")


def read_document(path: Path, root: Path, *, max_file_bytes: int = MAX_FILE_BYTES) -> Document | Skip:
    """Read one file as a :class:`Document`, or explain in a :class:`Skip` why it cannot be used.

    Args:
        path: The file; its suffix picks the format (see :data:`SUFFIXES`).
        root: The ingested folder; the document id is the path relative to it. A link whose target is
            outside it is refused.
        max_file_bytes: Largest file read.
    """
    where = safe_name(os.fspath(path))
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        return Skip(where, f"unsupported file type {safe_name(path.suffix)!r}; use one of {', '.join(SUFFIXES)}")
    try:
        data = _read_inside(path, root, max_file_bytes)
    except _Refused as refused:
        return Skip(where, str(refused))
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return Skip(where, "UTF-16 text, not UTF-8; convert it to UTF-8 (e.g. with iconv) to index it")
    if b"\x00" in data:
        return Skip(where, "binary file (contains NUL bytes); only UTF-8 text files are indexed")
    try:
        raw = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Skip(
            where,
            f"not UTF-8 (invalid byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "convert it to UTF-8 (e.g. with iconv) to index it",
        )
    doc_id = safe_name(path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name)
    title, text = _title_and_body(raw, fmt)
    # The source is the path under the ingested folder, so an index reads the same on every machine.
    return Document(id=doc_id, title=title or safe_name(path.stem), text=text, source=doc_id, fmt=fmt)


def _title_and_body(raw: str, fmt: str) -> tuple[str, str]:
    """Return ``(title, body)``: the title found in the text (or ``""``) and the text without front matter."""
    if fmt in ("markdown", "beir"):
        title, body = split_front_matter(raw)
        if not title:
            match = _MD_H1.search(body)
            title = match.group(1) if match else ""
        return clean_title(title), body
    if fmt == "html":
        found = element_text(raw, "title") or element_text(raw, "h1")
        return (clean_title(found) if found else ""), raw
    return "", raw


# --- loading a BEIR corpus -----------------------------------------------------------------------------


def load_beir(
    path: str | os.PathLike[str],
    *,
    on_skip: Callable[[str, str], None] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[Document]:
    """Read a BEIR corpus: ``corpus.jsonl[.gz]``, or a folder containing one.

    Each line is a JSON object with ``_id``, ``text`` and optionally ``title``. The text is treated as
    markdown (front matter dropped, its ``title:`` used when the record has no title). A malformed line
    (not JSON, nested too deeply, not an object, missing ``_id`` or ``text``, not UTF-8, longer than
    ``max_line_bytes``) is reported through ``on_skip`` with its line number and left out; so is the rest of
    a truncated ``.gz`` file. Lines are read in pieces of at most ``max_line_bytes``, so a compressed file
    that inflates to one enormous line never takes more memory than that.

    Args:
        path: The corpus file, or a folder containing ``corpus.jsonl`` or ``corpus.jsonl.gz``.
        on_skip: Called with ``(where, reason)`` for each line left out, ``where`` being ``file:line``.
            Without it, each is logged as a warning.
        max_line_bytes: Longest line read (uncompressed bytes).

    Yields:
        One :class:`Document` per good line, with ``fmt="beir"``.

    Raises:
        InputError: No corpus file at ``path``, or it is not a regular file, or (in a folder) a link leading
            out of it.
    """
    file = _beir_corpus(Path(path))
    if file is None:
        raise InputError(f"no BEIR corpus at {os.fspath(path)!r}; {_WHAT_TO_PASS}")
    report = on_skip or _log_skip
    shown = safe_name(os.fspath(file))
    lineno = 0
    try:
        with _open_corpus(file) as stream:
            for lineno, line in enumerate(_capped_lines(stream, max_line_bytes), start=1):
                if line is None:
                    report(
                        f"{shown}:{lineno}",
                        f"line too long (over {max_line_bytes:,} bytes); split the document or raise max_line_bytes",
                    )
                    continue
                if not line.strip():
                    continue
                parsed = _parse_beir_line(line, f"{shown}#")
                if isinstance(parsed, str):
                    report(f"{shown}:{lineno}", parsed)
                else:
                    yield parsed
    except (OSError, EOFError, zlib.error) as exc:
        report(
            f"{shown}:{lineno + 1}",
            f"the corpus ends early after line {lineno} ({exc}); the file is truncated or not valid gzip",
        )


def _capped_lines(stream: gzip.GzipFile | io.BufferedReader, cap: int) -> Iterator[bytes | None]:
    """The lines of ``stream``; ``None`` for a line longer than ``cap`` (whose rest is read and dropped)."""
    while True:
        line = stream.readline(cap + 1)
        if not line:
            return
        if len(line) > cap and not line.endswith(b"\n"):
            while True:  # drain the rest of the line piece by piece
                rest = stream.readline(1 << 20)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
        else:
            yield line


@contextlib.contextmanager
def _open_corpus(file: Path) -> Iterator[gzip.GzipFile | io.BufferedReader]:
    """The corpus, opened without blocking (a FIFO never hangs) and refused unless it is a regular file."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(file, flags), "rb") as raw:
        if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
            raise InputError(f"{safe_name(os.fspath(file))!r} is not a regular file; {_WHAT_TO_PASS}")
        if not file.name.endswith(".gz"):
            yield raw
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
            yield stream


def _json_line(line: bytes) -> tuple[Any, str | None]:
    """``(value, None)`` for a line of UTF-8 JSON, else ``(None, reason)``."""
    try:
        return json.loads(line.decode("utf-8")), None
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (invalid byte at column {exc.start + 1}); the corpus must be UTF-8 JSON lines"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno}); each line must be one JSON object"
    except RecursionError:
        return None, "nested too deeply (arrays or objects inside each other); each line must be one flat object"


def _parse_beir_line(line: bytes, source_prefix: str) -> Document | str:
    """Return the document on one corpus line, or the reason it is unusable."""
    record, problem = _json_line(line)
    if problem is not None:
        return problem
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
    safe_id = safe_name(str(doc_id))
    return Document(
        id=safe_id,
        title=clean_title(title) or clean_title(front_title),
        text=body,
        source=f"{source_prefix}{safe_id}",
        fmt="beir",
    )


def _beir_corpus(path: Path) -> Path | None:
    if path.is_file():
        return path if path.name.endswith((".jsonl", ".jsonl.gz")) else None
    if path.is_dir():
        for name in _BEIR_NAMES:
            candidate = path / name
            if candidate.is_file():
                real = candidate.resolve()
                if not real.is_relative_to(path.resolve()):
                    raise InputError(
                        f"{safe_name(os.fspath(candidate))!r} is a link out of the folder "
                        f"(to {safe_name(os.fspath(real))!r}); pass that file itself if you mean to index it"
                    )
                return candidate
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
