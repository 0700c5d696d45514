"""MiniLM's WordPiece tokenizer: token spans for chunks sized in the embedder's own tokens (no model needed).

The tokenizer file ships in ``ragloop/retrievers/assets``; only the ``tokenizers`` package is required, so
chunking counts MiniLM's tokens even where ONNX Runtime is not installed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

__all__ = ["WordPieceTokens", "minilm_tokenizer", "tokenizer_asset"]

_TOKENIZER_ASSET = "minilm-tokenizer.json"


class WordPieceTokens:
    """MiniLM's WordPiece tokenizer as a :class:`~ragloop.retrievers.ingest.Tokenizer`: token spans without
    ``[CLS]``/``[SEP]`` (:attr:`special_tokens` counts those), no truncation.

    Args:
        path: The ``tokenizer.json``.
    """

    special_tokens = 2
    #: Characters per piece a long text is tokenised in (see :meth:`token_spans`).
    segment_chars = 4096

    def __init__(self, path: Path) -> None:
        import tokenizers

        self._tok = tokenizers.Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self._tok.no_padding()
        self._lock = threading.Lock()

    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """For each text, the character span of each of its tokens.

        A text longer than :attr:`segment_chars` is tokenised in pieces cut just before an ASCII space or
        punctuation character, where BERT's pre-tokeniser splits anyway, so the tokens are the same as the whole
        text's (a property test checks it); one huge string is 2-3 times slower to tokenise than its pieces.
        """
        pieces: list[str] = []
        starts: list[list[int]] = []
        for text in texts:
            cuts = _segments(text, self.segment_chars)
            starts.append(cuts[:-1])
            pieces.extend(text[a:b] for a, b in itertools.pairwise(cuts))
        with self._lock:
            encs = self._tok.encode_batch(pieces, add_special_tokens=False) if pieces else []
        out: list[list[tuple[int, int]]] = []
        at = 0
        for offsets in starts:
            spans: list[tuple[int, int]] = []
            for start in offsets:
                spans.extend((start + a, start + b) for a, b in encs[at].offsets)
                at += 1
            out.append(spans)
        return out


#: Characters BERT's pre-tokeniser splits before: the whitespace its normaliser keeps and ASCII punctuation
#: (never a combining mark or a control character it removes, so normalisation cannot join across a cut).
_SPLIT_BEFORE = frozenset(" \t\n\r!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _segments(text: str, size: int) -> list[int]:
    """Cut positions ``[0, …, len(text)]`` splitting ``text`` into pieces of about ``size`` characters, each cut
    just before a character of :data:`_SPLIT_BEFORE` (a stretch without one stays whole)."""
    cuts = [0]
    while len(text) - cuts[-1] > size:
        target = cuts[-1] + size
        cut = next((i for i in range(target, cuts[-1], -1) if text[i] in _SPLIT_BEFORE), None)
        if cut is None:
            cut = next((i for i in range(target + 1, len(text)) if text[i] in _SPLIT_BEFORE), len(text))
        if cut >= len(text):
            break
        cuts.append(cut)
    cuts.append(len(text))
    return cuts


def tokenizer_asset() -> Path:
    """The path of MiniLM's ``tokenizer.json`` shipped with ragloop."""
    return Path(str(resources.files("ragloop.retrievers").joinpath("assets", _TOKENIZER_ASSET)))


@lru_cache(maxsize=1)
def minilm_tokenizer() -> WordPieceTokens | None:
    """MiniLM's tokenizer when the ``tokenizers`` package is installed (no model needed), else ``None``."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return None
    return WordPieceTokens(tokenizer_asset())
