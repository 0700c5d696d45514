"""Is a query new? Pure functions over normalised term sets, and the key two copies of one text share.

The offline rewriter checks its own output with :func:`is_near_duplicate`; the rewrite node uses it to reject a judge's
rewrite that repeats a query already tried this turn (and adds embedding cosine when it has an embedder).
:func:`content_key` is what retrieve merges copies of one chunk by and decide drops repeated queries by.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ragloop.text.terms import key_terms

__all__ = ["content_key", "is_near_duplicate", "normalised_terms", "term_overlap"]

_SPACE = re.compile(r"\W+", re.UNICODE)


def content_key(text: str) -> str:
    """The normalised content two copies of one chunk share: case-folded words, single-spaced."""
    return _SPACE.sub(" ", text.casefold()).strip()


def normalised_terms(query: str) -> frozenset[str]:
    """The query's content terms: lower-cased, stopwords dropped, stemmed; identifiers kept whole."""
    return frozenset(t.stem for t in key_terms(query))


def term_overlap(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two term sets (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def is_near_duplicate(query: str, tried: Iterable[str], *, threshold: float = 0.6) -> bool:
    """True when ``query`` repeats a tried query in substance.

    A query is a near-duplicate of a tried one when their normalised term sets are identical, their Jaccard
    similarity reaches ``threshold``, or the query's terms are a subset of the tried query's (it adds no term:
    searching "sso" after "sso setup okta" finds nothing new). A query with no content terms is a duplicate
    of anything tried, since it cannot search from a new angle.

    Args:
        query: The candidate query.
        tried: Queries already tried this turn.
        threshold: Jaccard similarity at or above which two queries count as the same.
    """
    terms = normalised_terms(query)
    for other in tried:
        seen = normalised_terms(other)
        if terms <= seen or term_overlap(terms, seen) >= threshold:
            return True
    return False
