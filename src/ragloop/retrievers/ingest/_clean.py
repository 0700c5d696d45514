"""Cleaning of documents before they are chunked and embedded.

Noisy chunks poison embeddings and the grader, so :func:`clean_text` removes what a reader of the rendered
page would not see or would not care about:

- HTML comments, CDATA sections, ``<script>``, ``<style>``, ``<svg>``, ``<noscript>``, ``<template>`` and
  ``<head>`` (with their contents; an unterminated comment, CDATA section, script, style, noscript or template
  hides the rest of the text, as in a browser), elements a reader never sees (the ``hidden`` attribute,
  ``aria-hidden="true"``, an inline style with ``display: none`` or ``visibility: hidden``), then every other
  HTML tag (their text is kept; headings become ``#`` lines and block elements become line breaks). Only
  real HTML element names count as tags, so placeholders such as ``<key>`` or ``<node-id>`` in command docs
  survive (in an ``html`` document every tag is markup).
- ``data:`` URIs and long base64 blobs.
- Template shortcodes: Hugo ``{{< name >}}…{{< /name >}}`` and ``{{% … %}}`` (inner text kept), Jinja
  ``{{ … }}``, ``{% … %}`` and ``{# … #}``, WordPress ``[name …]…[/name]`` (inner text kept), mkdocs
  ``{* file *}`` includes, ``{ #anchor }`` attribute lists and ``///`` / ``!!!`` admonition markers (a
  title given to the admonition is kept).
- Images whose alt text is short (fewer than three words, or a logo/icon/badge) and that have no caption.
  Informative alt text and captions are kept as plain text; markdown links keep their text only.
- Entities are decoded, control characters and lone surrogates removed, whitespace normalised (paragraph
  breaks and markdown heading lines are kept).

In markdown, fenced code blocks and inline code spans are literal: only blobs, data URIs and control
characters are removed there, and indentation is kept.

Cleaning takes time linear in the text: every pattern either stops at a character that starts the next
candidate or is bounded, and paired constructs (``<script>…</script>``, ``{% … %}``, code spans) are matched
in one left-to-right pass against an index of their closers, so no stretch of text is rescanned per opener.
``benchmarks/bench_clean.py`` times each pathological pattern from 64 KB to 1 MB. A caller may also give
:func:`clean_text` a time budget.

:func:`clean_text` is idempotent by construction: it applies one cleaning pass until the text stops changing
(each pass only removes or shortens, so this converges in two or three passes on real documents).
"""

from __future__ import annotations

import bisect
import html
import re
import unicodedata
from collections.abc import Callable, Iterator

from ragloop.retrievers.ingest._markup import (
    _B64_RUN,
    _DATA_URI,
    _INLINE_TAGS,
    _TAG,
    _clean_prose,
    _Deadline,
    _drop_blob,
)

__all__ = ["FORMATS", "clean_text", "clean_title", "element_text", "iter_segments", "split_front_matter"]

#: Document formats :func:`clean_text` understands.
FORMATS = ("markdown", "text", "html", "beir")

#: Passes after which cleaning stops even if the text still changes (never reached on real documents).
_MAX_PASSES = 12

# --- characters and whitespace -----------------------------------------------------------------------

_NEWLINES = re.compile(r"\r\n?|[\u2028\u2029\x0b\x0c\x85]")
# C0/C1 controls except tab and newline, lone surrogates, zero-width characters, the BOM, and the two
# private-use characters this module uses as code-span placeholders.
_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff\u200b-\u200d\u2060\ufeff\ue000\ue001]")
_PLACEHOLDER = re.compile("\ue000([0-9]+)\ue001")
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n{3,}")
_RULE = re.compile(r"^ {0,3}([-*_=])(?: *\1){2,} *$", re.M)

# --- markdown ------------------------------------------------------------------------------------------
_HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_TERMINAL_INFO = frozenset({"console", "shell", "bash", "sh", "zsh", "shell-session", "terminal", "text"})
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_BACKTICKS = re.compile(r"`++")
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*+\n")

# --- front matter --------------------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)(?:\r?\n)(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)
_YAML_LINE = re.compile(r"^(?:[ \t]+\S.*|-[ \t].*|-|#.*|[\w\"'][\w .\"'-]*:(?:[ \t].*)?|)$")
_YAML_TITLE = re.compile(r"^title:[ \t]*(.*?)[ \t]*$", re.M)


