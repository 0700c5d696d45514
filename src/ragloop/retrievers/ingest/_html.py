"""HTML pages to blocks: the page's main content only, parsed by a real HTML5 parser (selectolax/Lexbor).

What a documentation generator wraps around the content never reaches the index:

- The main content is found first: ``[role=main]`` (Sphinx, Read the Docs, Furo), then ``article`` (MkDocs
  Material, Docusaurus), ``main``, ``#content``; the whole ``<body>`` only when the page has none of these.
- Inside it, navigation is dropped: ``nav``, ``aside``, ``footer``, navigation/search/banner roles, the
  generators' sidebars, tables of contents, breadcrumbs, previous/next and "edit this page" links, heading
  permalinks (``¶``), navigation lines (Texinfo's "Next: … Up: …"), hidden elements (``hidden``,
  ``aria-hidden``, ``display: none``), forms and buttons, and link lists whose text is almost all links (a
  toctree, an index).
- Banners (cookie consent, newsletters) are recognised by structure: an overlay (a dialog role, ``aria-modal``,
  or a fixed or sticky position, inline or from the page's ``<style>``) holding buttons and little text. Never
  by a word in an id or class: a page or section about cookies is content.
- A page that cleaning empties, or that loses more than half of its main text, gets a note naming the rules
  that removed the most (the ingestion's warnings, or the reason it was skipped).
- Entities are decoded once, by the parser. ``<pre>`` becomes a code block verbatim (indentation, ``# comment``
  lines and ``<stdin>`` kept); headings come only from ``<h1>``–``<h6>``, with the id of the heading (or of its
  permalink, or of the ``<section>`` it opens) as the anchor; tables become markdown rows; inline ``<code>`` is
  kept in backticks; an image keeps its alt text when that says something; a definition list's ``<dt>`` is
  marked as a term and each block of its ``<dd>`` with that term (:attr:`Block.term`), which the chunker keeps
  with the description.

Measured against trafilatura and readability-lxml in ``benchmarks/bench_extract.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from attrs import evolve

from ragloop.retrievers.ingest._blocks import Block, LoaderError, MissingExtra, clean_code, clean_inline
from ragloop.retrievers.ingest._markup import _image_text

__all__ = ["html_blocks"]

#: Where a page's main content is, most specific first.
_MAIN = ("[role=main]", "main article", "article", "main", "#main-content", "#content", ".content", "body")
#: Never text a reader sees: removed before the page's text is measured.
_INVISIBLE = "script, style, noscript, template, svg, head"
#: What is never content, wherever it is, by rule: each rule's name is what a report of lost text names.
#: Only element names, roles, ARIA state and the generators' own class names: never a word inside an id or class
#: (``[id*=cookie]`` matched Sphinx's section ids on Python's http.cookiejar page and emptied it).
_RULES = (
    (
        "navigation and form elements (nav, aside, footer, dialog, form, button…)",
        "iframe, form, button, input, select, textarea, canvas, object, embed, nav, aside, footer, dialog",
    ),
    (
        "navigation roles and hidden elements",
        "[role=navigation], [role=search], [role=banner], [role=contentinfo], [hidden], [aria-hidden=true]",
    ),
    (
        "the generators' sidebars, tables of contents, permalinks and footers",
        # Sphinx
        ".headerlink, .sphinxsidebar, .related, .toctree-wrapper, .footer, .rst-footer-buttons, #searchbox, "
        # MkDocs (Material and the classic theme)
        ".md-sidebar, .md-footer, .md-header, .md-source-file, .md-content__button, .md-top, .md-dialog, "
        ".toc, #toc, .bs-sidebar, "
        # Docusaurus
        ".hash-link, .theme-doc-toc-mobile, .theme-doc-footer, .pagination-nav, .theme-edit-this-page, "
        ".theme-last-updated, .breadcrumbs, .theme-doc-breadcrumbs, .tableOfContents, .table-of-contents, "
        # skip links
        ".skip-link, .sr-only",
    ),
)
_BANNER_RULE = "fixed or overlay banners with buttons"
_HIDDEN_RULE = "elements hidden by their style"
_LINKS_RULE = "lists and tables that are almost all links"
_NAV_LINE_RULE = "navigation lines (Next: / Previous: / Up:) and permalink marks"
#: A banner is short: an overlay holding more text than this is a page, not a banner.
_BANNER_CHARS = 1200
_POSITIONED = re.compile(r"position\s*:\s*(?:fixed|sticky)", re.I)
_CSS_RULE = re.compile(r"([^{}]+)\{([^{}]*)\}")
_SIMPLE_SELECTOR = re.compile(r"^[.#][A-Za-z_][\w-]*$")
_NAV_REL = "a[rel=next], a[rel=prev], a[rel=previous], a[rel=up], a[accesskey=n], a[accesskey=p], a[accesskey=u]"
_NAV_WORDS = re.compile(r"\b(?:next|previous|prev|up|top|contents|index)\b|[\s:,;|\[\]()\u00bb\u00ab<>-]", re.I)
_PERMALINK_MARKS = frozenset(("\u00b6", "#", "\u00a7", "\U0001f517"))
_HIDDEN_STYLE = re.compile(r"(?:^|;)\s*(?:display\s*:\s*none|visibility\s*:\s*hidden)\b", re.I)
_LANG = re.compile(r"(?:^|\s)(?:language|lang|highlight)-([\w+#.-]+)")
_BLOCK_TAGS = frozenset(
    (
        "address", "article", "blockquote", "body", "center", "dd", "details", "div", "dl", "dt", "fieldset",
        "figcaption", "figure", "header", "hgroup", "html", "li", "main", "ol", "p", "section", "summary", "ul",
    )
)  # fmt: skip
_HEADINGS = frozenset(("h1", "h2", "h3", "h4", "h5", "h6"))
_LINK_LISTS = "ul, ol, dl, table"
#: Deepest element nesting read. Real pages nest a few dozen deep; the parser's time grows with the square of the
#: depth (100,000 nested <div>s take minutes) and the walk recurses, so a deeper page is refused up front.
MAX_DEPTH = 256
_TAG_SCAN = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)[^<>]*?(/?)>")
#: Elements HTML closes by itself (and void elements): they never deepen a real page.
_SELF_CLOSING = frozenset(
    (
        "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "tbody", "thead", "tfoot", "colgroup",
        "caption", "rb", "rt", "rp", "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
        "param", "source", "track", "wbr",
    )
)  # fmt: skip


def _parser() -> Any:
    try:
        from selectolax.lexbor import LexborHTMLParser
    except ImportError as exc:
        raise MissingExtra("HTML pages need the [ingest] extra (selectolax): pip install 'ragloop[ingest]'") from exc
    return LexborHTMLParser


def html_blocks(raw: str, notes: list[str] | None = None) -> tuple[str, list[Block]]:
    """The title and main-content blocks of an HTML page (see the module docstring).

    Args:
        raw: The page's HTML.
        notes: Where a report goes when cleaning removed more than half of the main content's text (or all
            of it), naming the rules that removed the most; by default dropped.

    Returns:
        ``(title, blocks)``: the first ``<h1>`` of the content (else the ``<title>``; ``""`` if neither) and the
        blocks.

    Raises:
        MissingExtra: selectolax is not installed.
    """
    _check_depth(raw)
    tree = _parser()(raw)
    title_node = tree.css_first("title")
    title = clean_inline(title_node.text(deep=True)) if title_node is not None else ""
    positioned = _positioned_selectors(tree)
    root = next((node for sel in _MAIN if (node := tree.css_first(sel)) is not None), None)
    if root is None:
        return title, []
    keyed = {h.mem_id: anchor for h, anchor in _heading_anchors(root)}
    _drop(root, root.css(_INVISIBLE), None)
    removed: dict[str, int] = {}
    base = _chars(root)
    _drop(root, _banners(root, positioned), removed, _BANNER_RULE)
    for rule, selector in _RULES:
        _drop(root, root.css(selector), removed, rule)
    hidden = [n for n in root.css("[style]") if _HIDDEN_STYLE.search(n.attributes.get("style") or "")]
    _drop(root, hidden, removed, _HIDDEN_RULE)
    _drop(root, _navigation_lines(root), removed, _NAV_LINE_RULE)
    _drop(root, [n for n in root.css(_LINK_LISTS) if _link_dense(n)], removed, _LINKS_RULE)
    walker = _Walker(keyed)
    walker.walk(root)
    walker.flush()
    blocks = walker.blocks
    if notes is not None:
        _report(base, sum(len("".join(b.text.split())) for b in blocks), removed, notes)
    # The page's own h1 names it; <title> adds the site's name ("… — Python 3.11 documentation"), which would
    # be repeated in front of every chunk of every page.
    h1 = next((b.text for b in blocks if b.kind == "heading" and b.level == 1), "")
    return h1 or title, blocks


def _chars(node: Any) -> int:
    return len("".join(node.text(deep=True).split()))


def _drop(root: Any, nodes: list[Any], removed: dict[str, int] | None, rule: str = "") -> None:
    """Remove ``nodes`` (never ``root`` itself), adding the text each held to ``removed[rule]``."""
    for node in nodes:
        if node.mem_id == root.mem_id or node.parent is None:
            continue
        if removed is not None:
            removed[rule] = removed.get(rule, 0) + _chars(node)
        node.decompose()


def _report(base: int, kept: int, removed: dict[str, int], notes: list[str]) -> None:
    """A note when cleaning kept less than half of the main content's text, naming the rules that took it."""
    if base == 0 or kept * 2 >= base:
        return
    rules = sorted(((n, rule) for rule, n in removed.items() if n), reverse=True)[:3]
    named = "; ".join(f"{rule} ({min(n, base):,})" for n, rule in rules) or "no rule (the text was whitespace)"
    share = "all" if kept == 0 else f"{1 - kept / base:.0%}"
    notes.append(f"cleaning removed {share} of the {base:,} characters of the page's main text, most by: {named}")


