"""Loaders for formats that are not plain text: PDF (pypdf), DOCX (python-docx), reStructuredText (docutils).

Each returns ``(title, blocks)``. The packages are optional extras (``[pdf]``, ``[office]``, ``[ingest]``);
without one, :class:`~ragloop.retrievers.ingest._blocks.MissingExtra` says which to install and the file is
skipped with that reason. pypdf was chosen over pdfminer.six by measurement (``benchmarks/bench_extract.py``:
faster on the same files, the same words out).

- PDF: pypdf's lines shaped into paragraphs, list items and headings (:mod:`ragloop.retrievers.ingest._pdf`:
  hyphenation joined, running heads and page numbers removed, outline headings where they point, contents
  pages skipped), each block carrying its page number (citations link ``file.pdf#page=N``); the metadata
  title, the title.
  What pypdf logs while it reads (``incorrect startxref pointer``…) is collected for the ingestion's warning
  report instead of reaching stderr through Python's last-resort handler (the library prints nothing).
- DOCX: paragraphs in body order; ``Title`` and ``Heading N`` styles become headings, list styles list items,
  preformatted/code styles code blocks; tables become markdown rows.
- RST: parsed by docutils without reading any other file and without raw HTML; sections become headings
  with their ids, literal blocks code, tables rows, lists items. Sphinx's roles and directives are rendered
  as readable text (:mod:`ragloop.retrievers.ingest._sphinx`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

from ragloop.retrievers.ingest._blocks import Block, LoaderError, MissingExtra, clean_code, clean_inline
from ragloop.retrievers.ingest._pdf import shape_pages
from ragloop.retrievers.ingest._sphinx import sphinx_markup
from ragloop.retrievers.ingest._types import MAX_PDF_STREAM_BYTES, MAX_ZIP_MEMBER_BYTES, MAX_ZIP_TOTAL_BYTES

__all__ = ["check_zip", "docx_blocks", "pdf_blocks", "rst_blocks"]

_HEADING_STYLE = re.compile(r"^(?:heading|überschrift|titre)\s*([1-9])$", re.I)


#: Most pypdf messages kept per file (a damaged file can log one per object).
MAX_PDF_NOTES = 5


class _Notes(logging.Handler):
    """Collects the ``pypdf`` logger's warnings for the threads that are reading a PDF (:meth:`reading`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lists: dict[int, list[str]] = {}
        self.readers_lock = threading.Lock()
        self.saved_propagate = True

    def emit(self, record: logging.LogRecord) -> None:
        found = self.lists.get(threading.get_ident())
        if found is None:
            return
        message = " ".join(record.getMessage().split())
        if message and message not in found and len(found) < MAX_PDF_NOTES:
            found.append(message)

    @contextlib.contextmanager
    def reading(self, into: list[str]) -> Iterator[None]:
        """While this thread reads a PDF, pypdf's warnings go to ``into``, not to the application's handlers or
        stderr: the ``pypdf`` logger gets this handler and stops propagating while any thread reads, and is
        restored when the last one finishes."""
        pypdf_log = logging.getLogger("pypdf")
        with self.readers_lock:
            if not self.lists:
                self.saved_propagate = pypdf_log.propagate
                pypdf_log.addHandler(self)
                pypdf_log.propagate = False
            self.lists[threading.get_ident()] = into
        try:
            yield
        finally:
            with self.readers_lock:
                self.lists.pop(threading.get_ident(), None)
                if not self.lists:
                    pypdf_log.removeHandler(self)
                    pypdf_log.propagate = self.saved_propagate


_NOTES = _Notes()


def pdf_blocks(data: bytes, notes: list[str] | None = None) -> tuple[str, list[Block]]:
    """Text blocks of a PDF, page by page (see the module docstring).

    Args:
        data: The file's bytes.
        notes: Where pypdf's warnings about the file go (at most :data:`MAX_PDF_NOTES`, each once); by default
            they are dropped. Either way nothing is printed.

    Raises:
        MissingExtra: pypdf is not installed.
        LoaderError: the PDF cannot be read (damaged, or encrypted with a password).
    """
    try:
        import pypdf
        from pypdf.errors import PyPdfError
    except ImportError as exc:
        raise MissingExtra("PDF files need the [pdf] extra (pypdf): pip install 'ragloop[pdf]'") from exc
    with _NOTES.reading(notes if notes is not None else []), _stream_caps(pypdf):
        return _read_pdf(pypdf, PyPdfError, data)


_PYPDF_CAPS = (
    "maximum_declared_stream_length",
    "array_based_stream_maximum_output_length",
    "jbig2_maximum_output_length",
    "lzw_maximum_output_length",
    "run_length_maximum_output_length",
    "zlib_maximum_output_length",
    "brotli_maximum_output_length",
    "image_maximum_buffer_size",
)


