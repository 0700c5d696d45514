"""Text analysis shared by every layer above: tokens, stopwords, stems, term statistics, ids, novelty.

A leaf package: it imports nothing from ragloop, so BM25 (:mod:`ragloop.retrievers.bm25`), the live sources,
the offline judges and the nodes all analyse text the same way.

- :mod:`.terms` — :func:`tokenize`, :data:`STOPWORDS`, :func:`stem`, :func:`key_terms`, :class:`CorpusStats`
  (document frequencies, IDF, term association) and glossary mining.
- :mod:`.ids` — exact identifiers (tickets, error codes, versions) and the exact-id rule.
- :mod:`.novelty` — is a query new, or a near-duplicate of one already tried? (and :func:`content_key`, what two
  copies of one text share)

numpy loads only when :class:`CorpusStats` is built.
"""

from __future__ import annotations

from ragloop.text.ids import IdKind, extract_ids, id_matches, ids_conflict, missing_ids, normalise_id
from ragloop.text.novelty import content_key, is_near_duplicate, normalised_terms, term_overlap
from ragloop.text.terms import (
    STOPWORDS,
    CorpusStats,
    KeyTerm,
    content_words,
    has_snowball,
    key_terms,
    merge_glossary,
    mine_glossary,
    stem,
    tokenize,
)

__all__ = [
    "STOPWORDS",
    "CorpusStats",
    "IdKind",
    "KeyTerm",
    "content_key",
    "content_words",
    "extract_ids",
    "has_snowball",
    "id_matches",
    "ids_conflict",
    "is_near_duplicate",
    "key_terms",
    "merge_glossary",
    "mine_glossary",
    "missing_ids",
    "normalise_id",
    "normalised_terms",
    "stem",
    "term_overlap",
    "tokenize",
]
