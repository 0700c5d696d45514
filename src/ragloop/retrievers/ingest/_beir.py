"""Reading a BEIR corpus (``corpus.jsonl[.gz]``), line by line in bounded memory."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ragloop._log import get_logger
from ragloop.errors import InputError
from ragloop.retrievers.ingest._clean import clean_title, split_front_matter
from ragloop.retrievers.ingest._types import _BEIR_NAMES, _WHAT_TO_PASS, MAX_LINE_BYTES, Document, safe_name

# --- loading a BEIR corpus -----------------------------------------------------------------------------

_log = get_logger("ragloop.retrievers.ingest")


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
