"""A PDF's pages of text lines made into blocks that keep the document's shape (pure functions).

pypdf gives each page as lines. :func:`shape_pages` turns them into blocks:

- **Paragraphs from the layout**: a line starts a new paragraph after a line that ends a sentence well short of
  the page's usual line width, or after a short line with no end mark (a title) when it starts with a capital;
  a list item (``-``, ``•``, ``1.``, ``a)``) always starts its own; the other lines join the paragraph they
  continue.
- **Hyphenation joined**: ``man-`` at a line's end followed by ``agement`` becomes ``management``.
- **Running heads, footers and page numbers removed**: in a document of three pages or more, a line among the
  first or last three of a page that recurs (digits aside) on at least half the pages, or a page's first or
  last line that recurs as one on three pages, or on two when it ends in a page number (a chapter's running
  head); and a line there that is only a page number (``12``, ``Page 3 of 9``, ``xiv``).
- **Outline headings placed where they point**: a heading goes before the first line of its page that reads as
  its title (that line is the heading itself, not repeated as text), else at the page's start.
- **Table-of-contents pages skipped**: a page whose lines are mostly dot leaders (``Installation ..... 3``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ragloop.retrievers.ingest._blocks import Block, clean_inline

__all__ = ["is_page_number", "is_toc_page", "join_lines", "running_lines", "shape_pages"]

#: ``12``, ``Page 3``, ``3 of 9``, and front matter's roman numbers up to xxxix.
_PAGE_NUMBER = re.compile(
    r"^(?:page\s+)?(?:\d{1,4}|(?=[ivx])x{0,3}(?:ix|iv|v?i{0,3}))(?:\s*(?:of|/)\s*\d{1,4})?$", re.I
)
_LEADER = re.compile(r"(?:\.\s?){4,}\s*\d{1,4}$|\s{3,}\d{1,4}$")
_ITEM = re.compile(r"^(?:[-\u2022\u25e6\u25aa\u2023\u25cf\u25cb\u25a0\u2013*]|\d{1,3}[.)]|[a-z][.)])\s+\S")
_SENTENCE_END = re.compile(r"[.!?:;)\"'\u201d]$")
_HYPHENATED = re.compile(r"[^\W\d_]-$")
_EDGE = 3


def _key(line: str) -> str:
    return re.sub(r"\d+", "#", " ".join(line.split()).lower())


def is_page_number(line: str) -> bool:
    """Whether a line is only a page number (``12``, ``Page 3``, ``3 of 9``, ``xiv``)."""
    return bool(_PAGE_NUMBER.match(line.strip()))


def is_toc_page(lines: Sequence[str]) -> bool:
    """Whether a page is a table of contents: five lines or more, and most of them dot leaders ending in a page
    number."""
    leaders = sum(1 for line in lines if _LEADER.search(line.rstrip()))
    return len(lines) >= 5 and leaders * 2 > len(lines)


def running_lines(pages: Sequence[Sequence[str]]) -> set[str]:
    """The keys (digits as ``#``) of running heads and footers: lines among a page's first or last three that
    recur on half the pages or more (three at least), and first or last lines that recur as such on three
    pages or more."""
    if len(pages) < 3:
        return set()
    near: Counter[str] = Counter()  # among a page's first or last three lines
    outer: Counter[str] = Counter()  # its very first or last line: a chapter's running head
    for lines in pages:
        near.update({_key(line) for line in [*lines[:_EDGE], *lines[-_EDGE:]]})
        outer.update({_key(line) for line in [*lines[:1], *lines[-1:]]})
    common = {key for key, n in near.items() if n * 2 >= len(pages) and n >= 3}
    # a head ending in its page number ("Chapter 2: Syntax 14") on two pages is already a running head
    return common | {key for key, n in outer.items() if n >= 3 or (n >= 2 and key.endswith(" #"))}


def join_lines(lines: Sequence[str]) -> list[str]:
    """A page's lines joined into paragraphs (see the module docstring); list items keep their marker."""
    widths = sorted(len(line) for line in lines)
    usual = widths[int(len(widths) * 0.9)] if widths else 0
    paragraphs: list[str] = []
    ended = True
    titled = False  # the last line was short with no end mark: a title, if a capital follows
    for raw in lines:
        line = " ".join(raw.split())
        if not line:
            ended = True
            continue
        if ended or not paragraphs or _ITEM.match(line) or (titled and line[:1].isupper()):
            paragraphs.append(line)
        elif _HYPHENATED.search(paragraphs[-1]) and line[:1].islower():
            paragraphs[-1] = paragraphs[-1][:-1] + line
        else:
            paragraphs[-1] += " " + line
        ended = bool(_SENTENCE_END.search(line)) and len(line) < 0.8 * usual
        titled = len(line) < 0.6 * usual and not _SENTENCE_END.search(line) and not _HYPHENATED.search(line)
    return paragraphs


def shape_pages(pages: Sequence[str], headings: dict[int, list[Block]]) -> list[Block]:
    """Blocks of a PDF's pages (their extracted text, page 1 first) with the outline's headings by page.

    Returns:
        Heading and text blocks in reading order, each text block carrying its page number; a list item is
        ``- item`` (or its number).
    """
    split = [[line.rstrip() for line in text.replace("\r\n", "\n").split("\n")] for text in pages]
    running = running_lines([[line for line in lines if line.strip()] for lines in split])
    blocks: list[Block] = []
    for number, lines in enumerate(split, start=1):
        waiting = list(headings.get(number, ()))
        filled = [i for i, line in enumerate(lines) if line.strip()]
        if is_toc_page([lines[i] for i in filled]):
            blocks.extend(waiting)
            continue
        edges = set(filled[:_EDGE] + filled[-_EDGE:])
        kept = [
            line for i, line in enumerate(lines) if not (i in edges and (_key(line) in running or is_page_number(line)))
        ]
        at: dict[int, list[Block]] = {}
        for heading in waiting:
            found = _heading_line(kept, heading.text, set(at))
            at.setdefault(found if found is not None else -1, []).append(heading)
        blocks.extend(at.pop(-1, []))
        start = 0
        for index in sorted(at):
            blocks.extend(_texts(kept[start:index], number))
            blocks.extend(at[index])
            start = index + 1
        blocks.extend(_texts(kept[start:], number))
    return blocks


_NUMBERING = re.compile(r"^(?:(?:chapter|section|appendix)\s+)?(?:\d{1,3}|[A-Z])(?:\.\d{1,3})*\.?\s+")


def _bare(text: str) -> str:
    """A heading or line compared without case, spacing, digits' values or its section number."""
    text = " ".join(text.split())
    return _key(_NUMBERING.sub("", text, count=1) if _NUMBERING.match(text) else text)


def _heading_line(lines: list[str], title: str, taken: set[int]) -> int | None:
    """The first line that is the heading ``title`` (section numbers aside), or that starts with its section
    number and title and goes on (the rest is kept as the line: pypdf ran them together); None when no line is
    (a sentence that merely starts with the title's words is not the heading)."""
    target = _bare(title)
    if not target:
        return None
    for i, line in enumerate(lines):
        if not line or i in taken:
            continue
        bare = _bare(line)
        if bare == target:
            return i
        numbered = _NUMBERING.match(" ".join(line.split())) is not None
        if numbered and bare.startswith(target + " "):  # "2.1 Upgrades The agent…": a numbered title run on
            words = len(title.split())
            lines[i] = " ".join(line.split()[words + 1 :])
            lines.insert(i, title)  # keep one line per heading: the title, then what followed it
            return i
    return None


def _texts(lines: Sequence[str], page: int) -> list[Block]:
    out = []
    for para in join_lines(lines):
        text = clean_inline(para)
        if text:
            bullet = re.match(r"^[\u2022\u25e6\u25aa\u2023\u25cf\u25cb\u25a0\u2013*]\s+", text)
            out.append(Block("text", "- " + text[bullet.end() :] if bullet else text, page=page))
    return out
