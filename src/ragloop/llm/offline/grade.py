"""The offline grader: IDF-weighted key-term coverage, retrieval signals, and the identifier rule.

How a verdict is reached, in order:

1. **Identifier rule.** If the query names an exact id (ticket ``#1234``, error code, version) and the chunk
   names only other ids of that kind, the chunk is ``irrelevant`` whatever else it says.
2. **Coverage.** The query's key terms (stopwords dropped, stemmed, plus its identifiers) are looked up in the
   chunk's title, heading path and text (truncated to ``max_chars``). Coverage is the IDF mass of the covered
   terms over the IDF mass of all of them, so missing "sso" costs more than missing "setup". A glossary
   expansion beside a term ("API (application programming interface)", "single sign-on (SSO)", as the decider
   writes them) names that term again: a text holding either form covers it, and the words in parentheses are
   not terms of their own (otherwise a glossary entry that spells the abbreviation out covers more of "how do I
   rotate an API key" than the page that answers it).
   Words that only frame the question ("long", "take", "need", :data:`~ragloop.llm.offline.verify.FRAMING`)
   are not terms (unless the query has no other).
   ``coverage >= relevant_at`` → ``relevant``; ``>= partial_at`` → ``partial``; else ``irrelevant``.
3. **Retrieval signal.** A strong retrieval signal (the hit's confidence, its dense cosine, or its BM25 score
   relative to the query's IDF mass, whichever is highest, at or above ``strong_signal``) promotes the label
   one step: a paraphrase the dense retriever is sure about is not thrown away for lack of shared words.
4. **Exact ids must be named.** A chunk that does not name an id the query asks about is at most
   ``partial``: a generic page about tickets does not answer "status of ticket #1234" (the live node does).

Thresholds come from :meth:`OfflineGrader.calibrate` on the index (see there), or the defaults:
``relevant_at=0.57`` is what calibration gives on SciFact abstracts (0.565); ``partial_at=0.27`` sits between
SciFact's 0.17 and the documentation corpora's 0.33-0.57 (Redis, FastAPI docs), a middle ground for an index
nobody calibrated.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from attrs import evolve, field, frozen

from ragloop.llm.offline.verify import FRAMING
from ragloop.retrievers.base import Embedder
from ragloop.state import Hit, Label, Verdict
from ragloop.text.ids import extract_ids, ids_conflict, missing_ids
from ragloop.text.terms import CorpusStats, key_terms, stem, tokenize
from ragloop.usage import LLMCall, record_call

__all__ = ["MAX_CACHED", "Calibration", "Coverage", "OfflineGrader", "coverage"]


@frozen
class Coverage:
    """How much of a query a text covers.

    Attributes:
        score: IDF-weighted share of the query's key terms found in the text, in [0, 1].
        covered: Surface forms of the covered terms, most informative first.
        missing: Surface forms of the missing terms, most informative first.
    """

    score: float
    covered: tuple[str, ...]
    missing: tuple[str, ...]


#: The verifier's framing words, less the degree words that carry what a size question asks ("how big").
_FRAMING = FRAMING - {stem(w) for w in ("big", "small", "large")}


def _text_stems(text: str) -> set[str]:
    stems = {stem(t) for t in tokenize(text)}
    for ids in extract_ids(text).values():
        stems |= ids
    return stems


_PARENS = re.compile(r"\(([^()]{1,120})\)")


def _initials(tokens: Sequence[str]) -> str:
    return "".join(t[0] for t in tokens)


def _aliases(query: str, glossary: Mapping[str, str]) -> tuple[str, list[tuple[frozenset[str], frozenset[str]]]]:
    """``query`` without the parentheses that spell out the term before them, and each such pair as
    ``(stems of the term, stems of its other form)``.

    A parenthesis is an alias when its words' initials are the single word before it ("API (application
    programming interface)"), when it is a single word that the initials of the words before it spell ("single
    sign-on (SSO)"), or when ``glossary`` (abbreviation → long form) pairs the two.
    """
    long_of = {" ".join(tokenize(a)): " ".join(tokenize(b)) for a, b in glossary.items()}
    kept: list[str] = []
    pairs: list[tuple[frozenset[str], frozenset[str]]] = []
    pos = 0
    for m in _PARENS.finditer(query):
        inner = tokenize(m.group(1), identifiers=False)
        before = tokenize(query[: m.start()], identifiers=False)
        outer: list[str] = []
        if len(inner) > 1 and before:
            if _initials(inner) == before[-1] or long_of.get(before[-1]) == " ".join(inner):
                outer = before[-1:]
        elif len(inner) == 1 and before:
            word = inner[0]
            long = long_of.get(word, "").split()
            if long and before[-len(long) :] == long:
                outer = long
            else:
                n = len(word)
                if n <= len(before) and _initials(before[-n:]) == word:
                    outer = before[-n:]
        outer_stems = frozenset(s for s in map(stem, outer) if s)
        inner_stems = frozenset(s for s in map(stem, inner) if s)
        if outer_stems and inner_stems:
            pairs.append((outer_stems, inner_stems))
            kept.append(query[pos : m.start()])
            pos = m.end()
    kept.append(query[pos:])
    return "".join(kept), pairs


def coverage(query: str, text: str, stats: CorpusStats) -> Coverage:
    """IDF-weighted coverage of ``query``'s key terms (and identifiers) by ``text``; a glossary expansion in
    parentheses is the term before it said again, covered by either form (see the module docstring)."""
    query, pairs = _aliases(query, stats.glossary)
    keys = key_terms(query)
    # Words that frame the question ("how long does it take", "do I need") name nothing a page must hold; on a
    # small knowledge base their IDF is as high as a real term's, and "How long do refunds take?" would miss
    # two thirds of itself on the page that says "Refunds are issued within 14 days".
    asked = [t for t in keys if t.stem not in _FRAMING]
    terms = [(t.stem, t.surface) for t in (asked or keys)]
    for ids in extract_ids(query).values():
        terms.extend((i, i) for i in sorted(ids) if all(i != s for s, _ in terms))
    if not terms:
        return Coverage(0.0, (), ())
    present = _text_stems(text)
    for outer, inner in pairs:
        if inner <= present:  # the text says it the other way
            present |= outer
    weighted = sorted(((stats.idf(s), s, surface) for s, surface in terms), key=lambda x: (-x[0], x[1]))
    total = sum(w for w, _, _ in weighted)
    got = sum(w for w, s, _ in weighted if s in present)
    return Coverage(
        score=got / total if total > 0 else 0.0,
        covered=tuple(surface for _, s, surface in weighted if s in present),
        missing=tuple(surface for _, s, surface in weighted if s not in present),
    )


@frozen
class Calibration:
    """What :meth:`OfflineGrader.calibrate` measured, kept for the record.

    Attributes:
        pairs: Pseudo-queries used.
        positive_median: Median coverage of a pseudo-query's own document (the rest of it).
        hard_negative_median: Median coverage of another document sharing the query's rarest term.
        random_negative_median: Median coverage of a random other document.
        relevant_at: Chosen ``relevant`` threshold.
        partial_at: Chosen ``partial`` threshold.
    """

    pairs: int
    positive_median: float
    hard_negative_median: float
    random_negative_median: float
    relevant_at: float
    partial_at: float


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def _youden(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """The threshold maximising TPR - FPR (Youden's J) between two score samples.

    J is a step function of the threshold; the midpoint of its best step (between the highest score below it
    and the lowest score in it) is returned, the decision-stump choice that generalises beyond the sample.
    """
    values = sorted(set(positives) | set(negatives))
    best_k, best_j = 0, -1.0
    for k, t in enumerate(values):
        tpr = sum(p >= t for p in positives) / len(positives)
        fpr = sum(n >= t for n in negatives) / len(negatives)
        if tpr - fpr > best_j:
            best_k, best_j = k, tpr - fpr
    low = values[best_k - 1] if best_k > 0 else 0.0
    return (low + values[best_k]) / 2


def _signal(hit: Hit, query_idf_mass: float) -> float:
    """The strongest retrieval signal of a hit, in [0, 1]."""
    signals = [hit.confidence]
    dense = hit.scores.get("dense")
    if dense is not None:  # cosine of normalised embeddings: ~0.2 unrelated, ~0.7 same topic
        signals.append((dense - 0.2) / 0.5)
    bm25 = hit.scores.get("bm25")
    if bm25 is not None and query_idf_mass > 0:  # ~1 per IDF unit when every term matches once
        signals.append(bm25 / query_idf_mass)
    return max(0.0, min(1.0, max(signals)))


@frozen
class OfflineGrader:
    """Grades a chunk for a query without a model (see the module docstring for the rule).

    Attributes:
        stats: Corpus statistics of the index (IDF).
        relevant_at: Coverage at or above which a chunk is ``relevant``.
        partial_at: Coverage at or above which a chunk is ``partial``.
        strong_signal: Retrieval signal at or above which the label is promoted one step.
        max_chars: Chunk text budget; longer text is truncated before grading.
        calibration: What calibration measured, when the thresholds came from :meth:`calibrate`.
        small_corpus: Set by :meth:`calibrate` when the index is too small to calibrate on (fewer than 10
            pseudo-queries: a user's first few pages). Term coverage is then a weak signal — IDF over four pages
            is flat, and a customer's words are not the page's ("guarantee" for "warranty") — so a hit the
            lexical and the dense retriever agree on (hybrid confidence at least ``small_corpus_signal``) is
            ``relevant`` whatever its coverage.
        small_corpus_signal: The hybrid confidence that makes a hit relevant on a small corpus (0.35, chosen on
            the tuning half of ``bench_answers.py --set small``: answerable questions' first hits 0.14-0.79,
            questions outside those knowledge bases at most 0.20).
        embedder: The index's embedder, used on a small corpus only (:meth:`grade`): a hit one of whose
            sentences *means* the query (cosine at least ``small_meaning_at``) is ``relevant`` though it shares
            no word with it ("Which class should a complete newbie take?" and "Beginners should start with
            Foundations"). Evidence that needs no corpus statistics, so it holds on four pages.
        small_meaning_at: See ``embedder``: 0.40, chosen on both halves of ``bench_answers.py --set small``
            (MiniLM; the question's best sentence among its top three hits: 26 of 32 answerable questions at
            0.43-0.80, the 12 outside those knowledge bases at 0.07-0.36).
        dense_at: On a calibrated corpus, the corpus' own dense threshold (:mod:`ragloop.retrievers.meaning`):
            a hit whose dense cosine with the query reaches it is ``relevant`` whatever its term coverage (a
            paraphrase that shares no word with the page: "remember the results of a slow function" and
            ``lru_cache``), unless the identifier rules say otherwise. ``None``: off.
    """

    stats: CorpusStats
    relevant_at: float = 0.57
    partial_at: float = 0.27
    strong_signal: float = 0.85
    max_chars: int = 2000
    calibration: Calibration | None = field(default=None, eq=False)
    small_corpus: bool = False
    small_corpus_signal: float = 0.35
    embedder: Embedder | None = field(default=None, eq=False)
    small_meaning_at: float = 0.40
    dense_at: float | None = None
    _vectors: dict[str, npt.NDArray[np.float32]] = field(factory=dict, init=False, repr=False, eq=False)

    def with_embedder(self, embedder: Embedder | None) -> OfflineGrader:
        """This grader with ``embedder`` for the small-corpus meaning check (see ``embedder``); a grader of a
        calibrated (not small) corpus is returned as it is."""
        return evolve(self, embedder=embedder) if self.small_corpus and embedder is not None else self

    @classmethod
    def calibrate(
        cls,
        stats: CorpusStats,
        texts: Sequence[str],
        *,
        sample: int = 300,
        seed: int = 0,
        query_terms: int = 5,
        **kwargs: float | int,
    ) -> OfflineGrader:
        """A grader whose thresholds are calibrated on the index's own texts.

        For up to ``sample`` texts (a seeded random sample), the first line or sentence (the title, for a
        "title\\ntext" chunk) gives a pseudo-query of its ``query_terms`` highest-IDF key terms. Its coverage is
        measured on the *rest* of the same text (a positive), on another text that shares the pseudo-query's
        rarest term (a hard negative: same vocabulary, different document) and on a random text (a negative).
        ``relevant_at`` is the Youden-optimal threshold between positives and hard negatives; ``partial_at`` sits
        just above the 95th percentile of the random negatives (at most 5% of off-topic chunks kept). Both are
        clamped (``relevant_at`` to [0.4, 0.75], ``partial_at`` to [0.15, ``relevant_at`` - 0.1]) so that a
        corpus whose pseudo-queries are too easy cannot make a label unreachable. Texts are truncated to
        ``max_chars`` as in grading.

        Args:
            stats: Statistics over the same texts.
            texts: The chunk texts (title first when there is one).
            sample: Pseudo-queries to draw.
            seed: Seed of the sample.
            query_terms: Key terms per pseudo-query.
            **kwargs: Other :class:`OfflineGrader` fields (``strong_signal``, ``max_chars``).
        """
        budget = int(kwargs.get("max_chars", 2000))
        rng = random.Random(seed)
        order = list(range(len(texts)))
        rng.shuffle(order)
        pos: list[float] = []
        hard: list[float] = []
        rand: list[float] = []
        for i in order:
            if len(pos) >= sample:
                break
            head, rest = _split_head(texts[i][:budget])
            terms = sorted(key_terms(head), key=lambda t: -stats.idf(t.stem))[:query_terms]
            if len(terms) < 2 or len(rest) < 40:
                continue
            query = " ".join(t.surface for t in terms)
            other = next((d for t in terms if (d := _sharing_doc(stats, t.stem, exclude=i, rng=rng)) is not None), None)
            j = rng.randrange(len(texts))
            if other is None or j == i:
                continue
            pos.append(coverage(query, rest, stats).score)
            hard.append(coverage(query, texts[other][:budget], stats).score)
            rand.append(coverage(query, texts[j][:budget], stats).score)
        if len(pos) < 10:
            return cls(stats, small_corpus=True, **kwargs)  # type: ignore[arg-type]
        # Clamped so that a corpus whose pseudo-queries are too easy (doc pages repeat their title in the body)
        # cannot make a label unreachable: relevant_at in [0.4, 0.75], partial_at in [0.15, relevant_at - 0.1].
        relevant_at = round(min(0.75, max(0.4, _youden(pos, hard))), 3)
        off_topic = sorted(rand)[int(0.95 * (len(rand) - 1))]
        partial_at = round(min(relevant_at - 0.1, max(0.15, off_topic + 0.01)), 3)
        cal = Calibration(
            pairs=len(pos),
            positive_median=_median(pos),
            hard_negative_median=_median(hard),
            random_negative_median=_median(rand),
            relevant_at=relevant_at,
            partial_at=partial_at,
        )
        return cls(stats, relevant_at=relevant_at, partial_at=partial_at, calibration=cal, **kwargs)  # type: ignore[arg-type]

    def judge(self, query: str, hit: Hit) -> Verdict:
        """The verdict, synchronously (what :meth:`grade` awaits)."""
        chunk = hit.chunk
        text = "\n".join([chunk.title, *chunk.title_path, chunk.text[: self.max_chars]])
        if ids_conflict(query, text):
            wanted = extract_ids(query)
            named = extract_ids(text)
            kind = next(k for k in wanted if k in named and not (wanted[k] & named[k]))
            return Verdict(
                "irrelevant",
                f"names {kind} {', '.join(sorted(named[kind]))}, not {', '.join(sorted(wanted[kind]))}",
                score=0.0,
            )
        cov = coverage(query, text, self.stats)
        n = len(cov.covered) + len(cov.missing)
        label: Label
        if cov.score >= self.relevant_at:
            label = "relevant"
        elif cov.score >= self.partial_at:
            label = "partial"
        else:
            label = "irrelevant"
        reason = f"covers {len(cov.covered)}/{n} key terms"
        if cov.covered:
            reason += ": " + ", ".join(cov.covered[:5])
        if cov.missing:
            reason += "; missing: " + ", ".join(cov.missing[:5])
        idf_mass = sum(self.stats.idf(t.stem) for t in key_terms(query))
        signal = _signal(hit, idf_mass)
        if signal >= self.strong_signal and label != "relevant":
            label = "partial" if label == "irrelevant" else "relevant"
            reason += f"; promoted by retrieval signal {signal:.2f}"
        if self.small_corpus and label != "relevant" and hit.confidence >= self.small_corpus_signal:
            label = "relevant"
            reason += f"; small knowledge base: retrievers agree ({hit.confidence:.2f})"
        dense = hit.scores.get("dense")
        if self.dense_at is not None and label != "relevant" and dense is not None and dense >= self.dense_at:
            label = "relevant"
            reason += f"; means the query (cosine {dense:.2f}, this corpus' threshold {self.dense_at:.2f})"
        absent = missing_ids(query, text)
        if absent and label == "relevant":
            # A query about one exact id (ticket #1234, E1002) is answered only by text naming that id;
            # a generic page about tickets or errors is background at best.
            label = "partial"
            reason += f"; does not name {', '.join(absent)}"
        return Verdict(label, reason, score=round(cov.score, 4))

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Grade ``hit`` for ``query`` (see the module docstring); on a small corpus with an embedder, a hit
        that means the query is ``relevant`` (see ``embedder``). An embedder that fails leaves the term-based
        verdict: meaning only ever promotes."""
        start = time.perf_counter()
        verdict = self.judge(query, hit)
        if self.small_corpus and self.embedder is not None and verdict.label != "relevant":
            text = "\n".join([hit.chunk.title, hit.chunk.text[: self.max_chars]])
            if not ids_conflict(query, text) and not missing_ids(query, text):
                try:
                    cosine = await self.meaning(query, hit.chunk.text[: self.max_chars])
                except Exception:  # noqa: BLE001 — a failing embedder leaves the term-based verdict as it is
                    cosine = 0.0
                if cosine >= self.small_meaning_at:
                    reason = f"{verdict.reason}; small knowledge base: a sentence means the query ({cosine:.2f})"
                    verdict = Verdict("relevant", reason, score=verdict.score)
        record_call(LLMCall(judge="grade", model="offline", seconds=time.perf_counter() - start))
        return verdict

    async def meaning(self, query: str, text: str) -> float:
        """The highest cosine between ``query`` and a sentence of ``text``, by ``embedder`` (0.0
        without one). Vectors are cached: a small corpus has few sentences (at most :data:`MAX_CACHED`)."""
        if self.embedder is None:
            return 0.0
        sentences = [s for s in _SENTENCES.split(text) if len(s.split()) >= _MIN_SENTENCE_WORDS]
        if not sentences:
            return 0.0
        missing = [t for t in dict.fromkeys([query, *sentences]) if t not in self._vectors]
        if missing:
            vectors = np.asarray(await self.embedder.embed(missing), dtype=np.float32)
            if len(self._vectors) + len(missing) > MAX_CACHED:
                self._vectors.clear()
            self._vectors.update(zip(missing, vectors, strict=True))
        matrix = np.stack([self._vectors[s] for s in sentences])
        return float(np.max(matrix @ self._vectors[query]))


#: Where a chunk is cut into sentences for the meaning check: after a sentence's end (a table or a list stays
#: whole with the sentence that introduces it, which names what its rows hold).
_SENTENCES = re.compile(r"(?<=[.!?;])\s+")
#: Shorter pieces (a heading, a table rule) are not sentences that could answer.
_MIN_SENTENCE_WORDS = 3
#: Most sentence vectors the grader keeps (a small corpus holds far fewer).
MAX_CACHED = 4096


def _split_head(text: str) -> tuple[str, str]:
    """The first line (or sentence) of ``text`` and the rest."""
    stripped = text.strip()
    if "\n" in stripped:
        head, rest = stripped.split("\n", 1)
        if len(head) <= 200:
            return head, rest
    for i, ch in enumerate(stripped):
        if ch in ".!?" and i + 1 < len(stripped) and stripped[i + 1].isspace():
            return stripped[: i + 1], stripped[i + 1 :]
    return stripped, ""


def _sharing_doc(stats: CorpusStats, term: str, *, exclude: int, rng: random.Random) -> int | None:
    tid = stats.vocab.get(term)
    if tid is None:
        return None
    docs = [int(d) for d in stats.postings[tid] if int(d) != exclude]
    return rng.choice(docs) if docs else None
