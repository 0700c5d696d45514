"""The per-turn decision record: what the turn decided, found, judged and answered (:class:`TurnRecord`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from attrs import frozen

from ragloop._redact import redact
from ragloop.events import StoppedBy
from ragloop.plan import PlanRun
from ragloop.runner import RunResult
from ragloop.state import (
    Abstention,
    HopAttempt,
    Label,
    LiveLookup,
    Outcome,
    PromptCuts,
    QueryStatus,
    RewriteAttempt,
    StaleSource,
    TurnState,
    Verification,
)
from ragloop.usage import Price, cost_of

__all__ = [
    "CallRecord",
    "DecisionRecord",
    "GradeRecord",
    "QueryRecord",
    "TokenCounts",
    "TurnRecord",
    "replayed_record",
    "turn_record",
]


@frozen
class DecisionRecord:
    """What decide chose.

    Attributes:
        direct: True when the turn answered without searching.
        reason: The decider's reason.
        queries: The searches it started.
    """

    direct: bool
    reason: str
    queries: tuple[str, ...]


@frozen
class QueryRecord:
    """One query of the turn and what became of it.

    Attributes:
        text: The query.
        root: The decide query it descends from.
        attempt: 0 for decide's query, n for its n-th rewrite.
        status: Its final status.
        hits: Hits it kept after the merge.
        best_score: Its best retrieval score.
        error: Why its search failed, if it did.
        hop: True for a follow-up (second-hop) query.
    """

    text: str
    root: str
    attempt: int
    status: QueryStatus
    hits: int
    best_score: float | None
    error: str | None
    hop: bool


@frozen
class GradeRecord:
    """One graded hit.

    Attributes:
        query: The query it was graded against.
        chunk_id: The chunk.
        label: ``relevant``, ``partial`` or ``irrelevant``.
        reason: The grader's reason.
        fail_open: True when the grader failed and the chunk was kept anyway.
    """

    query: str
    chunk_id: str
    label: Label
    reason: str
    fail_open: bool


@frozen
class CallRecord:
    """One judge call.

    Attributes:
        judge: ``decide``, ``grade``, ``rewrite``, ``answer``, ``bridge`` …
        model: The model, or ``offline``.
        seconds: Its wall time.
        error: Its error, if it failed.
        prompt_tokens: Its prompt tokens (server-reported).
        completion_tokens: Its completion tokens.
        cached_prompt_tokens: Of its prompt tokens, those the server took from its prompt cache.
    """

    judge: str
    model: str
    seconds: float
    error: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


@frozen
class TokenCounts:
    """Tokens the turn's model calls used.

    Attributes:
        prompt: Prompt tokens.
        completion: Completion tokens.
        total: Both.
        cached: Of the prompt tokens, those the servers took from their prompt caches.
    """

    prompt: int
    completion: int
    total: int
    cached: int = 0


@frozen
class TurnRecord:
    """The per-turn decision record: what the turn decided, found, judged and answered.

    Built once per turn by :func:`turn_record`; :meth:`as_dict` is its JSON form.

    Attributes:
        run_id: The runner's run id (also bound in the logs).
        path: Node names in the order they ran.
        timings: Seconds per node.
        stopped_by: ``end``, ``step_cap``, ``deadline`` or ``error``.
        seconds: Wall time of the turn.
        decision: What decide chose.
        queries: Every query and what became of it.
        fast_path: Whether grading was skipped.
        grades: Every graded hit.
        fail_open: How many grades failed open.
        live: Live-source lookups.
        rewrites: Rewrite attempts.
        hops: Follow-up hop attempts.
        outcome: ``context``, ``partial``, ``none`` or ``direct``.
        missing: Decide queries left unanswered.
        llm_calls: Calls that went to a model.
        tokens: Tokens those calls used.
        calls: Every judge call.
        errors: Failures the nodes absorbed, and the node error that stopped the run.
        plan: The retrieval plan, its waves (ids, seconds) and each sub-query's fate, when the turn planned.
        verification: What the verify step found in the reply (unsupported sentences, uncovered terms), when
            it ran.
        cost: What the turn's model calls cost under ``TurnSettings.prices`` (``None`` without a price table,
            or when a model is missing from it).
        prompt_cuts: What the answer prompt's token budget left out (blocks, history messages), and the tokens
            it counted.
        cache_hits: Cache hits of the turn by cache (``embedding``, ``retrieval``, ``grade``, ``reply``).
        abstention: Why the answer step said the knowledge base does not cover the question though passages
            were found (its evidence score, the threshold, names the corpus never mentions), when it did.
        stale: Cited pages past their ``valid_until`` or older than ``TurnSettings.stale_after_days``.
    """

    run_id: str
    path: tuple[str, ...]
    timings: Mapping[str, float]
    stopped_by: StoppedBy
    seconds: float
    decision: DecisionRecord
    queries: tuple[QueryRecord, ...]
    fast_path: bool
    grades: tuple[GradeRecord, ...]
    fail_open: int
    live: tuple[LiveLookup, ...]
    rewrites: tuple[RewriteAttempt, ...]
    hops: tuple[HopAttempt, ...]
    outcome: Outcome
    missing: tuple[str, ...]
    llm_calls: int
    tokens: TokenCounts
    calls: tuple[CallRecord, ...]
    errors: tuple[str, ...]
    plan: PlanRun | None = None
    verification: Verification | None = None
    cost: float | None = None
    cache_hits: Mapping[str, int] = attrs.field(factory=dict)
    prompt_cuts: PromptCuts | None = None
    abstention: Abstention | None = None
    stale: tuple[StaleSource, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (nested records as dicts, tuples as lists)."""
        return attrs.asdict(self)


