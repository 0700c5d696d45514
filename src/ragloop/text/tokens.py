"""Counting a prompt's tokens: the model's own tokenizer when the application has it, an estimate otherwise.

A prompt budget is only as good as its count. When the application knows the model's tokenizer (a Hugging Face
``tokenizer.json`` published with the model), :class:`TokenizersCounter` counts exactly what that model sees.
The tokenizer ragloop ships for its MiniLM embedder is *not* a chat model's tokenizer and is never used here.
Otherwise :class:`CharEstimate` divides characters by a fixed ratio. Its default, 3.2 characters per token, is
what SmolLM2's own tokenizer (through llama.cpp's ``/tokenize``) measured over the sample knowledge base's
chunks, the judges' fenced prompts and chat messages together (``benchmarks/calibrate_tokens.py``, results in
``benchmarks/results/token_calibration.json``): plain chunk text runs at about 3.7 characters per token, so for
passages and messages the estimate counts more tokens than there are (safe for a budget), while fenced prompts
(markers, nonces) run near 3.1. Per text the estimate is still off by tens of per cent either way: for a hard
limit, code, non-Latin scripts or another model family, pass the model's tokenizer or your own ratio.
"""

from __future__ import annotations

import math
import os
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

__all__ = ["DEFAULT_CHARS_PER_TOKEN", "CharEstimate", "TokenCounter", "TokenizersCounter"]

#: Characters per token of :class:`CharEstimate` (see the module docstring for where it comes from).
DEFAULT_CHARS_PER_TOKEN = 3.2


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a text for one model (or estimates them)."""

    @property
    def name(self) -> str:
        """What counts: a tokenizer's name, or ``chars/3.2`` for an estimate."""
        ...

    def count(self, text: str) -> int:
        """Tokens in ``text``."""
        ...


def _positive(instance: object, attribute: Any, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must be positive, got {value!r}")


@frozen
class CharEstimate:
    """An estimate: ``ceil(len(text) / chars_per_token)``.

    Attributes:
        chars_per_token: Characters per token (default :data:`DEFAULT_CHARS_PER_TOKEN`, calibrated).
    """

    chars_per_token: float = field(default=DEFAULT_CHARS_PER_TOKEN, validator=_positive)

    @property
    def name(self) -> str:
        """``chars/<ratio>``."""
        return f"chars/{self.chars_per_token:g}"

    def count(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        return math.ceil(len(text) / self.chars_per_token)


class TokenizersCounter:
    """Exact counts with the model's own Hugging Face tokenizer (the ``tokenizers`` library).

    Args:
        tokenizer: A ``tokenizers.Tokenizer`` of the chat model (not the embedder's).
        name: What to call it in records (default ``tokenizer``).
    """

    def __init__(self, tokenizer: Any, name: str = "tokenizer") -> None:
        self._tokenizer = tokenizer
        self._name = name

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenizersCounter:
        """Load a ``tokenizer.json`` published with the model."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(os.fspath(path)), name=os.path.basename(os.fspath(path)))

    @property
    def name(self) -> str:
        """The tokenizer's name."""
        return self._name

    def count(self, text: str) -> int:
        """Tokens of ``text`` (no special tokens added)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)
