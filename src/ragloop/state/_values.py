"""The values of a turn up to grading: messages, page, caller, chunks and hits, decisions, verdicts, blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from attrs import define, field, frozen

__all__ = [
    "Caller",
    "Chunk",
    "ContextBlock",
    "Decision",
    "Graded",
    "Hit",
    "Label",
    "Message",
    "Outcome",
    "PageContext",
    "QueryState",
    "QueryStatus",
    "Verdict",
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
        cosine: The chunk's dense cosine with the question itself, when the question's own search (one of
            decide's queries, not a rewrite or a hop) found it by meaning; ``None`` otherwise.
    """

    n: int
    text: str
    source: str = ""
    title: str = ""
    chunk_id: str = ""
    query: str = ""
    url: str = ""
    section: str = ""
    cosine: float | None = None


#: Where one query of the turn stands: not searched yet, enough context, short of it, failed, rewritten,
#: or no context found at all.
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
