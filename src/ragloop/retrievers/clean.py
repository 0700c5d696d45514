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
import functools
import html
import re
import time
import unicodedata
from collections.abc import Callable, Iterator

from ragloop.errors import InputError

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

# --- blobs ---------------------------------------------------------------------------------------------

_DATA_URI = re.compile(r"data:(?:[a-z]+/[a-z0-9.+-]+)?(?:;[a-z0-9.+-]+(?:=[a-z0-9.+-]+)?)*,[^\s\"'<>()\[\]]*", re.I)
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{60,}={0,2}(?![A-Za-z0-9+/=])")

# --- templates and shortcodes --------------------------------------------------------------------------

# Paired constructs: (opener, closer, longest inner text); matched by _sub_paired in linear time. A Hugo
# shortcode ends at the first "<}}", ">}}" or "%}}" after its opener, and only the last two close it.
_HUGO = (re.compile(r"\{\{[<%]"), re.compile(r"[<>%]\}\}"), 500)
_JINJA_RAW = re.compile(r"\{%-?[ \t]*+(?:end)?raw[ \t]*+-?%\}")
_JINJA_COMMENT = (re.compile(r"\{#"), re.compile(r"#\}"), 2000)
_JINJA_TAG = (re.compile(r"\{%"), re.compile(r"%\}"), 500)
_JINJA_EXPR = (re.compile(r"\{\{"), re.compile(r"\}\}"), 500)
_MKDOCS_INCLUDE = (re.compile(r"\{\*"), re.compile(r"\*\}"), 500)
_ATTR_LIST = re.compile(r"\{:?[ \t]*[#.][^{}\n]{0,200}\}")
_WP_CAPTION = (re.compile(r"\[caption\b[^\[\]\n]{0,500}\]", re.I), re.compile(r"\[/caption\]", re.I), None)
_WP_OPEN = re.compile(r"\[([a-z][a-z0-9_-]{0,40})(?:\s[^\[\]\n]{0,500})?\]", re.I)
_WP_CLOSE = re.compile(r"\[/([a-z][a-z0-9_-]{0,40})\]", re.I)
_WP_SELF_CLOSING = re.compile(r"\[[a-z][a-z0-9_-]{0,40}(?:\s[^\[\]\n]{0,500})?/\]", re.I)
_WP_WITH_ATTRS = re.compile(r"\[[a-z][a-z0-9_-]{0,40}(?:\s+[a-z_-]+=(?:\"[^\"\n]*\"|'[^'\n]*'))+\s*\]", re.I)
_ADMONITION = re.compile(
    r"^[ \t]*(?:/{3,}[ \t]*([a-z][\w-]*)?|(?:!!!|\?\?\?\+?)[ \t]*([a-z][\w-]*))[ \t]*(.*)$", re.M | re.I
)

# --- HTML ----------------------------------------------------------------------------------------------

_HTML_COMMENT = (re.compile(r"<!--"), re.compile(r"-->"), None)
_CDATA = (re.compile(r"<!\[CDATA\["), re.compile(r"\]\]>"), None)
_DROP_OPEN = re.compile(r"<(script|style|svg|noscript|template|head)\b[^<>]*+>", re.I)
_DROP_CLOSE = re.compile(r"</(script|style|svg|noscript|template|head)\s*+>", re.I)
_SELF_CLOSED_DROP = re.compile(r"<(?:script|style|svg|noscript|template|head)\b[^<>]*/>", re.I)
#: Elements whose unterminated opening tag hides the rest of the page in a browser.
_HIDES_REST = frozenset({"script", "style", "noscript", "template"})
_DECLARATION = re.compile(r"<![a-z][^<>]*>|<\?[^<>]*>", re.I)
_FIGURE = (re.compile(r"<figure\b[^<>]*+>", re.I), re.compile(r"</figure\s*+>", re.I), None)
_FIGCAPTION = (re.compile(r"<figcaption\b[^<>]*+>", re.I), re.compile(r"</figcaption\s*+>", re.I), None)
_IMG = re.compile(r"<img\b[^<>]*+>", re.I)
_ATTR_VALUE = r"\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'>]+))"
_ALT = re.compile(r"\balt" + _ATTR_VALUE, re.I)
_TITLE_ATTR = re.compile(r"\btitle" + _ATTR_VALUE, re.I)
_HEADING_OPEN = re.compile(r"<h([1-6])\b[^<>]*+>", re.I)
_HEADING_CLOSE = re.compile(r"</h([1-6])\s*+>", re.I)
_TAG = re.compile(r"</?([a-z][a-z0-9]*+(?:-[a-z0-9-]++)?)(?:\s[^<>]*+)?/?>", re.I)
# An opening tag whose attributes may hide it (checked precisely by _hides).
_MAYBE_HIDDEN = re.compile(r"<([a-z][a-z0-9]*+(?:-[a-z0-9-]++)?)(\s[^<>]*?(?:hidden|none)[^<>]*+)>", re.I)
_ATTRIBUTE = re.compile(r"([^\s\"'<>/=]++)(?:\s*+=\s*+(?:\"([^\"]*+)\"|'([^']*+)'|([^\s\"'=<>`]++)))?")
_HIDDEN_STYLE = re.compile(r"(?:^|;)\s*+(?:display\s*+:\s*+none|visibility\s*+:\s*+hidden)\b", re.I)
_VOID_TAGS = frozenset(
    ("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr")
)

