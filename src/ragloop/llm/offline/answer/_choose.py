"""Which units an extractive answer quotes, and in what order: the one that answers first, then what supports it.

Every unit (:mod:`._units`) is scored by the IDF-weighted share of the question's key terms (and its block's
query's) it holds; its context — a row's table header in full, the heading above it and the page title at half
weight — counts too, so "| Team | $9 | $11 |" answers "what does Team cost monthly" through its header
"Billed monthly". A unit holding the kind of value asked for (a year for "when", a number for "how many", a new
name for "who") gets a bonus. The **lead** is the best unit of all; each side of a comparison or part of a
multi-part question that the lead leaves out gets its own best unit next; then **support**: units within
``support_ratio`` of the lead's score that add a key term not yet covered, within the length budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Literal

from attrs import frozen

from ragloop.llm.offline.answer._units import Unit
from ragloop.text.terms import STOPWORDS, key_terms, stem, tokenize

__all__ = [
    "COMPARING",
    "HEADING_TIE",
    "REFERS",
    "RESOLVED_WEIGHT",
    "SIDE_SHARE",
    "TITLE_TIE",
    "Asked",
    "Picker",
    "Scored",
    "asked_for",
    "compared_parts",
    "counted",
    "counts",
    "has_asked_for",
    "head_in_title",
    "head_of",
    "labels",
    "part_share",
    "pick",
    "question_terms",
    "resolved_parts",
    "row_label",
    "serves",
    "side_terms",
    "side_terms_of",
    "specific_terms",
    "stems_of",
    "value_near",
]

#: What kind of value a question asks for, when it asks for one.
Asked = Literal["year", "number", "version", "name"]
_ASK_YEAR = re.compile(r"\b(?:(?:in )?(?:what|which) year|when|what (?:date|century|decade))\b", re.IGNORECASE)
_ASK_NUMBER = re.compile(
    r"\bhow (?:many|much|long|old|tall|far|big|high|large|quickly|fast|soon|often|frequently)\b"
    r"|\bwhat (?:number|percentage|population|age)\b|\b(?:what's|what is) the (?:most|maximum|max|limit|largest)\b",
    re.IGNORECASE,
)
_ASK_VERSION = re.compile(r"\b(?:which|what) (?:release|version)\b|\bsince (?:which|what) version\b", re.IGNORECASE)
_ASK_NAME = re.compile(r"\b(?:who|whom|whose)\b", re.IGNORECASE)
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})s?\b")
#: A number standing on its own ("10,000", "$11", "99.9%", "30-day"), not a digit inside a name ("2FA", "E4004").
_NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*(?![A-Za-z_])")
_VERSION = re.compile(r"(?<![\w.])v?\d+\.\d+(?:\.\d+)*\b")
_CAPITALISED = re.compile(r"\b[A-Z][\w'’-]+")


def asked_for(question: str) -> Asked | None:
    """What kind of value the question asks for: ``year`` ("when", "what year"), ``number`` ("how many",
    "how quickly"), ``version`` ("which release"), ``name`` ("who"), or ``None``."""
    if _ASK_VERSION.search(question):
        return "version"
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
    if asked == "version":
        return _VERSION.search(text) is not None
    return any(w.casefold() not in question_words for w in _CAPITALISED.findall(text)[1:])


_WORD = re.compile(r"[\w'’.,-]*\w")
#: "How many X …", "How long is the X good for", "How big can the X be": the words naming what is counted or
#: measured run up to the first of these (a verb, an auxiliary or a preposition), or the question's end.
_SUBJECT_WORDS = (
    "can could do does did are is were was will would should may might must have has be per in on of for at to "
    "by with from before after until when if good valid take takes last kept stay cost costs allowed"
)
_SUBJECT_END = frozenset(re.findall(r"\w+", _SUBJECT_WORDS))
_HOW_MUCH = re.compile(
    r"\bhow many\s+([^?.!]*)|\bhow (?:much|long|big|large|old|far|often|soon|quickly|fast)\s+"
    r"(?:is|are|do|does|can|will|should|must)\s+(?:the|my|a|an|your|our|their)\s+([^?.!]*)",
    re.IGNORECASE,
)


def counted(question: str) -> str:
    """The noun a "how many / how long / how big" question counts or measures, as a stem ("member" for "How
    many members can a Free workspace have?", "link" for "How long is the password reset link good for?": after
    "how many", or a determiner that opens a noun phrase), or ``""``: a number that counts something else ("5"
    guests per workspace) does not answer it."""
    m = _HOW_MUCH.search(question)
    words: list[str] = []
    for w in re.findall(r"[\w'’-]+", (m.group(1) or m.group(2)) if m else ""):
        if w.lower() in _SUBJECT_END or len(words) == 4:
            break
        words.append(w)
    named = [w for w in words if w.lower() not in STOPWORDS]
    return stem(named[-1].lower()) if named else ""


def counts(unit: Unit, noun: str) -> bool:
    """Whether ``unit`` (its text, table header or heading) names the counted ``noun`` (always, without one)."""
    return not noun or noun in stems_of(f"{unit.text} {unit.header} {unit.heading}")


def value_near(
    asked: Asked, text: str, q_terms: Collection[str], question_words: Collection[str], span: int = 3
) -> bool:
    """Whether a value of the asked kind sits within ``span`` words of a key term of the question ("at most
    **10,000 rows**" for "the most rows"): term proximity, the value that answers rather than any number."""
    words = _WORD.findall(text)
    at_terms = [i for i, w in enumerate(words) if stem(w.lower().strip(".,")) in q_terms]
    if not at_terms:
        return False
    if asked == "year":
        values = [i for i, w in enumerate(words) if _YEAR.fullmatch(w.strip(".,"))]
    elif asked == "number":
        values = [i for i, w in enumerate(words) if _NUMBER.match(w)]
    elif asked == "version":
        values = [i for i, w in enumerate(words) if _VERSION.match(w)]
    else:
        values = [i for i, w in enumerate(words) if w[:1].isupper() and w.casefold() not in question_words and i]
    return any(abs(i - j) <= span for i in values for j in at_terms)


@frozen
class Scored:
    """A unit with what it covers and how well it answers.

    Attributes:
        unit: The unit.
        terms: Its own stems.
        covered: The question's key terms it (or its context) holds.
        relevance: IDF share of the wanted terms it holds, context at its weight, plus the asked-for bonus.
        sides: Indexes of the question's parts whose distinctive terms it holds.
        lead_in: The heading it is quoted after, when only that heading holds the value asked for.
        part_scores: Per part of the question (when it has several), the IDF share of that part's terms held.
    """

    unit: Unit
    terms: frozenset[str]
    covered: frozenset[str]
    relevance: float
    sides: frozenset[int]
    lead_in: str = ""
    part_scores: tuple[float, ...] = ()


#: A reference back to something named elsewhere ("that plan", "it"), not "it is"/"that are".
REFERS = re.compile(r"\b(?:it|its|this|that|these|those|they|them|their)\b(?!\s+(?:is|are|was|were)\b)", re.I)
#: Words that frame a comparison rather than name what it is about; never counted as key terms.
COMPARING = frozenset(
    stem(w) for w in ("compare", "comparing", "comparison", "difference", "different", "differ", "versus", "vs")
)


#: How-to verbs a page says in other words ("set up SAML" is done where the page says SAML "is configured").
_HOW_TO = re.compile(r"\bset\s*-?\s*up\b|\bsetup\b", re.IGNORECASE)


#: "How does the monthly price of Team compare with Business?": what is compared, the name before "compare" and
#: the one after it ("with", "to", "against").
_COMPARE_WITH = re.compile(
    r"^(?P<pre>.*?)\b(?P<a>[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*)*)\s+(?:compares?|stacks? up)\s+(?:with|to|against)\s+"
    r"(?P<b>(?:the\s+)?[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*)*)(?P<post>.*)$"
)


def compared_parts(question: str) -> list[str]:
    """A comparison written "<what> of A compare(s) with B" as one part per side, each with what is compared
    ("monthly price of Team", "monthly price of Business"), so that each side gets its own best unit; ``[]``
    for any other question (:func:`~ragloop.llm.offline.decide.split_topics` splits "A vs B" itself)."""
    m = _COMPARE_WITH.match(question.strip())
    if m is None:
        return []
    frame = f"{m['pre']}{{}}{m['post']}".strip(" ?.")
    return [frame.format(m["a"]), frame.format(m["b"])]


def question_terms(question: str) -> frozenset[str]:
    """The question's key stems, without the words that only frame a comparison; "set up" also asks where a
    thing is configured."""
    terms = frozenset(t.stem for t in key_terms(question)) - COMPARING
    return terms | {stem("configure")} if _HOW_TO.search(question) else terms


def stems_of(text: str) -> frozenset[str]:
    """The stems of every token of ``text``."""
    return frozenset(stem(t) for t in tokenize(text))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def side_terms(parts: Sequence[str]) -> list[frozenset[str]]:
    """Per part of the question, its key terms that no other part holds (what tells the sides apart)."""
    return side_terms_of([question_terms(p) for p in parts])


def side_terms_of(terms: Sequence[frozenset[str]]) -> list[frozenset[str]]:
    """Per set of a part's terms, those no other part holds."""
    return [t - frozenset().union(*(o for j, o in enumerate(terms) if j != i)) for i, t in enumerate(terms)]


@frozen
class Picker:
    """The selection knobs (see the module docstring); :class:`~ragloop.llm.offline.answer.OfflineAnswerer`
    holds one.

    Attributes:
        max_units: Most units quoted.
        max_chars: Length budget of the quoted units (the lead is always quoted whole).
        support_ratio: A supporting unit scores at least this share of the lead's score.
        diversity: MMR trade-off for support; 1.0 ranks by relevance only.
        cover_weight: Weight of the key terms a supporting unit adds that the chosen ones do not hold yet.
        repeat_ratio: A supporting unit that adds no key term of the question is still quoted when it scores at
            least this share of the lead's (a second passage saying the same thing in other words often holds
            the fact the lead lacks). 0.6 was chosen on the tuning halves (answer recall up 4-6 points on the
            FastAPI and HotpotQA halves, replies ~120 characters longer).
    """

    max_units: int = 4
    max_chars: int = 600
    repeat_ratio: float = 0.6
    support_ratio: float = 0.3
    diversity: float = 0.7
    cover_weight: float = 1.0


def pick(
    pool: Sequence[Scored],
    picker: Picker,
    idf: Callable[[str], float],
    q_terms: frozenset[str],
    n_sides: int,
) -> list[Scored]:
    """The units to quote, in the order they are quoted: the lead, one per side it leaves out, then support."""
    if not pool:
        return []
    q_mass = sum(idf(t) for t in q_terms) or 1.0
    order = sorted(pool, key=lambda s: (-s.relevance, s.unit.block, s.unit.position))
    lead = order[0]
    if n_sides <= 1 and (table := _whole_table(lead, order, q_terms, 2 * picker.max_chars)):
        return table
    chosen = _sides_first(order, n_sides)[: picker.max_units] if n_sides > 1 else [lead]
    used = sum(len(c.unit.text) for c in chosen)
    rest = [s for s in order[1:] if s not in chosen and s.relevance >= picker.support_ratio * lead.relevance]
    while rest and len(chosen) < picker.max_units:
        covered = frozenset().union(*(c.covered for c in chosen))

        def gain(s: Scored, covered: frozenset[str] = covered) -> float:
            redundancy = max(_jaccard(s.terms, c.terms) for c in chosen)
            new = sum(idf(t) for t in s.covered - covered) / q_mass
            return picker.diversity * s.relevance - (1 - picker.diversity) * redundancy + picker.cover_weight * new

        best = max(rest, key=lambda s: (gain(s), -s.unit.block, -s.unit.position))
        rest.remove(best)
        if max(_jaccard(best.terms, c.terms) for c in chosen) > 0.8:
            continue  # a near-copy of a quoted unit (the same passage in two blocks)
        adds = bool(best.covered - covered) or _next_to(best, chosen)
        if not adds and (best.unit.kind == "row" or best.relevance < picker.repeat_ratio * lead.relevance):
            continue  # support adds a term of the question, continues a quoted sentence, or nearly matches the lead
            # (a row that adds nothing is another row of the table: another plan, not more evidence)
        if used + len(best.unit.text) > picker.max_chars:
            continue
        chosen.append(best)
        used += len(best.unit.text)
    return chosen


#: Most rows of a table quoted whole for a question asked across its rows.
WHOLE_TABLE_ROWS = 8


def _whole_table(lead: Scored, order: Sequence[Scored], q_terms: frozenset[str], max_chars: int) -> list[Scored]:
    """All rows of the lead's table, when the lead is a row that holds none of the question's terms itself (it
    leads through its header alone: "How many API keys per plan?" asks across the rows, and one plan's row would
    answer another question); empty when the table is large or a row names something the question asks about."""
    if lead.unit.kind != "row" or q_terms & stems_of(lead.unit.text):
        return []
    key = (lead.unit.block, lead.unit.table)
    rows = sorted((s for s in order if (s.unit.block, s.unit.table) == key), key=lambda s: s.unit.position)
    if not 1 < len(rows) <= WHOLE_TABLE_ROWS or sum(len(r.unit.text) for r in rows) > max_chars:
        return []
    if any(q_terms & stems_of(r.unit.text) for r in rows):
        return []  # a row the question names answers it: quote that one, not the table
    return rows


#: A comparison table is quoted for a comparison when its rows score at least this share of the best units.
TABLE_SHARE = 0.9


def _sides_first(order: Sequence[Scored], n_sides: int) -> list[Scored]:
    """For a comparison or a multi-part question: the best unit for each side (one unit may serve several),
    or the rows of one table that answer every side, when they score nearly as well (a comparison table
    answers a comparison: "| Team | 300 |" and "| Business | 1,000 |" under one header)."""
    free: list[Scored] = []
    for side in range(n_sides):
        serving = [s for s in order if side in s.sides]
        best = max(serving, key=lambda s: (_part(s, side), s.relevance), default=None)
        if best is not None and best not in free:
            free.append(best)
    # Options are weighed by how well each side's pick answers that side (its part score), not by overall
    # relevance: one row that names both sides in passing ("Automation runs | … | 1,000 | 10,000") must not beat
    # the rows about what is compared ("| Team | … $11 …" and "| Business | … $23 …" for "the monthly price").
    free_score = sum(_part(s, i) for i, s in _by_side(free, n_sides)) / n_sides if free else 0.0
    tables: list[tuple[float, list[Scored]]] = []
    for key in dict.fromkeys((s.unit.block, s.unit.table) for s in order if s.unit.kind == "row"):
        rows = [s for s in order if (s.unit.block, s.unit.table) == key]
        picks: list[Scored] = []
        per_side = 0.0
        for side in range(n_sides):
            row = max((s for s in rows if side in s.sides), key=lambda s: (_part(s, side), s.relevance), default=None)
            if row is None:
                break
            per_side += _part(row, side)
            if row not in picks:
                picks.append(row)
        else:
            tables.append((per_side / n_sides, picks))
    if tables:
        score, picks = max(tables, key=lambda t: t[0])
        if score >= TABLE_SHARE * free_score:
            return sorted(picks, key=lambda s: s.unit.position)
    return free or list(order[:1])


def _by_side(free: Sequence[Scored], n_sides: int) -> list[tuple[int, Scored]]:
    """Each side with the unit of ``free`` that answers it best (its part score)."""
    out = []
    for side in range(n_sides):
        serving = [s for s in free if side in s.sides]
        if serving:
            out.append((side, max(serving, key=lambda s: _part(s, side))))
    return out


def _part(s: Scored, side: int) -> float:
    return s.part_scores[side] if side < len(s.part_scores) else 0.0


def _next_to(s: Scored, chosen: Sequence[Scored]) -> bool:
    """A sentence right after a chosen sentence of the same block (the one that continues it)."""
    prose = ("sentence", "item")
    return s.unit.kind in prose and any(
        c.unit.block == s.unit.block and s.unit.position == c.unit.position + 1 and c.unit.kind in prose for c in chosen
    )


#: A unit serves a side of a comparison when it holds this share of the side's distinctive terms (IDF mass).
SIDE_SHARE = 0.5


def serves(side: frozenset[str], held: frozenset[str], idf: Callable[[str], float]) -> bool:
    total = sum(idf(t) for t in side)
    return total > 0 and sum(idf(t) for t in side & held) >= SIDE_SHARE * total


#: Weight of the terms that resolve a part's reference ("that plan" → "Enterprise") when units are ranked for it.
RESOLVED_WEIGHT = 2.0


def resolved_parts(parts: Sequence[str], terms: list[frozenset[str]], queries: Sequence[str]) -> list[frozenset[str]]:
    """Each part's terms, with those of the search query closest to it when the part refers back."""
    out = list(terms)
    for query in dict.fromkeys(queries):
        q = question_terms(query)
        overlap = [len(q & t) for t in terms]
        best = max(range(len(terms)), key=lambda i: overlap[i])
        if overlap[best] and REFERS.search(parts[best]):
            out[best] = out[best] | q
    return out


#: Weight of a part's terms in a unit's heading when units are ranked for that part (the section about it).
HEADING_TIE = 0.25


#: Weight, when units are ranked for a part of a multi-part question, of the part's head term (its rarest) in the
#: unit's page title: "How do I set up SAML single sign-on, and which plan?" is answered from the SAML page
#: first, not from the OIDC page that mentions SAML in passing.
TITLE_TIE = 0.5


def specific_terms(q_terms: frozenset[str], idf: Callable[[str], float]) -> tuple[frozenset[str], str]:
    """The question's specific terms (the rarer half, by IDF) and its rarest one (``""`` for a one-term
    question): a value next to "file" does not answer "How big can the workspace logo file be?"; one next to
    "logo" does."""
    ranked = sorted(q_terms, key=lambda t: (-idf(t), t))
    return frozenset(ranked[: max(1, (len(ranked) + 1) // 2)]), (ranked[0] if len(ranked) > 1 else "")


def row_label(unit: Unit) -> frozenset[str]:
    """The stems of a table row's first cell (its label); empty for any other unit."""
    return stems_of(unit.text.strip().strip("|").split("|")[0]) if unit.kind == "row" else frozenset()


def labels(unit: Unit, term: str) -> bool:
    """Whether ``unit`` is a table row whose first cell (its label) holds ``term``."""
    return bool(term) and term in row_label(unit)


def head_of(part: str, idf: Callable[[str], float]) -> str:
    """A question part's head term: the rarest of the names the user capitalised after its first word ("SAML"
    in "How do I set up SAML single sign-on"), else the rarest of its key terms; ``""`` without terms."""
    words = re.findall(r"[\w'’-]+", part)
    named = {stem(w.lower()) for w in words[1:] if w[:1].isupper()} & question_terms(part)
    pool = sorted(named or question_terms(part))
    return max(pool, key=idf) if pool else ""


def head_in_title(head: str, title: frozenset[str]) -> float:
    """1.0 when the page title holds the part's head term (:func:`head_of`), else 0.0."""
    return 1.0 if head and head in title else 0.0


def part_share(
    part: frozenset[str], own: frozenset[str], held: frozenset[str], idf: Callable[[str], float], weight: float
) -> float:
    """IDF share of a question part's terms a unit holds (its context's at ``weight``)."""
    total = sum(idf(t) for t in part) or 1.0
    return (sum(idf(t) for t in part & own) + weight * sum(idf(t) for t in (part & held) - own)) / total
