"""What a turn's passages say about its question: the terms none mentions, and the values cited pages disagree on.

Both run in the turn log's writer thread, never in the turn. They are lexical and offline on purpose: a docs team
reads the evidence in the report ("webhooks.md says 20 endpoints, webhooks-v1.md says 50"), so the rule must be
one a person can check by eye.

- :func:`unfound_terms`: the question's key terms (stemmed) that appear in none of the passages — the words the
  knowledge base has nothing about.
- :func:`conflicts`: a *fact* is a number followed by the words it counts (``20 webhook endpoints``,
  ``$19 per seat``); two cited pages conflict on a term of the question when each states values for it and the
  two sets of values have none in common.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from ragloop.text.terms import STOPWORDS, key_terms, stem, tokenize
from ragloop.turnlog._row import Conflict

__all__ = ["conflicts", "facts", "unfound_terms"]

_MARKUP = re.compile(r"[*`]+")
_FACT = re.compile(
    r"(?<![\w.,$€£-])(?P<cur>[$€£])?(?P<num>\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?P<unit>%|[ \t]?(?i:k|gb|mb|tb)\b)?"
    r"[ \t]+(?P<words>[A-Za-z][\w-]*(?:[ \t]+[A-Za-z][\w-]*){0,2})"
)
#: Words after a number that belong to the number, not to what it counts.
_SKIP = STOPWORDS | {"per", "up", "times", "x"}


@functools.lru_cache(maxsize=65_536)
def _stem(token: str) -> str:
    return stem(token)


def unfound_terms(question: str, texts: Iterable[str]) -> tuple[str, ...]:
    """The question's key terms (as written, lower-cased) whose stem appears in none of ``texts``."""
    seen: set[str] = set()
    for text in texts:
        seen.update(_stem(t) for t in tokenize(text))
    return tuple(t.surface for t in key_terms(question) if t.stem not in seen)


def facts(text: str) -> dict[str, set[str]]:
    """Stemmed term → the values ``text`` states for it (``20 webhook endpoints`` → webhook, endpoint: {"20"})."""
    out: dict[str, set[str]] = {}
    for m in _FACT.finditer(_MARKUP.sub("", text)):
        value = (m.group("cur") or "") + m.group("num").replace(",", "") + (m.group("unit") or "").strip().lower()
        words = [w.lower() for w in m.group("words").split()]
        content = [w for w in words if w not in _SKIP][:2]
        for word in content:
            out.setdefault(_stem(word), set()).add(value)
    return out


def conflicts(question_terms: Iterable[str], passages: Sequence[tuple[str, str]]) -> tuple[Conflict, ...]:
    """Terms of the question on which two cited pages state values with none in common.

    Args:
        question_terms: The question's key-term stems.
        passages: ``(source, text)`` of the cited passages (several per source are merged).
    """
    wanted = set(question_terms)
    by_source: dict[str, dict[str, set[str]]] = {}
    for source, text in passages:
        mine = by_source.setdefault(source, {})
        for term, values in facts(text).items():
            if term in wanted:
                mine.setdefault(term, set()).update(values)
    found: list[Conflict] = []
    seen: set[tuple[tuple[str, tuple[str, ...]], ...]] = set()
    for term in sorted({t for stated_ in by_source.values() for t in stated_}):
        stated = sorted((source, frozenset(f[term])) for source, f in by_source.items() if term in f)
        disjoint = any(a[1].isdisjoint(b[1]) for i, a in enumerate(stated) for b in stated[i + 1 :])
        if not disjoint:
            continue
        pairs = tuple((source, tuple(sorted(v))) for source, v in stated)
        if pairs not in seen:  # "20 webhook endpoints" states one conflict, not one per word
            seen.add(pairs)
            found.append(Conflict(term, pairs))
    return tuple(found)