def _positioned_selectors(tree: Any) -> str:
    """The simple selectors (``.class``, ``#id``) the page's own ``<style>`` rules make fixed or sticky."""
    found: list[str] = []
    for style in tree.css("style"):
        for selectors, body in _CSS_RULE.findall(style.text(deep=True) or ""):
            if _POSITIONED.search(body):
                found += [sel.strip() for sel in selectors.split(",") if _SIMPLE_SELECTOR.match(sel.strip())]
    return ", ".join(dict.fromkeys(found))


def _banners(root: Any, positioned: str) -> list[Any]:
    """Overlays that hold buttons and little text: a dialog role, ``aria-modal``, or a fixed or sticky position
    (inline, or from the page's own styles). A banner is recognised by what it is, not by what it is about: a
    section about cookies is content."""
    candidates = root.css("[role=dialog], [role=alertdialog], [aria-modal=true], [style]")
    styled = root.css(positioned) if positioned else []
    fixed = {n.mem_id for n in styled}
    found = []
    for node in candidates + styled:
        attrs = node.attributes
        overlay = (
            attrs.get("role") in ("dialog", "alertdialog")
            or attrs.get("aria-modal") == "true"
            or bool(_POSITIONED.search(attrs.get("style") or ""))
            or node.mem_id in fixed
        )
        if not overlay or node.tag in ("html", "body", "main", "article"):
            continue
        has_button = node.css_first("button, [role=button], input[type=button], input[type=submit]") is not None
        if has_button and _chars(node) <= _BANNER_CHARS and node.css_first("h1, h2") is None:
            found.append(node)
    return found


