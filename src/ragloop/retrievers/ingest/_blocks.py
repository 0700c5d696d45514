"""The structure every loader produces: a document as a flat list of blocks.

A :class:`Block` is a heading, a paragraph of prose, a code block or a table. Loaders (HTML, PDF, DOCX, RST)
build blocks from the real structure of their format; markdown and plain text are cleaned first
(:func:`ragloop.retrievers.ingest._clean.clean_text`) and then read into blocks by :func:`markdown_blocks`.
The chunker cuts blocks, never raw strings, so a heading comes only from a real heading, code stays whole
and verbatim, and a table is cut only between rows. :func:`render` writes blocks back as markdown: that is
the document's cleaned text (what ``ragloop index --explain`` shows) and what chunk texts are made of.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence

from attrs import field, frozen
from attrs.validators import in_

from ragloop.retrievers.ingest._clean import iter_segments

__all__ = [
    "BLOCK_KINDS",
    "Block",
    "LoaderError",
    "MissingExtra",
    "clean_code",
    "clean_inline",
    "markdown_anchors",
    "markdown_blocks",
    "render",
    "render_block",
    "slug",
]

#: The kinds of :class:`Block`.
BLOCK_KINDS = ("heading", "text", "code", "table")

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)")
_EXPLICIT_ID = re.compile(r"\{[ \t]*#([\w.:-]+)[^{}\n]*\}[ \t]*$")
_NOT_SLUG = re.compile(r"[^\w\- ]")
_DASHES = re.compile(r"[-\s]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200b-\u200d\u2060\ufeff]")
_SPACES = re.compile(r"[^\S\n]+")


class MissingExtra(Exception):
    """A loader's package is not installed; the message names the extra to install."""


class LoaderError(Exception):
    """The file is damaged, encrypted or built to hurt the parser; the message says so."""


@frozen
class Block:
    """One piece of a document's structure.

    Attributes:
        kind: ``"heading"``, ``"text"`` (a paragraph or list item), ``"code"`` or ``"table"``.
        text: The content: a heading's title, the prose, the code verbatim (no fences), or the table as
            markdown rows (``| a | b |``), one row a line.
        level: A heading's level (1–6); 0 for other kinds.
        anchor: A heading's id in the page (``#anchor`` of its URL), when the format has one.
        page: The page it is on (PDF, 1-based); 0 when the format has no pages.
        lang: A code block's language (its fence info), when known.
        term: The definition term this block describes (a block of an HTML ``<dd>``: the ``<dt>`` lines,
            e.g. an API's signature ``hashlib.sha256(data=b'')``, one a line); the chunker keeps it in front of
            every chunk that starts inside the description. ``""`` outside a definition's description.
        is_term: Whether this block is a definition's term itself (an HTML ``<dt>``): the chunker never cuts
            between it and the start of its description.
    """

    kind: str = field(validator=in_(BLOCK_KINDS))
    text: str = ""
    level: int = 0
    anchor: str = ""
    page: int = 0
    lang: str = ""
    term: str = ""
    is_term: bool = False


def clean_inline(text: str) -> str:
    """One line of prose: controls dropped, NFC, every whitespace run one space (HTML's own rendering rule)."""
    text = unicodedata.normalize("NFC", _CONTROL.sub("", text)).replace("\u00a0", " ")
    return " ".join(text.split())


def clean_code(text: str) -> str:
    """Code as written: controls dropped (tab and newline kept), trailing spaces and blank edge lines removed."""
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n")).replace("\u00a0", " ")
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def slug(title: str) -> str:
    """The id Python-Markdown's ``toc`` extension (MkDocs) gives a heading: lower case, words joined by ``-``."""
    text = unicodedata.normalize("NFKD", title)
    text = _NOT_SLUG.sub("", text).strip().lower()
    return _DASHES.sub("-", text)


def render_block(block: Block) -> str:
    """One block as markdown: ``## Title``, a fenced code block, the table rows, or the prose."""
    if block.kind == "heading":
        return "#" * max(1, min(block.level, 6)) + " " + block.text
    if block.kind == "code":
        fence = "~~~" if "```" in block.text else "```"
        return f"{fence}{block.lang}\n{block.text}\n{fence}"
    return block.text


def render(blocks: Iterable[Block]) -> str:
    """The blocks as markdown, one blank line between blocks."""
    return "\n\n".join(render_block(b) for b in blocks if b.text)


def markdown_anchors(raw: str) -> Iterator[str | None]:
    """For each heading line of raw markdown (outside fenced code), in order: its explicit ``{ #id }`` or None."""
    for is_code, segment in iter_segments(raw.replace("\r\n", "\n")):
        if is_code:
            continue
        for line in segment.split("\n"):
            if _HEADING.match(line):
                found = _EXPLICIT_ID.search(line)
                yield found.group(1) if found else None


def markdown_blocks(cleaned: str, *, headings: bool = True, anchors: Sequence[str | None] = ()) -> list[Block]:
    """Read cleaned markdown into blocks.

    Args:
        cleaned: Output of :func:`~ragloop.retrievers.ingest._clean.clean_text` (paragraphs separated by a
            blank line, heading lines as ``#`` lines, fenced code kept verbatim).
        headings: Read ``#`` lines as headings (``False`` for plain text, where ``#`` is just a character).
        anchors: Explicit ids of the headings, in order (:func:`markdown_anchors`); a heading without one gets
            :func:`slug` of its title, as MkDocs does.

    Returns:
        The blocks in document order; a paragraph whose every line starts with ``|`` is a table.
    """
    blocks: list[Block] = []
    explicit = list(anchors)
    n_heading = 0
    for is_code, segment in iter_segments(cleaned):
        if is_code:
            lines = segment.rstrip("\n").split("\n")
            opening = _FENCE.match(lines[0])
            lang = opening.group(2) if opening else ""
            body = lines[1:]
            if body and opening and body[-1].strip().startswith(opening.group(1)[0] * 3):
                body = body[:-1]
            code = clean_code("\n".join(body))
            if code:
                blocks.append(Block("code", code, lang=lang))
            continue
        for para in re.split(r"\n[ \t]*\n", segment):
            run: list[str] = []
            for line in para.split("\n"):
                m = _HEADING.match(line) if headings else None
                if m is None:
                    if line.strip():
                        run.append(_SPACES.sub(" ", line).strip())
                    continue
                _flush(run, blocks)
                title = m.group(2).strip()
                given = explicit[n_heading] if n_heading < len(explicit) else None
                anchor = given or slug(title)
                n_heading += 1
                blocks.append(Block("heading", title, level=len(m.group(1)), anchor=anchor))
            _flush(run, blocks)
    return blocks


def _flush(run: list[str], blocks: list[Block]) -> None:
    """Close a paragraph: a table when every line is a ``|`` row, else prose."""
    if run:
        kind = "table" if all(line.startswith("|") for line in run) else "text"
        blocks.append(Block(kind, "\n".join(run)))
        run.clear()
