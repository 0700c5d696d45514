"""Tests for ragloop.retrievers._wordpiece: MiniLM's tokenizer, token spans of long texts cut in pieces."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ragloop.retrievers._wordpiece import minilm_tokenizer, tokenizer_asset

#: Characters that stress a cut: letters, accents and combining marks, CJK (split apart by the normaliser),
#: control characters it drops (a cut before one would split a word), every kind of space, punctuation.
_TRICKY = st.sampled_from(list("abé\u0301\u0308中\x00\x0b\x7f \t\n\u00a0\u3000.[`#-9"))


class TestWordPieceTokens:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.text(_TRICKY, max_size=40), max_size=4), st.integers(1, 6))
    @example(["a\u0301b x\x00y z\x0bw 中文"], 1)
    def test_pieces_give_the_whole_texts_tokens(self, texts: list[str], size: int) -> None:
        """Tokenised in pieces of ``size`` characters, every text gets exactly the spans the whole text gets."""
        tokenizer = minilm_tokenizer()
        assert tokenizer is not None
        whole = [list(e.offsets) for e in tokenizer._tok.encode_batch(texts, add_special_tokens=False)]
        tokenizer.segment_chars = size
        try:
            assert tokenizer.token_spans(texts) == whole
        finally:
            del tokenizer.segment_chars

    def test_a_megabyte_word_stays_whole(self) -> None:
        """A text with nowhere to cut (one 1 MiB word) is tokenised as one piece, still exactly."""
        tokenizer = minilm_tokenizer()
        assert tokenizer is not None
        assert tokenizer.token_spans(["x" * (1 << 20), "a b"]) == [[(0, 1 << 20)], [(0, 1), (2, 3)]]

    def test_the_tokenizer_file_ships_with_ragloop(self) -> None:
        """The tokenizer needs no model download: its file is in the package."""
        assert tokenizer_asset().is_file()
