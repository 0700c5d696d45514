"""Citation markers checked before they are streamed: a token stream never shows ``[9]`` for a missing block.

:class:`CitationGate` sits between an answerer's tokens and the user. Text that may be the start of a marker
(``[`` followed by digits, commas and spaces) is held back until the marker closes; a closed marker keeps only
the block numbers that exist, and vanishes when none do. Anything else passes at once, so a ``[`` that turns
out not to be a marker (``arr[i]``, a link) costs at most :data:`MAX_MARKER_CHARS` characters of delay.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ragloop.text.safety import bounded_int

__all__ = ["MARKER", "MAX_MARKER_CHARS", "CitationGate", "is_marker", "marker_numbers"]

#: Longest text held back as a possible marker (``[12, 13, 14]`` fits easily); a longer one is text.
MAX_MARKER_CHARS = 40
#: A citation marker: ``[n]`` or ``[n, m, …]``, each number at most 6 digits (longer is text, never parsed).
MARKER = re.compile(r"\[(\d{1,6}(?:\s*,\s*\d{1,6})*)\]")
_INSIDE = re.compile(r"[\d,\s]*")


def is_marker(text: str) -> bool:
    """True when ``text`` is one whole citation marker of at most :data:`MAX_MARKER_CHARS` characters."""
    return len(text) <= MAX_MARKER_CHARS and MARKER.fullmatch(text) is not None


def marker_numbers(inside: str) -> list[int]:
    """The numbers of a marker's inside (``"1, 2"`` → ``[1, 2]``); parts that are not numbers are left out."""
    return [n for n in (bounded_int(part, 6) for part in inside.split(",")) if n is not None]


class CitationGate:
    """Holds back possible citation markers until they close, and drops the numbers that name no block.

    Args:
        valid: The block numbers that exist.
    """

    def __init__(self, valid: Iterable[int]) -> None:
        self.valid = frozenset(valid)
        self.held = ""
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
                out.append(text)
                break
            out.append(text[:start])
            text = text[start:]
            rest = text[1:]
            inside = _INSIDE.match(rest)
            body = inside.group() if inside else ""
            after = rest[len(body) :]
            if not after:  # the marker may go on in the next token
                if len(body) + 1 > MAX_MARKER_CHARS:
                    out.append(text[: len(body) + 1])
                    text = ""
                else:
                    self.held = text
                break
            if after[0] == "]" and is_marker(text[: len(body) + 2]):
                out.append(self._checked(body))
                text = after[1:]
            else:  # not a marker: show the bracket and go on after it
                out.append("[")
                text = rest
        return "".join(out)

    def flush(self) -> str:
        """What is still held back (an unclosed ``[12`` is text, not a marker)."""
        held, self.held = self.held, ""
        return held

    def _checked(self, body: str) -> str:
        numbers = marker_numbers(body)
        good = [n for n in numbers if n in self.valid]
        self.dropped.extend(n for n in numbers if n not in self.valid)
        return "".join(f"[{n}]" for n in dict.fromkeys(good))
