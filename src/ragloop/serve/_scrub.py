"""Model and document text made safe to show: control characters and terminal escape sequences removed.

A model (or a document it quotes) can emit bytes that a terminal or a log viewer obeys: ANSI CSI sequences
(``ESC [ 31 m``, cursor moves, screen clears), OSC strings (``ESC ] 8 ; ; url BEL`` hyperlinks, ``ESC ] 52``
clipboard writes, window titles), DCS/APC/PM/SOS strings, C1 controls (U+0080–U+009F, among them the one-character
CSI U+009B and OSC U+009D), carriage returns that overwrite a line, other C0 controls, and the bidirectional
controls (U+202A–U+202E, U+2066–U+2069) that reorder what a reader sees. :class:`TextScrubber` drops all of them
— whole sequences, not just their ``ESC`` — and keeps newlines, tabs and every printable character. It is a state
machine fed piece by piece, so a sequence split across two streamed tokens is still removed whole: scrubbing the
tokens one by one gives exactly the scrubbed whole text (a property test checks it).
"""

from __future__ import annotations

__all__ = ["TextScrubber", "scrub"]

_NORMAL, _ESC, _ESC_INTER, _CSI, _STRING, _STRING_ESC = range(6)
#: Longest escape sequence dropped whole; past it the machine gives up on the sequence (what follows is text).
_MAX_CSI = 64
_MAX_STRING = 4096
_ESC_CHAR = "\x1b"
_BEL = "\x07"
_C1_CSI = "\x9b"
_C1_ST = "\x9c"
_C1_STRINGS = frozenset("\x90\x98\x9d\x9e\x9f")  # DCS, SOS, OSC, PM, APC
_ESC_STRINGS = frozenset("]PX^_")  # OSC, DCS, SOS, PM, APC after ESC


def _control(ch: str) -> bool:
    """A character that is dropped outside a sequence: C0 (but tab and newline), DEL, C1 and the bidirectional
    embedding, override and isolate controls (U+202A–U+202E, U+2066–U+2069), which reorder what a reader sees
    ("Trojan Source": ``\u202e`` makes ``txt.exe`` read as ``exe.txt``)."""
    code = ord(ch)
    return (
        (code < 0x20 and ch not in "\t\n")
        or 0x7F <= code <= 0x9F
        or 0x202A <= code <= 0x202E
        or 0x2066 <= code <= 0x2069
    )


class TextScrubber:
    """Removes escape sequences and control characters from a stream of text pieces (see the module docstring)."""

    def __init__(self) -> None:
        self._state = _NORMAL
        self._length = 0

    def feed(self, text: str) -> str:
        """The printable part of ``text``, given everything fed before (a sequence may span pieces)."""
        out: list[str] = []
        for ch in text:
            self._step(ch, out)
        return "".join(out)

    def _step(self, ch: str, out: list[str]) -> None:
        state = self._state
        if state == _NORMAL:
            self._normal(ch, out)
        elif state in (_ESC, _ESC_INTER):
            self._escape(ch, out)
        elif state == _CSI:
            self._csi(ch, out)
        else:
            self._string(ch, out)

    def _normal(self, ch: str, out: list[str]) -> None:
        if ch == _ESC_CHAR:
            self._state = _ESC
        elif ch == _C1_CSI:
            self._enter(_CSI)
        elif ch in _C1_STRINGS:
            self._enter(_STRING)
        elif not _control(ch):
            out.append(ch)

    def _escape(self, ch: str, out: list[str]) -> None:
        code = ord(ch)
        if self._state == _ESC_INTER:  # ESC ( B and the like: intermediates, then one final character
            if 0x20 <= code <= 0x2F:
                return
            self._state = _NORMAL
            if not 0x30 <= code <= 0x7E:
                self._step(ch, out)
        elif ch == "[":
            self._enter(_CSI)
        elif ch in _ESC_STRINGS:
            self._enter(_STRING)
        elif ch == _ESC_CHAR:
            pass  # ESC ESC: the first one is dropped, the second starts a sequence
        elif 0x20 <= code <= 0x2F:
            self._enter(_ESC_INTER)
        else:
            self._state = _NORMAL  # a two-character sequence (ESC c, ESC 7, ESC =, …) is dropped whole
            if not 0x30 <= code <= 0x7E:
                self._step(ch, out)  # ESC then a control or non-ASCII character: only the ESC goes

    def _csi(self, ch: str, out: list[str]) -> None:
        code = ord(ch)
        self._length += 1
        if 0x40 <= code <= 0x7E:
            self._state = _NORMAL  # the final byte
        elif not (0x20 <= code <= 0x3F and self._length <= _MAX_CSI):  # not a parameter or intermediate
            self._state = _NORMAL
            self._step(ch, out)

    def _string(self, ch: str, out: list[str]) -> None:
        self._length += 1
        if self._state == _STRING_ESC:
            # ESC \ (ST) ends the string; ESC then anything else ends it too and begins a new sequence.
            self._state = _NORMAL if ch == "\\" else _ESC
            if ch != "\\":
                self._step(ch, out)
        elif ch in (_BEL, _C1_ST):
            self._state = _NORMAL
        elif ch == _ESC_CHAR:
            self._state = _STRING_ESC
        elif self._length > _MAX_STRING:
            self._state = _NORMAL
            self._step(ch, out)

    def _enter(self, state: int) -> None:
        self._state = state
        self._length = 0


def scrub(text: str) -> str:
    """``text`` without escape sequences and control characters (newlines and tabs kept)."""
    if text.isprintable():  # the common case: nothing to remove
        return text
    return TextScrubber().feed(text)
