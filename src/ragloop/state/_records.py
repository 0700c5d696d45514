"""The values of a turn after grading: citations, live lookups, rewrites, hops, cuts, stale pages, checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from attrs import frozen

__all__ = [
    "Abstention",
    "Citation",
    "CitedSection",
    "HopAttempt",
    "LiveLookup",
    "PromptCuts",
    "RewriteAttempt",
    "StaleSource",
    "Verification",
]


def _or_none(url: str | None) -> str | None:
    return url or None


@frozen
class CitedSection:
    """One cited block of a page, listed under the page's citation.

    Attributes:
        title: Its section heading (empty for a page's opening, or a source without sections).
        url: Its link (``page.html#anchor``), when known.
        chunk_id: Its chunk id.
    """

    title: str
    url: str
    chunk_id: str


@frozen
class Citation:
    """A ``[n]`` reference in the answer, resolved to its source: one per page.

    The numbers a reply shows are the client's: one per page (source), ``1..n`` in the order the reply first
    cites them; the blocks of one page share its number, and :attr:`sections` lists which of its parts were
    cited. They are not the block numbers the answerer was given (:class:`ContextBlock` ``n``).

    Attributes:
        n: The number shown in the reply.
        source: Where the page came from.
        title: Its title.
        chunk_id: The chunk id of its first cited block.
        url: The link of its first cited block, when known.
        sections: Every cited block of the page, in order of first citation.
    """

    n: int
    source: str
    title: str
    chunk_id: str
    url: str = ""
    sections: tuple[CitedSection, ...] = ()

    def as_dict(self, url: str | None, link: Callable[[str | None], str | None] = _or_none) -> dict[str, Any]:
        """The JSON shape replies send: ``n``, ``title``, ``source``, ``url`` (as given) and ``sections``, each
        section's ``title`` and ``url`` (passed through ``link``, by default an empty url as ``None``)."""
        sections = [{"title": s.title, "url": link(s.url or None)} for s in self.sections]
        return {"n": self.n, "title": self.title, "source": self.source, "url": url, "sections": sections}


@frozen
class LiveLookup:
    """One live-source lookup for a short query (live).

    Attributes:
        query: The query whose text carried the source's signal.
        source: The live source's name.
        ids: The ids asked for.
        accepted: Ids of the records that matched exactly and became context.
        mismatches: Ids of the records returned for other ids (rejected).
        error: Why the lookup failed, if it did.
    """

    query: str
    source: str
    ids: tuple[str, ...]
    accepted: tuple[str, ...] = ()
    mismatches: tuple[str, ...] = ()
    error: str | None = None


@frozen
class RewriteAttempt:
    """One rewrite of a short query (rewrite).

    Attributes:
        original: The short query rewritten.
        root: The decide query it descends from.
        attempt: Which rewrite of that root this is (1, 2 …).
        to: The rewrite (empty when the rewriter failed).
        accepted: Whether it was searched (new, not a near-duplicate of a tried query).
        reason: ``new angle``, or why it was rejected.
    """

    original: str
    root: str
    attempt: int
    to: str
    accepted: bool
    reason: str


@frozen
class HopAttempt:
    """One follow-up (second-hop) attempt (hop).

    Attributes:
        query: The follow-up query, if the bridger proposed one.
        found: Relevant passages the bridger was shown.
        accepted: Whether the follow-up was searched.
        reason: Why it was or was not.
    """

    query: str | None
    found: int
    accepted: bool
    reason: str


@frozen
class PromptCuts:
    """What the answer prompt's token budget cut (:class:`ragloop.prompt_budget.PromptBudget`).

    Attributes:
        counter: How tokens were counted (a tokenizer's name, or ``chars/3.2`` for the estimate).
        context_tokens: Tokens of the context blocks sent.
        history_tokens: Tokens of the history messages sent.
        blocks_cut: Chunk ids of the blocks left out, lowest ranked last.
        history_dropped: Earlier messages left out (oldest first).
    """

    counter: str
    context_tokens: int
    history_tokens: int
    blocks_cut: tuple[str, ...] = ()
    history_dropped: int = 0


@frozen
class StaleSource:
    """A cited page that may be out of date: past its ``valid_until``, or older than the configured age (answer).

    Attributes:
        n: The block number the reply cites it as.
        source: The page (its source path or URL).
        title: Its title.
        reason: ``expired`` (past ``valid_until``) or ``old`` (its ``updated`` date is older than the limit).
        owner: Its ``owner`` metadata, when it has one: who should refresh it.
        updated: Its ``updated`` metadata, as written.
        valid_until: Its ``valid_until`` metadata, as written.
    """

    n: int
    source: str
    title: str
    reason: Literal["expired", "old"]
    owner: str | None = None
    updated: str | None = None
    valid_until: str | None = None


@frozen
class Verification:
    """What the verify step found in the composed reply (answer).

    Attributes:
        checked: Sentences of the reply that cite a block.
        unsupported: Sentences the blocks they cite do not support (dropped from the final reply).
        uncovered: Key terms of the question the reply does not cover (named as missing when they downgrade
            the outcome).
        downgraded: True when the outcome went from ``context`` to ``partial`` because of them.
    """

    checked: int
    unsupported: tuple[str, ...] = ()
    uncovered: tuple[str, ...] = ()
    downgraded: bool = False


@frozen
class Abstention:
    """Why the answer step said the knowledge base does not cover the question, though a search found
    passages (answer).

    Attributes:
        score: The evidence score of the best passages (see :mod:`ragloop.llm.offline.answer`).
        threshold: The score below which the answer step abstains.
        unknown: Names in the question the knowledge base never mentions ("Trello", "Kubernetes").
        reason: One line a person can read.
    """

    score: float
    threshold: float
    unknown: tuple[str, ...] = ()
    reason: str = ""
