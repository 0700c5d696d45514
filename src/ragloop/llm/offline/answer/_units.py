"""What an extractive answer can quote from a block: sentences and list items, table rows with their header,
and fenced code blocks with their indentation — each with the heading it sits under."""

from __future__ import annotations

import re
from typing import Literal

from attrs import frozen

__all__ = ["Unit", "block_units", "is_block_unit", "split_sentences"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n|\n(?=\s*(?:[-*+]\s|\d+\.\s|#))")
#: Where a paragraph, a list item or a heading ends (inside one, sentences end at terminal punctuation).
_PART_END = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*+]\s|\d{1,3}[.)]\s|#))")
_STOP = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[*`]?[A-Z0-9])")
_HEADING_LINE = re.compile(r"(?m)^(#{1,6}\s[^\n]*)\n(?!\n)")
#: A fenced code block, or two or more table rows (``| a | b |``), each kept whole.
_ATOMIC = re.compile(r"(?ms)^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$|(?:^[ \t]*\|[^\n]*\|[ \t]*(?:\n|\Z)){2,}")
_HEADING = re.compile(r"^\s*#{1,6}\s+(.*?)\s*(?:\{\s*#[\w-]*\s*\})?\s*$")
_LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")
_SEPARATOR = re.compile(r"[\s|:-]+")
_QUOTE_MARK = re.compile(r"^(?:>\s*)+")

Kind = Literal["sentence", "item", "row", "code"]


@frozen
class Unit:
    """One quotable piece of a block.

    Attributes:
        block: The block's number.
        position: Its order in the block.
        kind: ``sentence``, ``item`` (a list item), ``row`` (a table row) or ``code`` (a fenced block).
        text: The text as it is quoted (a row's line, a code block's lines as written).
        heading: The heading it sits under in the block (``""`` before any heading).
        header: A row's table header line.
        table: A row's table, counted within the block (rows of one table are quoted under one header).
    """

    block: int
    position: int
    kind: Kind
    text: str
    heading: str = ""
    header: str = ""
    table: int = -1


def is_block_unit(sentence: str) -> bool:
    """True for a unit :func:`split_sentences` kept whole (a code block or a table)."""
    return "\n" in sentence


def split_sentences(text: str, *, headings: bool = True) -> list[str]:
    """Sentences (and list items, headings unless ``headings=False``) of ``text``, whitespace-collapsed,
    empty ones dropped. A fenced code block or a markdown table is one unit, kept line by line as written
    (flattened, a table or code loses its meaning)."""
    out = []
    start = 0
    for m in _ATOMIC.finditer(text):
        out += _prose_sentences(text[start : m.start()], headings)
        unit = "\n".join(line.rstrip() for line in m.group(0).strip("\n").splitlines())
        if unit.strip():
            out.append(unit)
        start = m.end()
    return out + _prose_sentences(text[start:], headings)


def _prose_sentences(text: str, headings: bool) -> list[str]:
    out = []
    text = _HEADING_LINE.sub(r"\1\n\n", text)  # a heading line is its own part even without a blank line
    for part in _SENTENCE_END.split(text):
        if not headings and part.lstrip().startswith("#"):
            continue
        sentence = " ".join(part.split()).lstrip("#*->+ ").strip()
        if sentence:
            out.append(sentence)
    return out


def block_units(block: int, text: str) -> list[Unit]:
    """Every quotable unit of a block's text, in reading order (headings are context, never units)."""
    units: list[Unit] = []
    heading = ""
    tables = 0
    start = 0

    def prose(piece: str) -> None:
        nonlocal heading
        piece = _HEADING_LINE.sub(r"\1\n\n", piece)
        for part in _PART_END.split(piece):
            if not part.strip():
                continue
            head = _HEADING.match(part)
            if head is not None and part.lstrip().startswith("#"):
                heading = " ".join(head.group(1).split())
                continue
            item = _LIST_MARK.match(part) is not None
            body = " ".join(_LIST_MARK.sub("", _QUOTE_MARK.sub("", part.strip())).split())
            for sentence in _STOP.split(body):
                if sentence.strip():
                    units.append(Unit(block, len(units), "item" if item else "sentence", sentence.strip(), heading))

    for m in _ATOMIC.finditer(text):
        prose(text[start : m.start()])
        start = m.end()
        lines = [line.rstrip() for line in m.group(0).strip("\n").splitlines()]
        if lines[0].lstrip().startswith("```"):
            units.append(Unit(block, len(units), "code", "\n".join(lines), heading))
            continue
        rows = [line.strip() for line in lines]
        header = ""
        if len(rows) >= 2 and _SEPARATOR.fullmatch(rows[1]):
            header, rows = rows[0], rows[2:]
        for row in rows:
            if not _SEPARATOR.fullmatch(row):
                units.append(Unit(block, len(units), "row", row, heading, header, tables))
        tables += 1
    prose(text[start:])
    return units
