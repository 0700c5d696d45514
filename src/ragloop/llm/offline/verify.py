"""The offline verifier: is each sentence of the reply supported by the block it cites, and does the reply
cover the question?

After the answer is composed, :meth:`OfflineVerifier.verify` reads it sentence by sentence:

1. **Support.** A sentence that cites ``[n]`` is supported when most of its key terms (``min_support``, stems,
   stopwords dropped) occur in the cited blocks, or, with an embedder, when its embedding is close to one of
   the cited block's sentences (cosine at least ``min_cosine``). Unsupported sentences are listed; the answer
   node drops them from the final text and says so.
2. **Coverage.** The question's key terms that neither the supported sentences nor the titles of the blocks
   they cite contain are the *uncovered aspects*, without the words that only frame a question ("name",
   "called", "difference", "quickly", and filler such as "answer", "add", "link", "command" …; a term the cited
   passage itself holds counts as covered, and a term sharing its first five letters with a present one counts as
   present: "counter" and "count"). A reply whose
   outcome was ``context`` but leaves aspects uncovered is downgraded to ``partial``, and the aspects are
   named as missing. With an embedder, a term is covered by meaning too (a word of the reply or its cited
   passages close to it: "guarantee" and "warranty"), and none is missing when the reply's first supported
   sentence means the whole question (``min_lead_cosine``): what is left then only frames it.

It never calls anything: one pass over the text, no extra retrieval round.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from attrs import field, frozen

from ragloop.retrievers.base import Embedder
from ragloop.state import ContextBlock, Verification
from ragloop.text.terms import STOPWORDS, key_terms, stem, tokenize

__all__ = ["FRAMING", "MAX_CACHED_WORDS", "MAX_MEANING_WORDS", "SHARED_PREFIX", "OfflineVerifier", "reply_sentences"]

_CITED = re.compile(r"(?<![\w)])\[(\d{1,6})\]")  # a free-standing marker (arr[0] is code), never a huge number
_SENTENCE = re.compile(r"(?<=\])\s+(?!\[)|(?<=[.!?])\s+(?=[A-Z])|\n\s*\n")
#: Words that frame a question rather than name something it asks about.
FRAMING = frozenset(
    stem(w)
    for w in [
        "name",
        "named",
        "called",
        "known",
        "located",
        "situated",
        "based",
        "kind",
        "type",
        "sort",
        "part",
        "member",
        "also",
        "one",
        "many",
        "much",
        "long",
        "first",
        "last",
        "later",
        "earlier",
        "older",
        "younger",
        "same",
        "both",
        "common",
        "which",
        "whose",
        "who",
        "whom",
        "what",
        "when",
        "where",
        "why",
        "how",
        "year",
        "years",
        "date",
        "time",
        "number",
        # what a comparison or a how-to question is framed with, not what it asks about
        "difference",
        "different",
        "compare",
        "comparison",
        "versus",
        "vs",
        "between",
        "come",
        "comes",
        "way",
        "best",
        "possible",
        "able",
        "actually",
        "quickly",
        "soon",
        "fast",
        "often",
        "need",
        "want",
        "get",
        "put",
        "make",
        "use",
        "work",
        "happen",
        "tell",
        "let",
        "thing",
        # filler a user types around what they ask about (a reply never has to repeat them to answer)
        "answer",
        "does",
        "do",
        "add",
        "link",
        "command",
        "empty",
        "big",
        "small",
        "large",
        "mean",
        "means",
        "say",
        "says",
        "take",
        "takes",
        "allow",
        "allowed",
        "exactly",
        "really",
        "still",
        "anything",
        "something",
        "someone",
        "able",
        "try",
        "going",
        "give",
        "find",
        "show",
        "see",
        "good",
        "back",
        # adverbs a user says around the thing asked about ("earbuds I already opened"); not "currently", whose
        # stem is "current" ("the current directory", "current incidents" name what is asked about)
        "already",
        "just",
        "ever",
        "yet",
        "anyway",
    ]
)
#: Most distinct words of the cited text compared with an uncovered term (the reply's own first).
MAX_MEANING_WORDS = 400
#: Most word vectors the verifier keeps (the cache is emptied past it).
MAX_CACHED_WORDS = 20_000
_WORDS = re.compile(r"[A-Za-z][A-Za-z-]{2,}")
#: Two stems sharing this many first letters name the same thing ("counter" and "count", "quickly" and "quick").
SHARED_PREFIX = 5


def reply_sentences(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """The reply's sentences that cite blocks, each with the block numbers it cites (notes are skipped)."""
    out = []
    uncited = ""  # a table or code block is cited by a marker on its own line after it
    for part in _SENTENCE.split(text):
        cites = tuple(int(n) for n in _CITED.findall(part))
        sentence = " ".join(_CITED.sub("", part).split())
        if cites and not sentence and uncited:
            sentence = uncited
        uncited = "" if cites else sentence
        if cites and sentence:
            out.append((sentence, cites))
    return out


