"""Cutting a document's blocks into chunks sized in the embedder's own tokens.

A chunk never spans two sections (nor two pages of a PDF): the document is split at its headings first (a
heading with nothing under it joins the section that follows). A section whose text, with the title and heading path
that :func:`index_text` puts in front, fits ``max_tokens`` is one chunk; a longer one is cut into pieces that fill the
limit, at the best boundary there is: between blocks, then between the items of a list, sentences of a
paragraph, rows of a table or lines of code (each piece of code fenced again), then between words, and only a
single enormous word at a token boundary. So no chunk is ever truncated by the embedder, a table is never cut
inside a row nor a list inside an item, and the pieces of every block, joined, give the block back: nothing is
lost and nothing repeated — but a definition's term.

A definition (an HTML ``<dt>`` and its ``<dd>``: an API reference's signature line and its description) keeps its
term with the start of its description: the chunk boundary goes before the term, never between it and the first
block of the description (unless the two together exceed the limit). A chunk that starts inside a description
repeats the term in front of its text (cut to its first words if it would take more than a quarter of the
chunk), so every chunk of an API's description names the API; the description's blocks are cut to leave it room.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
import re
import unicodedata
from collections.abc import Callable, Sequence

from attrs import evolve, frozen

from ragloop.errors import ConfigError
from ragloop.retrievers.ingest._blocks import Block, render_block
from ragloop.retrievers.ingest._tokens import Tokenizer
from ragloop.state import Chunk

__all__ = ["Piece", "check_limits", "chunk_blocks", "chunk_id", "index_text"]

#: Fewest tokens left for a chunk's own text once the title and heading path are counted.
_MIN_BODY = 16
_SENTENCE_END = re.compile(r"(?<=[.!?:;])[\"')\]]*\s+")
_SPACE = re.compile(r"\s+")
_LINE = re.compile(r"\n")
#: The line break before a list item (``- ``, ``* ``, ``+ ``, ``1. ``, ``1) ``): a list is cut between its items first.
#: Before a signature's parameters: a repeated term too long for its room keeps the API's name.
_PARAMS = re.compile(r"(?=[(\[])")
_ITEM = re.compile(r"\n(?=[ \t]*(?:[-*+]|[0-9]{1,9}[.)])[ \t])")
#: Blocks longer than this (characters) are cut without being counted whole first.
_COUNT_WHOLE_CHARS = 65_536


def chunk_id(text: str) -> str:
    """Return the stable content-hash id of a chunk's text.

    The text is normalised first (NFC, whitespace runs collapsed), so the same passage found in two
    documents, or re-indexed later, gets the same id and is stored once.
    """
    normalised = " ".join(unicodedata.normalize("NFC", text).split())
    return hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def index_text(chunk: Chunk) -> str:
    """The text that is indexed for a chunk: its title and heading path (each unless the text starts with it),
    then the text. Titles carry much of a document's topic, for both BM25 and the embedder; a section heading
    the text opens with is said again on purpose: the repetition is what weights a section's own title in BM25
    (without it, "how long is the audit log kept" lost the retention table under "How long we keep data")."""
    head: list[str] = []
    for part in (chunk.title, *chunk.title_path):
        part = part.strip()
        if part and part not in head and not chunk.text.startswith(part):
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
    term: str = ""  # the definition term of the description it is part of
    is_term: bool = False  # a piece of a definition's term
    first: bool = True  # its block's first unit


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
            pieces, exact = _pack_section(section, tokenizer, budget, limit_chars, kept, anchor)
            if exact:
                break
            texts = [f"{head}\n{p.text}" if head else p.text for p in pieces]
            worst = max((len(s) for s in tokenizer.token_spans(texts)), default=0) + tokenizer.special_tokens
            if worst <= max_tokens or budget <= _MIN_BODY:
                break
            budget = max(_MIN_BODY, budget - (worst - max_tokens))
        out.extend(pieces)
    return out


def _pack_section(
    section: Sequence[Block], tokenizer: Tokenizer, budget: int, limit_chars: float, path: tuple[str, ...], anchor: str
) -> tuple[list[Piece], bool]:
    heads = functools.cache(lambda term: _term_head(term, tokenizer, budget, limit_chars))
    units = _units(section, tokenizer, budget, limit_chars, heads)
    if not units:
        return [], True
    # Greedy to the full budget: aiming at equal pieces made more, smaller chunks (13,139 against 9,830 on SciFact).
    target = budget
    pieces: list[Piece] = []
    current: list[_Unit] = []
    used = chars = 0
    head = ("", 0)
    for group in _groups(units, budget, limit_chars):
        tokens = sum(u.tokens for u in group)
        size = sum(len(u.joiner) for u in group[1:]) + sum(len(u.text) for u in group)
        grown = chars + (len(group[0].joiner) if current else 0) + size
        if current and (used + tokens > target or grown > limit_chars):
            pieces.append(_piece(current, path, anchor, head[0]))
            current, used, grown = [], 0, size
        if not current:  # a piece that starts inside a description says the term first
            head = heads(group[0].term) if group[0].term and not group[0].is_term else ("", 0)
            used, grown = head[1], grown + (len(head[0]) + 2 if head[0] else 0)
        current.extend(group)
        used += tokens
        chars = grown
    pieces.append(_piece(current, path, anchor, head[0]))
    # Units joined by "" are pieces of one word cut at a token boundary: the only place counts may not add up.
    return pieces, all(u.joiner for u in units)


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


def _piece(units: list[_Unit], path: tuple[str, ...], anchor: str, head: str = "") -> Piece:
    text = units[0].text + "".join(u.joiner + u.text for u in units[1:])
    page = next((u.page for u in units if u.page), 0)
    return Piece(f"{head}\n\n{text}" if head else text, path, anchor, page, tuple(u.content for u in units))


def _term_head(term: str, tokenizer: Tokenizer, budget: int, limit_chars: float) -> tuple[str, int]:
    """The text repeated in front of a chunk that starts inside ``term``'s description, and its tokens (joiner
    included): the term's lines, one paragraph each; past a quarter of the chunk, the rest of the term is cut (at a
    line, a word, then before the parameters: ``hashlib.sha256`` of ``hashlib.sha256(data=b'')``)."""
    room, chars = max(1, budget // 4), limit_chars / 4
    kept: list[str] = []
    used = size = 0
    for part, tokens, before in _cut(term, tokenizer, room, chars, (_LINE, _SPACE, _PARAMS)):
        if kept and (used + tokens > room or size + len(before) + len(part) > chars):
            break
        kept.append(("\n\n" if "\n" in before else before) if kept else "")
        kept.append(part)
        used, size = used + tokens, size + len(before) + len(part)
    head = "".join(kept).strip()
    if not head or len(head) > chars:
        return "", 0
    return head, len(tokenizer.token_spans([head + "\n\n"])[0])


def _groups(units: list[_Unit], budget: int, limit_chars: float) -> list[list[_Unit]]:
    """The units in packing groups: a definition's term with the first unit of its description (and a second term
    line with the first) is one group, unless the group would not fit a chunk; every other unit alone."""
    groups: list[list[_Unit]] = []
    for unit in units:
        last = groups[-1] if groups else []
        glued = bool(last) and last[-1].is_term and (unit.is_term or (bool(unit.term) and unit.first))
        grown = [*last, unit]
        size = sum(len(u.joiner) for u in grown[1:]) + sum(len(u.text) for u in grown)
        if glued and sum(u.tokens for u in grown) <= budget and size <= limit_chars:
            groups[-1] = grown
        else:
            groups.append([unit])
    return groups


def _units(
    blocks: Sequence[Block],
    tokenizer: Tokenizer,
    budget: int,
    limit_chars: float,
    heads: Callable[[str], tuple[str, int]] | None = None,
) -> list[_Unit]:
    """Every block as one unit when it fits, else cut at its best boundaries into units that do; a description's
    blocks leave room for the term in front (``heads``)."""
    kept = [b for b in blocks if b.text.strip()]
    rendered = [render_block(b) for b in kept]
    # A block far longer than any chunk is cut without being counted whole first (tokenising is the cost here).
    small = [i for i, t in enumerate(rendered) if len(t) <= _COUNT_WHOLE_CHARS]
    counts = [budget + 1] * len(rendered)
    for i, spans in zip(small, tokenizer.token_spans([rendered[i] for i in small]), strict=True):
        counts[i] = len(spans)
    units: list[_Unit] = []
    for block, text, tokens in zip(kept, rendered, counts, strict=True):
        head, head_tokens = heads(block.term) if heads is not None and block.term else ("", 0)
        room, room_chars = budget - head_tokens, limit_chars - (len(head) + 2 if head else 0)
        if tokens <= room and len(text) <= room_chars:
            mine = [_Unit(text, block.text, tokens, "\n\n", block.page)]
        elif block.kind == "code":
            mine = _code_units(block, tokenizer, room, room_chars)
        else:
            mine = _prose_units(block, tokenizer, room, room_chars)
        if block.term or block.is_term:
            mine = [evolve(u, term=block.term, is_term=block.is_term, first=k == 0) for k, u in enumerate(mine)]
        units.extend(mine)
    return units


def _prose_units(block: Block, tokenizer: Tokenizer, budget: int, limit_chars: float) -> list[_Unit]:
    """A long paragraph, table or heading cut at sentences (rows), then words; a heading keeps its marker."""
    marker = "#" * max(1, min(block.level, 6)) + " " if block.kind == "heading" else ""
    marker_tokens = len(tokenizer.token_spans([marker])[0]) if marker else 0
    if block.kind == "table":
        cuts: tuple[re.Pattern[str], ...] = (_LINE, _SPACE)  # between rows
    elif block.kind == "text" and _ITEM.search(block.text):
        cuts = (_ITEM, _SENTENCE_END, _SPACE)  # between list items, then sentences
    else:
        cuts = (_SENTENCE_END, _SPACE)
    parts = _cut(block.text, tokenizer, budget - marker_tokens, limit_chars - len(marker), cuts)
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
        _cut(block.text, tokenizer, room, limit_chars - len(frame), (_LINE, _SPACE)), room, limit_chars - len(frame)
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


class _Counter:
    """Token counts of any slice of one text from a single tokenisation: the tokens that start inside the slice.

    Exact for slices cut at whitespace or punctuation (where WordPiece starts a new word); a cut between two
    pieces of one word may be off by a token, which :func:`chunk_blocks` checks afterwards.
    """

    def __init__(self, text: str, tokenizer: Tokenizer) -> None:
        self.starts = [a for a, _ in tokenizer.token_spans([text])[0]]

    def __call__(self, a: int, b: int) -> int:
        return bisect.bisect_left(self.starts, b) - bisect.bisect_left(self.starts, a)


def _cut(
    text: str, tokenizer: Tokenizer, budget: int, limit_chars: float, cuts: Sequence[re.Pattern[str]]
) -> list[tuple[str, int, str]]:
    """``text`` cut into ``(part, tokens, separator before it)`` that each fit (the section packs them).

    The cut points are, in order of preference, the matches of each of ``cuts`` (list items, sentence ends,
    rows or lines, whitespace), then token boundaries. Joining the parts with their separators gives ``text``
    back exactly. The text is tokenised once, however many levels the cutting goes down.
    """
    count = _Counter(text, tokenizer)
    out: list[tuple[str, int, str]] = []
    for a, b, before in _atoms(text, 0, len(text), count, max(1, budget), limit_chars, tuple(cuts), ""):
        out.append((text[a:b], max(count(a, b), 1 if b > a else 0), before))
    return out


def _atoms(
    text: str,
    start: int,
    end: int,
    count: _Counter,
    budget: int,
    limit_chars: float,
    cuts: tuple[re.Pattern[str], ...],
    before: str,
) -> list[tuple[int, int, str]]:
    """``(start, end, separator before it)`` slices of ``text[start:end]`` that fit: split at the matches of
    ``cuts[0]``, a slice still too long at those of ``cuts[1:]``, and at token boundaries when none are left."""
    if not cuts:
        return _token_cut(start, end, count, budget, before)
    out: list[tuple[int, int, str]] = []
    for a, b, sep_before in _slices(text, start, end, cuts[0], before):
        if count(a, b) <= budget and b - a <= limit_chars:
            out.append((a, b, sep_before))
        else:
            out.extend(_atoms(text, a, b, count, budget, limit_chars, cuts[1:], sep_before))
    return out


def _slices(text: str, start: int, end: int, pattern: re.Pattern[str], before: str) -> list[tuple[int, int, str]]:
    """``text[start:end]`` cut at each match of ``pattern``: ``(a, b, separator before)``; a match's trailing
    whitespace is the separator, anything else in it (a closing quote) stays with the piece before."""
    out: list[tuple[int, int, str]] = []
    pos, sep = start, before
    for m in pattern.finditer(text, start, end):
        kept = m.group(0)
        stripped = len(kept.rstrip()) if kept.strip() else 0
        if m.start() + stripped > pos:
            out.append((pos, m.start() + stripped, sep))
            sep = kept[stripped:]
        else:
            sep += kept[stripped:]
        pos = m.end()
    if pos < end:
        out.append((pos, end, sep))
    return out


def _token_cut(start: int, end: int, count: _Counter, budget: int, before: str) -> list[tuple[int, int, str]]:
    """One word too long for a chunk, cut at token starts (never inside a token)."""
    inside = [t for t in count.starts[bisect.bisect_left(count.starts, start) : bisect.bisect_left(count.starts, end)]]
    cuts = [start, *(inside[i] for i in range(budget, len(inside), budget)), end]
    return [(a, b, before if k == 0 else "") for k, (a, b) in enumerate(itertools.pairwise(cuts)) if b > a]
