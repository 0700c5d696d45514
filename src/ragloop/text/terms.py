"""Terms and corpus statistics shared by BM25, the offline judges and the live sources.

One tokenizer (:func:`tokenize`), one stopword list (:data:`STOPWORDS`), one stemmer (:func:`stem`, Snowball
English through PyStemmer when installed, a light suffix stripper otherwise) and :class:`CorpusStats`: document
frequencies, IDF and term association over a corpus of chunks, built once per index. Glossary mining
(:func:`mine_glossary`) finds abbreviations a text defines as "Long Form (LF)" or "LF (Long Form)".

numpy is imported lazily (only when :class:`CorpusStats` is built), so the pure helpers here stay light.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from ragloop.text.safety import glossary_problem

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "STOPWORDS",
    "CorpusStats",
    "KeyTerm",
    "content_words",
    "has_snowball",
    "key_terms",
    "merge_glossary",
    "mine_glossary",
    "stem",
    "tokenize",
]

# Identifiers first (so "#1234", "v2.3.1", "2.3.1", "ERR_TIMEOUT" survive whole), then unicode words. Hyphens and
# apostrophes split words ("sign-on" -> "sign", "on"), which is what both the query and the chunk side see.
_TOKEN_RE = re.compile(r"(?<![\w&])#\d+|\bv?\d+(?:\.\d+)+\b|[^\W_]+(?:_[^\W_]+)*", re.UNICODE)
# Plain words of two or more word characters: what BM25 indexes have always been built with.
_WORD_RE = re.compile(r"(?u)\b\w\w+\b")

#: English stopwords plus the question words and support-chat filler that never identify a topic.
STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are aren as at be because been before being below
    between both but by can cannot could couldn did didn do does doesn doing don down during each either else
    ever every few for from further get gets getting got had hadn has hasn have haven having he her here hers
    herself him himself his how however i if in into is isn it its itself just let lets like ll may me might
    more most much must mustn my myself need needs no nor not now of off on once one only or other our ours
    ourselves out over own please re really s same shall shan she should shouldn so some such t than that the
    their theirs them themselves then there these they this those through to too under until up upon us use
    used using ve very via want wants was wasn way we were weren what whats when where whether which while who
    whom whose why will with within without won would wouldn yes yet you your yours yourself yourselves
    tell know explain show give find help thanks thank hi hello hey d m o y ok okay
    """.split()  # noqa: SIM905 - a word block reads better than 170 quoted strings
)

_SUFFIXES = ("ational", "ization", "fulness", "iveness", "ations", "ingly", "ation", "ments", "ment", "ness",
             "ings", "ing", "edly", "ies", "ied", "ers", "er", "ed", "es", "ly", "s")  # fmt: skip


