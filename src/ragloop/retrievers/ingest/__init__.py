"""Ingestion: load documents, clean them, cut them into chunks.

Two sources are understood: a folder of documents (markdown, text, HTML, reStructuredText, PDF, DOCX; see
:data:`SUFFIXES`), and a BEIR corpus (``corpus.jsonl`` or ``corpus.jsonl.gz``, one ``{"_id", "title",
"text"}`` object a line).
:func:`ingest_path` detects which one it was given and returns deduplicated chunks plus what it skipped
and why; nothing in a bad file (not UTF-8, binary, malformed JSON line) stops the run.

Hostile input stays contained: ingestion never leaves the folder it was given (a link out of it is refused, a
linked folder is not followed), reads regular files only (FIFOs and devices are refused from ``os.stat``,
before any open), caps bytes per file and per corpus line while streaming (a gzip bomb is read no further
than the cap), gives undecodable file names safe ids, and skips a document whose cleaning overruns its time
budget. Files are read in worker processes, each under a wall-time and memory :class:`Budget`, with caps on
what a ZIP member (DOCX) or PDF stream may unpack to and on the text one file may give: a file over a budget or
cap, one that makes its loader raise, or one that kills its worker (a native crash) is one skip, and the run goes
on. Every refusal is a :class:`Skip` with its reason, counted in the result.

Example::

    result = ingest_path("docs/")
    print(len(result.chunks), "chunks from", result.files, "files;", len(result.skipped), "skipped")
"""

from ragloop.retrievers.ingest._beir import load_beir
from ragloop.retrievers.ingest._blocks import Block, MissingExtra, render
from ragloop.retrievers.ingest._chunk import chunk_id, index_text
from ragloop.retrievers.ingest._clean import clean_text, split_front_matter
from ragloop.retrievers.ingest._files import load_folder, read_document
from ragloop.retrievers.ingest._globs import FileFilter
from ragloop.retrievers.ingest._isolate import Budget
from ragloop.retrievers.ingest._pipeline import (
    INGEST_VERSION,
    Explained,
    chunk_document,
    document_blocks,
    explain_file,
    ingest_path,
)
from ragloop.retrievers.ingest._tokens import Tokenizer, WordTokens, default_tokenizer
from ragloop.retrievers.ingest._types import (
    CLEAN_BUDGET_S,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    MAX_TEXT_CHARS,
    SKIP_KINDS,
    SUFFIXES,
    Document,
    IngestResult,
    Skip,
    safe_name,
    skip_kind,
    skip_kinds,
)

__all__ = [
    "CLEAN_BUDGET_S",
    "INGEST_VERSION",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_TEXT_CHARS",
    "SKIP_KINDS",
    "SUFFIXES",
    "Block",
    "Budget",
    "Document",
    "Explained",
    "FileFilter",
    "IngestResult",
    "MissingExtra",
    "Skip",
    "Tokenizer",
    "WordTokens",
    "chunk_document",
    "chunk_id",
    "clean_text",
    "default_tokenizer",
    "document_blocks",
    "explain_file",
    "index_text",
    "ingest_path",
    "load_beir",
    "load_folder",
    "read_document",
    "render",
    "safe_name",
    "skip_kind",
    "skip_kinds",
    "split_front_matter",
]
