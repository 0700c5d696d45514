"""What a turn's passages say about its question: the terms none mentions, and the values cited pages disagree on.

Both run in the turn log's writer thread, never in the turn. They are lexical and offline on purpose: a docs team
reads the evidence in the report ("webhooks.md says 20 endpoints, webhooks-v1.md says 50"), so the rule must be
one a person can check by eye.

- :func:`unfound_terms`: the question's key terms (stemmed) that appear in none of the passages — the words the
  knowledge base has nothing about.
- :func:`conflicts`: a *fact* is a number followed by the word it counts (``20 webhook endpoints``,
  ``$19 per seat``) in a sentence that holds at least two of the question's terms; two pages the answer rests on
  conflict on a term of the question when each states values of one kind for it (plain numbers, or one currency,
  or one unit) and the two sets of values have none in common.
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
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+|\|")
#: Words after a number that belong to the number, not to what it counts.
_SKIP = STOPWORDS | {"per", "up", "times", "x"}


@functools.lru_cache(maxsize=65_536)
def _stem(token: str) -> str:
    return stem(token)


@functools.lru_cache(maxsize=8_192)
def _profile(text: str) -> tuple[frozenset[str], tuple[tuple[frozenset[str], tuple[tuple[str, str], ...]], ...]]:
    """A passage's stems, and per sentence its stems and facts ``(term, value)``: computed once per passage text.

    Passages are the knowledge base's chunks, so the same few hundred come back turn after turn; the writer
    thread reads them from here instead of tokenizing and stemming each again (about 2 ms a turn before).
    """
    every: set[str] = set()
    sentences = []
    for sentence in _SENTENCE.split(_MARKUP.sub("", text)):
        stems = frozenset(_stem(t) for t in tokenize(sentence))
        every |= stems
        found = []
        for m in _FACT.finditer(sentence):
            cur, unit = m.group("cur") or "", (m.group("unit") or "").strip().lower()
            value = cur + m.group("num").replace(",", "") + unit
            head = next((w.lower() for w in m.group("words").split() if w.lower() not in _SKIP), None)
            if head is not None:  # values of different kinds (20 members, 100 GB) never compare
                found.append((_stem(head) + (f"|{cur}{unit}" if cur or unit else ""), value))
        if found:
            sentences.append((stems, tuple(found)))
    return frozenset(every), tuple(sentences)


def unfound_terms(question: str, texts: Iterable[str]) -> tuple[str, ...]:
    """The question's key terms (as written, lower-cased) whose stem appears in none of ``texts``."""
    terms = key_terms(question)
    missing = {t.stem for t in terms}
    for text in texts:
        missing -= _profile(text)[0]
        if not missing:
            break
    return tuple(t.surface for t in terms if t.stem in missing)


def facts(text: str, question_terms: Iterable[str] | None = None) -> dict[str, set[str]]:
    """Term → the values ``text`` states for it, the term as its stem plus the values' kind (``20 webhook
    endpoints`` → ``webhook``: {"20"}; ``$19 per seat`` → ``seat|$``: {"$19"}).

    The term is the first content word after the number. With ``question_terms`` (stems), a fact counts only
    in a sentence (or table cell) that holds at least two of them, the term included: the sentence is then
    about what the question asks, not a number that happens to share a word with it.
    """
    wanted = set(question_terms) if question_terms is not None else None
    out: dict[str, set[str]] = {}
    for stems, found in _profile(text)[1]:
        if wanted is not None and len(wanted & stems) < 2:
            continue
        for term, value in found:
            out.setdefault(term, set()).add(value)
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
        for term, values in facts(text, wanted).items():
            if term.partition("|")[0] in wanted:
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
            found.append(Conflict(term.partition("|")[0], pairs))
    return tuple(found)
