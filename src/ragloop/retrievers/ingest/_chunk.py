"""Splitting cleaned text into bounded, heading-aware pieces.

Pure functions over strings; :func:`ragloop.retrievers.ingest.chunk_document` turns their output into
:class:`~ragloop.state.Chunk` values. Every piece is a slice of the cleaned text (stripped of surrounding
whitespace), so no text is lost or rewritten: long sections are split at the best boundary available
(paragraph, line, sentence, word) and consecutive pieces of one section overlap by up to ``overlap``
characters, starting at a word boundary.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from ragloop.errors import ConfigError
from ragloop.retrievers.ingest._clean import iter_segments

__all__ = ["Section", "check_limits", "chunk_id", "split_long", "split_sections"]

#: A section of a markdown document: ``(title_path, start, end)`` offsets into the text.
Section = tuple[tuple[str, ...], int, int]

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*$")
_BREAKS = (
    re.compile(r"\n[ \t]*\n"),  # paragraph
    re.compile(r"\n"),  # line
    re.compile(r"[.!?:;][\"')\]]*[ \t]+"),  # sentence or clause
    re.compile(r"[ \t]+"),  # word
)


def chunk_id(text: str) -> str:
    """Return the stable content-hash id of a chunk's text.

    The text is normalised first (NFC, whitespace runs collapsed), so the same passage found in two
    documents, or re-indexed later, gets the same id and is stored once.
    """
    normalised = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def check_limits(max_chars: int, overlap: int) -> None:
    """Raise :class:`~ragloop.errors.ConfigError` unless ``0 <= overlap < max_chars``."""
    if max_chars < 1:
        raise ConfigError(f"max_chars must be at least 1 (got {max_chars}); 1200 is a good default")
    if not 0 <= overlap < max_chars:
        raise ConfigError(
            f"overlap must be at least 0 and smaller than max_chars={max_chars} (got {overlap}); "
            "about an eighth of max_chars works well"
        )


def split_sections(text: str) -> list[Section]:
    """Split cleaned markdown at its heading lines (``#`` lines outside fenced code).

    A section runs from its heading line to the next heading line; the text before the first heading is a
    section with an empty title path. A heading with no text under it is merged into the section that
    follows (or, at the end of the document, the one before), so no section is a lone heading unless the
    document is only headings.

    Args:
        text: Cleaned markdown (see :func:`ragloop.retrievers.clean.clean_text`).

    Returns:
        Sections in document order; their spans are contiguous and together cover ``text``.
    """
    headings: list[tuple[int, int, str]] = []  # (offset, level, title)
    offset = 0
    for is_code, segment in iter_segments(text):
        if not is_code:
            line_start = offset
            for line in segment.split("\n"):
                match = _HEADING.match(line)
                if match is not None:
                    headings.append((line_start, len(match.group(1)), match.group(2)))
                line_start += len(line) + 1
        offset += len(segment)

    stack: list[tuple[int, str]] = []
    sections: list[Section] = []
    if not headings or headings[0][0] > 0:
        first_end = headings[0][0] if headings else len(text)
        if text[:first_end].strip():
            sections.append(((), 0, first_end))
    for index, (start, level, title) in enumerate(headings):
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
        end = headings[index + 1][0] if index + 1 < len(headings) else len(text)
        sections.append((tuple(t for _, t in stack), start, end))
    if sections and sections[0][1] > 0:  # leading whitespace before the first heading
        path, _, end = sections[0]
        sections[0] = (path, 0, end)
    return _merge_bare_headings(text, sections)


def _merge_bare_headings(text: str, sections: list[Section]) -> list[Section]:
    merged: list[Section] = []
    pending_start: int | None = None
    for path, start, end in sections:
        body = text[start:end].split("\n", 1)
        bare = path != () and (len(body) == 1 or not body[1].strip())
        if bare:
            pending_start = start if pending_start is None else pending_start
            continue
        merged.append((path, start if pending_start is None else pending_start, end))
        pending_start = None
    if pending_start is not None:
        if merged:
            path, start, _ = merged[-1]
            merged[-1] = (path, start, len(text))
        else:
            merged.append((sections[-1][0], pending_start, len(text)))
    return merged


def split_long(text: str, start: int, end: int, max_chars: int, overlap: int) -> list[tuple[int, int]]:
    """Split ``text[start:end]`` into spans of at most ``max_chars`` characters.

    Each span ends at the best boundary inside its window (paragraph, then line, then sentence, then word,
    preferring boundaries in the window's second half); the next span starts at the first word that begins
    within ``overlap`` characters before that end. A word longer than ``max_chars`` is cut hard, without
    overlap.

    Args:
        text: The whole cleaned text.
        start: Span start offset.
        end: Span end offset.
        max_chars: Largest span length.
        overlap: Characters of context repeated from the end of one span at the start of the next.

    Returns:
        ``(start, end)`` offsets, in order, each with non-whitespace content.
    """
    spans: list[tuple[int, int]] = []
    pos = _skip_space(text, start, end)
    while pos < end:
        if end - pos <= max_chars:
            spans.append((pos, end))
            break
        cut, hard = _best_cut(text, pos, pos + max_chars)
        spans.append((pos, cut))
        if hard:
            pos = cut
        else:
            nxt = _next_word_start(text, max(cut - overlap, pos + 1), cut)
            pos = _skip_space(text, nxt, end)
    return [(a, b) for a, b in spans if text[a:b].strip()]


def _best_cut(text: str, pos: int, limit: int) -> tuple[int, bool]:
    """Return ``(cut, hard)``: where to end a span that starts at ``pos`` and may not pass ``limit``."""
    window = text[pos:limit]
    # A boundary only counts if it lies before the start of the text that follows it; include the next
    # character so a break exactly at ``limit`` is seen.
    probe = text[pos : limit + 1]
    half = len(window) // 2
    fallback = -1
    for pattern in _BREAKS:
        best = -1
        for match in pattern.finditer(probe):
            cut = match.start() + len(match.group(0).rstrip())  # keep "end." and its closing quote
            if 0 < cut <= len(window):
                best = cut
        if best >= half:
            return pos + best, False
        fallback = max(fallback, best)
    if fallback > 0:
        return pos + fallback, False
    return limit, True  # one word longer than max_chars


def _next_word_start(text: str, lo: int, hi: int) -> int:
    """First offset in ``[lo, hi]`` where a word starts (``hi`` if none)."""
    for i in range(lo, hi):
        if not text[i].isspace() and (i == 0 or text[i - 1].isspace()):
            return i
    return hi


def _skip_space(text: str, pos: int, end: int) -> int:
    while pos < end and text[pos].isspace():
        pos += 1
    return pos
