"""Offline judges: deterministic, no model, no network, built from classic IR technique.

The embedded default behind every judgment seam (:mod:`ragloop.llm.protocols`):

- :class:`OfflineDecider` — small talk, multi-topic splitting, pronoun resolution, glossary expansion.
- :class:`OfflineGrader` — IDF-weighted key-term coverage and retrieval signals, calibrated thresholds, and the
  identifier rule (:func:`ids_conflict`).
- :class:`OfflineRewriter` — different-angle queries from corpus term association, never repeating a tried one.
- :class:`OfflineAnswerer` — extractive, cited answers with honest wording for partial and empty context.

:class:`CorpusStats` (built once per index with :meth:`CorpusStats.from_texts`) gives them IDF, term
association and a mined glossary. The pure helpers in :mod:`.ids` and :mod:`.novelty` are used by the nodes too.
Importing this package does not import numpy; building :class:`CorpusStats` does.
"""

from __future__ import annotations

from ragloop.llm.offline.answer import OfflineAnswerer
from ragloop.llm.offline.decide import OfflineDecider
from ragloop.llm.offline.grade import Calibration, OfflineGrader
from ragloop.llm.offline.ids import extract_ids, id_matches, ids_conflict, normalise_id
from ragloop.llm.offline.novelty import is_near_duplicate, normalised_terms
from ragloop.llm.offline.rewrite import OfflineRewriter
from ragloop.llm.offline.terms import CorpusStats, mine_glossary

__all__ = [
    "Calibration",
    "CorpusStats",
    "OfflineAnswerer",
    "OfflineDecider",
    "OfflineGrader",
    "OfflineRewriter",
    "extract_ids",
    "id_matches",
    "ids_conflict",
    "is_near_duplicate",
    "mine_glossary",
    "normalise_id",
    "normalised_terms",
]