def split_front_matter(text: str) -> tuple[str, str]:
    """Split a YAML front-matter block off the top of a markdown document.

    The block must start on the first line with ``---``, end with ``---`` (or ``...``), and look like
    YAML (``key: value`` lines, list items, indented continuations); otherwise nothing is split, so a
    document that merely starts with a horizontal rule keeps its text.

    Args:
        text: The raw markdown.

    Returns:
        ``(title, body)``: the front matter's ``title:`` value (unquoted; ``""`` if none or no block) and
        the text without the block.
    """
    match = _FRONT_MATTER.match(text)
    if match is None:
        return "", text
    block = match.group(1)
    if not all(_YAML_LINE.match(line) for line in block.splitlines()):
        return "", text
    title_match = _YAML_TITLE.search(block)
    title = ""
    if title_match is not None:
        title = title_match.group(1)
        if len(title) >= 2 and title[0] == title[-1] and title[0] in "\"'":
            title = title[1:-1]
    return title.strip(), text[match.end() :]


def clean_text(text: str, fmt: str, *, budget_s: float | None = None) -> str:
    """Clean a document's text for chunking and embedding (see the module docstring for the rules).

    Args:
        text: Raw document text (front matter already split off, see :func:`split_front_matter`).
        fmt: ``"markdown"``, ``"text"``, ``"html"`` or ``"beir"`` (BEIR text is cleaned as markdown).
        budget_s: Seconds cleaning may take (checked between steps); ``None`` for no limit.

    Returns:
        The cleaned text: paragraphs separated by one blank line, no leading or trailing whitespace.
        ``clean_text(clean_text(x, f), f) == clean_text(x, f)`` for every ``x``.

    Raises:
        ValueError: ``fmt`` is not one of the formats above.
        InputError: cleaning took longer than ``budget_s``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown document format {fmt!r}; pass one of: {', '.join(FORMATS)}")
    markdown = fmt in ("markdown", "beir")
    deadline = _Deadline(budget_s)
    for _ in range(_MAX_PASSES):
        cleaned = _clean_once(text, markdown=markdown, html_doc=fmt == "html", deadline=deadline)
        if cleaned == text:
            break
        text = cleaned
    return text


def element_text(text: str, name: str) -> str:
    """The raw inner text of the first ``<name>…</name>`` element in HTML ``text``, or ``""`` (linear time)."""
    opener = re.compile(rf"<{re.escape(name)}\b[^<>]*+>", re.I)
    found = opener.search(text)
    if found is None:
        return ""
    closer = re.compile(rf"</{re.escape(name)}\s*+>", re.I).search(text, found.end())
    return text[found.end() : closer.start()] if closer is not None else ""


def clean_title(title: str) -> str:
    """Clean a title to one line of plain text (markup, shortcodes and ``{ #anchor }`` lists removed)."""
    return " ".join(clean_text(title, "text").split())


def iter_segments(text: str) -> Iterator[tuple[bool, str]]:
    """Split markdown into prose and fenced-code segments, in order.

    Args:
        text: Markdown with ``\\n`` line ends.

    Yields:
        ``(is_code, segment)`` pairs whose segments concatenate back to ``text``. A code segment runs from
        its opening fence line through its closing fence line (or to the end of the text if unclosed).
    """
    lines = text.split("\n")
    start = 0  # index of the first line of the current segment
    i = 0
    while i < len(lines):
        opening = _FENCE_OPEN.match(lines[i])
        if opening is None or (opening.group(1)[0] == "`" and "`" in lines[i][opening.end() :]):
            i += 1
            continue
        fence = opening.group(1)
        closing = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        end = i + 1
        while end < len(lines) and closing.match(lines[end]) is None:
            end += 1
        if i > start:
            yield False, "\n".join(lines[start:i]) + "\n"
        last = min(end, len(lines) - 1)
        yield True, "\n".join(lines[i : last + 1]) + ("\n" if last < len(lines) - 1 else "")
        start = i = last + 1
    if start < len(lines):
        yield False, "\n".join(lines[start:])


# --- one pass ------------------------------------------------------------------------------------------


def _clean_once(text: str, *, markdown: bool, html_doc: bool, deadline: _Deadline) -> str:
    text = _NEWLINES.sub("\n", text)
    text = unicodedata.normalize("NFC", _INVISIBLE.sub("", text)).replace("\u00a0", " ")
    deadline.check()
    if not markdown:
        prose = _clean_prose(text, markdown=False, html_doc=html_doc, deadline=deadline)
        return _BLANK_LINES.sub("\n\n", _normalise_prose(prose)).strip()
    parts: list[str] = []
    for is_code, segment in iter_segments(text):
        if is_code:
            parts.append(_clean_code(segment))
        else:
            parts.append(_with_code_spans(segment, lambda prose: _clean_prose(prose, markdown=True, deadline=deadline)))
    text = "".join(parts)
    # Normalise whitespace outside code blocks, keeping their indentation and blank lines.
    out: list[str] = []
    for is_code, segment in iter_segments(text):
        if is_code:
            out.append("\n\n" + segment.strip("\n") + "\n\n")
        else:
            out.append(_normalise_prose(segment))
    return _BLANK_LINES.sub("\n\n", "".join(out)).strip()


def _clean_code(segment: str) -> str:
    segment = _DATA_URI.sub("", segment)
    segment = _B64_RUN.sub(_drop_blob, segment)
    opening = _FENCE_OPEN.match(segment)
    info = segment[opening.end() :].split("\n", 1)[0].strip().lower() if opening else ""
    if info in _TERMINAL_INFO:
        # Terminal transcripts are often coloured with inline HTML (<span>, <font>, <b>); that is not code.
        segment = html.unescape(_TAG.sub(lambda m: "" if m.group(1).lower() in _INLINE_TAGS else m.group(0), segment))
    return "\n".join(line.rstrip() for line in segment.split("\n"))


def _with_code_spans(prose: str, clean: Callable[[str], str]) -> str:
    """Clean ``prose`` but leave inline code spans literal (only blobs removed inside them).

    Spans are swapped for private-use placeholders while the prose around them is cleaned, so constructs
    that contain code (a link whose text is code, say) are still recognised.
    """
    spans: list[str] = []
    pieces: list[str] = []
    pos = 0
    for start, end, ticks in _code_spans(prose):
        inner = _B64_RUN.sub(_drop_blob, _DATA_URI.sub("", prose[start + ticks : end - ticks]))
        spans.append(prose[start : start + ticks] + inner + prose[start : start + ticks] if inner.strip() else "")
        pieces.append(prose[pos:start])
        pieces.append(f"\ue000{len(spans) - 1}\ue001")
        pos = end
    pieces.append(prose[pos:])
    cleaned = clean("".join(pieces))
    return _PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], cleaned)


