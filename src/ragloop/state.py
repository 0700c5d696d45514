"""The values that flow through a chat turn, and the turn state itself.

Read this module top to bottom to follow a turn: the caller's :class:`Message` history and
:class:`PageContext` → decide's :class:`Decision` → retrieval :class:`Hit` s (with provenance) →
grader :class:`Verdict` s → numbered :class:`ContextBlock` s → the :data:`Outcome` and the streamed answer.

Values are frozen attrs classes (tuples, not lists); :class:`TurnState` is the one mutable object a turn
shares between nodes. Each of its fields says which node writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from attrs import define, field, frozen

from ragloop.plan import PlanRun
from ragloop.usage import UsageMeter

__all__ = [
    "Abstention",
    "Caller",
    "Chunk",
    "Citation",
    "CitedSection",
    "ContextBlock",
    "Decision",
    "Graded",
    "Hit",
    "HopAttempt",
    "Label",
    "LiveLookup",
    "Message",
    "Outcome",
    "PageContext",
    "PromptCuts",
    "QueryState",
    "QueryStatus",
    "RewriteAttempt",
    "StaleSource",
    "TurnState",
    "Verdict",
    "Verification",
]

#: How a turn ended up: answered from context, partly answered, nothing found, or no search needed.
Outcome = Literal["context", "partial", "none", "direct"]
#: A grader's verdict on one chunk for one query.
Label = Literal["relevant", "partial", "irrelevant"]


@frozen
class Message:
    """One earlier message of the conversation.

    Attributes:
        role: ``"user"`` or ``"assistant"``.
        content: The message text.
    """

    role: Literal["user", "assistant"]
    content: str


@frozen
class PageContext:
    """Where the user is asking from; used to resolve "this project", "this page".

    Attributes:
        url: The page URL, if known.
        title: The page title, if known.
    """

    url: str | None = None
    title: str | None = None


@frozen
class Caller:
    """Who asks: handed to every live lookup so a source can show a user only what they may see.

    Attributes:
        tenant: The caller's organisation (the sample ticket source shows only that customer's tickets).
        user: The caller's user id, for sources that check per-user access.
    """

    tenant: str | None = None
    user: str | None = None


def _metadata_items(value: Mapping[str, str] | tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


@frozen
class Chunk:
    """A piece of a document as stored in an index.

    Attributes:
        id: Stable content-hash id.
        text: The cleaned chunk text.
        source: Where it came from (path, URL or corpus id).
        title: Document title.
        title_path: Heading path inside the document (markdown), outermost first.
        doc_id: Id of the document the chunk belongs to (BEIR corpus id, or the source path).
        url: Link to the document, when known (front matter ``url:`` or the caller's metadata).
        metadata: ``(key, value)`` pairs, sorted by key, that retrievers filter on (``tenant``, ``version``…).
    """

    id: str
    text: str
    source: str = ""
    title: str = ""
    title_path: tuple[str, ...] = ()
    doc_id: str = ""
    url: str = ""
    metadata: tuple[tuple[str, str], ...] = field(default=(), converter=_metadata_items)

    def meta(self) -> dict[str, str]:
        """The metadata as a dict."""
        return dict(self.metadata)


def _frozen_mapping(value: Mapping[str, float] | Mapping[str, int]) -> Mapping[str, float]:
    return dict(value)


@frozen
class Hit:
    """One retrieved chunk with its scores and provenance.

    Attributes:
        chunk: The chunk.
        score: The retriever's score; higher is better (fused score for hybrid).
        confidence: Normalised confidence in [0, 1] that the fast path and graders may threshold.
        ranks: Rank (1-based) per retriever that produced it, e.g. ``{"bm25": 1, "dense": 3}``.
        scores: Raw score per retriever.
        queries: Every query of the turn that found this chunk (filled by the retrieve node's merge).
        best_query: The query whose copy of this hit was kept (the best-scoring one).
    """

    chunk: Chunk
    score: float
    confidence: float = 0.0
    ranks: Mapping[str, int] = field(factory=dict, converter=_frozen_mapping, eq=False, hash=False)
    scores: Mapping[str, float] = field(factory=dict, converter=_frozen_mapping, eq=False, hash=False)
    queries: tuple[str, ...] = ()
    best_query: str = ""

    @property
    def id(self) -> str:
        """The chunk id."""
        return self.chunk.id

    @property
    def text(self) -> str:
        """The chunk text."""
        return self.chunk.text


@frozen
class Decision:
    """What the decide step chose.

    Exactly one of ``reply`` (answer directly, no search) or ``queries`` (search) is set.

    Attributes:
        queries: Standalone search queries, one per topic.
        reply: A direct reply, for greetings, thanks and small talk.
        reason: A short human-readable reason, for the decision record.
    """

    queries: tuple[str, ...] = ()
    reply: str | None = None
    reason: str = ""

    @property
    def direct(self) -> bool:
        """True when no search is needed."""
        return self.reply is not None


@frozen
class Verdict:
    """A grader's judgment of one chunk for one query.

    Attributes:
        label: ``relevant``, ``partial`` or ``irrelevant``.
        reason: Short reason.
        score: Optional numeric relevance in [0, 1] (offline grader).
        fail_open: True when the grader failed and the chunk was kept anyway.
    """

    label: Label
    reason: str = ""
    score: float | None = None
    fail_open: bool = False

    @property
    def keep(self) -> bool:
        """True when the chunk counts as context (relevant or partial)."""
        return self.label != "irrelevant"


@frozen
class ContextBlock:
    """A numbered block of context handed to the answerer; ``[n]`` citations point at ``n``.

    Attributes:
        n: 1-based block number.
        text: The chunk text.
        source: Where it came from.
        title: Document title.
        chunk_id: The chunk id.
        query: The query it answers.
        url: Link to the document, when known (``page.html#anchor``: the chunk's section).
        section: The heading of the chunk's section, when it has one.
    """

    n: int
    text: str
    source: str = ""
    title: str = ""
    chunk_id: str = ""
    query: str = ""
    url: str = ""
    section: str = ""


QueryStatus = Literal["pending", "enough", "short", "failed", "rewritten", "no_context"]


@define
class QueryState:
    """One search query of the turn and what happened to it.

    Attributes:
        text: The query text.
        root: The decide query this one descends from (itself for decide's queries).
        attempt: 0 for decide's query, n for its n-th rewrite.
        status: ``pending`` → ``enough`` / ``short`` / ``failed``; ``no_context`` once rewrites ran out.
        hits: Hits this query found (after the merge), best first.
        error: Why retrieval failed, if it did.
        live_tried: True once the live sources were asked for this query.
        hop: True for a follow-up (second-hop) query: it adds context and never makes its root short.
    """

    text: str
    root: str
    attempt: int = 0
    status: QueryStatus = "pending"
    hits: list[Hit] = field(factory=list)
    error: str | None = None
    live_tried: bool = False
    hop: bool = False

    @property
    def best_score(self) -> float | None:
        """Best retrieval score among this query's hits."""
        return max((h.score for h in self.hits), default=None)


@frozen
class Graded:
    """A hit with the verdict of one query's grading.

    Attributes:
        query: The query it was graded against.
        hit: The hit.
        verdict: The grader's verdict (``fail_open`` when the grader failed).
    """

    query: str
    hit: Hit
    verdict: Verdict


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


@define
class TurnState:
    """The shared state of one chat turn; each field names the node that writes it.

    Attributes:
        question: The user's question (caller).
        history: Earlier messages of the conversation (caller).
        page: Page the user asks from (caller).
        filters: Metadata filters every search of the turn applies: key → allowed values (caller).
        caller: Who asks; every live lookup receives it (caller).
        decision: decide's choice (decide).
        plan: The retrieval plan, its waves and each sub-query's fate, when the turn planned (plan).
        queries: Every query of the turn, by text, in the order they were made (decide, rewrite).
        pending: Queries the next retrieve must run (decide, rewrite; retrieve clears it).
        shown: Chunk ids already retrieved this turn; the thrash guard (retrieve).
        searches: Every search's hits as the retriever ranked them, by query, before the merge and the
            thrash guard; the answer's final ranking fuses them (retrieve).
        fast_path: True when retrieve skipped grading (retrieve).
        graded: Every graded hit, per query (grade, live); a grader failure is a verdict with ``fail_open``.
        live: Every live-source lookup (live).
        rewrites: Every rewrite attempt (rewrite).
        hops: Every follow-up hop attempt (hop).
        verification: What the verify step found in the reply, when it ran (answer).
        prompt_cuts: What the answer prompt's token budget left out, when a budget is set (answer).
        abstention: Why the answer step abstained on passages the search found, when it did (answer).
        stale: Cited pages past their ``valid_until`` or older than the configured age (answer).
        outcome: How the turn ended up (answer).
        missing: Queries left unanswered, for a partial or none outcome (answer).
        blocks: The numbered context handed to the answerer (answer).
        cited: Block numbers in the order the reply first cited them, which gives the citation numbers a client
            sees: one per page, in that order (answer).
        answer: The reply text; while answer streams, the text sent so far (answer).
        citations: The ``[n]`` references of the reply, resolved, one per page (answer).
        errors: ``node: error`` notes of failures nodes absorbed (any node).
        usage: The judge calls of the turn (every judge, through :func:`ragloop.usage.record_call`).
    """

    question: str
    history: tuple[Message, ...] = ()
    page: PageContext = field(factory=PageContext)
    filters: Mapping[str, tuple[str, ...]] = field(factory=dict)
    caller: Caller | None = None
    decision: Decision | None = None
    plan: PlanRun | None = None
    queries: dict[str, QueryState] = field(factory=dict)
    pending: list[str] = field(factory=list)
    shown: set[str] = field(factory=set)
    searches: dict[str, list[Hit]] = field(factory=dict)
    fast_path: bool = False
    graded: list[Graded] = field(factory=list)
    live: list[LiveLookup] = field(factory=list)
    rewrites: list[RewriteAttempt] = field(factory=list)
    hops: list[HopAttempt] = field(factory=list)
    verification: Verification | None = None
    prompt_cuts: PromptCuts | None = None
    abstention: Abstention | None = None
    stale: tuple[StaleSource, ...] = ()
    outcome: Outcome | None = None
    missing: tuple[str, ...] = ()
    blocks: tuple[ContextBlock, ...] = ()
    cited: list[int] = field(factory=list)
    answer: str = ""
    citations: tuple[Citation, ...] = ()
    errors: list[str] = field(factory=list)
    usage: UsageMeter = field(factory=UsageMeter)

    def roots(self) -> list[str]:
        """decide's queries, in order."""
        return [q.text for q in self.queries.values() if q.attempt == 0 and not q.hop]

    def lineage(self, root: str) -> list[QueryState]:
        """A root query and its rewrites, in order."""
        return [q for q in self.queries.values() if q.root == root]
