"""Offline judges: deterministic, no model, no network, built from classic IR technique.

The embedded default behind every judgment seam (:mod:`ragloop.llm.protocols`):

- :class:`OfflineDecider` — small talk, multi-topic splitting, pronoun resolution, glossary expansion.
- :class:`OfflineGrader` — IDF-weighted key-term coverage and retrieval signals, calibrated thresholds, and the
  identifier rule (:func:`ragloop.text.ids_conflict`).
- :class:`OfflineRewriter` — different-angle queries from corpus term association, never repeating a tried one.
- :class:`OfflineAnswerer` — extractive, cited answers with honest wording for partial and empty context.
- :class:`OfflineBridger` — bridge entities for a second-hop search.

They share the text analysis of :mod:`ragloop.text` (tokenizer, stemmer, :class:`~ragloop.text.CorpusStats`).
Each judge loads on first use: importing this package imports none of them, nor numpy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragloop.llm.offline.answer import OfflineAnswerer
    from ragloop.llm.offline.bridge import OfflineBridger
    from ragloop.llm.offline.decide import OfflineDecider
    from ragloop.llm.offline.grade import Calibration, OfflineGrader
    from ragloop.llm.offline.rewrite import OfflineRewriter

_LAZY = {
    "Calibration": "ragloop.llm.offline.grade",
    "OfflineAnswerer": "ragloop.llm.offline.answer",
    "OfflineBridger": "ragloop.llm.offline.bridge",
    "OfflineDecider": "ragloop.llm.offline.decide",
    "OfflineGrader": "ragloop.llm.offline.grade",
    "OfflineRewriter": "ragloop.llm.offline.rewrite",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ragloop.llm.offline' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["Calibration", "OfflineAnswerer", "OfflineBridger", "OfflineDecider", "OfflineGrader", "OfflineRewriter"]