def _navigation_lines(root: Any) -> list[Any]:
    """Generator navigation lines (Texinfo's "Next: … Previous: … Up: …": links marked ``rel`` next/prev/up or
    with their access keys, and nothing else but those labels) and permalink marks (a ``#…`` link whose text is
    ``¶``, ``#`` or ``§``)."""
    found = []
    seen: set[int] = set()
    for link in root.css(_NAV_REL):
        block = link.parent
        while block is not None and block.tag not in ("p", "div", "nav", "header", "td", "li", "body"):
            block = block.parent
        if block is None or block.mem_id in seen or block.mem_id == root.mem_id:
            continue
        rest = block.text(deep=True)
        for a in block.css("a"):
            rest = rest.replace(a.text(deep=True), "", 1)
        if not _NAV_WORDS.sub("", rest):
            seen.add(block.mem_id)
            found.append(block)
    for link in root.css("a[href^='#']"):
        if link.text(deep=True).strip() in _PERMALINK_MARKS:
            found.append(link)
    return found


def _check_depth(raw: str) -> None:
    """Refuse markup nested deeper than :data:`MAX_DEPTH` (one linear scan of the tags, before parsing)."""
    depth = 0
    for m in _TAG_SCAN.finditer(raw):
        if m.group(2).lower() in _SELF_CLOSING or m.group(3):
            continue
        depth = max(0, depth - 1) if m.group(1) else depth + 1
        if depth > MAX_DEPTH:
            raise LoaderError(
                f"HTML nested too deeply (over {MAX_DEPTH} elements inside each other); no real page is, "
                "so it is refused rather than parsed"
            )


