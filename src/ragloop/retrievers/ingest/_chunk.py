"""Cutting a document's blocks into chunks sized in the embedder's own tokens.

A chunk never spans two sections (nor two pages of a PDF): the document is split at its headings first (a
heading with nothing under it joins the section that follows). A section whose text, with the title and heading path
that :func:`index_text` puts in front, fits ``max_tokens`` is one chunk; a longer one is cut into pieces of about
equal size at the best boundary there is: between blocks, then between sentences of a paragraph or rows of a
table or lines of code (each piece of code fenced again), then between words, and only a single enormous word
at a token boundary. So no chunk is ever truncated by the embedder, a table is never cut inside a row, and
the pieces of every block, joined, give the block back: nothing is lost and nothing repeated.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Sequence

from attrs import frozen

from ragloop.errors import ConfigError
from ragloop.retrievers.ingest._blocks import Block, render_block
from ragloop.retrievers.ingest._tokens import Tokenizer
from ragloop.state import Chunk

__all__ = ["Piece", "check_limits", "chunk_blocks", "chunk_id", "index_text"]

#: Fewest tokens left for a chunk's own text once the title and heading path are counted.
_MIN_BODY = 16
_SENTENCE_END = re.compile(r"(?<=[.!?:;])[\"')\]]*\s+")
_SPACE = re.compile(r"\s+")


def chunk_id(text: str) -> str:
    """Return the stable content-hash id of a chunk's text.

    The text is normalised first (NFC, whitespace runs collapsed), so the same passage found in two
    documents, or re-indexed later, gets the same id and is stored once.
    """
    normalised = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def index_text(chunk: Chunk) -> str:
    """The text that is indexed for a chunk: its title and heading path (when not already in the text, as the
    text's opening line or heading), then the text. Titles carry much of a document's topic, for both BM25 and
    the embedder; said twice they only cost tokens."""
    head: list[str] = []
    first = chunk.text.split("\n", 1)[0]
    opening = first.lstrip("#").strip() if first.startswith("#") else ""  # the chunk opens with its heading
    for part in (chunk.title, *chunk.title_path):
        part = part.strip()
        if part and part not in head and not chunk.text.startswith(part) and part != opening:
            head.append(part)
    return "\n".join([*head, chunk.text]) if head else chunk.text


def check_limits(max_tokens: int, max_chars: int | None = None) -> None:
    """Raise :class:`~ragloop.errors.ConfigError` unless the chunk limits leave room for text."""
    if max_tokens < _MIN_BODY + 2:
        raise ConfigError(f"max_tokens must be at least {_MIN_BODY + 2} (got {max_tokens}); 256 is a good default")
    if max_chars is not None and max_chars < 1:
        raise ConfigError(f"max_chars must be at least 1 (got {max_chars}); leave it out to cut by tokens only")


@frozen
class Piece:
    """One chunk's worth of a document, before it becomes a :class:`~ragloop.state.Chunk`.

    Attributes:
        text: The chunk text (markdown: heading lines, prose, fenced code, table rows).
        title_path: The headings it sits under, outermost first.
        anchor: The id of its nearest heading (``""`` if none).
        page: The page it starts on (PDF), else 0.
        parts: The content of each block piece it holds, in order (what the no-loss property checks).
    """

    text: str
    title_path: tuple[str, ...]
    anchor: str
    page: int
    parts: tuple[str, ...]


@frozen
class _Unit:
    """An uncuttable piece of a block: its rendered text, tokens, and what joins it to the previous unit."""

    text: str
    content: str
    tokens: int
    joiner: str
    page: int


def _sections(blocks: Sequence[Block]) -> list[tuple[tuple[str, ...], str, list[Block]]]:
    """``(heading path, anchor, blocks)`` per section; bare headings join the next section."""
    stack: list[tuple[int, str, str]] = []
    sections: list[tuple[tuple[str, ...], str, list[Block]]] = []
    pending: list[Block] = []
    current: list[Block] = []
    path: tuple[str, ...] = ()
    anchor = ""
    for block in blocks:
        if block.kind == "heading":
            if any(b.kind != "heading" for b in current):
                sections.append((path, anchor, current))
                current = []
            pending, current = [], [*current, block]
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            stack.append((block.level, block.text, block.anchor))
            path = tuple(t for _, t, _ in stack)
            anchor = block.anchor or next((a for _, _, a in reversed(stack) if a), "")
        else:
            last = current[-1] if current else None
            if last is not None and last.kind != "heading" and 0 < last.page != block.page > 0:
                sections.append((path, anchor, current))  # a chunk never spans two pages of a PDF
                current = []
            current.append(block)
    del pending
    if current:
        if all(b.kind == "heading" for b in current) and sections:
            p, a, prev = sections[-1]
            sections[-1] = (p, a, prev + current)
        else:
            sections.append((path, anchor, current))
    return sections


def chunk_blocks(
    blocks: Sequence[Block],
    tokenizer: Tokenizer,
    *,
    max_tokens: int = 256,
    title: str = "",
    max_chars: int | None = None,
) -> list[Piece]:
    """Cut a document's blocks into pieces whose :func:`index_text` fits ``max_tokens`` (see the module docstring).

    Args:
        blocks: The document's blocks, in order.
        tokenizer: The embedder's tokenizer.
        max_tokens: Most tokens per chunk, the embedder's special tokens and the title in front included.
        title: The document title (put in front of every chunk's indexed text).
        max_chars: Most characters of chunk text, as well (``None``: tokens only).

    Returns:
        The pieces in document order, none empty.
    """
    check_limits(max_tokens, max_chars)
    limit_chars = math.inf if max_chars is None else max_chars
    out: list[Piece] = []
    for path, anchor, section in _sections(blocks):
        kept, budget = _fit_head(tokenizer, title, path, max_tokens)
        head = "\n".join(p for p in dict.fromkeys(x.strip() for x in (title, *kept)) if p)
        for _ in range(4):  # counts add up across whitespace; a cut inside a word may not, so check and retry
            pieces = _pack_section(section, tokenizer, budget, limit_chars, kept, anchor)
            texts = [f"{head}\n{p.text}" if head else p.text for p in pieces]
            worst = max((len(s) for s in tokenizer.token_spans(texts)), default=0) + tokenizer.special_tokens
            if worst <= max_tokens or budget <= _MIN_BODY:
                break
            budget = max(_MIN_BODY, budget - (worst - max_tokens))
        out.extend(pieces)
    return out


def _pack_section(
    section: Sequence[Block], tokenizer: Tokenizer, budget: int, limit_chars: float, path: tuple[str, ...], anchor: str
) -> list[Piece]:
    units = _units(section, tokenizer, budget, limit_chars)
    if not units:
        return []
    total = sum(u.tokens for u in units)
    target = min(budget, max(math.ceil(total / max(1, math.ceil(total / budget))), max(u.tokens for u in units)))
    pieces: list[Piece] = []
    current: list[_Unit] = []
    used = chars = 0
    for unit in units:
        grown = chars + (len(unit.joiner) if current else 0) + len(unit.text)
        if current and (used + unit.tokens > target or grown > limit_chars):
            pieces.append(_piece(current, path, anchor))
            current, used, grown = [], 0, len(unit.text)
        current.append(unit)
        used += unit.tokens
        chars = grown
    pieces.append(_piece(current, path, anchor))
    return pieces


def _fit_head(tokenizer: Tokenizer, title: str, path: tuple[str, ...], max_tokens: int) -> tuple[tuple[str, ...], int]:
    """The heading path kept in front of the chunks (outer headings dropped when it leaves too little room) and
    the tokens left for the chunk text."""
    while True:
        head = "\n".join(p for p in dict.fromkeys(x.strip() for x in (title, *path)) if p)
        used = len(tokenizer.token_spans([head])[0]) if head else 0
        budget = max_tokens - tokenizer.special_tokens - used
        if budget >= max(_MIN_BODY, max_tokens // 4) or not path:
            return path, max(budget, _MIN_BODY)
        path = path[1:]


def _piece(units: list[_Unit], path: tuple[str, ...], anchor: str) -> Piece:
    text = units[0].text + "".join(u.joiner + u.text for u in units[1:])
    page = next((u.page for u in units if u.page), 0)
    return Piece(text, path, anchor, page, tuple(u.content for u in units))


def _units(blocks: Sequence[Block], tokenizer: Tokenizer, budget: int, limit_chars: float) -> list[_Unit]:
    """Every block as one unit when it fits, else cut at its best boundaries into units that do."""
    kept = [b for b in blocks if b.text.strip()]
    rendered = [render_block(b) for b in kept]
    counts = [len(s) for s in tokenizer.token_spans(rendered)]
    units: list[_Unit] = []
    for block, text, tokens in zip(kept, rendered, counts, strict=True):
        if tokens <= budget and len(text) <= limit_chars:
            units.append(_Unit(text, block.text, tokens, "\n\n", block.page))
        elif block.kind == "code":
            units.extend(_code_units(block, tokenizer, budget, limit_chars))
        else:
            units.extend(_prose_units(block, tokenizer, budget, limit_chars))
    return units


def _prose_units(block: Block, tokenizer: Tokenizer, budget: int, limit_chars: float) -> list[_Unit]:
    """A long paragraph, table or heading cut at sentences (rows), then words; a heading keeps its marker."""
    marker = "#" * max(1, min(block.level, 6)) + " " if block.kind == "heading" else ""
    marker_tokens = len(tokenizer.token_spans([marker])[0]) if marker else 0
    separator = "\n" if block.kind == "table" else None
    parts = _cut(block.text, tokenizer, budget - marker_tokens, limit_chars - len(marker), separator)
    return [
        _Unit(
            (marker if i == 0 else "") + part,
            part,
            tokens + (marker_tokens if i == 0 else 0),
            "\n\n" if i == 0 else joiner,
            block.page,
        )
        for i, (part, tokens, joiner) in enumerate(parts)
    ]


def _code_units(block: Block, tokenizer: Tokenizer, budget: int, limit_chars: float) -> list[_Unit]:
    """A long code block cut between lines, each piece fenced again."""
    fence = "~~~" if "```" in block.text else "```"
    frame = f"{fence}{block.lang}\n\n{fence}"
    overhead = len(tokenizer.token_spans([frame])[0])
    units = []
    room = max(1, budget - overhead)
    for part in _group(
        _cut(block.text, tokenizer, room, limit_chars - len(frame), "\n"), room, limit_chars - len(frame)
    ):
        rendered = f"{fence}{block.lang}\n{part}\n{fence}"
        units.append(_Unit(rendered, part, len(tokenizer.token_spans([rendered])[0]), "\n\n", block.page))
    return units


def _group(atoms: list[tuple[str, int, str]], budget: int, limit_chars: float) -> list[str]:
    """Atoms joined (with their separators) into groups of about equal size, each within the limits."""
    total = sum(t for _, t, _ in atoms)
    target = min(budget, max(math.ceil(total / max(1, math.ceil(total / budget))), max(t for _, t, _ in atoms)))
    groups: list[list[tuple[str, int, str]]] = []
    used = chars = 0
    for atom in atoms:
        grown = chars + len(atom[2]) + len(atom[0])
        if groups and groups[-1] and used + atom[1] <= target and grown <= limit_chars:
            groups[-1].append(atom)
            used, chars = used + atom[1], grown
        else:
            groups.append([atom])
            used, chars = atom[1], len(atom[0])
    return [g[0][0] + "".join(sep + text for text, _, sep in g[1:]) for g in groups]


def _cut(
    text: str, tokenizer: Tokenizer, budget: int, limit_chars: float, separator: str | None
) -> list[tuple[str, int, str]]:
    """``text`` cut into ``(part, tokens, separator before it)`` that each fit (the section packs them).

    The cut points are, in order of preference: ``separator`` (rows, lines) or sentence ends, then whitespace,
    then token boundaries. Joining the parts with their separators gives ``text`` back exactly.
    """
    budget = max(1, budget)
    return _atoms(text, tokenizer, budget, limit_chars, 0 if separator is None else 1, separator)


def _atoms(
    text: str, tokenizer: Tokenizer, budget: int, limit_chars: float, level: int, separator: str | None
) -> list[tuple[str, int, str]]:
    """``(atom, tokens, separator before it)``: ``text`` split at the level's boundaries, recursing into any
    atom that is still too long; level 0 sentences (or ``separator``), 1 whitespace, 2 token boundaries."""
    if level >= 3:
        return _token_cut(text, tokenizer, budget)
    if level == 0:
        pairs = _split_keep(text, _SENTENCE_END)
    elif level == 1 and separator is not None:
        pairs = [(line, "\n") for line in text.split(separator)]
        pairs[-1] = (pairs[-1][0], "")
        separator = None
        level = 0  # rows or lines next fall back to whitespace
    else:
        pairs = _split_keep(text, _SPACE)
    counts = [len(s) for s in tokenizer.token_spans([p for p, _ in pairs])]
    out: list[tuple[str, int, str]] = []
    before = ""
    for (part, after), tokens in zip(pairs, counts, strict=True):
        if tokens <= budget and len(part) <= limit_chars:
            out.append((part, tokens, before))
        else:
            sub = _atoms(part, tokenizer, budget, limit_chars, level + 1 if level > 0 else 1, None)
            if sub:
                sub[0] = (sub[0][0], sub[0][1], before)
            out.extend(sub)
        before = after
    return out


def _token_cut(text: str, tokenizer: Tokenizer, budget: int) -> list[tuple[str, int, str]]:
    """One word too long for a chunk, cut at token boundaries (never inside a token)."""
    spans = tokenizer.token_spans([text])[0]
    out: list[tuple[str, int, str]] = []
    start = 0
    for i in range(budget, len(spans), budget):
        cut = spans[i][0]
        out.append((text[start:cut], budget, ""))
        start = cut
    out.append((text[start:], len(spans) - budget * (len(out)), ""))
    return [(t, max(k, 1), s) for t, k, s in out if t]


def _split_keep(text: str, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """``text`` cut at each match of ``pattern``: ``(piece, separator that followed it)``; the pieces and
    separators joined give ``text`` back."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() == pos and out:  # a separator right after another joins it
            out[-1] = (out[-1][0], out[-1][1] + m.group(0))
            pos = m.end()
            continue
        kept = m.group(0)
        stripped = kept.rstrip()
        out.append((text[pos : m.start()] + stripped, kept[len(stripped) :]))
        pos = m.end()
    if pos < len(text) or not out:
        out.append((text[pos:], ""))
    return out