def _stream_caps(pypdf: Any) -> contextlib.AbstractContextManager[Any]:
    """pypdf's limits on what one stream may decode to, lowered to :data:`MAX_PDF_STREAM_BYTES` (pypdf 6.6+;
    older versions keep their own, and the per-file memory budget still holds)."""
    apply = getattr(pypdf, "apply_configuration", None)
    current = getattr(pypdf, "get_configuration", None)
    if apply is None or current is None:
        return contextlib.nullcontext()
    known = {name for name in _PYPDF_CAPS if hasattr(current(), name)}
    return apply(**{name: min(getattr(current(), name), MAX_PDF_STREAM_BYTES) for name in known})  # type: ignore[no-any-return]


def _read_pdf(pypdf: Any, error: type[Exception], data: bytes) -> tuple[str, list[Block]]:
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise LoaderError("encrypted PDF (needs a password); decrypt it to index it")
        headings = _outline(reader)
        blocks = shape_pages([page.extract_text() or "" for page in reader.pages], headings)
        meta = reader.metadata
        title = clean_inline(str(meta.title)) if meta is not None and meta.title else ""
    except (error, ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        if type(exc).__name__ == "LimitReachedError":
            raise LoaderError(
                f"too large when decoded: a PDF stream is over a limit ({exc}; streams stop at "
                f"{MAX_PDF_STREAM_BYTES:,} bytes); re-export the PDF or split it"
            ) from exc
        raise LoaderError(f"damaged PDF ({type(exc).__name__}: {exc}); re-export it to index it") from exc
    return title, blocks


def _outline(reader: Any) -> dict[int, list[Block]]:
    """The outline's entries as heading blocks, keyed by the page they point at."""
    found: dict[int, list[Block]] = {}

    def walk(items: list[Any], level: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            try:
                page = reader.get_destination_page_number(item) + 1
            except Exception:  # noqa: BLE001 — an outline entry that points nowhere is left out
                continue
            title = clean_inline(str(getattr(item, "title", "") or ""))
            if title:
                found.setdefault(page, []).append(Block("heading", title, level=min(level, 6), page=page))

    try:
        walk(list(reader.outline), 1)
    except Exception:  # noqa: BLE001 — a damaged outline costs the headings, not the text
        return {}
    return found


def docx_blocks(data: bytes) -> tuple[str, list[Block]]:
    """Blocks of a Word document in body order (see the module docstring).

    Raises:
        MissingExtra: python-docx is not installed.
        LoaderError: the file is not a readable DOCX.
    """
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError as exc:
        raise MissingExtra("DOCX files need the [office] extra (python-docx): pip install 'ragloop[office]'") from exc
    check_zip(data)
    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:
        raise LoaderError(f"not a readable DOCX ({type(exc).__name__}: {exc}); re-save it as .docx") from exc
    try:
        return _docx_content(document, Paragraph, Table)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:  # inconsistent merged cells…
        raise LoaderError(f"damaged DOCX content ({type(exc).__name__}: {exc}); re-save it in Word") from exc


def check_zip(data: bytes, *, max_member: int = MAX_ZIP_MEMBER_BYTES, max_total: int = MAX_ZIP_TOTAL_BYTES) -> None:
    """Refuse a ZIP (a DOCX) whose members would unpack past the caps, from its directory alone.

    Python's :mod:`zipfile` never unpacks a member past the size its directory declares (it stops there and
    reports a bad CRC), so checking the declared sizes bounds what unpacking can produce.

    Raises:
        LoaderError: a member, or all of them together, over its cap; or not a ZIP at all.
    """
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise LoaderError(f"not a readable DOCX (not a ZIP archive: {exc}); re-save it as .docx") from exc
    total = 0
    for member in members:
        total += member.file_size
        if member.file_size > max_member:
            raise LoaderError(
                f"too large when unpacked: its part {member.filename[:80]!r} unpacks to {member.file_size:,} bytes "
                f"(over {max_member:,}; a zip bomb?); re-save it, or split the document"
            )
    if total > max_total:
        raise LoaderError(
            f"too large when unpacked: {total:,} bytes in {len(members):,} parts (over {max_total:,}); split it"
        )


#: Most grid columns one DOCX table cell may span (python-docx builds a cell object per column spanned).
MAX_DOCX_SPAN = 1000


def _docx_content(document: Any, paragraph_type: Any, table_type: Any) -> tuple[str, list[Block]]:
    Paragraph, Table = paragraph_type, table_type
    spans = document.element.body.xpath(".//w:gridSpan/@w:val")
    widest = max((int(v) for v in spans if str(v).isdigit()), default=0)
    if widest > MAX_DOCX_SPAN:
        raise LoaderError(
            f"too large: a table cell spans {widest:,} columns (over {MAX_DOCX_SPAN:,}); fix the table and re-save it"
        )
    blocks: list[Block] = []
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            _docx_paragraph(item, blocks)
        elif isinstance(item, Table):
            rows = [[clean_inline(cell.text).replace("|", "\\|") for cell in row.cells] for row in item.rows]
            rows = [r for r in rows if any(r)]
            if rows:
                width = max(len(r) for r in rows)
                lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
                lines.insert(1, "|" + " --- |" * width)
                blocks.append(Block("table", "\n".join(lines)))
    title = clean_inline(document.core_properties.title or "")
    return title, blocks


def _docx_paragraph(paragraph: Any, blocks: list[Block]) -> None:
    style = (paragraph.style.name if paragraph.style is not None else "") or ""
    lowered = style.lower()
    if "code" in lowered or "preformatted" in lowered or lowered == "plain text":
        code = clean_code(paragraph.text)
        if code:
            if blocks and blocks[-1].kind == "code":  # consecutive code lines are one block
                blocks[-1] = Block("code", blocks[-1].text + "\n" + code)
            else:
                blocks.append(Block("code", code))
        return
    text = clean_inline(paragraph.text)
    if not text:
        return
    heading = _HEADING_STYLE.match(style)
    if lowered == "title":
        blocks.append(Block("heading", text, level=1))
    elif heading is not None:
        blocks.append(Block("heading", text, level=min(int(heading.group(1)), 6)))
    elif lowered.startswith("list"):
        blocks.append(Block("text", ("1. " if "number" in lowered else "- ") + text))
    else:
        blocks.append(Block("text", text))


def rst_blocks(text: str) -> tuple[str, list[Block]]:
    """Blocks of a reStructuredText document (see the module docstring).

    Raises:
        MissingExtra: docutils is not installed.
    """
    try:
        from docutils import nodes
        from docutils.core import publish_doctree
    except ImportError as exc:
        raise MissingExtra(
            "reStructuredText needs the [ingest] extra (docutils): pip install 'ragloop[ingest]'"
        ) from exc
    settings = {
        "report_level": 5,  # parse quietly: docutils would otherwise print to stderr
        "halt_level": 5,
        "file_insertion_enabled": False,  # never read another file (.. include::)
        "raw_enabled": False,
        "_disable_config": True,
        "doctitle_xform": False,  # the top section stays a section (level 1), its subsections level 2
        "warning_stream": io.StringIO(),
    }
    with sphinx_markup():  # Sphinx's roles and directives read as text, not dropped (see _sphinx)
        tree = publish_doctree(text, settings_overrides=settings)
    blocks: list[Block] = []
    _RstWalker(nodes, blocks).walk(tree, 0)
    title = next((b.text for b in blocks if b.kind == "heading"), "")
    return title, blocks


class _RstWalker:
    def __init__(self, nodes: Any, blocks: list[Block]) -> None:
        self.n = nodes
        self.blocks = blocks

    def walk(self, node: Any, depth: int) -> None:
        for child in node.children:
            self.visit(child, depth)

    def visit(self, node: Any, depth: int) -> None:  # noqa: C901 — one branch per kind of node
        n = self.n
        if isinstance(node, n.title) and isinstance(node.parent, n.section | n.document):
            ids = node.parent.get("ids") or []
            level = min(max(depth, 1), 6)
            self.blocks.append(Block("heading", clean_inline(node.astext()), level=level, anchor=ids[0] if ids else ""))
        elif isinstance(node, n.section):
            self.walk(node, depth + 1)
        elif isinstance(node, n.literal_block | n.doctest_block):
            classes = [c for c in node.get("classes", []) if c not in ("code", "literal-block")]
            code = clean_code(node.astext())
            if code:
                self.blocks.append(Block("code", code, lang=classes[0] if classes else ""))
        elif isinstance(node, n.table):
            rows = [
                [clean_inline(e.astext()).replace("|", "\\|") for e in row.findall(n.entry)]
                for row in node.findall(n.row)
            ]
            rows = [r for r in rows if any(r)]
            if rows:
                width = max(len(r) for r in rows)
                lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
                lines.insert(1, "|" + " --- |" * width)
                self.blocks.append(Block("table", "\n".join(lines)))
        elif isinstance(node, n.list_item):
            start = len(self.blocks)
            self.walk(node, depth)
            if start < len(self.blocks) and self.blocks[start].kind == "text":
                first = self.blocks[start]
                marker = "1. " if isinstance(node.parent, n.enumerated_list) else "- "
                self.blocks[start] = Block("text", marker + first.text)
        elif isinstance(node, n.paragraph | n.line | n.term | n.rubric):
            line = clean_inline(node.astext())
            if line:
                self.blocks.append(Block("text", line))
        elif isinstance(node, n.comment | n.system_message | n.substitution_definition | n.target | n.raw):
            return
        elif isinstance(node, n.Element):
            self.walk(node, depth)
        elif isinstance(node, n.Text):
            line = clean_inline(node.astext())
            if line:
                self.blocks.append(Block("text", line))
