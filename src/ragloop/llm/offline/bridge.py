"""The offline bridger: a second-hop query for multi-hop questions.

A question like "What government position was held by the woman who portrayed Corliss Archer in the film
Kiss and Tell?" is answered by two passages: the first hop (the film, which names Shirley Temple) and the
second (Shirley Temple, which names the position). The first search finds only the film; every query is then
``enough`` and nothing asks for the second passage. The bridger notices that the relevant context leaves key
terms of the question uncovered ("government", "position") and builds a follow-up query from the *bridge
entities* of the relevant passages — names they mention that the question does not — plus those uncovered
terms: "Shirley Temple government position held woman".

Entities are runs of capitalised words; common capitalised words (nationalities, "New", "The") are dropped by
requiring a word of the entity to be rare in the index (IDF at least ``min_idf_ratio`` of the highest
possible IDF). Only the first relevant passage is read (``passages``): the entity the first hop names, not a
name that recurs across weaker passages. ``passages=1`` and ``min_missing_share=0.15`` were chosen on the
tuning half of HotpotQA dev200 (``benchmarks/bench_quality.py --half tuning``); the figures quoted in the README
come from the other half.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence

from attrs import frozen

from ragloop.text.novelty import is_near_duplicate
from ragloop.text.terms import STOPWORDS, CorpusStats, key_terms
from ragloop.usage import LLMCall, record_call

__all__ = ["OfflineBridger", "bridge_entities", "bridges_to", "uncovered_terms"]

_ENTITY = re.compile(r"\b[A-Z][\w'’.-]*(?:\s+(?:(?:of|the|and|de|von|van|la|du)\s+)?[A-Z][\w'’.-]*){0,4}")


def bridges_to(name: str, missing: Sequence[str], stats: CorpusStats) -> bool:
    """Whether a bridge entity leads anywhere the question still asks about: some chunk holds both its rarest
    word and one of the ``missing`` terms (a heading word such as "Tamper", or "IdP Certificate" for a question
    about API keys, shares no chunk with what is missing, and a hop with it adds off-topic blocks)."""
    terms = key_terms(name)
    if not terms or not missing:
        return False
    rarest = max(terms, key=lambda t: stats.idf(t.stem)).stem
    return any(stats.cooccurrence(rarest, m) > 0 for m in missing)


def uncovered_terms(question: str, texts: Sequence[str], stats: CorpusStats) -> tuple[list[str], float]:
    """The question's key terms that none of ``texts`` contains but the index does (surface form, in order),
    and their share of the question's IDF mass."""
    covered = {t.stem for text in texts for t in key_terms(text)}
    terms = key_terms(question)
    total = sum(stats.idf(t.stem) for t in terms) or 1.0
    missing = [t for t in terms if t.stem not in covered and stats.doc_freq(t.stem) > 0]
    return [t.surface for t in missing], sum(stats.idf(t.stem) for t in missing) / total


def bridge_entities(question: str, texts: Sequence[str], stats: CorpusStats, *, min_idf: float) -> list[str]:
    """Names the texts mention and the question does not, most mentioned first (ties: first seen)."""
    asked = {w.lower() for w in re.findall(r"\w+", question)}
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    offset = 0
    for text in texts:
        for m in _ENTITY.finditer(text):
            name = m.group(0).strip(" .")
            words = re.findall(r"\w+", name)
            if not words or (len(words) == 1 and (words[0].lower() in STOPWORDS or len(name) < 3)):
                continue
            if all(w.lower() in asked for w in words):
                continue
            terms = key_terms(name)
            if not terms or max(stats.idf(t.stem) for t in terms) < min_idf:
                continue
            counts[name] = counts.get(name, 0) + 1
            first.setdefault(name, offset + m.start())
        offset += len(text) + 1
    return sorted(counts, key=lambda n: (-counts[n], first[n]))


@frozen
class OfflineBridger:
    """Builds a second-hop query when the relevant context leaves part of the question uncovered.

    Attributes:
        stats: Corpus statistics of the index.
        entities: Bridge entities put in a follow-up query.
        min_idf_ratio: An entity needs a word at least this rare, as a share of the highest IDF (``ln N``).
        min_missing_share: Hop only when the uncovered terms carry at least this share of the question's
            IDF mass (one stray word such as "compare" does not make a question multi-hop).
        threshold: Jaccard similarity at or above which a follow-up repeats a tried query.
        passages: Only the first this many relevant passages (best first) are read for bridge entities: the
            entity the first hop names, not a name that recurs across weaker passages.
        check_bridge: Keep only the bridge entities that share a chunk with a term the question still misses
            (:func:`bridges_to`); none left, no hop.
    """

    stats: CorpusStats
    entities: int = 2
    min_idf_ratio: float = 0.45
    min_missing_share: float = 0.15
    threshold: float = 0.6
    passages: int = 1
    check_bridge: bool = True

    def follow_up_sync(self, question: str, found: Sequence[str], tried: Sequence[str]) -> str | None:
        """The follow-up query, or ``None`` when the context covers the question or no bridge exists."""
        found = list(found)[: self.passages]
        missing, share = uncovered_terms(question, found, self.stats)
        if not missing or not found or share < self.min_missing_share:
            return None
        min_idf = self.min_idf_ratio * math.log(max(self.stats.n_docs, 2))
        names = bridge_entities(question, found, self.stats, min_idf=min_idf)
        if self.check_bridge:
            gaps = [t.stem for t in key_terms(" ".join(missing))]
            names = [n for n in names if bridges_to(n, gaps, self.stats)]
        names = names[: self.entities]
        if not names:
            return None
        query = " ".join([*names, *missing])
        return None if is_near_duplicate(query, tried, threshold=self.threshold) else query

    async def follow_up(self, question: str, found: Sequence[str], tried: Sequence[str]) -> str | None:
        """See :meth:`follow_up_sync`."""
        start = time.perf_counter()
        try:
            return self.follow_up_sync(question, found, tried)
        finally:
            record_call(LLMCall(judge="hop", model="offline", seconds=time.perf_counter() - start))
