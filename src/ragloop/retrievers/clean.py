"""Cleaning of documents before they are chunked and embedded.

Noisy chunks poison embeddings and the grader, so :func:`clean_text` removes what a reader of the rendered
page would not see or would not care about:

- HTML comments, ``<script>``, ``<style>``, ``<svg>``, ``<noscript>``, ``<template>`` and ``<head>``
  (with their contents), then every other HTML tag (their text is kept; headings become ``#`` lines and
  block elements become line breaks). Only real HTML element names count as tags, so placeholders such as
  ``<key>`` or ``<node-id>`` in command docs survive (in an ``html`` document every tag is markup).
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

:func:`clean_text` is idempotent by construction: it applies one cleaning pass until the text stops changing
(each pass only removes or shortens, so this converges in two or three passes on real documents).
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable, Iterator

__all__ = ["FORMATS", "clean_text", "clean_title", "iter_segments", "split_front_matter"]

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

_FLAGS = re.S
_HUGO = re.compile(r"\{\{[<%](?:(?![<%]\}\}).){0,500}?[>%]\}\}", _FLAGS)
_JINJA_RAW = re.compile(r"\{%-?\s*(?:end)?raw\s*-?%\}")
_JINJA_COMMENT = re.compile(r"\{#(?:(?!#\}).){0,2000}?#\}", _FLAGS)
_JINJA_TAG = re.compile(r"\{%(?:(?!%\}).){0,500}?%\}", _FLAGS)
_JINJA_EXPR = re.compile(r"\{\{(?:(?!\}\}).){0,500}?\}\}", _FLAGS)
_MKDOCS_INCLUDE = re.compile(r"\{\*(?:(?!\*\}).){0,500}?\*\}", _FLAGS)
_ATTR_LIST = re.compile(r"\{:?[ \t]*[#.][^{}\n]{0,200}\}")
_WP_CAPTION = re.compile(r"\[caption\b[^\]\n]{0,500}\](.*?)\[/caption\]", re.S | re.I)
_WP_PAIRED = re.compile(r"\[([a-z][a-z0-9_-]{0,40})(?:\s[^\]\n]{0,500})?\](.{0,5000}?)\[/\1\]", re.S | re.I)
_WP_SELF_CLOSING = re.compile(r"\[[a-z][a-z0-9_-]{0,40}(?:\s[^\]\n]{0,500})?/\]", re.I)
_WP_WITH_ATTRS = re.compile(r"\[[a-z][a-z0-9_-]{0,40}(?:\s+[a-z_-]+=(?:\"[^\"\n]*\"|'[^'\n]*'))+\s*\]", re.I)
_ADMONITION = re.compile(
    r"^[ \t]*(?:/{3,}[ \t]*([a-z][\w-]*)?|(?:!!!|\?\?\?\+?)[ \t]*([a-z][\w-]*))[ \t]*(.*)$", re.M | re.I
)

# --- HTML ----------------------------------------------------------------------------------------------

_HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
_DROP_WITH_CONTENT = re.compile(r"<(script|style|svg|noscript|template|head)\b[^>]*>.*?</\1\s*>", re.S | re.I)
_DECLARATION = re.compile(r"<![a-z][^>]*>|<\?[^>]*\?>|<!\[CDATA\[|\]\]>", re.I)
_FIGURE = re.compile(r"<figure\b[^>]*>(.*?)</figure\s*>", re.S | re.I)
_FIGCAPTION = re.compile(r"<figcaption\b[^>]*>(.*?)</figcaption\s*>", re.S | re.I)
_IMG = re.compile(r"<img\b[^>]*>", re.I)
_ATTR_VALUE = r"\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'>]+))"
_ALT = re.compile(r"\balt" + _ATTR_VALUE, re.I)
_TITLE_ATTR = re.compile(r"\btitle" + _ATTR_VALUE, re.I)
_HTML_HEADING = re.compile(r"<h([1-6])\b[^>]*>(.*?)</h\1\s*>", re.S | re.I)
_TAG = re.compile(r"</?([a-z][a-z0-9]*(?:-[a-z0-9-]+)?)(?:\s[^<>]*)?/?>", re.I)

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

_LINK_TEXT = r"\[((?:[^\[\]]|\[[^\[\]]{0,200}\]){0,300})\]"  # one level of nested brackets: [@bot[bot]](url)
_MD_IMAGE = re.compile(r"!" + _LINK_TEXT + r"\(\s*<?[^)\s>]*>?(?:\s+(?:\"([^\"\n]*)\"|'([^'\n]*)'))?\s*\)")
_MD_REF_IMAGE = re.compile(r"!\[([^\]\n]*)\]\[[^\]\n]*\]")
_MD_LINK = re.compile(r"(?<!!)" + _LINK_TEXT + r"\(\s*<?[^)\s>]*>?(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)")
_HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_TERMINAL_INFO = frozenset({"console", "shell", "bash", "sh", "zsh", "shell-session", "terminal", "text"})
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n\s*\n).)+?)(?<!`)\1(?!`)", re.S)

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


def clean_text(text: str, fmt: str) -> str:
    """Clean a document's text for chunking and embedding (see the module docstring for the rules).

    Args:
        text: Raw document text (front matter already split off, see :func:`split_front_matter`).
        fmt: ``"markdown"``, ``"text"``, ``"html"`` or ``"beir"`` (BEIR text is cleaned as markdown).

    Returns:
        The cleaned text: paragraphs separated by one blank line, no leading or trailing whitespace.
        ``clean_text(clean_text(x, f), f) == clean_text(x, f)`` for every ``x``.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown document format {fmt!r}; pass one of: {', '.join(FORMATS)}")
    markdown = fmt in ("markdown", "beir")
    for _ in range(_MAX_PASSES):
        cleaned = _clean_once(text, markdown=markdown, html_doc=fmt == "html")
        if cleaned == text:
            break
        text = cleaned
    return text


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


