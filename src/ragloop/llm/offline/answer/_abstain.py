"""When the passages found do not support an answer: a calibrated abstention instead of quoting near misses.

Two signals, both cheap and offline:

- **Names the knowledge base never mentions.** A capitalised word of the question (not its first word), a
  mixed-case one ("gRPC") or a capitalised one with digits ("S3") that no chunk of the corpus contains, and
  that no capitalised neighbour in the question ties to a known name ("Livesey Hal War Memorial" is a typo of a
  known name, "Trello" is not). A word one edit away from a known word (six letters or more) is taken for a
  typo, not a new name. A question about "Trello" or "Kubernetes" over a corpus that never says either is not
  answered from passages about other things. On a small knowledge base (``meaning_at`` set) a kept passage
  that means the question by its dense cosine overrides this: a customer's "Saturdays" or "tax ID" is the
  page's "weekends" or "VAT number" (MiniLM on ``bench_answers --set small`` and ``small-heldout``, tuning
  data: the three answerable questions with such a word reach 0.48-0.66 on their best chunk, the three
  outside ones with a name — Klarna, PostgreSQL, QuickBooks — at most 0.30, under ``SMALL_MEANING``).
- **Evidence score** = the relevance of the unit the answerer would quote first (its IDF coverage of the
  question, the asked-for value, term proximity) + ``confidence_weight`` × the best hybrid confidence of the
  top passages (which is high only when the lexical and the dense retriever agree). Below ``threshold``
  the answer step abstains.

``confidence_weight=0.5`` and ``threshold=0.62`` were chosen on the tuning halves of
``benchmarks/bench_answers.py`` (the sample knowledge base, the FastAPI docs set and HotpotQA, 138 answerable
questions and 21 outside the corpora): honest-none 0.76 outside with false-none 1.4 % on answerable questions
there (the grader's own ``none`` included); the validation figures are in ``benchmarks/README.md``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence

from attrs import frozen

from ragloop.llm.offline.answer._units import Unit
from ragloop.text.terms import STOPWORDS, CorpusStats, stem, tokenize

__all__ = ["SMALL_MEANING", "SMALL_THRESHOLD", "AbstainRule", "Meant", "unknown_names"]

_WORD = re.compile(r"[A-Za-z0-9][\w'’.-]*\w|[A-Za-z0-9]")
_POSSESSIVE = re.compile(r"['’]s$")
#: The evidence threshold on a knowledge base too small to calibrate on (:meth:`AbstainRule.small`), chosen on
#: the tuning half of ``bench_answers.py --set small``.
SMALL_THRESHOLD = 0.35
#: On a small knowledge base, a kept passage whose dense cosine with the question is at least this supports an
#: answer whatever its term coverage (:attr:`AbstainRule.meaning_at`): MiniLM, both halves of
#: ``bench_answers.py --set small``: the 12 questions outside those knowledge bases at most 0.35 on any top hit.
SMALL_MEANING = 0.40
#: Words this long that are one edit away from a known word are typos, not names.
TYPO_MIN_LETTERS = 6


def _near_known(word: str, stats: CorpusStats) -> bool:
    """One deletion, substitution or insertion away from a word the corpus knows."""
    letters = string.ascii_lowercase
    candidates = {word[:i] + word[i + 1 :] for i in range(len(word))}
    candidates |= {word[:i] + c + word[i + 1 :] for i in range(len(word)) for c in letters}
    candidates |= {word[:i] + c + word[i:] for i in range(len(word) + 1) for c in letters}
    return any(stats.doc_freq(stem(c)) > 0 for c in candidates - {word})


def _known(word: str, stats: CorpusStats) -> bool:
    """Every content part of ``word`` is in the corpus (or it is a likely typo of a word that is). In a hyphenated
    compound only the parts that make it a name count: "CPU-heavy" is the name "CPU" with an ordinary word, and
    a page that never says "heavy" still knows the CPU (the evidence score weighs the ordinary word)."""
    word = _POSSESSIVE.sub("", word)
    pieces = word.split("-")
    named = [p for p in pieces if p[:1].isupper() or any(c.isdigit() for c in p)]
    if len(pieces) > 1 and named and len(named) < len(pieces):
        word = " ".join(named)
    parts = [p for p in tokenize(word) if len(p) > 1 and p not in STOPWORDS]
    if not parts or all(stats.doc_freq(stem(p)) > 0 for p in parts):
        return True
    low = word.lower()
    return len(low) >= TYPO_MIN_LETTERS and low.isalpha() and _near_known(low, stats)


def _name_like(word: str, first: bool) -> bool:
    if len(word) < 2:
        return False
    mixed = any(c.isupper() for c in word[1:]) and any(c.islower() for c in word)
    capital = word[0].isupper()
    return (capital and not first) or mixed or (capital and any(c.isdigit() for c in word))


#: A quoted span of the question that holds a code symbol: a literal value the user supplies (a format string
#: ``'<IHf'``, a pattern ``"[A-Z]+"``, an expression ```x | y```), not a name to look up.
_LITERAL = re.compile(r"""(?<![A-Za-z])(['"`])(?=\S)([^'"`\n]{1,80}?)(?<=\S)\1(?![A-Za-z])""")
_CODE_SYMBOL = re.compile(r"[<>%{}\[\]\\^$*|=~]")


def _without_literals(question: str) -> str:
    return _LITERAL.sub(lambda m: " " if _CODE_SYMBOL.search(m.group(2)) else m.group(0), question)


def unknown_names(question: str, stats: CorpusStats) -> tuple[str, ...]:
    """Names in ``question`` the corpus never mentions (see the module docstring), in order. A quoted literal
    with a code symbol in it (``'<IHf'``: a format string the user supplies) names nothing."""
    words = _WORD.findall(_without_literals(question))
    out: list[str] = []
    for i, word in enumerate(words):
        if not _name_like(word, i == 0) or word.lower() in STOPWORDS or _known(word, stats):
            continue
        neighbours = [words[j] for j in (i - 1, i + 1) if 0 < j < len(words) and words[j][:1].isupper()]
        if any(n.lower() not in STOPWORDS and _known(n, stats) for n in neighbours):
            continue  # part of a known multi-word name
        if word not in out:
            out.append(word)
    return tuple(out)


@frozen
class AbstainRule:
    """The abstention's knobs (see the module docstring).

    Attributes:
        confidence_weight: Weight of the top passages' hybrid confidence in the evidence score.
        threshold: Evidence score below which the answer step abstains.
        top: How many of the best passages' confidences count.
        meaning_at: When set (a small knowledge base), a kept passage whose dense cosine with the question
            (the retriever's ``dense`` score) is at least this supports an answer, whatever the evidence score:
            meaning needs no corpus statistics, and four pages give IDF nothing to weigh. ``None``: off.
        dense_at: On a calibrated corpus, its own dense threshold (:mod:`ragloop.retrievers.meaning`): a kept
            passage whose cosine with the *question* (:attr:`~ragloop.state.ContextBlock.cosine`: its own search,
            not a rewrite's) reaches it supports an answer whatever the evidence score. Unlike ``meaning_at`` it
            never covers a name the corpus never mentions: on a corpus of thousands of chunks the nearest page
            to "Salesforce" is an integrations page that names others. ``None``: off.
    """

    confidence_weight: float = 0.5
    threshold: float = 0.62
    top: int = 5
    meaning_at: float | None = None
    dense_at: float | None = None

    @classmethod
    def small(cls) -> AbstainRule:
        """The rule for a knowledge base too small to calibrate the grader on (a user's first few pages,
        :attr:`~ragloop.llm.offline.grade.OfflineGrader.small_corpus`). Its passages are graded by retrieval
        agreement, and a customer's wording rarely repeats the page's ("guarantee" for "warranty"), so the
        lead's term coverage runs low on questions the pages answer: the threshold is
        ``SMALL_THRESHOLD``. A question outside such a knowledge base is refused earlier, by the grader
        (no hit the retrievers agree on). A passage that means the question (``meaning_at``,
        ``SMALL_MEANING``) supports an answer too."""
        return cls(threshold=SMALL_THRESHOLD, meaning_at=SMALL_MEANING)

    def means(self, meaning: float) -> bool:
        """Whether the kept passages' best dense cosine ``meaning`` says they mean the question (``meaning_at``
        set and reached): then a name the corpus never spells ("Saturdays", "ID") is covered in other words
        ("weekends", "VAT number") and refuses nothing by itself."""
        return self.meaning_at is not None and meaning >= self.meaning_at

    def supported(self, score: float, meaning: float, cosine: float | None = None) -> bool:
        """Whether an evidence ``score``, the kept passages' best dense cosine ``meaning`` and their best cosine
        with the question itself (``cosine``, see ``dense_at``) support an answer."""
        close = self.dense_at is not None and cosine is not None and cosine >= self.dense_at
        return score >= self.threshold or self.means(meaning) or close

    def score(self, lead: float, confidences: Sequence[float]) -> float:
        """The evidence score of a lead unit's relevance and the passages' confidences."""
        return lead + self.confidence_weight * max(confidences[: self.top], default=0.0)


@frozen
class Meant:
    """The units that mean the question on a small knowledge base: their cosine (``dense``) reaches ``at``."""

    dense: Mapping[str, float]
    at: float | None

    def cosine(self, unit: Unit) -> float | None:
        """The unit's cosine with the question when it reaches ``at``, else ``None``."""
        c = self.dense.get(unit.text, 0.0)
        return c if self.at is not None and c >= self.at else None

    def __call__(self, unit: Unit) -> bool:
        """Whether the unit means the question (its cosine reaches ``at``)."""
        return self.cosine(unit) is not None