def _fallback_stem(word: str) -> str:
    """A light suffix stripper, used only when PyStemmer is not installed."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix in ("ies", "ied"):
                return word[: -len(suffix)] + "y"
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            return word[: -len(suffix)]
    return word


@functools.cache
def _snowball() -> Any:
    try:
        import Stemmer  # PyStemmer: Snowball English in C
    except ImportError:  # pragma: no cover - PyStemmer is a declared dependency
        return None
    return Stemmer.Stemmer("english")


def has_snowball() -> bool:
    """True when PyStemmer (Snowball English in C) is installed; :func:`stem` falls back otherwise."""
    return _snowball() is not None


@functools.lru_cache(maxsize=65536)
def stem(token: str, *, keep_ids: bool = True) -> str:
    """Stem one lower-case token.

    Args:
        token: The token, lower-cased.
        keep_ids: Keep identifiers (anything that is not all letters: ``#1234``, ``2fa``) as they are. BM25
            passes ``False``: its indexes stem every word (``1990s`` → ``1990``).
    """
    if keep_ids and not token.isalpha():
        return token
    stemmer = _snowball()
    return str(stemmer.stemWord(token)) if stemmer is not None else _fallback_stem(token)


def tokenize(text: str, *, identifiers: bool = True) -> list[str]:
    """Lower-cased tokens of ``text``, in order (stopwords kept).

    Args:
        text: Any text.
        identifiers: Keep identifiers whole (``#1234``, ``v2.3.1``, ``ERR_TIMEOUT``) and split words at
            underscores and hyphens. ``False`` gives plain words of two or more word characters, the rule
            BM25 indexes are built with (kept so that saved indexes and their retrieval results stay the same).
    """
    return (_TOKEN_RE if identifiers else _WORD_RE).findall(text.lower())


@frozen
class KeyTerm:
    """A content term of a text: its stem (what matching uses) and the surface form it first appeared as.

    Attributes:
        stem: Stemmed, lower-case form.
        surface: The token as written (lower-cased).
    """

    stem: str
    surface: str


def key_terms(text: str) -> list[KeyTerm]:
    """Content terms of ``text`` in order of first appearance: stopwords dropped, stemmed, deduplicated."""
    return list(_key_terms(text))


# The judges and the reranker ask this of the same question and passages many times a turn: memoised per text
# (frozen values; each caller gets its own list), bounded.
@functools.lru_cache(maxsize=2048)
def _key_terms(text: str) -> tuple[KeyTerm, ...]:
    seen: set[str] = set()
    out: list[KeyTerm] = []
    for token in tokenize(text):
        if token in STOPWORDS or (len(token) == 1 and token.isalpha()):
            continue
        s = stem(token)
        if s and s not in seen and s not in STOPWORDS:
            seen.add(s)
            out.append(KeyTerm(s, token))
    return tuple(out)


def content_words(text: str) -> list[str]:
    """The content words of ``text`` as written (case kept), stopwords and repeats (by stem) dropped."""
    seen: set[str] = set()
    out: list[str] = []
    for token in _TOKEN_RE.findall(text):
        low = token.lower()
        if low in STOPWORDS or (len(low) == 1 and low.isalpha()):
            continue
        s = stem(low)
        if s not in seen and s not in STOPWORDS:
            seen.add(s)
            out.append(token)
    return out


# --- glossary mining -----------------------------------------------------------------------------------------

_ABBREV = r"[A-Z][A-Za-z0-9&]*[A-Z0-9][A-Za-z0-9&]*s?"  # at least two capitals/digits: SSO, 2FA, SaaS, APIs
_PAREN_ABBREV = re.compile(r"\(\s*(" + _ABBREV + r")\s*\)")
_WORD_BEFORE = re.compile(r"[\w'&/-]+")
_SHORT_THEN_LONG = re.compile(r"\b(" + _ABBREV + r")\s*\(\s*([A-Za-z][\w'&/ -]{2,80}?)\s*\)")


def _long_form_for(abbrev: str, words: Sequence[str]) -> str | None:
    """Schwartz & Hearst (2003): the shortest word suffix of ``words`` whose letters spell ``abbrev``.

    The abbreviation's characters are matched right to left inside the candidate long form; its first
    character must start a word. Returns ``None`` when no suffix of at most ``len(abbrev) + 5`` words fits.
    """
    short = abbrev[:-1] if abbrev.endswith("s") and abbrev[:-1].isupper() else abbrev
    chars = [c.lower() for c in short if c.isalnum()]
    if len(chars) < 2:
        return None
    limit = min(len(words), len(chars) + 5)
    # Prefer a long form whose word initials (hyphenated parts count) spell the abbreviation exactly:
    # "myeloid-derived suppressor cells (MDSC)" rather than the shortest letter match.
    for n in range(1, limit + 1):
        initials = [p[0].lower() for w in words[-n:] for p in w.split("-") if p]
        if initials == chars:
            return " ".join(words[-n:])
    for n in range(1, limit + 1):
        cand = " ".join(words[-n:])
        text = cand.lower()
        i = len(text) - 1
        ok = True
        for j in range(len(chars) - 1, -1, -1):
            c = chars[j]
            while i >= 0 and (text[i] != c or (j == 0 and i > 0 and text[i - 1].isalnum())):
                i -= 1
            if i < 0:
                ok = False
                break
            i -= 1
        if n == 1 and len(cand) < 3 * len(chars):
            continue  # one short word hiding the letters ("cell (CE)") is a coincidence, not a definition
        if ok and words[-n][:1].lower() == chars[0] and cand.lower() != short.lower():
            return cand
    return None


def mine_glossary(texts: Iterable[str]) -> dict[str, str]:
    """Abbreviations the texts define, ``{"SSO": "single sign-on"}``.

    Finds "Long Form (LF)" and "LF (Long Form)" and keeps a pair only when the long form's letters spell the
    abbreviation (Schwartz & Hearst). When a text defines an abbreviation several ways the most frequent wins.
    Entries that are not short noun phrases (:func:`ragloop.text.safety.glossary_problem`: an instruction, a
    link, more than eight words) are left out.
    """
    votes: dict[str, Counter[str]] = {}
    for text in texts:
        for m in _PAREN_ABBREV.finditer(text):
            # Anchor on "(LF)" and look back a bounded window: a regex that scans for the long form first
            # backtracks at every word of the corpus.
            abbrev = m.group(1)
            window = text[max(0, m.start() - 160) : m.start()]
            if window.rstrip()[-1:] in (",", ";", ".", ":"):
                continue
            long = _long_form_for(abbrev, _WORD_BEFORE.findall(window)[-(len(abbrev) + 5) :])
            if long:
                votes.setdefault(abbrev, Counter())[long.lower()] += 1
        for m in _SHORT_THEN_LONG.finditer(text):
            abbrev, long = m.group(1), m.group(2).strip()
            if len(long.split()) >= 2 and _long_form_for(abbrev, long.split()) == long:
                votes.setdefault(abbrev, Counter())[long.lower()] += 1
    mined = {abbrev: counts.most_common(1)[0][0] for abbrev, counts in votes.items()}
    # A document can define anything as an "abbreviation": only short noun phrases become entries.
    return {abbrev: long for abbrev, long in mined.items() if glossary_problem(abbrev, long) is None}


def merge_glossary(mined: Mapping[str, str], configured: Mapping[str, str]) -> dict[str, str]:
    """Mined abbreviations overridden by configured ones (configuration always wins)."""
    return {**mined, **configured}


# --- corpus statistics ---------------------------------------------------------------------------------------


@frozen(eq=False)
class CorpusStats:
    """Document frequencies, IDF and term association over a corpus, built once per index.

    Build with :meth:`from_texts`. Terms are stems (see :func:`key_terms`). Association is computed from a
    sparse term → documents inverted list, so memory is linear in the corpus size.

    Attributes:
        n_docs: Number of documents (chunks).
        vocab: Stem → term id.
        terms: Term id → stem (the inverse of ``vocab``).
        df: Document frequency per term id.
        surface: The most frequent surface form per term id (to write readable queries).
        doc_terms: Sorted unique term ids per document.
        postings: Sorted document ids per term id.
        glossary: Abbreviations mined from the texts.
    """

    n_docs: int
    vocab: Mapping[str, int]
    terms: Sequence[str] = field(repr=False)
    df: npt.NDArray[np.int32]
    surface: Sequence[str]
    doc_terms: Sequence[npt.NDArray[np.int32]] = field(repr=False)
    postings: Sequence[npt.NDArray[np.int32]] = field(repr=False)
    glossary: Mapping[str, str] = field(factory=dict)

    @classmethod
    def from_texts(cls, texts: Iterable[str], *, mine_abbreviations: bool = True) -> CorpusStats:
        """Build statistics over ``texts`` (one per chunk; include the title in the text if you want it counted).

        Args:
            texts: The chunk texts.
            mine_abbreviations: Also mine "Long Form (LF)" definitions into :attr:`glossary`.
        """
        import numpy as np

        vocab: dict[str, int] = {}
        tid_of: dict[str, int] = {}  # token -> term id, -1 for a stopword or a one-letter token
        token_df: Counter[str] = Counter()
        doc_terms: list[np.ndarray] = []
        kept_texts: list[str] = []
        for text in texts:
            if mine_abbreviations:
                kept_texts.append(text)
            tokens = set(tokenize(text))
            token_df.update(tokens)  # C loop; surfaces are picked from these counts at the end
            for token in tokens.difference(tid_of):  # only tokens never seen before: few after a while
                if token in STOPWORDS or (len(token) == 1 and token.isalpha()):
                    tid_of[token] = -1
                    continue
                s = stem(token)
                if s in STOPWORDS:
                    tid_of[token] = -1
                    continue
                tid_of[token] = vocab.setdefault(s, len(vocab))
            ids = {tid_of[t] for t in tokens}
            ids.discard(-1)
            doc_terms.append(np.fromiter(sorted(ids), dtype=np.int32, count=len(ids)))
        surface = [""] * len(vocab)
        best = [0] * len(vocab)
        for token, count in token_df.items():
            tid = tid_of[token]
            if tid >= 0 and (count > best[tid] or (count == best[tid] and token < surface[tid])):
                surface[tid], best[tid] = token, count
        n_docs = len(doc_terms)
        if doc_terms:
            flat = np.concatenate(doc_terms)
            owner = np.repeat(np.arange(n_docs, dtype=np.int32), [len(d) for d in doc_terms])
        else:
            flat = owner = np.zeros(0, dtype=np.int32)
        order = np.argsort(flat, kind="stable")  # stable keeps each posting list sorted by document
        df = np.bincount(flat, minlength=len(vocab)).astype(np.int32)
        bounds = np.concatenate([[0], np.cumsum(df)])
        sorted_owner = owner[order]
        postings = [sorted_owner[bounds[i] : bounds[i + 1]] for i in range(len(vocab))]
        glossary = mine_glossary(kept_texts) if mine_abbreviations else {}
        return cls(
            n_docs=n_docs,
            vocab=vocab,
            terms=list(vocab),
            df=df,
            surface=surface,
            doc_terms=doc_terms,
            postings=postings,
            glossary=glossary,
        )

    def doc_freq(self, term: str) -> int:
        """Documents containing the stem ``term`` (0 when unknown)."""
        tid = self.vocab.get(term)
        return 0 if tid is None else int(self.df[tid])

    def idf(self, term: str) -> float:
        """BM25's IDF of a stem, ``ln(1 + (N - df + 0.5) / (df + 0.5))``; unknown terms get the highest IDF."""
        df = self.doc_freq(term)
        return math.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5))

    def surface_of(self, term: str) -> str:
        """The most frequent surface form of a stem (the stem itself when unknown)."""
        tid = self.vocab.get(term)
        return term if tid is None else self.surface[tid]

    def cooccurrence(self, a: str, b: str) -> int:
        """Documents containing both stems."""
        import numpy as np

        ta, tb = self.vocab.get(a), self.vocab.get(b)
        if ta is None or tb is None:
            return 0
        return int(np.intersect1d(self.postings[ta], self.postings[tb], assume_unique=True).size)

    def pmi(self, a: str, b: str) -> float:
        """Pointwise mutual information of two stems over documents, ``ln(N·n_ab / (n_a·n_b))``; -inf if never."""
        n_ab = self.cooccurrence(a, b)
        if n_ab == 0:
            return -math.inf
        return math.log(self.n_docs * n_ab / (self.doc_freq(a) * self.doc_freq(b)))

    def associated(
        self,
        terms: Iterable[str],
        *,
        k: int = 5,
        exclude: Iterable[str] = (),
        feedback_docs: int = 30,
        min_support: int = 2,
        max_df: float = 0.1,
    ) -> list[tuple[str, float]]:
        """Stems most associated with ``terms`` in the corpus, best first, as ``(stem, weight)``.

        Pseudo-relevance feedback with a KL-divergence term weight (the "KL" expansion model of Terrier/Amati):
        the ``feedback_docs`` documents that contain the most IDF mass of ``terms`` form the feedback set ``R``;
        each candidate stem ``t`` is weighted ``p_R(t) · ln(p_R(t) / p_C(t))`` with document-level
        probabilities, so a term scores high when it occurs in many feedback documents but is rare overall
        (a PMI with the query's documents). Only documents with at least half the best document's query IDF
        mass give feedback. Stems in ``exclude``, stopwords, the query's own stems, terms seen in fewer than
        ``min_support`` feedback documents, terms without a letter, and terms in more than ``max_df`` of all
        documents (and more than ten: the corpus' boilerplate, "methods", "results") are skipped.
        """
        import numpy as np

        query = [t for t in dict.fromkeys(terms) if t in self.vocab]
        if not query or self.n_docs == 0:
            return []
        weights = np.zeros(self.n_docs, dtype=np.float64)
        for t in query:
            weights[self.postings[self.vocab[t]]] += self.idf(t)
        candidates = np.flatnonzero(weights)
        candidates = candidates[np.argsort(-weights[candidates], kind="stable")][:feedback_docs]
        # Documents carrying at least half the best document's query mass give feedback (at least five, when
        # there are); documents that merely share one common term would pull in the corpus' boilerplate.
        strong = int(np.count_nonzero(weights[candidates] >= 0.5 * weights[candidates[0]]))
        candidates = candidates[: max(strong, 5)]
        min_support = min(min_support, max(1, candidates.size // 3))
        feedback = np.concatenate([self.doc_terms[d] for d in candidates.tolist()])
        counts = np.bincount(feedback, minlength=len(self.vocab))
        skip = {self.vocab[t] for t in (*query, *exclude) if t in self.vocab}
        size = float(candidates.size)
        scored: list[tuple[float, int]] = []
        for tid in np.flatnonzero(counts >= min_support).tolist():
            if tid in skip:
                continue
            p_r = counts[tid] / size
            p_c = self.df[tid] / self.n_docs
            if p_r <= p_c or self.df[tid] > max(max_df * self.n_docs, 10):
                continue
            scored.append((float(p_r * math.log(p_r / p_c)), tid))
        scored.sort(key=lambda x: (-x[0], x[1]))
        out: list[tuple[str, float]] = []
        for weight, tid in scored:
            s = self.terms[tid]
            if s in STOPWORDS or len(s) < 2 or not any(c.isalpha() for c in s):
                continue
            out.append((s, weight))
            if len(out) == k:
                break
        return out
