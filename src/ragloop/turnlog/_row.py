"""The values of the turn log: what one finished turn leaves behind, as built in the turn and as stored.

:func:`pending_turn` runs inside the turn and only gathers references (no copies, no JSON, no hashing: it
must cost next to nothing); the writer thread turns a :class:`PendingTurn` into a :class:`TurnRow`
(:func:`ragloop.turnlog._prepare.prepare`) and stores it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
from attrs import field, frozen

from ragloop.state import Caller, Citation, Graded, Hit, StaleSource

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ragloop.turn import TurnRecord

__all__ = [
    "Conflict",
    "LoggedCitation",
    "LoggedHit",
    "LoggedQuery",
    "LoggedRewrite",
    "LoggedTurn",
    "PendingTurn",
    "Rating",
    "TurnRow",
    "pending_turn",
    "row_from_json",
    "row_to_json",
]

#: A user's verdict on a reply.
Rating = Literal["up", "down"]
#: Hits kept per turn (best first).
MAX_HITS = 8

_LABEL_RANK = {"relevant": 0, "partial": 1, "irrelevant": 2}


@frozen
class LoggedHit:
    """One of the turn's best hits.

    Attributes:
        chunk_id: The chunk.
        source: Its page.
        title: Its title.
        score: The retriever's score.
        confidence: The retriever's normalised confidence in [0, 1].
        label: Its best grade in the turn (``None``: not graded, e.g. on the fast path).
    """

    chunk_id: str
    source: str
    title: str
    score: float
    confidence: float
    label: str | None


@frozen
class LoggedQuery:
    """One query of the turn.

    Attributes:
        text: The query (its terms only, without ``capture_questions``).
        status: Its final status (``enough``, ``no_context`` …).
        attempt: 0 for decide's query, n for its n-th rewrite.
        hits: Hits it kept.
        best_score: Its best retrieval score.
        hop: True for a follow-up query.
        failed: True when its search failed (the store down, a timeout: not an answer that found nothing).
    """

    text: str
    status: str
    attempt: int
    hits: int
    best_score: float | None
    hop: bool = False
    failed: bool = False


@frozen
class LoggedRewrite:
    """One rewrite the turn tried.

    Attributes:
        original: The short query.
        to: The rewrite.
        accepted: Whether it was searched.
        reason: Why (not).
    """

    original: str
    to: str
    accepted: bool
    reason: str


@frozen
class LoggedCitation:
    """One source the reply cited.

    Attributes:
        n: Its block number.
        source: Its page.
        title: Its title.
        chunk_id: The chunk.
    """

    n: int
    source: str
    title: str
    chunk_id: str


@frozen
class Conflict:
    """Cited pages that state different values for one of the question's terms (e.g. a limit or a price).

    Attributes:
        term: The term the values are stated for (``endpoint``).
        values: ``(source, values it states)`` per page, sorted by source.
    """

    term: str
    values: tuple[tuple[str, tuple[str, ...]], ...]


@frozen
class PendingTurn:
    """A finished turn as the turn hands it over: references only; the writer prepares and stores it.

    Attributes:
        turn_id: The reply's ``turn_id``.
        at: When it finished (seconds since the epoch, UTC).
        question: The question as the turn saw it.
        principal: Who asked, as authenticated (an API key's principal; ``anonymous`` without one).
        caller: The turn's caller (its ``user`` and ``tenant``), when given.
        record: The turn's decision record.
        citations: The reply's citations.
        hits: The turn's best hits (see :func:`pending_turn`).
        labels: Best grade per chunk id.
        passages: ``(chunk id, source, text)`` of those hits, for the writer's term and conflict checks.
        stale: Stale pages the reply rests on.
        filters: The metadata filters every search of the turn applied (the tenant wall included).
    """

    turn_id: str
    at: float
    question: str
    principal: str
    caller: Caller | None
    record: TurnRecord
    citations: tuple[Citation, ...]
    hits: tuple[Hit, ...]
    labels: Mapping[str, str]
    passages: tuple[tuple[str, str, str], ...]
    stale: tuple[StaleSource, ...]
    filters: Mapping[str, tuple[str, ...]] = field(factory=dict)


def pending_turn(  # noqa: PLR0913 — the pieces of a finished turn, by keyword
    *,
    turn_id: str,
    question: str,
    record: TurnRecord,
    citations: Sequence[Citation] = (),
    graded: Sequence[Graded] = (),
    searches: Mapping[str, Sequence[Hit]] | None = None,
    stale: Sequence[StaleSource] = (),
    principal: str | None = None,
    caller: Caller | None = None,
    at: float | None = None,
    filters: Mapping[str, tuple[str, ...]] | None = None,
) -> PendingTurn:
    """What the turn log needs of a finished turn, gathered cheaply (it runs inside the turn).

    The hits kept are the ``MAX_HITS`` (8) best by confidence among the graded hits and, for a turn that
    skipped grading, the searches' hits; each with its best grade.
    """
    labels: dict[str, str] = {}
    best: dict[str, Hit] = {}
    for g in graded:
        hid = g.hit.id
        label = labels.get(hid)
        if label is None or _LABEL_RANK[g.verdict.label] < _LABEL_RANK[label]:
            labels[hid] = g.verdict.label
        if hid not in best or g.hit.confidence > best[hid].confidence:
            best[hid] = g.hit
    if not best and searches:
        for hits in searches.values():
            for h in hits[:MAX_HITS]:
                if h.id not in best or h.confidence > best[h.id].confidence:
                    best[h.id] = h
    top = sorted(best.values(), key=lambda h: (-h.confidence, -h.score, h.id))[:MAX_HITS]
    kept = {i for i, label in labels.items() if label != "irrelevant"}
    keep = {h.id for h in top} | {c.chunk_id for c in citations} | kept
    passages = tuple((h.id, h.chunk.source, h.chunk.text) for h in best.values() if h.id in keep)
    return PendingTurn(
        turn_id=turn_id,
        at=time.time() if at is None else at,
        question=question,
        principal=principal or "anonymous",
        caller=caller,
        record=record,
        citations=tuple(citations),
        hits=tuple(top),
        labels=labels,
        passages=passages,
        stale=tuple(stale),
        filters=filters or {},
    )


@frozen
class TurnRow:
    """One stored turn.

    Attributes:
        turn_id: The reply's ``turn_id``.
        at: When it finished (seconds since the epoch, UTC).
        principal: Who asked (hashed unless the log keeps identities).
        user: The user it counts as (the caller's ``user``, else the principal; hashed likewise).
        tenant: The caller's tenant (hashed likewise), if any.
        question: The question after redaction (``None`` without ``capture_questions``).
        question_hash: SHA-256 of the redacted, normalised question.
        terms: The question's key terms (lower-cased, stopwords dropped).
        outcome: ``context``, ``partial``, ``none`` or ``direct``.
        stopped_by: How the run ended (``end``, ``deadline`` …).
        missing: Queries left unanswered.
        uncovered: Key terms of the question the reply did not cover (the verify step).
        unfound: Key terms of the question that none of the turn's hits mentions.
        queries: Every query and what became of it.
        rewrites: Rewrites tried.
        hits: The best hits, with scores and grades.
        citations: Sources the reply cited.
        stale: Stale pages the reply rests on.
        conflicts: Pages the answer rested on (cited, or graded relevant or partial) that state different values
            for one of the question's terms.
        seconds: Wall time of the turn.
        llm_calls: Calls that went to a model.
        models: Models the turn's judges used (``offline`` for the offline judges).
        errors: Failures the turn absorbed (redacted).
        truncated: True when the question was longer than the log keeps (its start is kept).
        abstained: True when the answer step abstained on the passages the search found (they were on the subject
            but did not support an answer: ``TurnRecord.abstention``); the outcome is then ``none``.
        filters: The metadata filters the turn's searches applied, ``(key, values)`` sorted by key: what walled
            it in (a principal's tenant among them), stored as given so that ``ragloop replay`` asks within the
            same walls; ``None`` for a row written before rows kept them (its walls are unknown).
    """

    turn_id: str
    at: float
    principal: str
    user: str
    tenant: str | None
    question: str | None
    question_hash: str
    terms: tuple[str, ...]
    outcome: str
    stopped_by: str = "end"
    missing: tuple[str, ...] = ()
    uncovered: tuple[str, ...] = ()
    unfound: tuple[str, ...] = ()
    queries: tuple[LoggedQuery, ...] = ()
    rewrites: tuple[LoggedRewrite, ...] = ()
    hits: tuple[LoggedHit, ...] = ()
    citations: tuple[LoggedCitation, ...] = ()
    stale: tuple[StaleSource, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    seconds: float = 0.0
    llm_calls: int = 0
    models: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    truncated: bool = False
    abstained: bool = False
    filters: tuple[tuple[str, tuple[str, ...]], ...] | None = ()


@frozen
class LoggedTurn:
    """A stored turn as read back, with the latest feedback on it.

    Attributes:
        row: The turn.
        rating: The latest rating (``None``: not rated).
        comment: The comment that came with it.
        embedding: The question's stored embedding, if the log keeps them.
        embedder: The name of the embedder that made it.
    """

    row: TurnRow
    rating: Rating | None = None
    comment: str | None = None
    embedding: npt.NDArray[np.float32] | None = field(default=None, eq=False, repr=False)
    embedder: str | None = None


#: The columns of a row; everything else goes into its JSON ``data``.
COLUMNS = ("turn_id", "at", "principal", "user", "tenant", "outcome", "question", "question_hash", "seconds")


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in attrs.fields(cls))
    return names


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: attrs values as dicts, tuples as lists (by hand: ``attrs.asdict`` cost the
    writer more than the row's own checks)."""
    if attrs.has(type(value)):
        return {name: _plain(getattr(value, name)) for name in _names(type(value))}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def row_to_json(row: TurnRow) -> dict[str, Any]:
    """The row's fields that are not columns, JSON-ready (``terms`` included)."""
    return {name: _plain(getattr(row, name)) for name in _names(TurnRow) if name not in COLUMNS}


def _tuple(items: Any, build: Any) -> tuple[Any, ...]:
    return tuple(build(item) for item in items or ())


def _values(cls: type, item: Mapping[str, Any]) -> Any:
    """``cls`` from the stored ``item``, keys a later version added ignored (a log outlives the code reading it)."""
    names = _names(cls)
    return cls(**{k: v for k, v in item.items() if k in names})


def row_from_json(columns: Mapping[str, Any], data: Mapping[str, Any]) -> TurnRow:
    """The row back from its columns and its JSON ``data`` (keys it does not know are ignored, nested ones too)."""
    return TurnRow(
        turn_id=str(columns["turn_id"]),
        at=float(columns["at"]),
        principal=str(columns["principal"]),
        user=str(columns["user"]),
        tenant=columns.get("tenant"),
        question=columns.get("question"),
        question_hash=str(columns["question_hash"]),
        terms=tuple(data.get("terms") or ()),
        outcome=str(columns["outcome"]),
        stopped_by=str(data.get("stopped_by", "end")),
        missing=tuple(data.get("missing") or ()),
        uncovered=tuple(data.get("uncovered") or ()),
        unfound=tuple(data.get("unfound") or ()),
        queries=_tuple(data.get("queries"), lambda q: _values(LoggedQuery, q)),
        rewrites=_tuple(data.get("rewrites"), lambda r: _values(LoggedRewrite, r)),
        hits=_tuple(data.get("hits"), lambda h: _values(LoggedHit, h)),
        citations=_tuple(data.get("citations"), lambda c: _values(LoggedCitation, c)),
        stale=_tuple(data.get("stale"), lambda s: _values(StaleSource, s)),
        conflicts=_tuple(
            data.get("conflicts"),
            lambda c: Conflict(c["term"], tuple((str(s), tuple(v)) for s, v in c["values"])),
        ),
        seconds=float(columns.get("seconds") or 0.0),
        llm_calls=int(data.get("llm_calls", 0)),
        models=tuple(data.get("models") or ()),
        errors=tuple(data.get("errors") or ()),
        truncated=bool(data.get("truncated", False)),
        abstained=bool(data.get("abstained", False)),
        filters=None
        if "filters" not in data
        else tuple((str(k), tuple(str(x) for x in v)) for k, v in data["filters"] or ()),
    )
