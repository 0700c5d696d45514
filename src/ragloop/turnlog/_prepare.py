"""From a finished turn to a stored row: redaction, identity hashing, terms, the passage checks (writer thread)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from attrs import field, frozen

from ragloop._redact import redact as redact_credentials
from ragloop.state import StaleSource
from ragloop.text.terms import key_terms
from ragloop.turnlog._facts import conflicts, unfound_terms
from ragloop.turnlog._row import (
    LoggedCitation,
    LoggedHit,
    LoggedQuery,
    LoggedRewrite,
    PendingTurn,
    TurnRow,
)

__all__ = ["LogPolicy", "clean", "hash_identity", "prepare", "question_hash"]

_BAD = re.compile("[\ud800-\udfff\x00]")


def clean(text: str) -> str:
    """``text`` storable anywhere: lone surrogates and NUL characters become U+FFFD (SQLite's UTF-8 and
    PostgreSQL's text and jsonb refuse them)."""
    if text.isascii() and "\x00" not in text:  # nearly every string: no regex pass
        return text
    return _BAD.sub("\ufffd", text)


def _positive(instance: object, attribute: object, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"LogPolicy: max_question_chars must be a positive int, got {value!r}")


@frozen
class LogPolicy:
    """What the turn log keeps of a turn.

    Attributes:
        capture_questions: Keep the question text (and the queries and rewrites written from it). ``False``
            keeps only its hash, its key terms and, with an embedder, its embedding.
        redact: A PII redaction hook, ``text → text``, applied to the question, queries, rewrites and feedback
            comments before anything (terms, hash, embedding) is taken from them. Credentials (keys, tokens,
            URL passwords) are always redacted. A hook that raises costs the row (counted as a write error).
        hash_identities: Store principals, users and tenants as salted SHA-256 hashes (``False``: as given).
        identity_salt: The salt of those hashes (keep it secret to keep them unguessable).
        max_question_chars: Longest question kept; a longer one keeps its start and is marked ``truncated``.
    """

    capture_questions: bool = True
    redact: Callable[[str], str] | None = field(default=None, eq=False)
    hash_identities: bool = True
    identity_salt: str = field(default="", repr=False)
    max_question_chars: int = field(default=8_000, validator=_positive)

    def scrub(self, text: str) -> str:
        """``text`` with credentials and (through the hook) PII removed, storable."""
        text = redact_credentials(clean(text))
        if self.redact is not None:
            text = clean(str(self.redact(text)))
        return text

    def private(self, text: str) -> str:
        """A query, rewrite, reason or error as kept (they may quote the question): scrubbed, or only its key
        terms without ``capture_questions``."""
        text = self.scrub(text)
        return text if self.capture_questions else " ".join(t.surface for t in key_terms(text))


def hash_identity(value: str, salt: str = "") -> str:
    """A principal, user or tenant as stored when identities are hashed: ``h:`` and 24 hex digits."""
    digest = hashlib.sha256(f"{salt}\x00{value}".encode("utf-8", "surrogatepass")).hexdigest()
    return "h:" + digest[:24]


def question_hash(question: str) -> str:
    """SHA-256 (hex) of the question, lower-cased with its whitespace collapsed."""
    return hashlib.sha256(" ".join(question.lower().split()).encode()).hexdigest()


def _identity(value: str | None, policy: LogPolicy) -> str | None:
    if value is None:
        return None
    value = clean(value)
    return hash_identity(value, policy.identity_salt) if policy.hash_identities else value


def prepare(turn: PendingTurn, policy: LogPolicy) -> TurnRow:
    """The row stored for ``turn`` under ``policy`` (raises if the redaction hook does)."""
    record = turn.record
    question = policy.scrub(turn.question)
    truncated = len(question) > policy.max_question_chars
    if truncated:
        question = question[: policy.max_question_chars]
    terms = key_terms(question)
    texts = [text for _, _, text in turn.passages]
    by_id = {cid: (source, text) for cid, source, text in turn.passages}
    # What the answer could rest on: the cited passages and every hit a grader kept.
    kept = {c.chunk_id for c in turn.citations} | {cid for cid, label in turn.labels.items() if label != "irrelevant"}
    cited = [by_id[cid] for cid in sorted(kept) if cid in by_id]
    caller = turn.caller
    principal = _identity(turn.principal, policy) or "anonymous"
    user = _identity(caller.user, policy) if caller is not None and caller.user else principal
    verification = record.verification
    return TurnRow(
        turn_id=clean(turn.turn_id),
        at=turn.at,
        principal=principal,
        user=user or principal,
        tenant=_identity(caller.tenant, policy) if caller is not None and caller.tenant else None,
        question=question if policy.capture_questions else None,
        question_hash=question_hash(question),
        terms=tuple(t.surface for t in terms),
        outcome=record.outcome,
        stopped_by=record.stopped_by,
        missing=tuple(policy.private(m) for m in record.missing),
        uncovered=tuple(clean(u) for u in (verification.uncovered if verification is not None else ())),
        unfound=unfound_terms(question, texts) if texts else tuple(t.surface for t in terms),
        queries=tuple(
            LoggedQuery(policy.private(q.text), q.status, q.attempt, q.hits, q.best_score, q.hop, q.error is not None)
            for q in record.queries
        ),
        rewrites=tuple(
            LoggedRewrite(policy.private(r.original), policy.private(r.to), r.accepted, policy.private(r.reason))
            for r in record.rewrites
        ),
        hits=tuple(
            LoggedHit(
                clean(h.id),
                clean(h.chunk.source),
                clean(h.chunk.title),
                float(h.score),
                float(h.confidence),
                turn.labels.get(h.id),
            )
            for h in turn.hits
        ),
        citations=tuple(
            LoggedCitation(c.n, clean(c.source), clean(c.title), clean(c.chunk_id)) for c in turn.citations
        ),
        stale=tuple(_clean_stale(s) for s in turn.stale),
        conflicts=conflicts({t.stem for t in terms}, cited) if len({s for s, _ in cited}) > 1 else (),
        seconds=float(record.seconds),
        llm_calls=int(record.llm_calls),
        models=tuple(sorted({clean(c.model) for c in record.calls})),
        errors=tuple(policy.private(e) for e in record.errors),
        truncated=truncated,
        abstained=record.abstention is not None,
        filters=tuple(sorted((clean(k), tuple(clean(v) for v in values)) for k, values in turn.filters.items())),
    )


def _clean_stale(s: StaleSource) -> StaleSource:
    def opt(value: str | None) -> str | None:
        return None if value is None else clean(value)

    return StaleSource(s.n, clean(s.source), clean(s.title), s.reason, opt(s.owner), opt(s.updated), opt(s.valid_until))
