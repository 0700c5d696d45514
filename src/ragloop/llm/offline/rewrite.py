"""The offline rewriter: a different-angle query from corpus statistics.

Starting from the *original question*'s key terms (not the failed query, which may already have drifted), it
drops every term already tried this turn and adds terms that the corpus associates with the question (pseudo-
relevance feedback, :meth:`CorpusStats.associated`) and that were not tried either. Candidates are checked with
:func:`~ragloop.text.novelty.is_near_duplicate` against every tried query; when no novel candidate
exists it raises :class:`~ragloop.errors.JudgeError` instead of repeating itself, and the rewrite node stops.

Two rules keep rewrites honest:

* A name or identifier of the question that the index does not contain at all ("Salesforce", "Australia",
  a ticket id no page names) cannot be found by any rewrite built from corpus statistics; the rewriter says so
  (``JudgeError``) instead of drifting to a query about something else, and the turn answers with what it has.
  (Unknown ordinary words — "problems", "failing" — are dropped as usual: they are incidental.)
* Identifiers of the question (``E1002``, ``v3.2.0``) are kept in every rewrite: without them the grader would
  judge generic pages against a query that no longer asks about the id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence

from attrs import frozen

from ragloop.errors import JudgeError
from ragloop.text.novelty import is_near_duplicate, normalised_terms
from ragloop.text.terms import CorpusStats, key_terms, stem
from ragloop.usage import LLMCall, record_call

__all__ = ["OfflineRewriter"]


@frozen
class OfflineRewriter:
    """Rewrites a failed query from a new angle using the corpus' term associations.

    Attributes:
        stats: Corpus statistics of the index.
        max_terms: Most terms in a rewritten query.
        expansion: Associated terms added per candidate.
        threshold: Jaccard similarity at or above which a candidate counts as a near-duplicate.
    """

    stats: CorpusStats
    max_terms: int = 6
    expansion: int = 3
    threshold: float = 0.6

    def _candidates(self, question: str, tried_terms: frozenset[str]) -> Iterator[list[str]]:
        """Stem lists to try, best first."""
        by_idf = sorted(key_terms(question), key=lambda t: -self.stats.idf(t.stem))
        q_stems = [t.stem for t in by_idf]
        fresh = [s for s in q_stems if s not in tried_terms]
        related = [
            s for s, _ in self.stats.associated(q_stems, k=self.expansion * 4, exclude=tried_terms | set(q_stems))
        ]
        windows = [related[i : i + self.expansion] for i in range(0, len(related), self.expansion)] or [[]]
        anchor = self._anchor(q_stems)
        for window in windows:
            if fresh:
                yield (fresh + window)[: self.max_terms]
            yield (anchor + window)[: self.max_terms]  # the question's rarest term keeps the topic
            yield window[: self.max_terms]

    def _anchor(self, stems: list[str]) -> list[str]:
        """The question term that keeps the topic: rare, and central to the question.

        Each term the corpus contains scores ``idf(t) · (1 + Σ_u P(u | t))`` over the question's other terms
        ``u`` (document co-occurrence), so "ambulatory" beats a rarer but incidental "inaccurate" in "ambulatory
        blood pressure monitoring is inaccurate". A term the corpus lacks cannot find anything and is skipped.
        """
        known = [s for s in stems if self.stats.doc_freq(s) > 0]
        if not known:
            return stems[:1]

        def score(t: str) -> float:
            df = self.stats.doc_freq(t)
            central = sum(self.stats.cooccurrence(t, u) / df for u in known if u != t)
            return self.stats.idf(t) * (1.0 + central)

        return [max(known, key=score)]

    def rewrite_sync(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """The rewrite, synchronously (what :meth:`rewrite` awaits).

        Raises:
            JudgeError: No query that is new against ``tried`` (and ``failed_query``) can be built.
        """
        all_tried = [failed_query, *tried]
        terms = key_terms(question)
        names = _names(question)
        unknown = [t.surface for t in terms if self.stats.doc_freq(t.stem) == 0 and (_is_id(t.stem) or t.stem in names)]
        if unknown:
            raise JudgeError(
                f"no new angle for {question!r}: {', '.join(unknown)} occur nowhere in the index, "
                "so no rewrite can find them; answer with what was found"
            )
        ids = [t.stem for t in terms if _is_id(t.stem)]
        tried_terms = frozenset().union(*(normalised_terms(q) for q in all_tried)) - set(ids)
        own = {t.stem: t.surface for t in terms}
        for candidate in self._candidates(question, tried_terms):
            stems = ids + [s for s in candidate if s not in ids]
            if not [s for s in stems if s not in ids]:
                continue
            query = " ".join(own.get(s) or self.stats.surface_of(s) for s in stems)
            if not is_near_duplicate(query, all_tried, threshold=self.threshold):
                return query
        raise JudgeError(
            f"no new angle for {question!r}: every candidate repeats a tried query "
            f"({len(all_tried)} tried); stop rewriting and answer with what was found"
        )

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """A new query built from ``question`` that repeats none of ``tried`` (see the module docstring)."""
        start = time.perf_counter()
        error: str | None = None
        try:
            return self.rewrite_sync(question, failed_query, tried)
        except JudgeError as exc:
            error = f"JudgeError: {exc}"
            raise
        finally:
            record_call(LLMCall(judge="rewrite", model="offline", seconds=time.perf_counter() - start, error=error))


def _is_id(stem: str) -> bool:
    """True for identifier tokens (``#1234``, ``e1002``, ``v3.2.0``): they carry digits."""
    return any(ch.isdigit() for ch in stem)


def _names(question: str) -> set[str]:
    """Stems of the capitalised words that do not start a sentence: the names a question is about."""
    out: set[str] = set()
    for sentence in re.split(r"(?<=[.!?])\s+", question):
        words = re.findall(r"[^\W\d_][\w'-]*", sentence)
        out.update(stem(w.lower()) for w in words[1:] if w[0].isupper())
    return out
