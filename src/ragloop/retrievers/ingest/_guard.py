"""One file, read in a worker process: what :func:`~ragloop.retrievers.ingest.ingest_path` hands the pool.

:func:`parse_file` reads, loads and cleans one file (:func:`~ragloop.retrievers.ingest.read_document` then
:func:`~ragloop.retrievers.ingest.document_blocks`) and returns a :class:`Document` whose blocks are final, or a
:class:`Skip`. It runs in a worker of :func:`~ragloop.retrievers.ingest._isolate.run_isolated`, under the
per-file budgets (wall time, memory); it applies the caps that need no process boundary itself: the text a
file may produce (:data:`MAX_TEXT_CHARS`), the size a ZIP member (DOCX) or PDF stream may expand to (enforced by
the loaders). :func:`failure_reason` turns what the pool reports about a file into its skip line.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import evolve, frozen

from ragloop.errors import InputError
from ragloop.retrievers.ingest._blocks import Block, markdown_anchors, markdown_blocks
from ragloop.retrievers.ingest._clean import clean_text
from ragloop.retrievers.ingest._files import read_document
from ragloop.retrievers.ingest._html import html_blocks
from ragloop.retrievers.ingest._isolate import Budget, Failure
from ragloop.retrievers.ingest._loaders import rst_blocks
from ragloop.retrievers.ingest._types import MAX_FILE_BYTES, MAX_TEXT_CHARS, SUFFIXES, Document, Skip, safe_name

__all__ = ["EMPTY_REASON", "FILE_BUDGET", "FileTask", "document_blocks", "failure_reason", "file_size", "parse_file"]

#: What reading one file may spend by default: 30 s plus 10 s per MB of the file (a 16 MB manual gets 190 s, a
#: 70 KB file that only pretends to be work 30 s), and 512 MB of address space.
FILE_BUDGET = Budget(seconds=30.0, memory_bytes=512 << 20, seconds_per_mb=10.0)


def file_size(task: FileTask) -> int:
    """The size of a task's file (0 when it cannot be read: the worker reports why)."""
    try:
        return os.stat(task.path).st_size
    except OSError:
        return 0


_FORMAT_NAMES = {"pdf": "PDF", "docx": "DOCX", "html": "HTML", "rst": "reStructuredText"}
#: The skip reason of a file that has no text once cleaned.
EMPTY_REASON = "empty after cleaning (only markup, navigation, images, shortcodes or whitespace)"


def document_blocks(doc: Document, *, budget_s: float | None = None) -> list[Block]:
    """The blocks of a document: what its loader read, else its text cleaned and read as markdown or text.

    Raises:
        InputError: cleaning took longer than ``budget_s``.
        MissingExtra: the document's format needs a package that is not installed.
    """
    if doc.blocks:
        return list(doc.blocks)
    if doc.fmt == "html":
        return html_blocks(doc.text)[1]
    if doc.fmt == "rst":
        return rst_blocks(doc.text)[1]
    if doc.fmt in ("markdown", "beir"):
        cleaned = clean_text(doc.text, doc.fmt, budget_s=budget_s)
        return markdown_blocks(cleaned, anchors=list(markdown_anchors(doc.text)))
    fmt = "text" if doc.fmt in ("pdf", "docx") else doc.fmt
    return markdown_blocks(clean_text(doc.text, fmt, budget_s=budget_s), headings=False)


@frozen
class FileTask:
    """One file for a worker.

    Attributes:
        path: The file.
        root: The ingested folder (ids are relative to it; links out of it are refused).
        max_file_bytes: Largest file read.
        max_text_chars: Most characters of text the file may produce.
        clean_budget_s: Seconds cleaning may take (``None``: no limit; the worker's wall budget still holds).
    """

    path: str
    root: str
    max_file_bytes: int = MAX_FILE_BYTES
    max_text_chars: int = MAX_TEXT_CHARS
    clean_budget_s: float | None = None


def parse_file(task: FileTask) -> Document | Skip:
    """Read, load and clean one file: a :class:`Document` whose ``blocks`` are what it indexes (its raw
    ``text`` left out, so the result is small to send), or a :class:`Skip` with the reason.

    Never raises for a problem in the file itself (a loader's exception is the caller's
    :class:`~ragloop.retrievers.ingest._isolate.Failure`, see :func:`failure_reason`).
    """
    path = Path(task.path)
    item = read_document(path, Path(task.root), max_file_bytes=task.max_file_bytes)
    if isinstance(item, Skip):
        return item
    if not item.blocks and len(item.text) > task.max_text_chars:
        return _too_much_text(item.source, len(item.text), task.max_text_chars)
    try:
        blocks = document_blocks(item, budget_s=task.clean_budget_s)
    except InputError as exc:  # cleaning over its time budget
        return Skip(item.source, str(exc))
    chars = sum(len(b.text) for b in blocks)
    if chars > task.max_text_chars:
        return _too_much_text(item.source, chars, task.max_text_chars)
    if not any(b.kind != "heading" for b in blocks):
        why = next((w for w in item.warnings if w.startswith("cleaning removed")), "")
        return Skip(item.source, f"{EMPTY_REASON}: {why}" if why else EMPTY_REASON)
    return evolve(item, text="", blocks=tuple(blocks))


def _too_much_text(where: str, chars: int, cap: int) -> Skip:
    return Skip(
        where, f"too large: it gives {chars:,} characters of text (over {cap:,} per file); split it into smaller files"
    )


def failure_reason(path: str, failure: Failure, budget: Budget) -> Skip:
    """The skip line for a file whose worker gave no result (over a budget, a loader's exception, a crash)."""
    where = safe_name(path)
    fmt = SUFFIXES.get(os.path.splitext(path)[1].lower(), "text")
    loader = f"the {_FORMAT_NAMES.get(fmt, fmt)} loader"
    mb = f"{budget.memory_bytes / (1 << 20):g} MB" if budget.memory_bytes is not None else ""
    if failure.kind == "timeout":
        why = f"took more than {failure.detail} to read (the per-file time budget); split it or raise --file-timeout"
    elif failure.kind == "memory":
        why = f"needed more than {mb} of memory to read (the per-file budget); split it or raise --file-memory"
    elif failure.kind == "crash":
        hint = f" or ran out of its {mb} memory budget" if mb else ""
        why = f"{loader} crashed ({failure.detail}): the file is damaged or hostile{hint}; re-export it"
    else:
        why = f"{loader} failed ({failure.detail}); the file may be damaged: re-export or re-save it"
    return Skip(where, why)
