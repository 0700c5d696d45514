"""Citation markers checked before they are streamed: a token stream never shows ``[9]`` for a missing block.

:class:`CitationGate` sits between an answerer's tokens and the user. Text that may be the start of a marker
(a free-standing ``[`` followed by digits, commas and spaces, see :mod:`ragloop.text.citations`) is held back
until the marker closes; a closed marker keeps only
the block numbers that exist, and vanishes when none do. Anything else passes at once, so a ``[`` that turns
out not to be a marker (``arr[i]``, a link) costs at most :data:`MAX_MARKER_CHARS` characters of delay.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ragloop.text.citations import GLUED, MAX_MARKER_CHARS, is_marker, marker_numbers

__all__ = ["CitationGate"]

_INSIDE = re.compile(r"[\d,\s]*")


class CitationGate:
    """Holds back possible citation markers until they close, and drops the numbers that name no block.

    Args:
        valid: The block numbers that exist.
    """

    def __init__(self, valid: Iterable[int]) -> None:
        self.valid = frozenset(valid)
        self.held = ""
        self.prev = ""  # the last character shown, and whether a marker run ended right there
        self.chain = False
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
        return text

    def _checked(self, body: str) -> str:
        numbers = marker_numbers(body)
        good = [n for n in numbers if n in self.valid]
        self.dropped.extend(n for n in numbers if n not in self.valid)
        return "".join(f"[{n}]" for n in good)
