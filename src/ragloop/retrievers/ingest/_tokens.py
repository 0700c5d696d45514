"""Counting text in an embedder's own tokens, for chunks that the embedder never truncates.

A :class:`Tokenizer` returns each token's character span in the text (special tokens such as ``[CLS]`` left
out), so the chunker can both count and cut at a token boundary. :class:`~ragloop.retrievers.embed.
MiniLMEmbedder` is one (its WordPiece tokenizer); :func:`default_tokenizer` gives the same tokenizer when the
``tokenizers`` package is installed (no model needed), else :class:`WordTokens`, an estimate for the
lexical embedders that have no token limit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Tokenizer", "WordTokens", "default_tokenizer"]

_PIECE = re.compile(r"\w{1,4}|[^\w\s]")


@runtime_checkable
class Tokenizer(Protocol):
    """Splits texts into tokens the way an embedder does."""

    #: Tokens the embedder adds around every text (``[CLS]`` and ``[SEP]``: 2).
    special_tokens: int

    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """For each text, the ``(start, end)`` character span of each of its tokens, in order."""
        ...


class WordTokens:
    """An estimate for embedders without a tokenizer: every run of up to four word characters, and every
    punctuation character, is a token (WordPiece splits rare words into pieces; this counts them high)."""

    special_tokens = 2

    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """See :meth:`Tokenizer.token_spans`."""
        return [[m.span() for m in _PIECE.finditer(text)] for text in texts]


def default_tokenizer() -> Tokenizer:
    """MiniLM's WordPiece tokenizer when ``tokenizers`` is installed, else :class:`WordTokens`."""
    from ragloop.retrievers.embed import minilm_tokenizer

    found = minilm_tokenizer()
    return found if found is not None else WordTokens()
