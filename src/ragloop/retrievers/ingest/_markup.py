"""HTML, shortcode and image markup removal: the regex half of :func:`~ragloop.retrievers.ingest.clean_text`.

Every pattern here either stops at a character that starts the next candidate or is bounded, and paired
constructs are matched in one left-to-right pass against an index of their closers (:func:`_sub_paired`), so
the time is linear in the text.
"""

from __future__ import annotations

import bisect
import functools
import html
import re
import time
from collections.abc import Callable

from ragloop.errors import InputError

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
