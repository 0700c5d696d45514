"""What a citation marker is, in one place: ``[n]`` or ``[n, m]``, standing free, never attached to a word.

A run of markers (``[2][3]``) counts only when it is not glued to a word, a closing parenthesis or bracket, so
a document's code (``arr[0]``, ``pair[1]``, ``matrix[1][2]``, ``f(x)[0]``) is text, never a citation: an
answer that quotes it keeps it as written. Each number has at most 6 digits; a longer one is text and is never
parsed (``[`` + 5,000 digits + ``]`` cannot raise).
"""

from __future__ import annotations

import re

from ragloop.text.safety import bounded_int

__all__ = ["GLUED", "MARKER", "MARKER_RUN", "MAX_MARKER_CHARS", "is_marker", "marker_numbers", "strip_markers"]

#: Longest marker (characters); a longer bracketed run of numbers is text.
MAX_MARKER_CHARS = 40
#: One marker; group 1 is its inside (``"1, 2"``).
MARKER = re.compile(r"\[(\d{1,6}(?:\s*,\s*\d{1,6})*)\]")
#: A run of markers that stands free (not right after a word character, ``)`` or ``]``).
MARKER_RUN = re.compile(r"(?<![\w)\]])(?:\[\d{1,6}(?:\s*,\s*\d{1,6})*\])+")
#: Characters after which a ``[`` is an index or a call, not a citation.
GLUED = re.compile(r"[\w)\]]")
_MARKER_RUN_AND_SPACE = re.compile(r"\s*" + MARKER_RUN.pattern)


def is_marker(text: str) -> bool:
    """True when ``text`` is one whole marker of at most :data:`MAX_MARKER_CHARS` characters."""
    return len(text) <= MAX_MARKER_CHARS and MARKER.fullmatch(text) is not None


def marker_numbers(inside: str) -> list[int]:
    """The numbers of a marker's inside (``"1, 2"`` → ``[1, 2]``); parts that are not numbers are left out."""
    return [n for n in (bounded_int(part, 6) for part in inside.split(",")) if n is not None]


def strip_markers(text: str) -> str:
    """``text`` without its free-standing marker runs (and the space before them); code brackets stay."""
    return _MARKER_RUN_AND_SPACE.sub("", text)
