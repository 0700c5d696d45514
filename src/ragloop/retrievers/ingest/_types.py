"""The values ingestion produces (documents, skips, results) and the limits it applies."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from attrs import field, frozen
from attrs.validators import in_

from ragloop.retrievers.ingest._blocks import Block
from ragloop.retrievers.ingest._clean import FORMATS
from ragloop.state import Chunk

#: File suffixes :func:`load_folder` reads, and the format each is read as.
SUFFIXES = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdx": "markdown",
    ".txt": "text",
    ".html": "html",
    ".htm": "html",
    ".rst": "rst",
    ".pdf": "pdf",
    ".docx": "docx",
}
#: Every document format: the text formats :func:`~ragloop.retrievers.ingest.clean_text` cleans, and the
#: formats a loader turns into blocks.
DOC_FORMATS = (*FORMATS, "rst", "pdf", "docx")
#: The kinds of skip a summary counts (:func:`skip_kind`), in the order it lists them.
SKIP_KINDS = (
    "unsupported type",
    "too large",
    "binary",
    "unreadable",
    "outside the folder",
    "empty after cleaning",
    "needs an extra",
    "malformed",
    "too slow",
    "too much memory",
    "loader crashed",
    "loader failed",
)
_KIND_WORDS = (  # first match wins: the budget and loader kinds first, since their details quote anything
    ("took more than", "too slow"),
    ("of memory to read", "too much memory"),
    ("loader crashed", "loader crashed"),
    ("loader failed", "loader failed"),
    ("needs the [", "needs an extra"),
    ("unsupported", "unsupported type"),
    ("too large", "too large"),
    ("line too long", "too large"),
    ("binary", "binary"),
    ("empty after cleaning", "empty after cleaning"),
    ("link out of the folder", "outside the folder"),
    ("linked folder", "outside the folder"),
    ("cleaning too slow", "too slow"),
    ("cannot", "unreadable"),
    ("broken symbolic link", "unreadable"),
    ("not a regular file", "unreadable"),
    ("damaged", "unreadable"),
    ("encrypted", "unreadable"),
    ("not a readable", "unreadable"),
)

_BEIR_NAMES = ("corpus.jsonl", "corpus.jsonl.gz")
_WHAT_TO_PASS = (
    "pass a folder of .md, .txt, .html, .rst, .pdf or .docx files, or a BEIR corpus "
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
#: Most characters of text one file may produce once loaded and cleaned; a file giving more is skipped.
MAX_TEXT_CHARS = 8_000_000
#: Largest size a ZIP member (a part of a DOCX) may declare unpacked, and all members together: a zip bomb is
#: refused from its directory, before anything is unpacked (Python's zipfile never unpacks past the declared size).
MAX_ZIP_MEMBER_BYTES = 64 << 20
MAX_ZIP_TOTAL_BYTES = 256 << 20
#: Largest size one PDF stream may decode to (pypdf's own limits are set to it in the loader).
MAX_PDF_STREAM_BYTES = 32 << 20
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


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


def skip_kind(reason: str) -> str:
    """The kind of a skip (one of :data:`SKIP_KINDS`) from its reason; ``"malformed"`` for a bad corpus line."""
    lowered = reason.lower()
    for words, kind in _KIND_WORDS:
        if words in lowered:
            return kind
    return "malformed"


def skip_kinds(skipped: Iterable[tuple[str, str]]) -> list[tuple[str, int]]:
    """Count skips by kind (:func:`skip_kind`), most common first."""
    counts = Counter(skip_kind(why) for _, why in skipped)
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
        fmt: How to read it: ``"markdown"``, ``"text"``, ``"html"``, ``"beir"``, ``"rst"``, ``"pdf"`` or ``"docx"``.
        blocks: Its structure when a loader already read it (PDF, DOCX, HTML, RST); empty for text that is
            cleaned as markdown or plain text.
        encoding: The text encoding it was decoded from (``""`` for binary formats and corpus lines).
        warnings: What its loader warned about while reading it (pypdf's messages on a damaged PDF).
    """

    id: str
    title: str
    text: str
    source: str
    fmt: str = field(validator=in_(DOC_FORMATS))
    blocks: tuple[Block, ...] = ()
    encoding: str = ""
    warnings: tuple[str, ...] = ()


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
        excluded: Files left out by the caller's include and exclude globs (not skips: asked for).
        hidden: Hidden files and folders (names starting with ``.``) left out, not looked into.
        warnings: ``(path, message)`` for what a loader warned about in a file it still read (pypdf on a
            damaged PDF): the file is indexed, but may be missing text.
    """

    chunks: tuple[Chunk, ...]
    files: int
    skipped: tuple[tuple[str, str], ...]
    seconds: float
    excluded: int = 0
    hidden: int = 0
    warnings: tuple[tuple[str, str], ...] = ()