def _stems(text: str) -> set[str]:
    return {stem(t) for t in tokenize(text)}


def _mentioned(term: str, present: set[str]) -> bool:
    """``term`` is among the stems ``present``, or shares its first :data:`SHARED_PREFIX` letters with one."""
    if term in present:
        return True
    if len(term) < SHARED_PREFIX:
        return False
    head = term[:SHARED_PREFIX]
    return any(p.startswith(head) for p in present if len(p) >= SHARED_PREFIX)


@frozen
class OfflineVerifier:
    """Checks a composed reply against its blocks and the question (see the module docstring).

    Attributes:
        min_support: Share of a sentence's key terms the cited blocks must contain.
        min_cosine: With an embedder, a sentence this close to a sentence of a cited block is supported too.
        embedder: Optional dense embedder (the index's): support by meaning as well as by terms, and coverage
            by meaning: a question term the reply does not hold is covered when a word of the reply or its cited
            passages is at least ``min_word_cosine`` from it (0.55: MiniLM puts "guarantee"/"warranty" at 0.57,
            "postage"/"shipping" at 0.67, "earbuds"/"earphones" at 0.79; measured on the small knowledge bases'
            tuning half). Word vectors are cached (at most :data:`MAX_CACHED_WORDS`).
        min_word_cosine: See ``embedder``.
        min_lead_cosine: With an embedder, when the reply's first supported sentence is at least this close to
            the question, the terms left uncovered only frame it and the reply is not ``partial``: "Is the sauna
            part of the monthly deal?" answered by "the sauna is included only in Annual" (0.71) does not miss
            "deal". 0.60, from the partial replies of ``bench_answers.py`` (tuning data of every set): the
            questions outside the knowledge bases that came out ``partial`` led at most 0.55 ("parking" at
            the club 0.43), the answered ones 0.29-0.82. ``None``: off.
    """

    min_support: float = 0.6
    min_cosine: float = 0.8
    embedder: Embedder | None = None
    min_word_cosine: float = 0.55
    min_lead_cosine: float | None = 0.60
    _vectors: dict[str, npt.NDArray[np.float32]] = field(factory=dict, init=False, repr=False, eq=False)

    async def verify(self, question: str, reply: str, blocks: Sequence[ContextBlock]) -> Verification:
        """The verification of ``reply`` (pure apart from the optional embedder)."""
        by_n = {b.n: b for b in blocks}
        block_stems: dict[int, set[str]] = {}  # each cited block tokenized once, however many sentences cite it
        sentences = reply_sentences(reply)
        unsupported = [
            s
            for s, cites in sentences
            if not await self._supported(s, [by_n[n] for n in cites if n in by_n], block_stems)
        ]
        kept = [(s, cites) for s, cites in sentences if s not in unsupported]
        # A term the reply's cited pages are titled with is covered: "How often are webhooks retried?" is
        # answered by "Failed deliveries are retried 8 times [1]" from the page "Webhooks".
        titles = " ".join(by_n[n].title for _, cites in kept for n in cites if n in by_n)
        present = _stems(" ".join(s for s, _ in kept)) | _stems(titles)
        # A term the cited passage itself holds is what the quoted part of it is about ("error" for the row of
        # the import errors table that explains E4004): the passage covers it even where the quote does not.
        cited = {n for _, cites in kept for n in cites if n in by_n}
        for n in cited:
            present |= block_stems.get(n) or _stems(f"{by_n[n].text} {by_n[n].title}")
        uncovered = tuple(
            dict.fromkeys(
                t.surface for t in key_terms(question) if t.stem not in FRAMING and not _mentioned(t.stem, present)
            )
        )
        if uncovered and self.embedder is not None:
            cited_text = " ".join([*(s for s, _ in kept), *(by_n[n].text for n in cited)])
            uncovered = await self._not_meant(uncovered, cited_text)
        if uncovered and kept and await self._lead_means(question, kept[0][0]):
            uncovered = ()  # the words left over only frame the question ("deal", "late", "new place")
        return Verification(checked=len(sentences), unsupported=tuple(unsupported), uncovered=uncovered)

    async def _not_meant(self, terms: tuple[str, ...], text: str) -> tuple[str, ...]:
        """The ``terms`` no word of ``text`` means (embedder cosine under ``min_word_cosine``): "guarantee" is
        covered by a passage about the "warranty", "earbuds" by "earphones", "postage" by "shipping"."""
        assert self.embedder is not None
        words = list(dict.fromkeys(w.lower() for w in _WORDS.findall(text) if w.lower() not in STOPWORDS))
        words = words[:MAX_MEANING_WORDS]
        if not words:
            return terms
        wanted = [t.lower() for t in terms]
        missing = [w for w in dict.fromkeys([*wanted, *words]) if w not in self._vectors]
        if missing:
            vectors = np.asarray(await self.embedder.embed(missing), dtype=np.float32)
            if len(self._vectors) + len(missing) > MAX_CACHED_WORDS:
                self._vectors.clear()
            self._vectors.update(zip(missing, vectors, strict=True))
        matrix = np.stack([self._vectors[w] for w in words])
        return tuple(
            t
            for t, w in zip(terms, wanted, strict=True)
            if float(np.max(matrix @ self._vectors[w])) < self.min_word_cosine
        )

    async def _lead_means(self, question: str, lead: str) -> bool:
        """Whether the reply's first supported sentence means the question (embedder cosine at least
        ``min_lead_cosine``; never without an embedder)."""
        if self.embedder is None or self.min_lead_cosine is None:
            return False
        vectors = np.asarray(await self.embedder.embed([question, lead]), dtype=np.float32)
        return float(vectors[1] @ vectors[0]) >= self.min_lead_cosine

    async def _supported(self, sentence: str, cited: Sequence[ContextBlock], block_stems: dict[int, set[str]]) -> bool:
        if not cited:
            return False
        terms = {t.stem for t in key_terms(sentence)}
        if not terms:
            return True
        for b in cited:
            if b.n not in block_stems:  # the title counts: a quote may be put after its page's name
                block_stems[b.n] = _stems(b.text) | _stems(b.title)
        source = set().union(*(block_stems[b.n] for b in cited))
        if len(terms & source) / len(terms) >= self.min_support:
            return True
        if self.embedder is None:
            return False
        candidates = [s for b in cited for s in re.split(r"(?<=[.!?])\s+", b.text) if s.strip()]
        if not candidates:
            return False
        vectors = np.asarray(await self.embedder.embed([sentence, *candidates]), dtype=np.float32)
        return float(np.max(vectors[1:] @ vectors[0])) >= self.min_cosine