_BLOCK_TAGS_WORDS = (
    "address article aside blockquote body br caption dd details dialog div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hr html li main nav ol p pre section summary table "
    "tbody td tfoot th thead tr ul"
)
_INLINE_TAGS_WORDS = (
    "a abbr acronym area audio b base bdi bdo big button canvas center cite code col colgroup data "
    "datalist del dfn em embed font i iframe img input ins kbd label legend link map mark menu meta "
    "meter noscript object optgroup option output param picture progress q rp rt ruby s samp script "
    "select slot small source span strike strong style sub sup textarea time title track tt u var video "
    "wbr"
)
_BLOCK_TAGS = frozenset(_BLOCK_TAGS_WORDS.split())
_INLINE_TAGS = frozenset(_INLINE_TAGS_WORDS.split())

# --- markdown ------------------------------------------------------------------------------------------

_LINK_TEXT = r"\[((?:[^\[\]]|\[[^\[\]]{0,200}+\]){0,300}+)\]"  # one level of nested brackets: [@bot[bot]](url)
# A link target stops at whitespace, brackets and parentheses (one balanced pair allowed, as in wiki URLs), so a
# run of "[a](" never makes the pattern scan ahead past the next candidate.
_LINK_URL = r"\(\s*+(?:<[^<>\n]*+>|(?:[^()\s<>]|\([^()\s<>]*+\))*+)"
_MD_IMAGE = re.compile(r"!" + _LINK_TEXT + _LINK_URL + r"(?:\s++(?:\"([^\"\n]*+)\"|'([^'\n]*+)'))?\s*+\)")
_MD_REF_IMAGE = re.compile(r"!\[([^\[\]\n]*+)\]\[[^\[\]\n]*+\]")
_MD_LINK = re.compile(r"(?<!!)" + _LINK_TEXT + _LINK_URL + r"(?:\s++(?:\"[^\"\n]*+\"|'[^'\n]*+'))?\s*+\)")
_HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_TERMINAL_INFO = frozenset({"console", "shell", "bash", "sh", "zsh", "shell-session", "terminal", "text"})
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_BACKTICKS = re.compile(r"`++")
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*+\n")

_UNINFORMATIVE_ALT = re.compile(r"\b(?:logo|icon|badge|avatar|banner|spacer|button|emoji)s?\b", re.I)

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
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
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


class _Deadline:
    """The time a cleaning run must finish by; :meth:`check` raises once it has passed."""

    __slots__ = ("budget_s", "end")

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self.end = None if budget_s is None else time.monotonic() + budget_s

    def check(self) -> None:
        if self.end is not None and time.monotonic() > self.end:
            raise InputError(
                f"cleaning too slow (over {self.budget_s:g} s, pathological markup); simplify or split the document"
            )


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


_Pair = tuple[re.Pattern[str], re.Pattern[str], "int | None"]