def _heading_anchors(root: Any) -> list[tuple[Any, str]]:
    """Each heading with its anchor: its own id, its permalink's ``#target``, or the id of the section it opens."""
    out = []
    for h in root.css("h1, h2, h3, h4, h5, h6"):
        anchor = h.attributes.get("id") or ""
        if not anchor:
            link = h.css_first("a.headerlink, a.hash-link, a.anchor, a[href^='#']")
            href = (link.attributes.get("href") or "") if link is not None else ""
            anchor = href[1:] if href.startswith("#") else ""
        if not anchor and h.parent is not None and h.parent.tag in ("section", "div"):
            anchor = h.parent.attributes.get("id") or ""
        out.append((h, anchor))
    return out


def _link_dense(node: Any) -> bool:
    """A list or table that is navigation: five links or more, and links make nine tenths of its text."""
    links = node.css("a")
    if len(links) < 5:
        return False
    total = len("".join(node.text(deep=True).split()))
    linked = sum(len("".join(a.text(deep=True).split())) for a in links)
    return total > 0 and linked >= 0.9 * total


class _Walker:
    """Walks the main content depth-first, collecting inline text into paragraphs and emitting blocks."""

    def __init__(self, anchors: dict[int, str]) -> None:
        self.anchors = anchors
        self.blocks: list[Block] = []
        self.inline: list[str] = []
        self.prefix = ""  # a list item's marker, put before its first paragraph
        self.term = ""  # the <dt> lines of the <dd> being read
        self.is_term = False  # reading a <dt>

    def add(self, block: Block) -> None:
        if self.term or self.is_term:
            block = evolve(block, term=self.term, is_term=self.is_term)
        self.blocks.append(block)

    def flush(self) -> None:
        text = clean_inline("".join(self.inline))
        self.inline.clear()
        if text:
            self.add(Block("text", self.prefix + text))
            self.prefix = ""

    def definitions(self, dl: Any) -> None:
        """A ``<dl>``: each ``<dt>``'s blocks marked as terms, each ``<dd>``'s blocks with the terms above it."""
        outer, terms = self.term, list[str]()
        for item in _items(dl):
            self.flush()
            first = len(self.blocks)
            self.is_term = item.tag == "dt"
            if item.tag == "dd":
                self.term = "\n".join(terms) or outer
            if item.tag in ("dt", "dd"):
                self.walk(item)
            else:
                self.visit(item)
            self.flush()
            if item.tag == "dt":
                terms += [b.text for b in self.blocks[first:] if b.kind == "text"]
            elif item.tag == "dd":
                terms = []
            self.term, self.is_term = outer, False

    def walk(self, node: Any) -> None:
        child = node.child
        while child is not None:
            self.visit(child)
            child = child.next

    def visit(self, node: Any) -> None:  # noqa: C901, PLR0912 — one branch per kind of element
        tag = node.tag
        if tag == "-text":
            self.inline.append(node.text_content or "")
        elif tag in _HEADINGS:
            self.flush()
            text = clean_inline(node.text(deep=True))
            if text:
                self.add(Block("heading", text, level=int(tag[1]), anchor=self.anchors.get(node.mem_id, "")))
        elif tag == "pre":
            self.flush()
            code = clean_code(_pre_text(node))
            if code:
                self.add(Block("code", code, lang=_language(node)))
        elif tag == "table":
            self.flush()
            rows = _table_rows(node)
            if rows:
                self.add(Block("table", "\n".join(rows)))
        elif tag == "br":
            self.inline.append("\n")
        elif tag == "img":
            attrs = node.attributes
            alt = _image_text(attrs.get("alt") or "", attrs.get("title") or "")
            if alt:
                self.inline.append(f" {alt} ")
        elif tag == "code" or tag == "kbd" or tag == "samp":
            text = node.text(deep=True)
            if text.strip():
                self.inline.append("`" + " ".join(text.split()) + "`")
        elif tag == "li":
            self.flush()
            parent = node.parent
            self.prefix = "1. " if parent is not None and parent.tag == "ol" else "- "
            self.walk(node)
            self.flush()
            self.prefix = ""
        elif tag == "hr":
            self.flush()
        elif tag == "dl":
            self.definitions(node)
        elif tag in _BLOCK_TAGS:
            self.flush()
            self.walk(node)
            self.flush()
        elif tag is not None and not tag.startswith("-"):
            self.walk(node)  # inline element: its text joins the paragraph


