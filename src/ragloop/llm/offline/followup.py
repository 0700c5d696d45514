"""Follow-ups, offline: a question read against the conversation it continues.

The antecedent is the previous question (itself resolved, so a chain of follow-ups keeps its subject) and the
reply that answered it. :meth:`FollowupResolver.resolve` rewrites, in order:

1. **Fragments** ("and on Business?", "what about OIDC?", "and Team?", "and with OIDC?", "and the RTO?"): no
   verb of their own, so they mean the previous question with the fragment in place of its counterpart: the
   phrase after the same preposition ("on the Team plan" → "on Business"), else the previous question's word
   that shares the fragment's head ("GitHub" for "GitHub Enterprise Server") or is most associated with the
   fragment in the corpus (pointwise mutual information: "Team" for "Business", "SAML" for "OIDC"). A question
   that opens like the previous one and has no verb ("and how many API keys?" after "How many webhook
   endpoints can a workspace have?") swaps the noun phrase after the opening.
2. **References** ("it", "its", "they", "them", "their", "this" or "that" used as a noun, "the old one", "when
   one is opened"): replaced by the previous subject, the previous question's most specific words (those the
   reply also uses first). Expletive "it" ("is it possible …") is not a reference.
3. **Continuations** with no subject of their own ("how long do I have?", "and how fast?", "why not?"), or
   whose specific words all come from the previous question and reply and that say they continue ("and …",
   "what if …", "… too?", or a definite "the grace period"): the previous subject is added ("… for CSV
   import").

Anything else (a question that names a subject of its own without these marks) is a new topic, left as asked.
Everything here is pure: strings and corpus statistics in, a rewrite (or ``None``) out.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Literal

from attrs import frozen

from ragloop.text.terms import STOPWORDS, CorpusStats, key_terms, stem, tokenize

__all__ = [
    "DEMONSTRATIVE_REF",
    "EXPLETIVE",
    "Followup",
    "FollowupResolver",
    "is_follow_on",
    "one_anaphora",
    "references",
]

How = Literal["fragment", "reference", "continuation"]


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


#: Words that open a follow-up ("and on Business?", "so what if …", "ok, and …").
_CONNECTOR = re.compile(r"^\s*(?:(?:and|but|or|so|also|then|ok|okay|now|well|plus)\b[\s,]*)+", re.IGNORECASE)
_ABOUT = re.compile(r"^(?:(?:what|how)\s+about|what\s+of|same\s+(?:for|with|on|in))\s+", re.IGNORECASE)
_TRAILING = re.compile(r"[\s,]+(?:too|as well|also|then|instead)\s*$", re.IGNORECASE)
_WHAT_IF = re.compile(r"^\s*(?:(?:and|but|so|ok|okay)\s+)*(?:what|and)\s+if\b", re.IGNORECASE)
_AUX = _set("am is are was were be been do does did can could should would will shall may might must has have had")
_WH = _set("how what which who whom whose when where why")
_SUBJECT_PRONOUNS = _set("i we you he she they it")
_PREP = _set("on for in with to about at from under of by after before during within into over via")
# Where a prepositional phrase of the previous question ends.
_PHRASE_END = (
    _set("on for in with to about at from under by after before during when while if and or but than") | _AUX | _WH
)
_DET = _set("a an the this that these those my our your their its")
_OPENING = re.compile(r"^\s*(how\s+(?:long|many|much|often|far)|which|what)\s+(.+)$", re.IGNORECASE)
#: Words that never name what a question is about, whatever their corpus frequency ("how *long*", "*happens*").
_GENERIC = _set(
    "long many much often far fast quickly soon old new big large early late happen happens happened make makes "
    "work works take takes include includes mean means kept keep set turn thing things possible back wait "
    "one ones lose lost still again ever exactly actually"
)


@functools.cache
def _generic_stems() -> frozenset[str]:
    return frozenset(stem(w) for w in _GENERIC)


_PRONOUN_REF = re.compile(r"\b(?:it|its|they|them|their|theirs)\b", re.IGNORECASE)
# "that" as a relative pronoun or conjunction ("the key that expires") is not a reference: only a demonstrative
# at the end of the question or before a verb-ish word is.
#: "this" / "that" … used as a noun.
DEMONSTRATIVE_REF = re.compile(
    r"\b(?:this|that|these|those)\b(?=\s*$|\s+(?:is|are|was|were|does|do|work|works|mean|means|cost|costs|"
    r"happen|happens|support|supports|require|requires|up|out|off|on|back|working|enabled|disabled)\b)",
    re.IGNORECASE,
)
# "the old one", "a Business one", "which one", "when one is opened"
_ONE = re.compile(
    r"\b(?:(?:the|a|an|this|that|which|each|another|every)\s+(?:(?!one\b)[\w-]+\s+)?one\b(?!\s+of\b)"
    r"|one\b(?=\s+(?:is|was|gets|got|has|had|expires|expired)\b))",
    re.IGNORECASE,
)
#: "is it possible", "it depends": an "it" that refers to nothing.
EXPLETIVE = re.compile(
    r"\b(?:is it|it is|it's|it was|was it|does it (?:matter|make sense))\s+(?:possible|necessary|ok|okay|safe|"
    r"true|better|best|recommended|required|normal|easy|hard|worth|allowed|a good idea|free)\b"
    r"|\bit (?:takes|seems|looks like|depends)\b",
    re.IGNORECASE,
)
_WORDS = re.compile(r"[\w'’.&+-]*\w")


@frozen
class Followup:
    """A follow-up rewritten to stand alone.

    Attributes:
        asked: The follow-up as asked (small talk removed).
        standalone: What to search for instead.
        how: ``fragment``, ``reference`` or ``continuation`` (see the module docstring).
    """

    asked: str
    standalone: str
    how: How


def is_follow_on(question: str) -> bool:
    """True when ``question`` says it continues: it opens with "and", "so", "what about", "what if" … or ends
    with "too"."""
    text = question.strip()
    return bool(_CONNECTOR.match(text) or _ABOUT.match(text) or _TRAILING.search(text.strip(" ?!.")))


def references(text: str) -> bool:
    """True when ``text`` refers back: a pronoun, a demonstrative used as a noun, or "the … one"."""
    if EXPLETIVE.search(text):
        return bool(_ONE.search(text))
    return bool(_PRONOUN_REF.search(text) or DEMONSTRATIVE_REF.search(text) or _ONE.search(text))


def one_anaphora(text: str, subject: str) -> str:
    """``text`` with "the old one" → "the old <subject>", "when one is opened" → "when <subject> is opened"."""

    def repl(m: re.Match[str]) -> str:
        words = m.group(0).split()
        return " ".join([*words[:-1], subject]) if len(words) > 1 else subject

    return _ONE.sub(repl, text)


def _is_name(word: str) -> bool:
    """A word written like a name: a capital or digit after its first letter, or capitalised ("Team", "OIDC",
    "iOS", "P1")."""
    return word[:1].isupper() or any(c.isupper() or c.isdigit() for c in word[1:])


def _joins(word: str) -> bool:
    """A name word the next one continues ("Microsoft Entra"), not a possessive or the end of a clause."""
    return not re.search(r"(?:['’]s|[,;:])$", word)


def _strip_opening(text: str) -> str:
    text = _CONNECTOR.sub("", text.strip())
    text = _ABOUT.sub("", text)
    return _TRAILING.sub("", text.strip(" ?!.,;:")).strip(" ?!.,;:")


@frozen
class FollowupResolver:
    """Rewrites a follow-up against the previous question, its subject and its reply (module docstring).

    Attributes:
        stats: Corpus statistics: which words are specific (IDF), which names go together (PMI). Without
            them every content word counts as specific and the last name of the previous question is swapped.
    """

    stats: CorpusStats | None = None

    def _rare_at(self) -> float:
        return 0.5 * math.log(max(self.stats.n_docs, 2)) if self.stats is not None else -math.inf

    def _idf(self, s: str) -> float:
        return self.stats.idf(s) if self.stats is not None else 1.0

    def specific(self, text: str) -> list[str]:
        """The stems of ``text`` that could name a subject: no pronouns, no question words, no generic words
        ("long", "happens"), and (with statistics) not common in the corpus."""
        out = []
        for t in key_terms(_PRONOUN_REF.sub(" ", text)):
            if t.surface in _GENERIC or t.stem in _generic_stems():
                continue
            if self.stats is None or self.stats.n_docs < 2 or self._idf(t.stem) >= self._rare_at():
                out.append(t.stem)
        return out

    def subject(self, question: str, reply: str = "", limit: int = 3) -> str:
        """What ``question`` is about: its ``limit`` most specific words as written ("sign-on" whole), in order;
        a word the reply also uses counts a little more."""
        said = {stem(t) for t in tokenize(reply)} if reply else set()
        words: list[tuple[str, float]] = []
        seen: set[str] = set()
        for word in _WORDS.findall(question):
            terms = [t for t in key_terms(word) if t.stem not in seen]
            if not terms or word.lower() in _GENERIC or all(t.stem in _generic_stems() for t in terms):
                continue
            seen.update(t.stem for t in terms)
            weight = max(self._idf(t.stem) + (0.5 if t.stem in said else 0.0) for t in terms)
            words.append((word.strip("'’"), weight))
        if len(words) > limit:
            keep = sorted(range(len(words)), key=lambda i: -words[i][1])[:limit]
            words = [words[i] for i in sorted(keep)]
        return " ".join(w for w, _ in words)

    def _without(self, subject: str, text: str) -> str:
        """``subject`` without the words ``text`` already has ("export project" in "can I export it")."""
        have = {stem(t) for t in tokenize(text)}
        kept = [w for w in subject.split() if not all(t.stem in have for t in key_terms(w))]
        return " ".join(kept) or subject

    def resolve(
        self, question: str, previous: str, subject: str | Callable[[], str], reply: str = ""
    ) -> Followup | None:
        """``question`` rewritten against the previous question, or ``None`` when it is a new topic.

        Args:
            question: The follow-up, small talk removed (its opening "and" / "what about" kept).
            previous: The previous question, itself resolved.
            subject: What the conversation is about (or a callable computing it only when needed).
            reply: The reply that answered the previous question.
        """
        asked = question.strip(" ?!.")
        if not previous.strip() or not asked:
            return None
        swapped = self._fragment(asked, previous)
        if swapped is not None:
            return Followup(asked, swapped, "fragment")
        who = subject() if callable(subject) else subject
        if not who:
            return None
        body = _CONNECTOR.sub("", asked) or asked
        referred = self._refer(body, who)
        if referred is not None:
            return Followup(asked, referred, "reference")
        core = _TRAILING.sub("", body.strip(" ?!.,"))
        named = self.specific(who)
        if not self._continues(asked, body, previous, reply) or (named and set(named) <= set(self.specific(core))):
            return None  # a new topic, or it already names the subject
        return Followup(asked, f"{core} for {self._without(who, core)}", "continuation")

    def _refer(self, body: str, who: str) -> str | None:
        """``body`` with its references replaced by the subject, or ``None`` when it has none."""
        if not references(body):
            return None
        what = self._without(who, body)
        text = one_anaphora(body, what)
        if not EXPLETIVE.search(text):
            text = _PRONOUN_REF.sub(lambda _: what, text)
            text = DEMONSTRATIVE_REF.sub(lambda _: what, text)
        return " ".join(text.split()) if text != body else None

    def _continues(self, asked: str, body: str, previous: str, reply: str) -> bool:
        """True when ``body`` names no subject of its own, or only what the previous turn talked about and says
        it continues."""
        words = [w.lower() for w in _WORDS.findall(body)]
        if not words:
            return False
        own = self.specific(body)
        if not own:
            return True
        if words[0] in _WH and not any(w in _AUX for w in words[1:]) and len(words) <= 4:
            return True  # "and how fast?", "why not?", "and how many rows?"
        before = {stem(t) for t in tokenize(f"{previous}\n{reply}")}
        if any(s not in before for s in own):
            return False
        marked = is_follow_on(asked) or bool(_WHAT_IF.match(asked)) or " the " in f" {body.lower()} "
        return marked or any(s in {stem(t) for t in tokenize(previous)} for s in own)

    def _fragment(self, asked: str, previous: str) -> str | None:
        """The previous question with the fragment's words in place of their counterpart; ``None`` when
        ``asked`` is not a fragment (see the module docstring)."""
        follow_on = is_follow_on(asked)
        core = _strip_opening(asked)
        words = core.split()
        if not words or not follow_on:
            return None
        low = [w.lower().strip(",") for w in words]
        opening = _OPENING.match(core)
        if opening and not any(w in _AUX or w in _SUBJECT_PRONOUNS for w in low[1:]):
            return self._same_opening(opening, previous)
        if low[0] in _WH or low[0] in _AUX or any(w in _AUX or w in _SUBJECT_PRONOUNS for w in low):
            return None
        if references(core) and not _ONE.search(core):
            return None
        prev = previous.strip(" ?!.")
        if low[0] in _PREP and len(words) > 1:
            phrase = self._prepositional(prev, low[0])
            if phrase is not None:
                start, end = phrase
                return " ".join(f"{prev[:start]}{core}{prev[end:]}".split())
        return self._swap(prev, [w for w in words if w.lower() not in _DET and w.lower() not in _PREP])

    def _same_opening(self, opening: re.Match[str], previous: str) -> str | None:
        """ "how many API keys" after "How many webhook endpoints can a workspace have": swap the noun phrase."""
        m = _OPENING.match(previous.strip(" ?!."))
        if m is None or m.group(1).lower().split() != opening.group(1).lower().split():
            return None
        rest = m.group(2).split()
        cut = next((i for i, w in enumerate(rest) if w.lower() in _AUX), None)
        if not cut:
            return None
        return " ".join([m.group(1), opening.group(2).strip(" ?!.,"), *rest[cut:]])

    @staticmethod
    def _prepositional(prev: str, prep: str) -> tuple[int, int] | None:
        """The span of the phrase after the first ``prep`` of ``prev`` (the preposition included)."""
        for m in re.finditer(rf"\b{re.escape(prep)}\s+", prev, re.IGNORECASE):
            end = m.end()
            for w in re.finditer(r"\S+", prev[m.end() :]):
                if w.group(0).lower().strip(",;:") in _PHRASE_END:
                    break
                end = m.end() + w.end()
            if end > m.end():
                return m.start(), end
        return None

    def _swap(self, prev: str, core: list[str]) -> str | None:
        """``prev`` with the word most like ``core`` (its name run) replaced by ``core``."""
        core = [w for w in core if w.lower() not in ("one", "ones")]
        if not core or not key_terms(" ".join(core)):
            return None
        tokens = prev.split()
        mine = {stem(t) for w in core for t in tokenize(w)}
        names = any(_is_name(w) for w in core)
        candidates = [
            i
            for i, w in enumerate(tokens)
            if (i > 0 or not w[:1].isupper() or _is_name(w[1:])) and w.lower().strip(",'’s") not in STOPWORDS
            and key_terms(w)
        ]  # fmt: skip
        named = [i for i in candidates if _is_name(tokens[i])]
        if names and named:
            candidates = named
        if not candidates:
            return None

        def score(i: int) -> float:
            stems = {stem(t) for t in tokenize(tokens[i])}
            if stems & mine:
                return math.inf
            if self.stats is None:
                return float(i) / 1000 + (1.0 if _is_name(tokens[i]) == names else 0.0)
            best = max((self.stats.pmi(a, b) for a in stems for b in mine), default=-math.inf)
            return best if best > -math.inf else -1e9 + i

        best = max(candidates, key=score)
        start = end = best
        if _is_name(tokens[best]):  # the whole name: "Microsoft Entra ID"
            while start > 1 and _is_name(tokens[start - 1]) and start - 1 in candidates and _joins(tokens[start - 1]):
                start -= 1
            while end + 1 < len(tokens) and _is_name(tokens[end + 1]) and end + 1 in candidates and _joins(tokens[end]):
                end += 1
        trail = re.search(r"[,;:]+$", tokens[end])
        return " ".join([*tokens[:start], " ".join(core) + (trail.group(0) if trail else ""), *tokens[end + 1 :]])
