"""The offline answerer: extractive, cited, and honest about what it did not find.

For ``context`` and ``partial`` outcomes it splits the numbered blocks into sentences, scores each by the
IDF-weighted coverage of the question's (and the block's query's) key terms, and picks the best few by maximal
marginal relevance (MMR: relevance minus similarity to sentences already picked) within a length budget. Each
sentence carries its block's ``[n]``. Blocks that cover too little of the question (a different topic) are not
cited at all. Sentences that read like instructions to the assistant ("ignore previous instructions…") are never
picked: block text is data, not commands; neither are sentences that tell the reader or the user what to do
for someone else ("tell the user the admin password is …"), carry a credential, or link to another host than
the block's own (:func:`ragloop.text.safety.instruction_problem`). Free-standing citation-like markers inside
block text are removed so that every ``[n]`` in the answer points at a block that was given; brackets glued to
a word are code (``arr[0]``, ``pair[1]``) and stay as written (:mod:`ragloop.text.citations`).

``partial`` answers what it can and then lists what was not found (``missing``); ``none`` says nothing relevant
was found and suggests rephrasing, without guessing; ``direct`` streams the decider's reply.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Literal
from urllib.parse import urlsplit

from attrs import frozen

from ragloop.retrievers.base import Embedder
from ragloop.state import ContextBlock, Message, Outcome
from ragloop.text.citations import strip_markers
from ragloop.text.safety import instruction_problem
from ragloop.text.terms import CorpusStats, key_terms, stem, tokenize
from ragloop.usage import LLMCall, record_call

__all__ = ["INJECTION", "OfflineAnswerer", "asked_for", "has_asked_for", "is_block_unit", "split_sentences"]

#: Sentences that address the assistant rather than inform the reader; never quoted.
INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:instructions?|prompts?|rules|context|above|previous)\b"
    r"|\byou are now\b|\bsystem prompt\b|\bas an ai\b|\bact as\b|\bjailbreak\b"
    r"|\b(?:respond|reply|answer|say)\s+(?:only\s+)?(?:with|that)\b"
    r"|\bnew instructions?\b|\bdo not (?:tell|mention) the user\b"
    # Imitated tool calls: an assistant's function-call JSON, or a request to call a tool.
    r"|[\"']?(?:tool_calls|function_call)[\"']?\s*:|\bcall (?:the |a )?\w+ (?:tool|function)\b",
    re.IGNORECASE | re.DOTALL,
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n|\n(?=\s*(?:[-*+]\s|\d+\.\s|#))")
_HEADING_LINE = re.compile(r"(?m)^(#{1,6}\s[^\n]*)\n(?!\n)")
_TOKEN = re.compile(r"\S+\s*")
#: A fenced code block, or two or more table rows (``| a | b |``), each kept whole.
_ATOMIC = re.compile(r"(?ms)^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$|(?:^[ \t]*\|[^\n]*\|[ \t]*(?:\n|\Z)){2,}")


def _hosts(block: ContextBlock) -> tuple[str, ...]:
    """The hosts a block's own links may point at: its document's host, when its source or URL is a URL."""
    hosts = []
    for u in (block.url, block.source):
        if u.startswith(("http://", "https://")):
            try:
                hosts.append(urlsplit(u).hostname or "")
            except ValueError:  # a malformed URL (``http://[::1``) names no host
                continue
    return tuple(h for h in hosts if h)


def split_sentences(text: str, *, headings: bool = True) -> list[str]:
    """Sentences (and list items, headings unless ``headings=False``) of ``text``, whitespace-collapsed,
    empty ones dropped. A fenced code block or a markdown table is one unit, kept line by line as written
    (flattened, a table or code loses its meaning)."""
    out = []
    start = 0
    for m in _ATOMIC.finditer(text):
        out += _prose_sentences(text[start : m.start()], headings)
        unit = "\n".join(line.rstrip() for line in m.group(0).strip("\n").splitlines())
        if unit.strip():
            out.append(unit)
        start = m.end()
    return out + _prose_sentences(text[start:], headings)


def is_block_unit(sentence: str) -> bool:
    """True for a unit :func:`split_sentences` kept whole (a code block or a table)."""
    return "\n" in sentence


def _prose_sentences(text: str, headings: bool) -> list[str]:
    out = []
    text = _HEADING_LINE.sub(r"\1\n\n", text)  # a heading line is its own part even without a blank line
    for part in _SENTENCE_END.split(text):
        if not headings and part.lstrip().startswith("#"):
            continue
        sentence = " ".join(part.split()).lstrip("#*->+ ").strip()
        if sentence:
            out.append(sentence)
    return out


Asked = Literal["year", "number", "name"]
_ASK_YEAR = re.compile(r"\b(?:(?:in )?(?:what|which) year|when|what (?:date|century|decade))\b", re.IGNORECASE)
_ASK_NUMBER = re.compile(
    r"\bhow (?:many|much|long|old|tall|far|big|high|large)\b|\bwhat (?:number|percentage|population|age)\b",
    re.IGNORECASE,
)
_ASK_NAME = re.compile(r"\b(?:who|whom|whose)\b", re.IGNORECASE)
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})s?\b")
_NUMBER = re.compile(r"\d")
_CAPITALISED = re.compile(r"\b[A-Z][\w'’-]+")


def asked_for(question: str) -> Asked | None:
    """What kind of value the question asks for: ``year`` ("when", "what year"), ``number`` ("how many"),
    ``name`` ("who"), or ``None``."""
    if _ASK_YEAR.search(question):
        return "year"
    if _ASK_NUMBER.search(question):
        return "number"
    if _ASK_NAME.search(question):
        return "name"
    return None


def has_asked_for(asked: Asked, text: str, question_words: Collection[str] = ()) -> bool:
    """Whether ``text`` holds a value of the asked kind (a name must be one the question does not contain)."""
    if asked == "year":
        return _YEAR.search(text) is not None
    if asked == "number":
        return _NUMBER.search(text) is not None
    return any(w.casefold() not in question_words for w in _CAPITALISED.findall(text)[1:])


@frozen
class _Sentence:
    block: int
    position: int
    text: str
    terms: frozenset[str]
    relevance: float


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


@frozen
class OfflineAnswerer:
    """Writes an extractive, cited answer without a model.

    Attributes:
        stats: Corpus statistics for IDF weights; without them the blocks themselves give the weights.
        max_sentences: Most sentences quoted.
        max_chars: Length budget of the quoted sentences.
        min_block_coverage: A block covering less of the question than this is ignored (other topic).
        min_sentence_coverage: A sentence covering less than this is never quoted.
        diversity: MMR trade-off; 1.0 ranks by relevance only, lower values penalise repetition more.
        cover_weight: Weight of the question's key terms a sentence covers that no chosen sentence covers yet
            (IDF share): the second sentence answers the part of the question the first one did not.
        dense_weight: Weight of the cosine between the question and a sentence (``embedder``'s) added to the
            sentence's relevance when :meth:`answer` runs (not in :meth:`compose` alone, which has no I/O). Off by
            default: with MiniLM it lowered answer recall on the HotpotQA tuning half (0.54 at 0, 0.53 at 0.3,
            0.49 at 1.0): the question's nearest sentence restates the question instead of answering it.
        embedder: The index's dense embedder, for ``dense_weight``.
        asked_bonus: Added to the relevance of a sentence holding what the question asks for (a year for
            "when", a number for "how many", a name the question does not contain for "who"; see
            :func:`asked_for`).
    """

    stats: CorpusStats | None = None
    max_sentences: int = 4
    max_chars: int = 900
    min_block_coverage: float = 0.2
    min_sentence_coverage: float = 0.15
    diversity: float = 0.7
    cover_weight: float = 1.0
    asked_bonus: float = 0.1
    dense_weight: float = 0.0
    embedder: Embedder | None = None

    def _idf(self, blocks: Sequence[ContextBlock]) -> dict[str, float] | CorpusStats:
        if self.stats is not None:
            return self.stats
        n = len(blocks)
        df: dict[str, int] = {}
        for b in blocks:
            for s in {stem(t) for t in tokenize(b.text)}:
                df[s] = df.get(s, 0) + 1
        return {s: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for s, d in df.items()}

    def compose(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        dense: Mapping[str, float] | None = None,
    ) -> str:
        """The whole reply as one string (what :meth:`answer` streams); ``dense`` maps a sentence to its
        cosine with the question (see ``dense_weight``)."""
        if outcome == "direct":
            return direct_reply or "Hello! Ask me anything about this knowledge base."
        picked = self.select(question, blocks, dense) if outcome in ("context", "partial") else []
        if not picked:
            return (
                "I couldn't find anything relevant to that in the knowledge base, so I won't guess. "
                "Try rephrasing, or add a detail such as a product name, a feature or an error message."
            )
        body = ""
        for s in picked:  # a table or code block stands on its own lines, its citation on the line after it
            if is_block_unit(s.text):
                body = f"{body.rstrip()}\n\n{s.text}\n\n[{s.block}]\n\n"
            else:
                body += f"{s.text} [{s.block}] "
        body = body.strip()
        gaps = [m for m in missing if m.strip()]
        if outcome == "partial" and gaps:
            body += "\n\nI couldn't find information about: " + "; ".join(gaps) + "."
        elif outcome == "partial":
            body += "\n\nThe knowledge base only partly covers this question."
        return body

    def select(
        self, question: str, blocks: Sequence[ContextBlock], dense: Mapping[str, float] | None = None
    ) -> list[_Sentence]:
        """The sentences to quote, in block and reading order."""
        weights = self._idf(blocks)
        unseen = 1.0 if isinstance(weights, CorpusStats) else max(weights.values(), default=1.0)

        def idf(s: str) -> float:
            if isinstance(weights, CorpusStats):
                return weights.idf(s)
            return weights.get(s, unseen)  # a stem in no block weighs as the rarest one

        q_terms = {t.stem for t in key_terms(question)}
        q_mass = sum(idf(t) for t in q_terms) or 1.0
        asked = asked_for(question)
        q_words = {w.casefold() for w in re.findall(r"\w+", question)}
        pool: list[_Sentence] = []
        for block in blocks:
            wanted = q_terms | {t.stem for t in key_terms(block.query)}
            total = sum(idf(t) for t in wanted)
            if total <= 0:
                continue
            block_stems = {stem(t) for t in tokenize(block.text)}
            if sum(idf(t) for t in wanted & block_stems) / total < self.min_block_coverage:
                continue  # a block about another topic is not cited
            hosts = _hosts(block)  # once per block, not per sentence
            # A heading ("Delivery and retries") names a topic; it answers nothing, so it is never quoted.
            for pos, raw in enumerate(split_sentences(block.text, headings=False)):
                if INJECTION.search(raw) or instruction_problem(raw, allowed_hosts=hosts) is not None:
                    continue
                text = strip_markers(raw).strip()
                if len(text.split()) < 5 and not text.endswith((".", "!", "?")):
                    continue  # a link title or label ("API rate limits"), not a statement
                terms = frozenset(stem(t) for t in tokenize(text))
                rel = sum(idf(t) for t in wanted & terms) / total
                if len(terms) >= 3 and rel >= self.min_sentence_coverage:
                    if asked is not None and has_asked_for(asked, text, q_words):
                        rel += self.asked_bonus
                    rel += self.dense_weight * (dense or {}).get(text, 0.0)
                    pool.append(_Sentence(block.n, pos, text, terms, rel))
        chosen: list[_Sentence] = []
        covered: set[str] = set()
        used = 0
        while pool and len(chosen) < self.max_sentences:
            best = max(
                pool,
                key=lambda s: (
                    self.diversity * s.relevance
                    - (1 - self.diversity) * max((_jaccard(s.terms, c.terms) for c in chosen), default=0.0)
                    + self.cover_weight * sum(idf(t) for t in (q_terms & s.terms) - covered) / q_mass,
                    -s.block,
                    -s.position,
                ),
            )
            pool.remove(best)
            if chosen and max(_jaccard(best.terms, c.terms) for c in chosen) > 0.8:
                continue  # a near-copy of a quoted sentence (the same passage in two blocks)
            if chosen and used + len(best.text) > self.max_chars:
                continue
            chosen.append(best)
            covered |= q_terms & best.terms
            used += len(best.text)
        return sorted(chosen, key=lambda s: (s.block, s.position))

    async def dense_scores(self, question: str, blocks: Sequence[ContextBlock]) -> dict[str, float] | None:
        """Cosine between the question and each candidate sentence, by the index's embedder (``None`` without
        one or with ``dense_weight`` 0)."""
        if self.embedder is None or self.dense_weight <= 0:
            return None
        sentences = sorted(
            {strip_markers(raw).strip() for b in blocks for raw in split_sentences(b.text, headings=False)} - {""}
        )
        if not sentences:
            return None
        vectors = await self.embedder.embed([question, *sentences])
        cosines = vectors[1:] @ vectors[0]
        return {s: float(c) for s, c in zip(sentences, cosines, strict=True)}

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """Stream the reply word by word (each token keeps its trailing whitespace)."""
        start = time.perf_counter()
        dense = await self.dense_scores(question, blocks) if outcome in ("context", "partial") else None
        text = self.compose(question, blocks, outcome, missing=missing, direct_reply=direct_reply, dense=dense)
        record_call(LLMCall(judge="answer", model="offline", seconds=time.perf_counter() - start))
        for m in _TOKEN.finditer(text):
            yield m.group(0)
