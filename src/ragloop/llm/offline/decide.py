"""The offline decider: small talk, multi-topic splitting, pronoun resolution, abbreviation expansion.

Steps, in order:

1. **Small talk.** The question is cut at punctuation; segments that are greetings, thanks, goodbyes, "how are
   you", "who are you" or short acknowledgements are small talk. If nothing else is left, the decision is a
   friendly direct reply (no search). Otherwise the small talk is dropped and the rest is searched: "hi, how do I
   reset my password?" searches for the password.
2. **Splitting.** The rest is split into topics: at question marks, at "and also", at "and" + a question word
   ("How do I X and how do I Y?"), and inside comparisons ("compare A and B", "A vs B", "difference between A
   and B", lists "A, B and C"). Shared context is copied into every part: text before "compare", a trailing
   prepositional phrase ("… in the admin console"), a shared plural head ("the pro and enterprise *plans*") or
   a shared leading head ("the *pricing of* pro and enterprise"), and what the sides are compared on ("SAML and
   OIDC *when it comes to certificate rotation*", "Team vs Business*: API requests per minute*";
   :func:`compared_sides`); "compare A *with* B and C" has two sides. Comparisons of named things give one query
   per name, each with what is asked about it (:func:`comparison_parts`): "Who is older, A or B?", "which …
   first, A or B", "Are A and B both …", "Were A and B of the same …", "Both A and B …". The turn also
   searches the question as asked beside its parts, and fuses every list (``ragloop.retrievers.fusion``).
3. **Follow-ups and pronouns.** In a conversation, the question's first part is read against the previous
   question (itself resolved) and the reply to it (:mod:`ragloop.llm.offline.followup`): a fragment ("and on
   Business?", "what about OIDC?") becomes the previous question with its counterpart swapped, a reference
   ("it", "them", "the old one") becomes the conversation's subject, a continuation with no subject of its own
   ("how long do I have?", "why not?") gets the subject added; the rewrite is noted in the decision's reason.
   "this page / project / product …" is resolved from the page title or URL slug (``…/products/widgets/sso`` →
   "widgets sso"); a bare "it / this / that / they" in a later part from the previous part of the same
   question, else the conversation's topic (:meth:`OfflineDecider.topic`), else the page. Expletive "it" ("is
   it possible …") is left.
4. **Abbreviations.** Glossary abbreviations are expanded in place and kept ("SSO (single sign-on)"); a long
   form gets its abbreviation added. The glossary is the configured one over the one mined from the corpus.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Literal
from urllib.parse import unquote, urlparse

from attrs import field, frozen

from ragloop.llm.offline.followup import DEMONSTRATIVE_REF as _DEMONSTRATIVE_REF
from ragloop.llm.offline.followup import EXPLETIVE as _EXPLETIVE
from ragloop.llm.offline.followup import Followup, FollowupResolver, is_follow_on
from ragloop.state import Decision, Message, PageContext
from ragloop.text.novelty import normalised_terms
from ragloop.text.terms import CorpusStats, content_words, key_terms, merge_glossary, stem
from ragloop.usage import LLMCall, record_call

__all__ = [
    "REPLIES",
    "Glossary",
    "OfflineDecider",
    "compared_sides",
    "comparison_parts",
    "page_subject",
    "small_talk_kind",
    "split_topics",
]

SmallTalk = Literal["greeting", "thanks", "bye", "wellbeing", "identity", "ack"]

_SMALL_TALK_PATTERNS: list[tuple[SmallTalk, str]] = [
    (
        "thanks",
        r"(?:many |thanks? |thank you |cheers |ok |okay |great |perfect )*(?:thanks?|thank you|thx|ty|"
        r"cheers|much appreciated|appreciate it)(?: (?:a lot|so much|very much|again|for (?:the|your|all"
        r" the) help|for helping|a ton|mate|man|buddy))*",
    ),
    (
        "bye",
        r"(?:ok |okay |well )?(?:bye|goodbye|good bye|bye bye|see you|see ya|cya|talk later|later|"
        r"have a (?:good|nice|great) (?:day|one|evening|weekend)|that'?s all|that is all|nothing else"
        r"|good night)(?: (?:then|now|for now|everyone|all))*",
    ),
    (
        "wellbeing",
        r"(?:hi |hello |hey )?(?:how (?:are|r) (?:you|u)(?: doing)?(?: today)?|how'?s it going|"
        r"how is it going|what'?s up|whats up|sup|how do you do)",
    ),
    (
        "identity",
        r"(?:who|what) are you|are you (?:a )?(?:bot|human|robot|real person|ai)|what can you do|"
        r"what do you do|how can you help(?: me)?|what(?: is|'s) your name|what are you for",
    ),
    (
        "greeting",
        r"(?:hi|hello|hey|hiya|howdy|yo|greetings|good (?:morning|afternoon|evening|day))"
        r"(?: (?:there|all|everyone|team|folks|bot|friend))*",
    ),
    (
        "ack",
        r"(?:ok|okay|k|cool|great|nice|perfect|awesome|got it|sounds good|understood|i see|alright|"
        r"all right|sure|yes|no|yep|nope|fine|good|makes sense|that helps|that helped|that works|"
        r"ok great|ok cool|excellent|wonderful|lol|haha)(?: (?:a lot|so much|a ton|thanks|thank you|again))*",
    ),
]
_SMALL_TALK: tuple[tuple[SmallTalk, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern)) for kind, pattern in _SMALL_TALK_PATTERNS
)

#: The direct reply per kind of small talk.
REPLIES: Mapping[str, str] = {
    "greeting": "Hi! What can I help you with?",
    "thanks": "You're welcome! Is there anything else I can help with?",
    "bye": "Goodbye! Come back any time you have a question.",
    "wellbeing": "I'm doing well, thanks for asking! What can I help you with?",
    "identity": (
        "I'm an assistant that answers questions from this knowledge base. Ask me about a feature, a setting "
        "or an error message, and I'll search the documentation and cite what I find."
    ),
    "ack": "Glad that helps. Anything else?",
    "unclear": "Could you tell me a little more about what you're looking for?",
}
_PRIORITY: tuple[SmallTalk, ...] = ("thanks", "bye", "identity", "wellbeing", "greeting", "ack")

_SEGMENT = re.compile(r"([.!?,;:\n]+)")
_LEADING_FILLER = re.compile(
    r"^\s*(?:(?:hi|hello|hey|hiya|ok|okay|so|well|um|uh|thanks|thank you|also|and|but|then|plus|now)\b[\s,!.:;-]*)+",
    re.IGNORECASE,
)
_QUESTION_WORD = r"(?:how|what|why|when|where|which|who|whom|whose|can|could|do|does|did|is|are|should|would|will)"
_CLAUSE_SPLIT = re.compile(
    r"\?+|;|\n+|\s*,?\s+and also\s+|\s*,?\s+as well as how\s+|\s*,?\s+and\s+(?=" + _QUESTION_WORD + r"\b)",
    re.IGNORECASE,
)
_COMPARE = re.compile(
    r"^(?P<pre>.*?)\b(?:compare|comparing|comparison (?:of|between)|differences? (?:between|of|in))\s+(?P<body>.+)$",
    re.IGNORECASE | re.DOTALL,
)
_VERSUS = re.compile(r"\s+(?:vs\.?|versus)\s+", re.IGNORECASE)
_CONJUNCT = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or|with|to|against)\s+", re.IGNORECASE)
_SHARED_SUFFIX = re.compile(r"\s+((?:in|on|for|within|under|across|during|when using)\s+\S.*)$", re.IGNORECASE)
_SHARED_PREFIX = re.compile(r"^(.*\S\s+(?:of|for|in|on))\s+(\S.*)$", re.IGNORECASE)

_PAGE_REF = re.compile(
    r"\b(?:this|that|the current|the same)\s+(?:project|page|product|feature|article|doc|docs|document|"
    r"documentation|tool|service|app|site|section|guide|library|package|module|plan|setting|option)\b",
    re.IGNORECASE,
)
_PRONOUN = re.compile(r"\b(?:it|its|this|that|these|those|they|them)\b", re.IGNORECASE)
#: How much of the conversation a follow-up is read against: the last messages, the start of each.
_RECENT_MESSAGES, _QUESTION_CHARS, _REPLY_CHARS = 12, 2_000, 4_000
#: A question word alone or with a measure: "why not", "how", "and how fast" (a follow-up's whole question).
_ASKS = re.compile(r"^\s*(?:how|why|when|where|what|which|who)\b", re.IGNORECASE)
_BARE_REF = re.compile(r"\b(?:it|its|they|them)\b", re.IGNORECASE)
_GENERIC_WORDS = (
    "docs doc documentation en en-us latest stable current products product help articles article kb guide "
    "guides www index html htm page pages p v1 v2 v3 api reference manual wiki blog support home main"
)
_GENERIC_SEGMENTS = frozenset(_GENERIC_WORDS.split())


def small_talk_kind(segment: str) -> SmallTalk | None:
    """The kind of small talk ``segment`` is, or ``None`` when it carries a request."""
    norm = " ".join(re.sub(r"[^\w' ]+", " ", segment.lower().replace("’", "'")).split())
    if not norm:
        return None
    for kind, pattern in _SMALL_TALK:
        if pattern.fullmatch(norm):
            return kind
    return None


def _drop_small_talk(question: str) -> tuple[str, list[SmallTalk]]:
    """The question without its small-talk segments (its opening "and", "so" … kept), and the kinds removed."""
    parts = _SEGMENT.split(question)
    kept: list[str] = []
    kinds: list[SmallTalk] = []
    for i in range(0, len(parts), 2):
        text, sep = parts[i], parts[i + 1] if i + 1 < len(parts) else ""
        kind = small_talk_kind(text)
        if kind is not None:
            kinds.append(kind)
            continue
        kept.append(text + sep)
    return "".join(kept).strip(" \t\n,;:.!"), kinds


def page_subject(page: PageContext) -> str:
    """What the page is about, in a few words: its title, else the meaningful tail of its URL path."""
    if page.title:
        title = re.split(r"\s+[|–—-]\s+", page.title.strip())[0]  # "SSO setup | Widgets Docs" -> "SSO setup"
        if key_terms(title):
            return _surface(title)
    if page.url:
        try:
            path = urlparse(page.url).path
        except ValueError:  # "http://[bad" - a malformed URL still has a usable tail
            path = re.sub(r"^[a-z][\w+.-]*://[^/]*", "", page.url, flags=re.IGNORECASE).split("?", 1)[0]
        words: list[str] = []
        for seg in unquote(path).split("/"):
            seg = re.sub(r"\.(?:html?|md|php|aspx?)$", "", seg.lower())
            if not seg or seg in _GENERIC_SEGMENTS or re.fullmatch(r"v?\d+(?:\.\d+)*", seg):
                continue
            words.extend(w for w in re.split(r"[-_+.]+", seg) if w)
        return " ".join(words[-4:])
    return ""


def _surface(text: str, limit: int = 5, stats: CorpusStats | None = None) -> str:
    """The key words of ``text`` as written, in order; with ``stats``, the ``limit`` most informative ones."""
    words = content_words(text)
    if stats is not None and len(words) > limit:
        ranked = sorted(range(len(words)), key=lambda i: -stats.idf(stem(words[i].lower())))[:limit]
        words = [words[i] for i in sorted(ranked)]
    return " ".join(words[:limit])


def _share_context(conjuncts: list[str]) -> list[str]:
    """Copy what coordinated parts share into each part (see the module docstring)."""
    parts = [c.strip(" ,.;:") for c in conjuncts if c.strip(" ,.;:")]
    if len(parts) < 2:
        return parts
    suffix = ""
    m = _SHARED_SUFFIX.search(parts[-1])
    if m and key_terms(parts[-1][: m.start()]):
        suffix, parts[-1] = m.group(1), parts[-1][: m.start()]
    sizes = [len(key_terms(p)) for p in parts]
    last_words = parts[-1].split()
    head = last_words[-1] if last_words else ""
    # "plans", "APIs" are plural heads; "status", "analysis", "access" are not.
    plural = re.fullmatch(r"[a-z]{3,}s", head, re.IGNORECASE) is not None and (
        head[:-1].isupper() or not head.lower().endswith(("ss", "us", "is"))
    )
    if sizes[-1] >= 2 and plural and all(s == 1 for s in sizes[:-1]):
        parts = [*(f"{p} {head}" for p in parts[:-1]), parts[-1]]  # "pro and enterprise plans"
    m = _SHARED_PREFIX.match(parts[0])
    if m and key_terms(m.group(1)) and key_terms(m.group(2)) and all(s == 1 for s in sizes[1:]):
        lead = m.group(1)
        parts = [parts[0], *(f"{lead} {p}" for p in parts[1:])]  # "the pricing of pro and enterprise"
    return [re.sub(r"^(?:the|a|an)\s+", "", f"{p} {suffix}".strip(), flags=re.IGNORECASE) for p in parts]


def split_topics(text: str) -> list[str]:
    """One standalone phrase per topic of ``text`` (no pronoun resolution, no glossary)."""
    topics: list[str] = []
    for clause in _CLAUSE_SPLIT.split(text):
        clause = _LEADING_FILLER.sub("", clause or "").strip(" \t\n,;:.!?")
        if not clause:
            continue
        compared = comparison_parts(clause)
        if compared:
            topics.extend(compared)
            continue
        m = _COMPARE.match(clause)
        if m:
            pre = _surface(m.group("pre"))
            body = re.sub(r"^(?:the\s+)?(?:between|of)\s+", "", m.group("body").strip(), flags=re.IGNORECASE)
            parts = compared_sides(body)
            if len(parts) >= 2:
                topics.extend(f"{pre} {p}".strip() for p in parts)
                continue
        if _VERSUS.search(clause):
            parts = compared_sides(clause)
            if len(parts) >= 2:
                topics.extend(parts)
                continue
        topics.append(clause)
    return [t for t in topics if key_terms(t) or _PRONOUN.search(t)]


# --- comparison and coordination ---------------------------------------------------------------------
# What every side is compared on: "… when it comes to X", "… in terms of X", "A vs B: X".
_ASPECT = re.compile(
    r"\s*,?\s*(?:\b(?:when it comes to|in terms of|with respect to|with regard to|regarding|as regards|as far as)\b"
    r"\s+|:\s+)(?P<aspect>\S.*)$",
    re.IGNORECASE,
)
# Two sides joined by "with", "to", "against" or "vs": "compare the lifespan parameter with the startup and
# shutdown event handlers" has two sides, not three.
_PAIRWISE = re.compile(r"^(?P<a>.+?)\s+(?:with|to|against|versus|vs\.?)\s+(?P<b>.+)$", re.IGNORECASE)


def compared_sides(body: str) -> list[str]:
    """The sides of a comparison ("A and B", "A vs B", "A with B and C"), each with the context they share
    and what they are compared on ("SAML and OIDC when it comes to certificate rotation" → "SAML certificate
    rotation", "OIDC certificate rotation"); one item when nothing is compared."""
    aspect = ""
    m = _ASPECT.search(body)
    if m and key_terms(body[: m.start()]) and key_terms(m.group("aspect")):
        aspect, body = m.group("aspect").strip(" ?.!"), body[: m.start()]
    pair = _PAIRWISE.match(body)
    sides = [pair.group("a"), pair.group("b")] if pair else _CONJUNCT.split(body)
    parts = _share_context(sides)
    return [f"{p} {aspect}".strip() for p in parts] if aspect and len(parts) >= 2 else parts


# A name: a run of capitalised words or numbers (small joining words allowed inside), or a quoted title.
_NAME_WORD = r"(?:[A-Z0-9][\w'’.&-]*)"
_NAME = (
    r"(?:\"[^\"]+\"|“[^”]+”|(?:the\s+)?"
    + _NAME_WORD
    + r"(?:\s+(?:(?:of|the|and|de|du|von|van|la|le|in|on|for|a)\s+)*"
    + _NAME_WORD
    + r")*)"
)
# "Who is older, Annie Morton or Terry Richardson?", "who is younger Keith Bostic or Jerry Glanville",
# "Which battle occurred first, the Battle of X or the Battle of Y?"
_ALTERNATIVES = re.compile(r"^(?P<head>.*?)[\s,:]+(?P<a>" + _NAME + r")\s*,?\s+or\s+(?P<b>" + _NAME + r")\s*[?.!]*$")
# "Are X and Y both …", "Were X and Y of the same nationality", "Which actor do X and Y have in common"
_COORDINATED = re.compile(
    r"^(?P<pre>(?:.*?\s)?)(?i:are|were|is|was|do|did|does|have|had|has)\s+(?P<a>"
    + _NAME
    + r")\s+and\s+(?P<b>"
    + _NAME
    + r")\s+(?P<rest>.*)$"
)
# "Is SSO or SAML cheaper?"
_ALTERNATIVES_FIRST = re.compile(
    r"^(?i:is|was|are|were|does|do|did)\s+(?P<a>"
    + _NAME
    + r")\s+or\s+(?P<b>"
    + _NAME
    + r")\s+(?P<rest>[^,]+?)\s*[?.!]*$"
)
# "Both X and Y embrace what campaign?", "known for both the songs "X" and "Y""
_BOTH = re.compile(
    r"^(?P<pre>.*?)\b(?i:both)\s+(?:the\s+\w+\s+)?(?P<a>" + _NAME + r")\s+and\s+(?P<b>" + _NAME + r")(?P<rest>.*)$"
)
# "What nationality were social anthropologists Alfred Gell and Edmund Leach?" (two names of 2+ words each)
_TWO_NAMES = re.compile(
    r"^(?P<pre>.*?\b[a-z]\w*)\s+(?P<a>"
    + _NAME_WORD
    + r"(?:\s+"
    + _NAME_WORD
    + r")+)\s+and\s+(?P<b>"
    + _NAME_WORD
    + r"(?:\s+"
    + _NAME_WORD
    + r")+)\s*[?.!]*$"
)
_SAME = re.compile(r"\b(?:both|all|each|(?:of|from|in|at)?\s*the same|in common|respectively)\b", re.IGNORECASE)
_COMPARATIVE = re.compile(
    r"\b(?:which|who|what|whom|whose|is|was|are|were|does|did|do|has|had|one|first|earlier|later|last|older|"
    r"younger|more|most|less|least|longer|shorter|larger|smaller|bigger|higher|lower|taller|greater|better|"
    r"worse|newer|earliest|latest|oldest|youngest|born|founded|occurred|happened|started|released|published|"
    r"formed|established|created|opened)\b",
    re.IGNORECASE,
)


def _attribute(text: str) -> str:
    """What a comparison asks about, without question words and comparatives ("nationality", "battle")."""
    return " ".join(_COMPARATIVE.sub(" ", _SAME.sub(" ", text)).split()).strip(" ,.;:?!")


def _part(name: str, attribute: str) -> str:
    name = re.sub(r"^the\s+", "", name.strip(), flags=re.IGNORECASE).strip('"“”')
    return f"{name} {attribute}".strip() if attribute and key_terms(attribute) else name


def _pair(m: re.Match[str], attribute: str) -> list[str]:
    """The two compared names of ``m`` (groups ``a`` and ``b``), each with ``attribute``."""
    return [_part(m.group("a"), attribute), _part(m.group("b"), attribute)]


def comparison_parts(clause: str) -> list[str] | None:
    """One query per compared or coordinated name of ``clause``, each with what is asked about them;
    ``None`` when the clause compares nothing.

    Forms: alternatives ("Who is older, A or B?", "which … first, A or B"), "Are A and B both …",
    "Were A and B of the same …", "Both A and B …", and two multi-word names joined by "and" at the end
    ("What nationality were A B and C D?"). Names are capitalised runs or quoted titles, so "left-hand or
    right-hand" and "Kiss and Tell" (one-word sides) are not split.
    """
    text = clause.strip()
    m = _ALTERNATIVES.match(text)
    if m and key_terms(m.group("a")) and key_terms(m.group("b")):
        return _pair(m, _attribute(m.group("head")))
    m = _ALTERNATIVES_FIRST.match(text)
    if m:
        return _pair(m, _attribute(m.group("rest")))
    m = _COORDINATED.match(text)
    if m and _SAME.search(m.group("rest")):
        return _pair(m, _attribute(f"{m.group('pre')} {m.group('rest')}"))
    m = _BOTH.match(text)
    if m:
        return _pair(m, _attribute(f"{m.group('pre')} {m.group('rest')}"))
    m = _TWO_NAMES.match(text)
    if m:
        return _pair(m, _attribute(m.group("pre")))
    return None


_WORD = re.compile(r"[\w&]+")


@frozen
class Glossary:
    """A glossary indexed for expansion: abbreviation lookup by token, long forms by their first word.

    Attributes:
        entries: Abbreviation → long form.
    """

    entries: Mapping[str, str]
    _by_first_word: Mapping[str, tuple[tuple[str, str], ...]] = field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        index: dict[str, list[tuple[str, str]]] = {}
        for abbrev, long in self.entries.items():
            words = _WORD.findall(long.lower())
            if abbrev and words:
                index.setdefault(words[0], []).append((abbrev, long))
        object.__setattr__(self, "_by_first_word", {k: tuple(v) for k, v in index.items()})

    def expand(self, query: str) -> str:
        """ "SSO" → "SSO (single sign-on)"; "single sign-on" → "single sign-on (SSO)"; once per abbreviation."""
        tokens = _WORD.findall(query)
        candidates = {(t, self.entries[t]) for t in tokens if self.entries.get(t)}
        for t in tokens:
            candidates.update(self._by_first_word.get(t.lower(), ()))
        for abbrev, long in sorted(candidates):
            short = re.compile(r"(?<![\w-])" + re.escape(abbrev) + r"(?![\w-])")
            longform = re.compile(r"(?<!\w)" + re.escape(long) + r"(?!\w)", re.IGNORECASE)
            has_long = longform.search(query)
            m = short.search(query)
            if m and not has_long:
                query = f"{query[: m.end()]} ({long}){query[m.end() :]}"
            elif has_long and not m:
                query = f"{query[: has_long.end()]} ({abbrev}){query[has_long.end() :]}"
        return query


@frozen
class OfflineDecider:
    """Decides without a model: small talk, topic splitting, pronouns, abbreviations (see the module docstring).

    Attributes:
        stats: Corpus statistics; their mined glossary is used under the configured one.
        glossary: Abbreviation → long form, e.g. ``{"SSO": "single sign-on"}``; wins over mined entries.
        max_queries: Most standalone queries per question (extra topics are dropped, last first).
    """

    stats: CorpusStats | None = None
    glossary: Mapping[str, str] = field(factory=dict)
    max_queries: int = 4
    _glossary: Glossary = field(init=False, repr=False, eq=False)
    _followups: FollowupResolver = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        mined = self.stats.glossary if self.stats is not None else {}
        object.__setattr__(self, "_glossary", Glossary(merge_glossary(mined, self.glossary)))
        object.__setattr__(self, "_followups", FollowupResolver(self.stats))

    @property
    def terms_glossary(self) -> Mapping[str, str]:
        """The glossary in effect: configured entries over mined ones."""
        return self._glossary.entries

    def _subject(self, index: int, previous: list[str], history: Sequence[Message], page: PageContext) -> str:
        if index > 0 and previous:
            return _surface(previous[-1], limit=3, stats=self.stats)
        return self.topic(history, page)

    def topic(self, history: Sequence[Message], page: PageContext) -> str:
        """What the conversation is about: the subject of the latest user turn that named one of its own.

        A follow-up that only refers back ("How do I change it?", "Is that faster?", "how long do I have?")
        keeps the topic it refers to, so a third turn's "it" still means the first turn's subject, not the
        follow-up's verb; a fragment ("and on Business?") moves it to the swapped question's subject. Without
        such a turn, the page's subject.
        """
        return self._conversation(history, page)[1]

    def _conversation(self, history: Sequence[Message], page: PageContext) -> tuple[str, str, str]:
        """The latest user question (resolved: follow-ups rewritten, page references filled in), the
        conversation's subject, and the reply that answered that question."""
        page_subj = page_subject(page)
        previous, subject, reply = "", page_subj, ""
        # What a follow-up refers to is in the last few turns, at the start of each: the cost stays bounded.
        messages = list(history)[-_RECENT_MESSAGES:]
        for k, message in enumerate(messages):
            if message.role != "user":
                continue
            lead, _ = _drop_small_talk(message.content[:_QUESTION_CHARS])
            rest = _LEADING_FILLER.sub("", lead).strip(" \t\n,;:.!")
            answer = next((m.content[:_REPLY_CHARS] for m in messages[k + 1 : k + 2] if m.role == "assistant"), "")
            if not key_terms(rest) and not (previous and _ASKS.match(rest)):
                continue
            followed = self._followups.resolve(lead, previous, subject, reply) if previous else None
            if followed is None:
                previous = self._resolve(rest, subject, page_subj)
                subject = self._followups.subject(previous, answer, limit=3) or subject
            else:
                previous = followed.standalone
                if followed.how == "fragment":
                    subject = self._followups.subject(previous, answer, limit=3) or subject
            reply = answer
        return previous, subject, reply

    def _follow_up(self, lead: str, head: str, history: Sequence[Message], page: PageContext) -> Followup | None:
        """``head`` (the question's first part) rewritten against the conversation, or ``None`` (module
        docstring, step 3; :mod:`ragloop.llm.offline.followup`)."""
        if not any(m.role == "user" for m in history):
            return None
        asked = head if is_follow_on(head) or not is_follow_on(lead) else f"and {head}"
        previous, subject, reply = self._conversation(history, page)
        return self._followups.resolve(asked, previous, subject, reply)

    def _resolve(self, topic: str, subject: str | Callable[[], str], page_subj: str) -> str:
        """``topic`` with page references and pronouns resolved; a callable ``subject`` is called only when the
        topic has a pronoun to resolve (finding the conversation's topic reads the whole history)."""
        # Replacements are functions so a backslash in a URL or title is text, not a group reference.
        if page_subj:
            topic = _PAGE_REF.sub(lambda _: page_subj, topic)
        if _EXPLETIVE.search(topic) or not (_BARE_REF.search(topic) or _DEMONSTRATIVE_REF.search(topic)):
            return topic
        who = subject() if callable(subject) else subject
        if not who:
            return topic
        topic = _BARE_REF.sub(lambda _: who, topic)
        return _DEMONSTRATIVE_REF.sub(lambda _: who, topic)

    def decide_sync(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """The decision, synchronously (what :meth:`decide` awaits)."""
        lead, kinds = _drop_small_talk(question)
        rest = _LEADING_FILLER.sub("", lead).strip(" \t\n,;:.!")
        parts = split_topics(rest)
        notes: list[str] = []
        # "why not?", "and how fast?": nothing to search for on their own, a follow-up in a conversation.
        followed = (
            self._follow_up(lead, parts[0] if parts else rest, history, page) if parts or _ASKS.match(rest) else None
        )
        if followed is not None:
            parts = [followed.standalone, *parts[1:]]
            notes.append(f"follow-up ({followed.how}) {followed.asked!r} -> {followed.standalone!r}")
        elif not key_terms(rest) and not _PRONOUN.search(rest):
            if kinds:
                kind = next(k for k in _PRIORITY if k in kinds)
                return Decision(reply=REPLIES[kind], reason=f"small talk: {kind}")
            return Decision(reply=REPLIES["unclear"], reason="nothing to search for")
        page_subj = page_subject(page)
        queries: list[str] = []
        seen: set[frozenset[str]] = set()
        topics: list[str] = []  # resolved, before expansion: what a later pronoun refers to
        for i, topic in enumerate(parts):
            resolved = self._resolve(topic, functools.partial(self._subject, i, topics, history, page), page_subj)
            if i > 0 and topics and self._elliptical(resolved):
                # "How do I set up SAML SSO, and which plan do I need?": the second clause means "for SAML SSO".
                resolved = f"{resolved} for {self._specific_words(topics[0])}"
            if resolved != topic:
                notes.append(f"resolved {topic!r} -> {resolved!r}")
            query = " ".join(self._glossary.expand(resolved).split())
            key = normalised_terms(query)
            if key and key not in seen:
                seen.add(key)
                topics.append(resolved)
                queries.append(query)
        if not queries:
            return Decision(reply=REPLIES["unclear"], reason="nothing to search for")
        dropped = len(queries) - self.max_queries
        queries = queries[: self.max_queries]
        reason = f"{len(queries)} topic{'s' if len(queries) > 1 else ''}"
        if kinds:
            reason += f"; dropped small talk ({', '.join(kinds)})"
        if dropped > 0:
            reason += f"; dropped {dropped} topic(s) over max_queries={self.max_queries}"
        if notes:
            reason += "; " + "; ".join(notes)
        return Decision(queries=tuple(queries), reason=reason)

    def _rare_at(self) -> float:
        """IDF from which a term counts as specific: half the highest possible (``ln N``)."""
        return 0.5 * math.log(max(self.stats.n_docs, 2)) if self.stats is not None else math.inf

    def _elliptical(self, topic: str) -> bool:
        """True when a later clause names no specific subject of its own (every key term is common in the
        index, e.g. "which plan do I need"), so it continues the first clause's subject."""
        if self.stats is None or self.stats.n_docs < 2:
            return False
        return all(self.stats.idf(t.stem) < self._rare_at() for t in key_terms(topic))

    def _specific_words(self, topic: str) -> str:
        """The three most specific words of ``topic``, as written and in order."""
        return _surface(topic, limit=3, stats=self.stats)

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """A direct reply for small talk, else one standalone query per topic."""
        start = time.perf_counter()
        decision = self.decide_sync(question, history, page)
        record_call(LLMCall(judge="decide", model="offline", seconds=time.perf_counter() - start))
        return decision
