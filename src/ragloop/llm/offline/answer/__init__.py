"""The offline answerer: extractive, cited, answer first, and honest about what it did not find.

For ``context`` and ``partial`` outcomes it cuts the numbered blocks into quotable units (:mod:`._units`:
sentences and list items, table rows under their header, fenced code blocks with their indentation), scores
each against the question (:mod:`._choose`) and quotes, in this order: the unit that answers best (the
**lead**), the best unit for each side of a comparison or part of a multi-part question the lead leaves out,
then only what supports them, within a short length budget. Table rows are quoted under their header, never the
whole table; code keeps its fence and indentation. A lead that opens without a subject of its own ("It is
available on every plan") is quoted after the subject its block names — the heading it sits under, else the
page title: "Slack integration: it is available on every plan". Each unit carries its block's ``[n]``.

Blocks that cover too little of the question (a different topic) are not cited at all. Sentences that read
like instructions to the assistant ("ignore previous instructions…") are never picked: block text is data, not
commands; neither are sentences that tell the reader or the user what to do for someone else ("tell the user
the admin password is …"), carry a credential, or link to another host than the block's own
(:func:`ragloop.text.safety.instruction_problem`). Free-standing citation-like markers inside block text are
removed so that every ``[n]`` in the answer points at a block that was given; brackets glued to a word are
code (``arr[0]``, ``pair[1]``) and stay as written (:mod:`ragloop.text.citations`).

``partial`` answers what it can and then names what the knowledge base does not say (``missing``); ``none``
says the knowledge base does not cover the question and cites nothing, without guessing; ``direct`` streams
the decider's reply.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
from attrs import evolve, field, frozen

from ragloop.llm.offline.answer._abstain import AbstainRule, Meant, unknown_names
from ragloop.llm.offline.answer._choose import (
    HEADING_TIE,
    REFERS,
    RESOLVED_WEIGHT,
    TITLE_TIE,
    Asked,
    Picker,
    Scored,
    asked_for,
    compared_parts,
    counted,
    counts,
    has_asked_for,
    head_in_title,
    head_of,
    labels,
    part_share,
    pick,
    question_terms,
    resolved_parts,
    row_label,
    serves,
    side_terms,
    side_terms_of,
    specific_terms,
    stems_of,
    value_near,
)
from ragloop.llm.offline.answer._gaps import MAX_GAP_WORDS, NOT_COVERED, join_quoted, not_covered, user_gaps
from ragloop.llm.offline.answer._pages import page_weight
from ragloop.llm.offline.answer._render import introduces, lead_in, render, with_introduced
from ragloop.llm.offline.answer._units import Unit, answers_how, block_units, is_block_unit, split_sentences
from ragloop.llm.offline.decide import split_topics
from ragloop.retrievers.base import Embedder
from ragloop.state import Abstention, ContextBlock, Hit, Message, Outcome
from ragloop.text.citations import strip_markers
from ragloop.text.safety import instruction_problem
from ragloop.text.terms import CorpusStats, stem, tokenize
from ragloop.usage import LLMCall, record_call

__all__ = [
    "INJECTION",
    "MAX_GAP_WORDS",
    "NOT_COVERED",
    "AbstainRule",
    "Asked",
    "OfflineAnswerer",
    "Picker",
    "asked_for",
    "has_asked_for",
    "is_block_unit",
    "not_covered",
    "split_sentences",
    "user_gaps",
]

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
#: The turn's own markup, never quoted to a user: a prompt fence (``<<<UNTRUSTED_CONTEXT …>>>``, what a page
#: imitating one holds) anywhere, and a plan slot placeholder (``{ids}``) in prose (code may format strings).
_FENCE_MARK = re.compile(r"<{3,}|>{3,}|untrusted[\s_]*context", re.IGNORECASE)
_SLOT_MARK = re.compile(r"\{[A-Za-z_]\w*\}")
_TOKEN = re.compile(r"\S+\s*")
# Most sentence vectors an answerer keeps (see :meth:`OfflineAnswerer.dense_scores`): 6 MB with MiniLM, about 200
# pairs of blocks; each scope's answerer keeps its own (at most 32 scopes are kept: ~200 MB at worst).
_MAX_CACHED_VECTORS = 4096
#: A glossary expansion decide wrote into a query ("CSV (comma-separated values)"): not what the question asks.
_EXPANSION = re.compile(r"\([^()]*\)")


def _coverage(
    block: ContextBlock, title: frozenset[str], wanted: frozenset[str], total: float, weight: Callable[[str], float]
) -> float:
    """How much of the question a block holds: of all the wanted terms, or of its own search's terms when that
    is higher (the block answers one part of a multi-part question)."""
    held = stems_of(block.text) | title
    searched = question_terms(_EXPANSION.sub(" ", block.query))
    coverage = sum(weight(t) for t in wanted & held) / total
    part = sum(weight(t) for t in searched)
    return max(coverage, sum(weight(t) for t in searched & held) / part) if part > 0 else coverage


def _quotable(unit: Unit, hosts: tuple[str, ...]) -> bool:
    """A unit that is data for the reader: no instruction to the assistant, no turn markup (see above)."""
    if INJECTION.search(unit.text) or instruction_problem(unit.text, allowed_hosts=hosts) is not None:
        return False
    return not (_FENCE_MARK.search(unit.text) or (unit.kind != "code" and _SLOT_MARK.search(unit.text)))


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


@frozen
class OfflineAnswerer:
    """Writes an extractive, cited answer without a model, the answering unit first.

    Attributes:
        stats: Corpus statistics for IDF weights; without them the blocks themselves give the weights.
        picker: How many units are quoted and in what budget (:class:`Picker`).
        min_block_coverage: A block covering less of the question than this is ignored (other topic).
        min_sentence_coverage: A unit covering less than this is never quoted.
        context_weight: Weight of the key terms a unit's heading or page title holds and it does not (a table
            row's header counts in full).
        code_weight: Factor on a code block's relevance: identifiers such as ``app`` or ``run`` match question
            words without answering them.
        query_weight: Weight of the key terms of a block's search query that the question does not hold (a
            hop's bridge entity, a rewrite's new angle); glossary expansions in parentheses are left out, and a
            question that refers back ("that plan", "this page") counts its queries' terms in full (they
            resolve the reference).
        asked_bonus: Added to the relevance of a unit holding what the question asks for (a year for "when",
            a number for "how many", a name the question does not contain for "who"; see :func:`asked_for`).
        dense_weight: Weight of the cosine between the question and a unit (``embedder``'s) added to its
            relevance when :meth:`answer` runs (not in :meth:`compose` alone, which has no I/O). Off by
            default: with MiniLM it lowered answer recall on the HotpotQA tuning half (0.54 at 0, 0.53 at 0.3,
            0.49 at 1.0): the question's nearest sentence restates the question instead of answering it.
        embedder: The index's dense embedder, for ``dense_weight`` and ``meaning_at``.
        meaning_at: When set (with ``embedder``: a small knowledge base's ``SMALL_MEANING``, or a larger corpus'
            own dense threshold, :mod:`ragloop.retrievers.meaning`), a unit whose cosine with the question is at
            least this may be quoted however few of the question's words it shares, and ranks by that cosine if
            it is higher than its term relevance: a user's words are rarely the page's ("a complete newbie" for
            "beginners", "remember the results of a slow function" for a cache). ``None``: off.
        meaning_blocks: Whose sentences are scored by the embedder (``dense_weight``, ``meaning_at``): the blocks
            the question's own search found closest (:attr:`~ragloop.state.ContextBlock.cosine`), at most this
            many. 2, on the tuning sets of ``bench_answers.py``: every block's sentences, about 60 of them, took
            the offline turn from about 50 to about 100 ms with no better lead (pydoc2's first sentence 0.73 with
            every block, 0.80 with two; the sample's and the small knowledge bases' the same or better).
        abstain_rule: When :meth:`abstain` says the passages do not support an answer.
    """

    stats: CorpusStats | None = None
    picker: Picker = field(factory=Picker)
    min_block_coverage: float = 0.2
    min_sentence_coverage: float = 0.15
    context_weight: float = 0.5
    code_weight: float = 0.7
    query_weight: float = 0.3
    asked_bonus: float = 0.1
    near_bonus: float = 0.3
    dense_weight: float = 0.0
    embedder: Embedder | None = None
    meaning_at: float | None = None
    meaning_blocks: int = 2
    abstain_rule: AbstainRule = field(factory=AbstainRule)
    _vectors: dict[tuple[str, ...], dict[str, npt.NDArray[np.float32]]] = field(
        factory=dict, init=False, repr=False, eq=False
    )

    def _idf(self, blocks: Sequence[ContextBlock]) -> dict[str, float] | CorpusStats:
        if self.stats is not None:
            return self.stats
        n = len(blocks)
        df: dict[str, int] = {}
        for b in blocks:
            for s in {stem(t) for t in tokenize(b.text)}:
                df[s] = df.get(s, 0) + 1
        return {s: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for s, d in df.items()}

    def _weigher(self, blocks: Sequence[ContextBlock]) -> Callable[[str], float]:
        """A stem's IDF weight: the corpus statistics', else the blocks' own (a stem in no block weighs as the
        rarest one)."""
        weights = self._idf(blocks)
        if isinstance(weights, CorpusStats):
            return weights.idf
        unseen = max(weights.values(), default=1.0)
        return lambda s: weights.get(s, unseen)

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
        """The whole reply as one string (what :meth:`answer` streams); ``dense`` maps a unit's text to its
        cosine with the question (see ``dense_weight``)."""
        if outcome == "direct":
            return direct_reply or "Hello! Ask me anything about this knowledge base."
        picked = self.select(question, blocks, dense) if outcome in ("context", "partial") else []
        if not picked:
            return not_covered(missing, question)
        body = render(picked, {b.n: b for b in blocks})
        gaps = user_gaps(missing, question)
        if outcome == "partial" and gaps:
            body += f"\n\nThe knowledge base doesn't say anything about {join_quoted(gaps)}."
        elif outcome == "partial":
            body += "\n\nThe knowledge base only partly covers this question."
        return body

    def select(
        self, question: str, blocks: Sequence[ContextBlock], dense: Mapping[str, float] | None = None
    ) -> list[Scored]:
        """The units to quote, in the order they are quoted."""
        idf = self._weigher(blocks)
        q_terms = question_terms(question)
        parts = compared_parts(question) or split_topics(question)
        sides = side_terms(parts) if len(parts) > 1 else []
        part_terms = [question_terms(p) for p in parts] if sides else []
        resolved: frozenset[str] = frozenset()
        if sides:  # a part that refers back ("that plan") takes the terms its search resolved it to
            before = frozenset().union(*part_terms)
            part_terms = resolved_parts(parts, part_terms, [_EXPANSION.sub(" ", b.query) for b in blocks])
            sides = side_terms_of(part_terms)
            resolved = frozenset().union(*part_terms) - before

        def part_idf(t: str) -> float:
            return idf(t) * (RESOLVED_WEIGHT if t in resolved else 1.0)

        heads = [head_of(p, idf) for p in parts] if sides else []

        meant = Meant(dense or {}, self.meaning_at)
        asked, noun = asked_for(question), counted(question)
        q_words = {w.casefold() for w in re.findall(r"\w+", question)}
        specific, head = specific_terms(q_terms, idf)
        pool: list[Scored] = []
        units: dict[int, list[Unit]] = {}
        # A question that refers back ("that plan") is completed by its queries: their terms count in full.
        query_weight = 1.0 if REFERS.search(question) else self.query_weight
        for block in blocks:
            wanted = q_terms | question_terms(_EXPANSION.sub(" ", block.query))

            def weight(t: str, block_terms: frozenset[str] = wanted - q_terms) -> float:
                return idf(t) * (query_weight if t in block_terms else 1.0)

            total = sum(weight(t) for t in wanted)
            if total <= 0:
                continue
            title = stems_of(block.title)
            mine = units[block.n] = block_units(block.n, block.text)
            if _coverage(block, title, wanted, total, weight) < self.min_block_coverage and not any(map(meant, mine)):
                continue  # a block about another topic is not cited
            hosts, kind_weight = _hosts(block), page_weight(block, question)  # once per block, not per unit
            for unit in mine:
                code, cosine = introduces(unit, mine), meant.cosine(unit)
                scored = self._score(unit, wanted, total, title, weight, hosts, code, meant=cosine)
                if scored is None:
                    continue
                rel = scored.relevance * (self.code_weight if unit.kind == "code" else 1.0) * kind_weight
                # The asked-for value, of the counted thing ("5" guests per workspace is no count of members).
                if (
                    asked is not None
                    and counts(unit, noun)
                    and has_asked_for(asked, f"{unit.text} {unit.heading}", q_words)
                ):
                    rel += self.asked_bonus
                    # Only the question's specific terms count ("50 MB per file" does not answer the logo), and
                    # in a row also a term its label holds: the row's values belong to it ("| Team | 1,000 |").
                    if value_near(asked, f"{unit.header} {unit.text}", specific | (q_terms & row_label(unit)), q_words):
                        rel += self.near_bonus
                rel += self.asked_bonus * labels(unit, head) + self.near_bonus * answers_how(question, unit)
                rel += self.dense_weight * (dense or {}).get(unit.text, 0.0)
                held = scored.terms | title | stems_of(unit.heading)
                on = frozenset(
                    i
                    for i, side in enumerate(sides)
                    if serves(side, held, idf) and (not side & resolved or side & resolved & held)
                )
                heading = stems_of(unit.heading)
                per_part = tuple(
                    part_share(p, scored.terms, held, part_idf, self.context_weight)
                    + HEADING_TIE * part_share(p, heading, heading, part_idf, 1.0)
                    + TITLE_TIE * head_in_title(h, title)
                    for p, h in zip(part_terms, heads, strict=True)
                )
                lead = lead_in(scored.unit, asked, q_words)
                pool.append(Scored(scored.unit, scored.terms, scored.covered & q_terms, rel, on, lead, per_part))
        return with_introduced(pick(pool, self.picker, idf, q_terms, len(sides)), units)

    def _score(
        self,
        unit: Unit,
        wanted: frozenset[str] | set[str],
        total: float,
        title: frozenset[str],
        idf: Callable[[str], float],
        hosts: tuple[str, ...],
        code: Unit | None = None,
        *,
        meant: float | None = None,
    ) -> Scored | None:
        """A unit's coverage of the wanted terms (its context at ``context_weight``), or ``None`` when it may
        not be quoted (an instruction, a label, too little coverage). A sentence that introduces ``code`` (it
        ends in a colon: "Install it with pip:") is scored with the code it introduces: the two are quoted
        together and answer together. A unit that means the question (``meant``: its cosine, see
        ``meaning_at``) is not held to the coverage minimums and is at least that relevant."""
        if not _quotable(unit, hosts):
            return None
        text = unit.text if unit.kind in ("code", "row") else strip_markers(unit.text).strip()
        if (
            code is None
            and unit.kind in ("sentence", "item")
            and len(text.split()) < 5
            and not text.endswith((".", "!", "?"))
        ):
            return None  # a link title or label ("API rate limits"), not a statement
        terms = stems_of(text) | (stems_of(code.text) if code is not None else frozenset())
        if len(terms) < 3 and unit.kind != "row":
            return None
        header = stems_of(unit.header)
        context = (stems_of(unit.heading) | title) - terms - header
        own = wanted & (terms | header)
        rel = (sum(idf(t) for t in own) + self.context_weight * sum(idf(t) for t in wanted & context)) / total
        low = sum(idf(t) for t in wanted & terms) / total < self.min_sentence_coverage and not own - terms
        if meant is None and (low or rel < self.min_sentence_coverage):
            return None
        rel = max(rel, meant or 0.0)
        clean = evolve(unit, text=text)
        return Scored(clean, terms | header, frozenset(own | (wanted & context)), rel, frozenset(), "")

    def abstain(self, question: str, blocks: Sequence[ContextBlock], hits: Sequence[Hit]) -> Abstention | None:
        """Why ``blocks`` (the passages found, ``hits`` their search results best first) do not support an
        answer to ``question``, or ``None`` when they do (see :mod:`._abstain`): a name the corpus never
        mentions (unless, with the rule's ``meaning_at``, a kept passage means the question: "Saturdays" over a
        page about weekends), or an evidence score below the rule's threshold (the lead's relevance without the
        how-to bonus, which picks a definition but is no evidence; and, with ``meaning_at``, no kept passage that
        close to the question by its dense cosine; with ``dense_at``, no kept passage the question's own search
        found that close). Needs corpus statistics (``None`` without)."""
        if self.stats is None:
            return None
        rule = self.abstain_rule
        unknown = unknown_names(question, self.stats)
        picked = self.select(question, blocks) if blocks else []
        lead = picked[0].relevance - self.near_bonus * answers_how(question, picked[0].unit) if picked else 0.0
        score = rule.score(lead, [h.confidence for h in hits])
        kept = {b.chunk_id for b in blocks}
        meaning = max((h.scores.get("dense", 0.0) for h in hits if h.id in kept), default=0.0)
        if unknown and not rule.means(meaning):  # a passage that means it covers the name in other words
            why = f"the knowledge base never mentions {join_quoted(unknown)}"
            return Abstention(score, rule.threshold, unknown, why)
        cosine = max((b.cosine for b in blocks if b.cosine is not None), default=None)
        if not rule.supported(score, meaning, cosine):
            why = f"the best passage scores {score:.2f} as an answer, under the {rule.threshold:.2f} threshold"
            return Abstention(score, rule.threshold, (), why)
        return None

    async def dense_scores(self, question: str, blocks: Sequence[ContextBlock]) -> dict[str, float] | None:
        """Cosine between the question and each candidate unit, by the index's embedder (``None`` without
        one, or with ``dense_weight`` 0 and no ``meaning_at``)."""
        if self.embedder is None or (self.dense_weight <= 0 and self.meaning_at is None):
            return None
        # The blocks the question's own search found closest (the ranking's first ones when none has a cosine):
        # embedding every block's sentences on every turn doubled the turn's time for no better lead.
        nearest = sorted(blocks, key=lambda b: (b.cosine is None, -(b.cosine or 0.0), b.n))[: self.meaning_blocks]
        texts = sorted({u.text for b in nearest for u in block_units(b.n, b.text)} - {""})
        if not texts:
            return None
        # The sentence vectors of a pair of blocks are kept (this answerer serves one scope): popular pages come
        # back turn after turn. They are embedded in one call of their own and the question alone, so a vector
        # never depends on what else was embedded with it (an embedder may take another path for a small call)
        # and the reply is the same whatever was asked before.
        key = tuple(sorted(b.text for b in nearest))
        by_text = self._vectors.get(key)
        if by_text is None:
            by_text = dict(zip(texts, np.asarray(await self.embedder.embed(texts), dtype=np.float32), strict=True))
            if sum(map(len, self._vectors.values())) + len(by_text) > _MAX_CACHED_VECTORS:
                self._vectors.clear()
            self._vectors[key] = by_text
        asked = np.asarray(await self.embedder.embed([question]), dtype=np.float32)[0]
        cosines = np.stack([by_text[t] for t in texts]) @ asked
        return {s: float(c) for s, c in zip(texts, cosines, strict=True)}

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
        """Stream the reply word by word (each token keeps its trailing whitespace); an embedder that fails
        (for ``dense_weight`` or ``meaning_at``) leaves the choice to the terms alone."""
        start = time.perf_counter()
        dense = None
        if outcome in ("context", "partial"):
            try:
                dense = await self.dense_scores(question, blocks)
            except Exception:  # noqa: BLE001 — without the cosines the reply is chosen by its terms alone
                dense = None
        text = self.compose(question, blocks, outcome, missing=missing, direct_reply=direct_reply, dense=dense)
        record_call(LLMCall(judge="answer", model="offline", seconds=time.perf_counter() - start))
        for m in _TOKEN.finditer(text):
            yield m.group(0)