def _code_spans(prose: str) -> list[tuple[int, int, int]]:
    """``(start, end, backticks)`` of each inline code span: a run of backticks up to the next run of the same
    length, with no blank line between. One pass over the runs (each run's next same-length run is found from
    the right), so a text full of unmatched backticks costs no more than one with none."""
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(prose)]
    if len(runs) < 2:
        return []
    breaks = [m.start() for m in _PARAGRAPH_BREAK.finditer(prose)]
    following = [-1] * len(runs)
    last: dict[int, int] = {}
    for i in range(len(runs) - 1, -1, -1):
        width = runs[i][1] - runs[i][0]
        following[i] = last.get(width, -1)
        last[width] = i
    spans: list[tuple[int, int, int]] = []
    i = 0
    while i < len(runs):
        j = following[i]
        if j != -1:
            b = bisect.bisect_left(breaks, runs[i][1])
            if b == len(breaks) or breaks[b] >= runs[j][0]:
                spans.append((runs[i][0], runs[j][1], runs[i][1] - runs[i][0]))
                i = j + 1
                continue
        i += 1
    return spans


def _normalise_prose(text: str) -> str:
    lines = []
    for raw in text.split("\n"):
        line = _SPACES.sub(" ", raw).strip()
        heading = _HEADING_LINE.match(line)
        if heading is not None:
            title = heading.group(2).strip()
            line = f"{heading.group(1)} {title}" if title else ""
        lines.append(line)
    text = _RULE.sub("", "\n".join(lines))
    return "\n\n" + _BLANK_LINES.sub("\n\n", text).strip("\n") + "\n\n"
