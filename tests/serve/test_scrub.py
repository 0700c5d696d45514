"""The text scrubber: escape sequences and control characters out, whole, however the text is split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.serve._scrub import TextScrubber, scrub

#: Pieces that make escape sequences (and near misses) when strung together.
_PIECES = st.sampled_from(
    ["\x1b", "[", "]", "31m", "0;title", "8;;https://x.example", "\x07", "\x9b", "\x9d", "\x9c", "\\", "P", "(",
     "B", "?25l", "a", "ü", "语", "\n", "\r", "\t", "\x00", "\x7f", "\x85", " ", "\u202e", "\u2066", "\u2069",
     "\u200d"]
)  # fmt: skip
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40).map("".join)


def _controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F or c in _BIDI]


_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


class TestScrub:
    @pytest.mark.parametrize(
        ("raw", "clean"),
        [
            ("\x1b[31mred\x1b[0m text", "red text"),  # CSI colours
            ("\x1b[2J\x1b[Hcleared", "cleared"),  # clear screen, cursor home
            ("see \x1b]8;;javascript:alert(1)\x07this\x1b]8;;\x07 link", "see this link"),  # OSC 8 hyperlink (BEL)
            ("\x1b]52;c;cm0gLXJmIH4=\x1b\\copied", "copied"),  # OSC 52 clipboard write (ST)
            ("\x1b]0;window title\x07x", "x"),
            ("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel"),  # DCS
            ("\x9b31mC1\x9d0;t\x9c!", "C1!"),  # 8-bit CSI and OSC
            ("\x1b(Bcharset", "charset"),  # ESC with an intermediate
            ("\x1bcreset", "reset"),  # two-character sequence
            ("over\rwrite", "overwrite"),  # carriage return
            ("nul\x00 del\x7f nel\x85", "nul del nel"),
            ("keeps\nnewlines\tand tabs, ü, 语, 🔑", "keeps\nnewlines\tand tabs, ü, 语, 🔑"),
            ("dangling \x1b", "dangling "),
            ("invoice\u202egpj.exe", "invoicegpj.exe"),  # Trojan Source: a right-to-left override
            ("\u2066isolated\u2069 \u202aembedded\u202c \u202blr\u202d", "isolated embedded lr"),
            ("zero\u200dwidth joiner stays", "zero\u200dwidth joiner stays"),  # emoji sequences need it
        ],
    )
    def test_examples(self, raw: str, clean: str) -> None:
        """Each kind of sequence goes whole; printable text, newlines and tabs stay."""
        assert scrub(raw) == clean

    @given(_TEXT)
    def test_no_control_character_survives(self, text: str) -> None:
        """Whatever goes in, nothing but printable characters, newlines and tabs comes out; twice is once."""
        out = scrub(text)
        assert not _controls(out)
        assert scrub(out) == out

    @given(_TEXT, st.lists(st.integers(0, 200), max_size=8))
    def test_splitting_the_text_changes_nothing(self, text: str, cuts: list[int]) -> None:
        """Fed as streamed tokens cut anywhere (mid-sequence too), the output is the scrubbed whole text."""
        points = sorted({min(c, len(text)) for c in cuts})
        pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
        scrubber = TextScrubber()
        assert "".join(scrubber.feed(p) for p in pieces) == scrub(text)

    def test_a_sequence_split_across_tokens_is_removed(self) -> None:
        """An OSC hyperlink cut into four tokens leaves none of its bytes in any token."""
        scrubber = TextScrubber()
        out = [scrubber.feed(t) for t in ("click \x1b]8", ";;javascript:ale", "rt(1)\x07here", "\x1b]8;;\x07.")]
        assert out == ["click ", "", "here", "."]

    def test_an_unterminated_string_is_bounded(self) -> None:
        """An OSC that never ends swallows at most 4,096 characters, not the rest of the answer."""
        out = scrub("\x1b]0;" + "x" * 5000 + " the answer")
        assert out.endswith(" the answer") and len(out) < 1000