def _clean_once(text: str, *, markdown: bool, html_doc: bool) -> str:
    text = _NEWLINES.sub("\n", text)
    text = unicodedata.normalize("NFC", _INVISIBLE.sub("", text)).replace("\u00a0", " ")
    if not markdown:
        return _BLANK_LINES.sub("\n\n", _normalise_prose(_clean_prose(text, markdown=False, html_doc=html_doc))).strip()
    parts: list[str] = []
    for is_code, segment in iter_segments(text):
        if is_code:
            parts.append(_clean_code(segment))
        else:
            parts.append(_with_code_spans(segment, lambda prose: _clean_prose(prose, markdown=True)))
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

    def hold(match: re.Match[str]) -> str:
        inner = _B64_RUN.sub(_drop_blob, _DATA_URI.sub("", match.group(2)))
        spans.append(match.group(1) + inner + match.group(1) if inner.strip() else "")
        return f"\ue000{len(spans) - 1}\ue001"

    cleaned = clean(_CODE_SPAN.sub(hold, prose))
    return _PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], cleaned)


def _clean_prose(text: str, *, markdown: bool, html_doc: bool = False) -> str:
    text = _HTML_COMMENT.sub("", text)
    text = _DROP_WITH_CONTENT.sub("", text)
    text = _DECLARATION.sub("", text)
    text = _DATA_URI.sub("", text)
    text = _B64_RUN.sub(_drop_blob, text)
    text = _resolve_shortcodes(text)
    text = _FIGURE.sub(_figure, text)
    text = _IMG.sub(lambda m: _image_text(_attr(_ALT, m.group(0)), _attr(_TITLE_ATTR, m.group(0))), text)
    if markdown:
        text = _MD_IMAGE.sub(lambda m: _image_text(m.group(1), m.group(2) or m.group(3) or ""), text)
        text = _MD_REF_IMAGE.sub(lambda m: _image_text(m.group(1), ""), text)
        text = _MD_LINK.sub(lambda m: m.group(1), text)
    text = _HTML_HEADING.sub(lambda m: "\n\n" + "#" * int(m.group(1)) + " " + _one_line(m.group(2)) + "\n\n", text)
    text = _TAG.sub(_tag if markdown or not html_doc else _any_tag, text)
    return html.unescape(text)


def _resolve_shortcodes(text: str) -> str:
    text = _HUGO.sub("", text)
    text = _JINJA_RAW.sub("", text)
    text = _JINJA_COMMENT.sub("", text)
    text = _JINJA_TAG.sub("", text)
    text = _JINJA_EXPR.sub("", text)
    text = _MKDOCS_INCLUDE.sub("", text)
    text = _ATTR_LIST.sub("", text)
    text = _WP_CAPTION.sub(_wp_caption, text)
    text = _WP_PAIRED.sub(lambda m: m.group(2), text)
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


def _wp_caption(match: re.Match[str]) -> str:
    inner = match.group(1)
    images = "".join(m.group(0) for m in _IMG.finditer(inner))
    caption = _IMG.sub("", inner)
    return f"<figure>{images}<figcaption>{caption}</figcaption></figure>"


def _figure(match: re.Match[str]) -> str:
    inner = match.group(1)
    captions = [_one_line(_TAG.sub(" ", c)) for c in _FIGCAPTION.findall(inner)]
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