def _sub_paired(
    text: str,
    pair: _Pair,
    repl: Callable[[re.Match[str], str], str],
    *,
    unclosed: Callable[[re.Match[str]], str | None] | None = None,
    closes: Callable[[re.Match[str]], bool] | None = None,
) -> str:
    """Replace each ``opener … closer`` with ``repl(opener_match, inner)``, in one left-to-right pass.

    ``pair`` is ``(opener, closer, longest inner text or None)``. When both patterns have a group, it names
    the construct (a tag name, a shortcode name) and an opener only pairs with a closer of the same name,
    compared case-insensitively. An opener pairs with the first closer after it: if ``closes`` rejects that
    closer or the inner text is too long, the opener stays literal; if there is no closer at all,
    ``unclosed(opener_match)`` may return what replaces the opener *and the rest of the text* (``None`` keeps
    the opener literal). Every closer is found once, up front, so the time is linear in the text.
    """
    opener, closer, longest = pair
    keyed = closer.groups > 0
    starts: dict[str, list[int]] = {}
    found: dict[str, list[re.Match[str]]] = {}
    for c in closer.finditer(text):
        key = c.group(1).lower() if keyed else ""
        starts.setdefault(key, []).append(c.start())
        found.setdefault(key, []).append(c)
    out: list[str] = []
    pos = at = 0
    while (m := opener.search(text, at)) is not None:
        key = m.group(1).lower() if keyed else ""
        candidates = starts.get(key, [])
        i = bisect.bisect_left(candidates, m.end())
        if i == len(candidates):
            replacement = unclosed(m) if unclosed is not None else None
            if replacement is not None:
                out.append(text[pos : m.start()])
                out.append(replacement)
                pos = len(text)
                break
            at = m.start() + 1
            continue
        c = found[key][i]
        if (closes is not None and not closes(c)) or (longest is not None and c.start() - m.end() > longest):
            at = m.start() + 1
            continue
        out.append(text[pos : m.start()])
        out.append(repl(m, text[m.end() : c.start()]))
        pos = at = c.end()
    out.append(text[pos:])
    return "".join(out)


def _inners(text: str, pair: _Pair) -> list[str]:
    """The inner texts of every ``opener … closer`` pair in ``text``."""
    inners: list[str] = []

    def keep(_m: re.Match[str], inner: str) -> str:
        inners.append(inner)
        return ""

    _sub_paired(text, pair, keep)
    return inners


def _drop(_m: re.Match[str], _inner: str) -> str:
    return ""


def _hide_rest(_m: re.Match[str]) -> str:
    return ""


def _drop_hidden(text: str) -> str:
    """Remove elements a reader never sees (``hidden``, ``aria-hidden="true"``, ``display: none``,
    ``visibility: hidden``) with everything inside them; an unclosed one hides the rest of the text."""
    out: list[str] = []
    pos = at = 0
    while (m := _MAYBE_HIDDEN.search(text, at)) is not None:
        if not _hides(m.group(2)):
            at = m.start() + 1
            continue
        name = m.group(1).lower()
        out.append(text[pos : m.start()])
        if name in _VOID_TAGS or m.group(2).rstrip().endswith("/"):
            pos = at = m.end()
            continue
        end = _element_end(text, name, m.end())
        if end is None:
            pos = len(text)
            break
        pos = at = end
    out.append(text[pos:])
    return "".join(out)


def _hides(attributes: str) -> bool:
    for attribute in _ATTRIBUTE.finditer(attributes):
        name = attribute.group(1).lower()
        value = next((g for g in attribute.groups()[1:] if g is not None), "")
        if name == "hidden":
            return True
        if name == "aria-hidden" and value.strip().lower() == "true":
            return True
        if name == "style" and _HIDDEN_STYLE.search(html.unescape(value)):
            return True
    return False


def _element_end(text: str, name: str, start: int) -> int | None:
    """Where the element opened just before ``start`` ends (after its matching closing tag), or None."""
    depth = 1
    for tag in _same_tag(name).finditer(text, start):
        if tag.group(0).startswith("</"):
            depth -= 1
            if depth == 0:
                return tag.end()
        elif not tag.group(0).endswith("/>"):
            depth += 1
    return None


@functools.lru_cache(maxsize=256)
def _same_tag(name: str) -> re.Pattern[str]:
    return re.compile(rf"</?{re.escape(name)}(?![a-z0-9-])[^<>]*+>", re.I)


def _clean_prose(text: str, *, markdown: bool, html_doc: bool = False, deadline: _Deadline | None = None) -> str:
    check = deadline.check if deadline is not None else _no_deadline
    # Markdown and HTML are rendered, so what a browser would hide is dropped, unterminated constructs included;
    # a plain-text file is read as is, so only complete constructs are removed from it.
    rendered = markdown or html_doc
    text = _sub_paired(text, _HTML_COMMENT, _drop, unclosed=_hide_rest if rendered else None)
    text = _sub_paired(text, _CDATA, _drop, unclosed=_hide_rest if rendered else None)
    text = _SELF_CLOSED_DROP.sub("", text)
    text = _sub_paired(
        text,
        (_DROP_OPEN, _DROP_CLOSE, None),
        _drop,
        unclosed=lambda m: "" if rendered and m.group(1).lower() in _HIDES_REST else None,
    )
    check()
    if rendered:
        text = _drop_hidden(text)
    text = _DECLARATION.sub("", text)
    text = _DATA_URI.sub("", text)
    text = _B64_RUN.sub(_drop_blob, text)
    check()
    text = _resolve_shortcodes(text)
    check()
    text = _sub_paired(text, _FIGURE, lambda _m, inner: _figure(inner))
    text = _IMG.sub(lambda m: _image_text(_attr(_ALT, m.group(0)), _attr(_TITLE_ATTR, m.group(0))), text)
    if markdown:
        text = _MD_IMAGE.sub(lambda m: _image_text(m.group(1), m.group(2) or m.group(3) or ""), text)
        text = _MD_REF_IMAGE.sub(lambda m: _image_text(m.group(1), ""), text)
        text = _MD_LINK.sub(lambda m: m.group(1), text)
    check()
    text = _sub_paired(
        text,
        (_HEADING_OPEN, _HEADING_CLOSE, None),
        lambda m, inner: "\n\n" + "#" * int(m.group(1)) + " " + _one_line(inner) + "\n\n",
    )
    text = _TAG.sub(_tag if markdown or not html_doc else _any_tag, text)
    return html.unescape(text)


