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

from attrs import field, frozen

from ragloop.llm.offline.answer._choose import (
    Asked,
    Picker,
    Scored,
    asked_for,
    has_asked_for,
    pick,
    question_terms,
    side_terms,
    stems_of,
    value_near,
)
from ragloop.llm.offline.answer._units import Unit, block_units, is_block_unit, split_sentences
from ragloop.llm.offline.decide import split_topics
from ragloop.retrievers.base import Embedder
from ragloop.state import ContextBlock, Message, Outcome
from ragloop.text.citations import strip_markers
from ragloop.text.safety import instruction_problem
from ragloop.text.terms import CorpusStats, key_terms, stem, tokenize
from ragloop.usage import LLMCall, record_call

__all__ = [
    "INJECTION",
    "NOT_COVERED",
    "Asked",
    "OfflineAnswerer",
    "Picker",
    "asked_for",
    "has_asked_for",
    "is_block_unit",
    "not_covered",
    "split_sentences",
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
#: How a reply with nothing to quote begins: it says the knowledge base does not cover the question.
NOT_COVERED = "The knowledge base doesn't cover this, so I won't guess."
_TRY = "Try rephrasing, or add a detail such as a product name, a feature or an error message."
_TOKEN = re.compile(r"\S+\s*")
#: An opening word that refers back to a subject the sentence does not name ("It returns …", "They are …").
_SUBJECTLESS = re.compile(r"^(?:It|Its|It's|This|That|These|Those|They|Their|Them|He|She|His|Her)\b|^[a-z]")
_ANCHOR = re.compile(r"\s*\{\s*#[\w-]*\s*\}\s*$")


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


#: A gap longer than this many words (a whole question) is not named in a "not covered" reply.
MAX_GAP_WORDS = 4


def not_covered(missing: Sequence[str] = ()) -> str:
    """The reply for a question the knowledge base does not cover, naming the few words it says nothing about
    ("Trello"); a longer gap (the whole question) is not repeated back."""
    gaps = [m.strip() for m in missing if m.strip() and len(m.split()) <= MAX_GAP_WORDS]
    if not gaps:
        return f"{NOT_COVERED} {_TRY}"
    return f"The knowledge base doesn't cover this: it says nothing about {_join(gaps)}, so I won't guess. {_TRY}"


def _join(items: Sequence[str]) -> str:
    quoted = [f"“{i}”" for i in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _subject(block: ContextBlock, unit: Unit) -> str:
    """What a unit's block is about: the heading it sits under, else the page title (anchors removed)."""
    return _ANCHOR.sub("", unit.heading or block.title).strip()


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
            glossary expansion, a resolved pronoun, a hop's bridge entity).
        asked_bonus: Added to the relevance of a unit holding what the question asks for (a year for "when",
            a number for "how many", a name the question does not contain for "who"; see :func:`asked_for`).
        dense_weight: Weight of the cosine between the question and a unit (``embedder``'s) added to its
            relevance when :meth:`answer` runs (not in :meth:`compose` alone, which has no I/O). Off by
            default: with MiniLM it lowered answer recall on the HotpotQA tuning half (0.54 at 0, 0.53 at 0.3,
            0.49 at 1.0): the question's nearest sentence restates the question instead of answering it.
        embedder: The index's dense embedder, for ``dense_weight``.
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
        """The whole reply as one string (what :meth:`answer` streams); ``dense`` maps a unit's text to its
        cosine with the question (see ``dense_weight``)."""
        if outcome == "direct":
            return direct_reply or "Hello! Ask me anything about this knowledge base."
        picked = self.select(question, blocks, dense) if outcome in ("context", "partial") else []
        if not picked:
            return not_covered(missing if outcome == "none" else ())
        body = _render(picked, {b.n: b for b in blocks})
        gaps = [m for m in missing if m.strip()]
        if outcome == "partial" and gaps:
            body += f"\n\nThe knowledge base doesn't say anything about {_join(gaps)}."
        elif outcome == "partial":
            body += "\n\nThe knowledge base only partly covers this question."
        return body

    def select(
        self, question: str, blocks: Sequence[ContextBlock], dense: Mapping[str, float] | None = None
    ) -> list[Scored]:
        """The units to quote, in the order they are quoted."""
        weights = self._idf(blocks)
        unseen = 1.0 if isinstance(weights, CorpusStats) else max(weights.values(), default=1.0)

        def idf(s: str) -> float:
            if isinstance(weights, CorpusStats):
                return weights.idf(s)
            return weights.get(s, unseen)  # a stem in no block weighs as the rarest one

        q_terms = question_terms(question)
        parts = split_topics(question)
        sides = side_terms(parts) if len(parts) > 1 else []
        part_terms = [question_terms(p) for p in parts] if sides else []
        asked = asked_for(question)
        q_words = {w.casefold() for w in re.findall(r"\w+", question)}
        pool: list[Scored] = []
        units: dict[int, list[Unit]] = {}
        for block in blocks:
            wanted = q_terms | {t.stem for t in key_terms(block.query)}

            def weight(t: str, block_terms: frozenset[str] = wanted - q_terms) -> float:
                return idf(t) * (self.query_weight if t in block_terms else 1.0)

            total = sum(weight(t) for t in wanted)
            if total <= 0:
                continue
            title = stems_of(block.title)
            if sum(weight(t) for t in wanted & (stems_of(block.text) | title)) / total < self.min_block_coverage:
                continue  # a block about another topic is not cited
            hosts = _hosts(block)  # once per block, not per unit
            units[block.n] = block_units(block.n, block.text)
            for unit in units[block.n]:
                scored = self._score(unit, wanted, total, title, weight, hosts)
                if scored is None:
                    continue
                rel = scored.relevance * (self.code_weight if unit.kind == "code" else 1.0)
                if asked is not None and has_asked_for(asked, f"{unit.text} {unit.heading}", q_words):
                    rel += self.asked_bonus
                    if value_near(asked, f"{unit.header} {unit.text}", q_terms, q_words):
                        rel += self.near_bonus
                rel += self.dense_weight * (dense or {}).get(unit.text, 0.0)
                held = scored.terms | title | stems_of(unit.heading)
                on = frozenset(i for i, side in enumerate(sides) if _serves(side, held, idf))
                heading = stems_of(unit.heading)
                per_part = tuple(
                    _share(p, scored.terms, held, idf, self.context_weight)
                    + HEADING_TIE * _share(p, heading, heading, idf, 1.0)
                    for p in part_terms
                )
                lead_in = _lead_in(scored.unit, asked, q_words)
                pool.append(Scored(scored.unit, scored.terms, scored.covered & q_terms, rel, on, lead_in, per_part))
        return _with_introduced(pick(pool, self.picker, idf, q_terms, len(sides)), units)

    def _score(
        self,
        unit: Unit,
        wanted: frozenset[str] | set[str],
        total: float,
        title: frozenset[str],
        idf: Callable[[str], float],
        hosts: tuple[str, ...],
    ) -> Scored | None:
        """A unit's coverage of the wanted terms (its context at ``context_weight``), or ``None`` when it may
        not be quoted (an instruction, a label, too little coverage)."""
        if INJECTION.search(unit.text) or instruction_problem(unit.text, allowed_hosts=hosts) is not None:
            return None
        text = unit.text if unit.kind in ("code", "row") else strip_markers(unit.text).strip()
        if unit.kind in ("sentence", "item") and len(text.split()) < 5 and not text.endswith((".", "!", "?")):
            return None  # a link title or label ("API rate limits"), not a statement
        terms = stems_of(text)
        if len(terms) < 3 and unit.kind != "row":
            return None
        header = stems_of(unit.header)
        context = (stems_of(unit.heading) | title) - terms - header
        own = wanted & (terms | header)
        rel = (sum(idf(t) for t in own) + self.context_weight * sum(idf(t) for t in wanted & context)) / total
        if sum(idf(t) for t in wanted & terms) / total < self.min_sentence_coverage and not own - terms:
            return None
        if rel < self.min_sentence_coverage:
            return None
        clean = Unit(unit.block, unit.position, unit.kind, text, unit.heading, unit.header, unit.table)
        return Scored(clean, terms | header, frozenset(own | (wanted & context)), rel, frozenset(), "")

    async def dense_scores(self, question: str, blocks: Sequence[ContextBlock]) -> dict[str, float] | None:
        """Cosine between the question and each candidate unit, by the index's embedder (``None`` without
        one or with ``dense_weight`` 0)."""
        if self.embedder is None or self.dense_weight <= 0:
            return None
        texts = sorted({u.text for b in blocks for u in block_units(b.n, b.text)} - {""})
        if not texts:
            return None
        vectors = await self.embedder.embed([question, *texts])
        cosines = vectors[1:] @ vectors[0]
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
        """Stream the reply word by word (each token keeps its trailing whitespace)."""
        start = time.perf_counter()
        dense = await self.dense_scores(question, blocks) if outcome in ("context", "partial") else None
        text = self.compose(question, blocks, outcome, missing=missing, direct_reply=direct_reply, dense=dense)
        record_call(LLMCall(judge="answer", model="offline", seconds=time.perf_counter() - start))
        for m in _TOKEN.finditer(text):
            yield m.group(0)


def _render(picked: Sequence[Scored], by_n: Mapping[int, ContextBlock]) -> str:
    """The quoted units as reply text: prose with ``[n]`` after each sentence, a table's rows under their
    header (one table once, its citation on the line after it), code blocks on their own lines."""
    pieces: list[str | list[Unit]] = []  # text, or the rows of one table
    tables: dict[tuple[int, int], list[Unit]] = {}
    previous: Unit | None = None
    for i, s in enumerate(picked):
        u = s.unit
        if u.kind == "row":
            if (u.block, u.table) not in tables:
                tables[(u.block, u.table)] = []
                pieces.append(tables[(u.block, u.table)])
            tables[(u.block, u.table)].append(u)
        elif u.kind == "code":
            pieces.append(f"\n\n{u.text}\n\n[{u.block}]\n\n")
        else:
            continues = previous is not None and previous.block == u.block and u.position == previous.position + 1
            text = u.text if continues else _with_subject(u, by_n[u.block], s.lead_in)
            introduces = i + 1 < len(picked) and _introduced(u, picked[i + 1].unit)
            pieces.append(f"{text}" if introduces else f"{text} [{u.block}] ")
        previous = u
    text = "".join(piece if isinstance(piece, str) else _table(piece) for piece in pieces)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _table(rows: Sequence[Unit]) -> str:
    """Rows of one table under its header line, the citation on the line after it."""
    header = rows[0].header
    head = [header, "|" + "---|" * (header.count("|") - 1)] if header else []
    return "\n\n" + "\n".join([*head, *(r.text for r in rows)]) + f"\n\n[{rows[0].block}]\n\n"


def _with_subject(unit: Unit, block: ContextBlock, lead_in: str) -> str:
    """A sentence after the subject it leaves to its context: the heading that holds the value asked for
    ("v3.2.0 — 23 July 2024: **Passkeys** can be registered …"), or, for one that opens without a subject of
    its own ("It is …"), the heading or page title its block names."""
    text = unit.text
    if lead_in:
        return f"{lead_in}: {text}"
    subject = _subject(block, unit)
    if not _SUBJECTLESS.match(text) or not subject or not stems_of(subject) - stems_of(text):
        return text
    first = text.split(" ", 1)[0]
    lowered = first.lower() if first[:1].isupper() and not first.isupper() else first
    return f"{subject}: {lowered}{text[len(first) :]}"


#: A unit serves a side of a comparison when it holds this share of the side's distinctive terms (IDF mass).
SIDE_SHARE = 0.5


def _serves(side: frozenset[str], held: frozenset[str], idf: Callable[[str], float]) -> bool:
    total = sum(idf(t) for t in side)
    return total > 0 and sum(idf(t) for t in side & held) >= SIDE_SHARE * total


#: Weight of a part's terms in a unit's heading when units are ranked for that part (the section about it).
HEADING_TIE = 0.25


def _share(
    part: frozenset[str], own: frozenset[str], held: frozenset[str], idf: Callable[[str], float], weight: float
) -> float:
    """IDF share of a question part's terms a unit holds (its context's at ``weight``)."""
    total = sum(idf(t) for t in part) or 1.0
    return (sum(idf(t) for t in part & own) + weight * sum(idf(t) for t in (part & held) - own)) / total


def _lead_in(unit: Unit, asked: Asked | None, question_words: set[str]) -> str:
    """The heading a prose unit is quoted after when only the heading holds the value asked for."""
    if asked is None or unit.kind not in ("sentence", "item") or not unit.heading:
        return ""
    if has_asked_for(asked, unit.text, question_words) or not has_asked_for(asked, unit.heading, question_words):
        return ""
    return _ANCHOR.sub("", unit.heading).strip()


#: A code block a sentence ending in a colon introduces is quoted with it when it has at most this many lines.
MAX_INTRODUCED_LINES = 20


def _introduced(unit: Unit, nxt: Unit) -> bool:
    """``nxt`` is the code block that ``unit`` (a sentence ending in a colon) introduces."""
    return (
        unit.kind in ("sentence", "item")
        and unit.text.rstrip().endswith(":")
        and nxt.kind == "code"
        and nxt.block == unit.block
        and nxt.position == unit.position + 1
    )


def _with_introduced(chosen: list[Scored], units: Mapping[int, Sequence[Unit]]) -> list[Scored]:
    """``chosen`` with the short code block right after each chosen sentence that ends in a colon
    ("… specify the version with:" and the block that shows it)."""
    out: list[Scored] = []
    quoted = {(s.unit.block, s.unit.position) for s in chosen}
    for s in chosen:
        out.append(s)
        block = units.get(s.unit.block, ())
        nxt = block[s.unit.position + 1] if s.unit.position + 1 < len(block) else None
        if (
            nxt is not None
            and _introduced(s.unit, nxt)
            and (nxt.block, nxt.position) not in quoted
            and nxt.text.count("\n") < MAX_INTRODUCED_LINES
        ):
            out.append(Scored(nxt, stems_of(nxt.text), frozenset(), 0.0, frozenset(), ""))
            quoted.add((nxt.block, nxt.position))
    return out
