"""Reading a folder of documents without leaving it: the walk, safe reads, one file to a document."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ragloop.retrievers.ingest._blocks import Block, LoaderError, MissingExtra, render
from ragloop.retrievers.ingest._clean import clean_title, split_front_matter
from ragloop.retrievers.ingest._decode import Undecodable, decode_text
from ragloop.retrievers.ingest._globs import FileFilter
from ragloop.retrievers.ingest._html import html_blocks
from ragloop.retrievers.ingest._loaders import docx_blocks, pdf_blocks, rst_blocks
from ragloop.retrievers.ingest._sphinx import built_page, is_sphinx_source
from ragloop.retrievers.ingest._types import _MD_H1, MAX_FILE_BYTES, SUFFIXES, Document, Skip, _Refused, safe_name

# --- loading a folder ----------------------------------------------------------------------------------


def load_folder(
    path: str | os.PathLike[str],
    *,
    max_file_bytes: int = MAX_FILE_BYTES,
    select: FileFilter | None = None,
) -> Iterator[Document | Skip]:
    """Read every file under a folder, recursively, in sorted path order.

    Hidden files and folders (names starting with ``.``) are left out (counted in ``select``), and so are
    files ``select`` excludes. Every other file becomes a :class:`Document` or a :class:`Skip` naming the file
    and the problem: a type ragloop does not read, a file that cannot be read, is binary, is larger than
    ``max_file_bytes``, is not a regular file (FIFO, device, socket) or is a symbolic link leading out of the
    folder; so does a linked folder (never followed). Nothing raises. A single file may be passed instead.

    Args:
        path: The folder (or one file).
        max_file_bytes: Largest file read.
        select: The include/exclude globs (:class:`FileFilter`); it also counts what it left out.

    Yields:
        A :class:`Document` or a :class:`Skip` per file.
    """
    root = Path(path)
    if root.is_file():
        real = root.resolve()  # a file named by the caller is read even through a link
        yield read_document(real, real.parent, max_file_bytes=max_file_bytes)
        return
    for item in _walk(root, select or FileFilter()):
        yield item if isinstance(item, Skip) else read_document(item, root, max_file_bytes=max_file_bytes)


def _walk(root: Path, select: FileFilter) -> list[Path | Skip]:
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
        select.hidden += sum(1 for d in dirnames if d.startswith(".")) + sum(1 for f in filenames if f.startswith("."))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            relative = (here / name).relative_to(root).as_posix()
            if select.wants(relative):
                found.append((safe_name(relative), here / name))
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

    Text is decoded as UTF-8, else by its byte-order mark, else by detection (latin-1, UTF-16, Shift-JIS…);
    stray NUL bytes are removed. PDF, DOCX, HTML and RST are read into blocks here by their loaders. A Sphinx
    source copy (``_sources/…/x.rst.txt``) is read as RST, its source (what citations name) the built page.

    Args:
        path: The file; its suffix picks the format (see :data:`SUFFIXES`).
        root: The ingested folder; the document id is the path relative to it. A link whose target is
            outside it is refused.
        max_file_bytes: Largest file read.
    """
    where = safe_name(os.fspath(path))
    relative = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    sphinx = is_sphinx_source(relative)
    fmt = "rst" if sphinx else SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        shown = safe_name(path.suffix) or "(no suffix)"
        return Skip(where, f"unsupported type {shown!r}; ragloop reads {', '.join(SUFFIXES)}")
    try:
        data = _read_inside(path, root, max_file_bytes)
    except _Refused as refused:
        return Skip(where, str(refused))
    doc_id = safe_name(relative)
    warnings: list[str] = []
    try:
        title, text, blocks, encoding = _load(data, fmt, warnings)
    except (MissingExtra, Undecodable, LoaderError) as exc:
        return Skip(where, str(exc))
    except RecursionError:  # docutils on pathologically nested markup
        return Skip(where, "cannot parse the file: nested too deeply; simplify or split it")
    # The source is the path under the ingested folder, so an index reads the same on every machine.
    return Document(
        id=doc_id,
        title=title or safe_name(path.stem),
        text=text,
        source=safe_name(built_page(relative)) if sphinx else doc_id,
        fmt=fmt,
        blocks=tuple(blocks),
        encoding=encoding,
        warnings=tuple(warnings),
    )


def _load(data: bytes, fmt: str, warnings: list[str]) -> tuple[str, str, list[Block], str]:
    """``(title, text, blocks, encoding)`` of a file's bytes in format ``fmt``; a loader's warnings go to
    ``warnings``."""
    if fmt == "pdf":
        title, blocks = pdf_blocks(data, warnings)
        return clean_title(title), render(blocks), blocks, ""
    if fmt == "docx":
        title, blocks = docx_blocks(data)
        return clean_title(title), render(blocks), blocks, ""
    raw, encoding = decode_text(data)
    if raw.startswith("\ufeff"):
        raw = raw[1:]
    if fmt == "html":
        title, blocks = html_blocks(raw, warnings)
        return clean_title(title), raw, blocks, encoding
    if fmt == "rst":
        title, blocks = rst_blocks(raw)
        return clean_title(title), raw, blocks, encoding
    title, text = _title_and_body(raw, fmt)
    return title, text, [], encoding


def _title_and_body(raw: str, fmt: str) -> tuple[str, str]:
    """Return ``(title, body)``: the title found in the text (or ``""``) and the text without front matter."""
    if fmt in ("markdown", "beir"):
        title, body = split_front_matter(raw)
        if not title:
            match = _MD_H1.search(body)
            title = match.group(1) if match else ""
        return clean_title(title), body
    return "", raw
