"""Citation markers checked and numbered before they are streamed.

:class:`CitationGate` sits between an answerer's tokens and the user. Text that may be the start of a marker
(a free-standing ``[`` followed by digits, commas and spaces, see :mod:`ragloop.text.citations`) is held back
until the marker closes; a closed marker keeps only
the block numbers that exist, and vanishes when none do. Anything else passes at once, so a ``[`` that turns
out not to be a marker (``arr[i]``, a link) costs at most :data:`MAX_MARKER_CHARS` characters of delay.

With a :class:`Numbering`, the gate also writes each marker in the client's numbers: the answerer cites the
blocks it was given (``[3]``), the user sees one number per page, ``1..n`` in the order the reply first cites
them. A number is decided when its marker is first streamed and never changes: the blocks of one page share
it (``[2][5]`` of one page streams as ``[1]``), and the final text, ``Reply.citations`` and every client's
sources list are built from the same numbering, so they agree with what was streamed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ragloop.state import Citation, CitedSection, ContextBlock
from ragloop.text.citations import GLUED, MARKER, MARKER_RUN, MAX_MARKER_CHARS, is_marker, marker_numbers

__all__ = ["CitationGate", "Numbering", "page_key", "resolve_citations"]

_INSIDE = re.compile(r"[\d,\s]*")


def page_key(block: ContextBlock) -> str:
    """What makes two blocks one page: their source (the document), else the chunk itself."""
    return block.source or block.chunk_id or f"#{block.n}"


class Numbering:
    """The client's citation numbers: one per page, ``1..n`` in the order of first citation.

    Args:
        blocks: The numbered blocks the answerer was given.
        cited: Block numbers in the order they were first cited (``TurnState.cited``); :meth:`number` appends
            to it, so a numbering rebuilt from the same list gives the same numbers.
    """

    def __init__(self, blocks: Sequence[ContextBlock], cited: list[int]) -> None:
        self.by_n = {b.n: b for b in blocks}
        self.cited = cited
        self._page: dict[str, int] = {}
        self._blocks: dict[int, list[ContextBlock]] = {}
        for n in cited:
            self._assign(n)

    def _assign(self, n: int) -> int | None:
        block = self.by_n.get(n)
        if block is None:
            return None
        page = self._page.setdefault(page_key(block), len(self._page) + 1)
        members = self._blocks.setdefault(page, [])
        if block not in members:
            members.append(block)
        return page

    def number(self, n: int) -> int | None:
        """The client's number for block ``n``, decided now if it is first cited now (``None``: no such block)."""
        if n in self.by_n and n not in self.cited:
            self.cited.append(n)
        return self._assign(n)

    def pages(self) -> tuple[ContextBlock, ...]:
        """One block per numbered page, numbered as the client sees it: its cited blocks' texts joined, the
        first cited block's source, title, chunk id and link (what the verifier and the final text resolve)."""
        out = []
        for page, members in self._blocks.items():
            first = members[0]
            text = "\n\n".join(b.text for b in members)
            out.append(ContextBlock(page, text, first.source, first.title, first.chunk_id, first.query, first.url))
        return tuple(out)

    def sections(self, page: int) -> tuple[CitedSection, ...]:
        """The cited blocks of page number ``page``, in order of first citation."""
        return tuple(CitedSection(b.section, b.url, b.chunk_id) for b in self._blocks.get(page, ()))


class CitationGate:
    """Holds back possible citation markers until they close, and drops the numbers that name no block.

    Args:
        valid: The block numbers that exist.
        numbering: Writes the kept numbers as the client's (one per page, a page once per run of markers);
            without it they stream as the answerer wrote them.
    """

    def __init__(self, valid: Iterable[int], numbering: Numbering | None = None) -> None:
        self.valid = frozenset(valid)
        self.numbering = numbering
        self.held = ""
        self.prev = ""  # the last character shown, and whether a marker run ended right there
        self.chain = False
        self._run: set[int] = set()  # client numbers already shown in the current run of markers
        #: Numbers dropped from markers, in order.
        self.dropped: list[int] = []

    def feed(self, text: str) -> str:
        """The part of everything fed so far that can be shown now."""
        out: list[str] = []
        text = self.held + text
        self.held = ""
        while text:
            start = text.find("[")
            if start < 0:
                out.append(self._shown(text))
                break
            if start:
                out.append(self._shown(text[:start]))
            text = text[start:]
            rest = text[1:]
            inside = _INSIDE.match(rest)
            body = inside.group() if inside else ""
            after = rest[len(body) :]
            if not self.chain and GLUED.fullmatch(self.prev):  # arr[0], f(x)[1]: an index, not a citation
                out.append(self._shown("["))
                text = rest
            elif not after:  # the marker may go on in the next token
                if len(body) + 1 > MAX_MARKER_CHARS:
                    out.append(self._shown(text))
                else:
                    self.held = text
                break
            elif after[0] == "]" and is_marker(text[: len(body) + 2]):
                out.append(self._checked(body))
                self.chain = True
                text = after[1:]
            else:  # not a marker: show the bracket and go on after it
                out.append(self._shown("["))
                text = rest
        return "".join(out)

    def flush(self) -> str:
        """What is still held back (an unclosed ``[12`` is text, not a marker)."""
        held, self.held = self.held, ""
        return self._shown(held)

    def _shown(self, text: str) -> str:
        if text:
            self.prev, self.chain = text[-1], False
            self._run.clear()
        return text

    def _checked(self, body: str) -> str:
        numbers = marker_numbers(body)
        good = [n for n in numbers if n in self.valid]
        self.dropped.extend(n for n in numbers if n not in self.valid)
        if self.numbering is None:
            return "".join(f"[{n}]" for n in good)
        shown = []
        for n in good:
            page = self.numbering.number(n)
            if page is not None and page not in self._run:
                self._run.add(page)
                shown.append(f"[{page}]")
        return "".join(shown)


def resolve_citations(text: str, blocks: Sequence[ContextBlock]) -> tuple[str, tuple[Citation, ...], list[int]]:
    """Resolve ``[n]`` and ``[n, m]`` markers; drop markers that name no block.

    Only free-standing markers count (:mod:`ragloop.text.citations`): ``arr[0]`` and ``pair[1]`` are code.

    Returns the cleaned text, the citations in order of first use, and the invalid numbers removed.
    """
    by_n = {b.n: b for b in blocks}
    cited: dict[int, Citation] = {}
    invalid: list[int] = []

    def fix(m: re.Match[str]) -> str:
        out = []
        for one in MARKER.finditer(m.group()):
            if len(one.group()) > MAX_MARKER_CHARS:  # text, as the gate streamed it
                out.append(one.group())
                continue
            ns = marker_numbers(one.group(1))
            good = [n for n in ns if n in by_n]
            invalid.extend(n for n in ns if n not in by_n)
            for n in good:
                b = by_n[n]
                cited.setdefault(n, Citation(n, b.source, b.title, b.chunk_id, b.url))
            out.extend(f"[{n}]" for n in good)
        return "".join(out)

    cleaned = MARKER_RUN.sub(fix, text)
    return cleaned, tuple(cited.values()), invalid