def replayed_record(record: TurnRecord, run_id: str) -> TurnRecord:
    """``record`` as the record of turn ``run_id`` that the reply cache answered: no calls, no tokens, no cost, and
    ``cache_hits`` saying so."""
    return attrs.evolve(
        record,
        run_id=run_id,
        llm_calls=0,
        calls=(),
        tokens=TokenCounts(0, 0, 0),
        cost=None if record.cost is None else 0.0,
        cache_hits={"reply": 1},
    )


def _redacted(error: str | None) -> str | None:
    return None if error is None else redact(error)


def turn_record(result: RunResult, *, prices: Mapping[str, Price] | None = None) -> TurnRecord:
    """The decision record of a finished turn, from the run's result (its cost under ``prices``).

    Error texts are redacted (:func:`ragloop._redact.redact`): no credentials (URL user info, keys,
    bearer tokens) and no upstream server's own message reach the record, its log line or ``Reply.as_dict()``.
    """
    state: TurnState = result.state
    usage = state.usage
    calls = usage.calls
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    decision = state.decision
    return TurnRecord(
        run_id=result.run_id,
        path=result.path,
        timings={k: round(v, 6) for k, v in result.timings.items()},
        stopped_by=result.stopped_by,
        seconds=round(result.duration, 6),
        decision=DecisionRecord(
            direct=bool(decision and decision.direct),
            reason=decision.reason if decision else "decide did not run",
            queries=decision.queries if decision else (),
        ),
        queries=tuple(
            QueryRecord(q.text, q.root, q.attempt, q.status, len(q.hits), q.best_score, _redacted(q.error), q.hop)
            for q in state.queries.values()
        ),
        fast_path=state.fast_path,
        grades=tuple(
            GradeRecord(g.query, g.hit.id, g.verdict.label, redact(g.verdict.reason), g.verdict.fail_open)
            for g in state.graded
        ),
        fail_open=sum(g.verdict.fail_open for g in state.graded),
        live=tuple(attrs.evolve(lookup, error=_redacted(lookup.error)) for lookup in state.live),
        rewrites=tuple(state.rewrites),
        hops=tuple(state.hops),
        outcome=state.outcome or "none",
        missing=state.missing,
        llm_calls=usage.llm_calls,
        tokens=TokenCounts(prompt, completion, prompt + completion, usage.cached_prompt_tokens),
        calls=tuple(
            CallRecord(
                c.judge,
                c.model,
                round(c.seconds, 6),
                _redacted(c.error),
                c.prompt_tokens,
                c.completion_tokens,
                c.cached_prompt_tokens,
            )
            for c in calls
        ),
        errors=tuple(
            redact(e) for e in (*state.errors, *(f"{step.node}: {step.error}" for step in result.trace if step.error))
        ),
        plan=state.plan,
        verification=state.verification,
        cost=cost_of(calls, prices or {}),
        cache_hits=dict(usage.cache_hits),
        prompt_cuts=state.prompt_cuts,
        abstention=state.abstention,
        stale=tuple(state.stale),
    )
