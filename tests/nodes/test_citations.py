"""nodes._citations: markers are checked before they stream, and the stream agrees with the final text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.nodes._citations import CitationGate
from ragloop.nodes.answer import resolve_citations
from ragloop.state import ContextBlock

BLOCKS = tuple(ContextBlock(n, f"block {n}", f"s{n}.md") for n in (1, 2, 3))


def gated(pieces: list[str]) -> str:
    gate = CitationGate(b.n for b in BLOCKS)
    return "".join(gate.feed(p) for p in pieces) + gate.flush()


class TestCitationGate:
    def test_unknown_marker_split_across_tokens_never_shows(self) -> None:
        """``[4`` + ``2]`` is held, then dropped; ``[1, 9]`` keeps 1."""
        gate = CitationGate([1, 2])
        assert gate.feed("Yes [") == "Yes " and gate.feed("4") == "" and gate.feed("2] and [1, 9].") == " and [1]."
        assert gate.dropped == [42, 9]

    def test_code_brackets_are_text(self) -> None:
        """``arr[0]``, ``pair[1]``, ``matrix[1][2]`` and ``f(x)[3]`` stream as written."""
        text = "Use arr[0], sort(key=lambda pair: pair[1]), matrix[1][2] and f(x)[3] [2]."
        assert gated([text]) == text

    def test_giant_number_is_text(self) -> None:
        """``[`` + 5,000 digits + ``]`` streams as text and never raises."""
        text = "x [" + "9" * 5000 + "] y"
        assert gated([text[i : i + 7] for i in range(0, len(text), 7)]) == text

    @given(
        st.lists(
            st.sampled_from(["[", "]", "1", "2", "9", "42", ",", " ", "a", "(", ")", ".", "[1]", "[4]", "[2, 7]"]),
            max_size=30,
        ),
        st.lists(st.integers(1, 6), max_size=30),
    )
    def test_stream_agrees_with_final_resolution(self, parts: list[str], cuts: list[int]) -> None:
        """Whatever the text and however it is split into tokens, what streams is what the reply resolves to."""
        text = "".join(parts)
        pieces, i = [], 0
        for c in cuts:
            pieces.append(text[i : i + c])
            i += c
        pieces.append(text[i:])
        assert gated(pieces) == resolve_citations(text, BLOCKS)[0]