def _items(dl: Any) -> Iterator[Any]:
    """A ``<dl>``'s children, those of a ``<div>`` grouping a term with its description (HTML5) included."""
    child = dl.child
    while child is not None:
        yield from _items(child) if child.tag == "div" else (child,)
        child = child.next


def _pre_text(node: Any) -> str:
    """A ``<pre>``'s text verbatim, a ``<br>`` inside it a line break (Docusaurus ends each line with one)."""
    parts: list[str] = []
    child = node.child
    while child is not None:
        if child.tag == "-text":
            parts.append(child.text_content or "")
        elif child.tag == "br":
            parts.append("\n")
        elif child.tag is not None and not child.tag.startswith("-"):
            parts.append(_pre_text(child))
        child = child.next
    return "".join(parts)


def _language(pre: Any) -> str:
    """A code block's language from ``language-x`` / ``highlight-x`` classes on it, its code or its wrapper."""
    candidates = [pre, pre.css_first("code"), pre.parent, pre.parent.parent if pre.parent is not None else None]
    for node in candidates:
        if node is None:
            continue
        found = _LANG.search(node.attributes.get("class") or "")
        if found and found.group(1) not in ("default", "none"):
            return found.group(1)
    return ""


def _table_rows(table: Any) -> list[str]:
    """The table as markdown rows, a separator after the first; cells one line each, ``|`` escaped."""
    rows: list[list[str]] = []
    for tr in table.css("tr"):
        cells = [clean_inline(cell.text(deep=True)).replace("|", "\\|") for cell in tr.css("th, td")]
        if any(cells):
            rows.append(cells)
    if not rows:
        return []
    width = max(len(r) for r in rows)
    lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
    lines.insert(1, "|" + " --- |" * width)
    return lines