def _no_deadline() -> None:
    return None


def _resolve_shortcodes(text: str) -> str:
    text = _sub_paired(text, _HUGO, _drop, closes=lambda c: not c.group(0).startswith("<"))
    text = _JINJA_RAW.sub("", text)
    text = _sub_paired(text, _JINJA_COMMENT, _drop)
    text = _sub_paired(text, _JINJA_TAG, _drop)
    text = _sub_paired(text, _JINJA_EXPR, _drop)
    text = _sub_paired(text, _MKDOCS_INCLUDE, _drop)
    text = _ATTR_LIST.sub("", text)
    text = _sub_paired(text, _WP_CAPTION, lambda _m, inner: _wp_caption(inner))
    text = _sub_paired(text, (_WP_OPEN, _WP_CLOSE, 5000), lambda _m, inner: inner)
    text = _WP_SELF_CLOSING.sub("", text)
    text = _WP_WITH_ATTRS.sub("", text)
    return _ADMONITION.sub(_admonition, text)


def _admonition(match: re.Match[str]) -> str:
    kind, rest = (match.group(1) or match.group(2) or "").lower(), match.group(3).strip()
    if not rest:
        return ""  # a bare marker line: "/// tip", "///", "!!! note"
    if rest.startswith("|"):
        return "" if kind == "tab" else rest[1:].strip()  # "/// note | Technical Details" keeps its title
    if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "\"'":
        return rest[1:-1].strip()  # '!!! note "Title"'
    return match.group(0)  # not an admonition after all


def _wp_caption(inner: str) -> str:
    images = "".join(m.group(0) for m in _IMG.finditer(inner))
    caption = _IMG.sub("", inner)
    return f"<figure>{images}<figcaption>{caption}</figcaption></figure>"


def _figure(inner: str) -> str:
    captions = [_one_line(_TAG.sub(" ", c)) for c in _inners(inner, _FIGCAPTION)]
    caption = " ".join(c for c in captions if c)
    if not caption:
        return inner  # no caption: the images inside are judged on their alt text alone
    alts = [_attr(_ALT, m.group(0)) for m in _IMG.finditer(inner)]
    lines = [a for a in (_one_line(a) for a in alts) if a]
    return "\n\n" + "\n".join([*lines, caption]) + "\n\n"


def _image_text(alt: str, caption: str) -> str:
    alt, caption = _one_line(alt), _one_line(caption)
    if caption:
        return " ".join(part for part in (alt, caption) if part)
    if len(alt.split()) >= 3 and _UNINFORMATIVE_ALT.search(alt) is None:
        return alt
    return ""


def _attr(pattern: re.Pattern[str], tag: str) -> str:
    match = pattern.search(tag)
    if match is None:
        return ""
    return html.unescape(next((g for g in match.groups() if g is not None), ""))


def _tag(match: re.Match[str]) -> str:
    name = match.group(1).lower()
    if name in _BLOCK_TAGS:
        return "\n"
    if name in _INLINE_TAGS:
        return ""
    return match.group(0)  # not HTML: a placeholder such as <key> or <node-id> in command docs


def _any_tag(match: re.Match[str]) -> str:
    # In an HTML document every tag is markup, custom elements (<my-widget>) included.
    return "\n" if match.group(1).lower() in _BLOCK_TAGS else ""


def _drop_blob(match: re.Match[str]) -> str:
    run = match.group(0)
    # Long runs of one case only (paths, hex digests, words) are not blobs; base64 mixes all three classes.
    mixed = any(c.islower() for c in run) and any(c.isupper() for c in run) and any(c.isdigit() for c in run)
    return "" if mixed else run


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
