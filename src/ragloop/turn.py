"""The default chat turn: its settings, its nodes, its graph and its decision record.

``decide → retrieve → grade → live → rewrite → retrieve … → answer``; any node or judge can be swapped by
building the nodes yourself and passing them to :class:`ragloop.Graph` (see :func:`default_nodes`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import frozen

from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.nodes.answer import Answer
from ragloop.nodes.decide import Decide
from ragloop.nodes.grade import Grade
from ragloop.nodes.hop import Hop
from ragloop.nodes.live import Live
from ragloop.nodes.retrieve import Retrieve
from ragloop.nodes.rewrite import Rewrite
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.live import LiveSource
from ragloop.runner import Graph, Node, RunResult
from ragloop.state import TurnState
from ragloop.usage import metering

__all__ = ["TurnRecord", "TurnSettings", "build_graph", "default_nodes", "turn_record", "turn_summary"]


@frozen
class TurnSettings:
    """Knobs of the default chat turn.

    Attributes:
        max_queries: Most queries decide may start.
        k: Hits per query.
        per_query_budget: Merged hits kept for one query.
        total_budget: Most merged hits kept per retrieve, however many queries.
        fast_path_confidence: Confidence a hit needs to count for the fast path.
        fast_path_min_hits: A single query with this many confident hits skips grading (only those are kept).
        max_attempts: Rewrites per decide query before it is given up as ``no_context``.
        max_hops: Follow-up (second-hop) searches per turn once every query found something; they run
            only with a bridger.
        max_blocks: Most context blocks handed to the answerer.
        retrieve_timeout_s: Time limit per query's search.
        grade_timeout_s: Time limit per grade (past it the chunk is kept: fail-open).
        rewrite_timeout_s: Time limit per rewrite.
        live_timeout_s: Time limit per live lookup.
        max_steps: The runner's step cap. The longest regular turn with the defaults is 14 steps (decide; four
            retrieve/grade rounds: the first, two rewrites and a hop; live; two rewrites; hop; answer), so
            16 leaves room and a cap means something went wrong.
        deadline_s: Default time limit for a whole turn (``None``: no limit).
    """

    max_queries: int = 4
    k: int = 8
    per_query_budget: int = 6
    total_budget: int = 12
    fast_path_confidence: float = 0.75
    fast_path_min_hits: int = 2
    max_attempts: int = 2
    max_hops: int = 1
    max_blocks: int = 8
    retrieve_timeout_s: float = 5.0
    grade_timeout_s: float = 10.0
    rewrite_timeout_s: float = 10.0
    live_timeout_s: float = 5.0
    max_steps: int = 16
    deadline_s: float | None = 60.0


def default_nodes(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
    *,
    retriever: Retriever,
    decider: Decider,
    grader: Grader,
    rewriter: Rewriter,
    answerer: Answerer,
    live_sources: Sequence[LiveSource] = (),
    settings: TurnSettings = TurnSettings(),
    embedder: Embedder | None = None,
    fallback_decider: Decider | None = None,
    fallback_answerer: Answerer | None = None,
    bridger: Bridger | None = None,
) -> dict[str, Node]:
    """The seven nodes of the default turn, wired to the given collaborators (no bridger: no hops)."""
    s = settings
    max_hops = s.max_hops if bridger is not None else 0
    return {
        "decide": Decide(decider, max_queries=s.max_queries, fallback=fallback_decider),
        "retrieve": Retrieve(
            retriever,
            k=s.k,
            per_query_budget=s.per_query_budget,
            total_budget=s.total_budget,
            timeout_s=s.retrieve_timeout_s,
            fast_path_confidence=s.fast_path_confidence,
            fast_path_min_hits=s.fast_path_min_hits,
        ),
        "grade": Grade(
            grader, live_sources, max_attempts=s.max_attempts, timeout_s=s.grade_timeout_s, max_hops=max_hops
        ),
        "hop": Hop(bridger, timeout_s=s.rewrite_timeout_s),
        "live": Live(live_sources, max_attempts=s.max_attempts, timeout_s=s.live_timeout_s),
        "rewrite": Rewrite(rewriter, max_attempts=s.max_attempts, embedder=embedder, timeout_s=s.rewrite_timeout_s),
        "answer": Answer(answerer, fallback=fallback_answerer, max_blocks=s.max_blocks),
    }


def build_graph(nodes: Mapping[str, Node], settings: TurnSettings = TurnSettings()) -> Graph:
    """The default chat-turn graph over ``nodes`` (see :func:`default_nodes`)."""
    return Graph(
        nodes,
        start="decide",
        finish="answer",
        max_steps=settings.max_steps,
        summarize=turn_summary,
        context=lambda state: metering(state.usage),
    )


@frozen
class TurnRecord:
    """The per-turn decision record: what the turn decided, found, judged and answered.

    Attributes:
        run_id: The runner's run id (also bound in the logs).
        path: Node names in the order they ran.
        timings: Seconds per node.
        stopped_by: ``end``, ``step_cap``, ``deadline`` or ``error``.
        seconds: Wall time of the turn.
        decision: decide's choice: ``direct``, ``reason``, ``queries``.
        queries: Per query: text, root, attempt, status, hits, best_score, error.
        fast_path: Whether grading was skipped.
        grades: Per graded hit: query, chunk_id, label, reason, fail_open.
        fail_open: How many grades failed open.
        live: Live-source lookups: query, source, ids, accepted, mismatches, error.
        rewrites: Rewrite attempts: from, to, attempt, accepted, reason.
        hops: Follow-up hop attempts: query, found, accepted, reason.
        outcome: ``context``, ``partial``, ``none`` or ``direct``.
        missing: Decide queries left unanswered.
        llm_calls: Calls that went to a model.
        tokens: ``prompt``, ``completion``, ``total`` tokens.
        calls: Per judge call: judge, model, seconds, error.
        errors: Failures the nodes absorbed, and the node error that stopped the run.
    """

    run_id: str
    path: tuple[str, ...]
    timings: dict[str, float]
    stopped_by: str
    seconds: float
    decision: dict[str, Any]
    queries: tuple[dict[str, Any], ...]
    fast_path: bool
    grades: tuple[dict[str, Any], ...]
    fail_open: int
    live: tuple[dict[str, Any], ...]
    rewrites: tuple[dict[str, Any], ...]
    hops: tuple[dict[str, Any], ...]
    outcome: str
    missing: tuple[str, ...]
    llm_calls: int
    tokens: dict[str, int]
    calls: tuple[dict[str, Any], ...]
    errors: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


def turn_summary(state: TurnState) -> dict[str, Any]:
    """The turn's record fields that come from the state and the usage meter (everything but the trace)."""
    calls = state.usage.calls
    prompt = sum(c.prompt_tokens for c in calls)
    completion = sum(c.completion_tokens for c in calls)
    decision = state.decision
    return {
        "decision": {
            "direct": bool(decision and decision.direct),
            "reason": decision.reason if decision else "decide did not run",
            "queries": list(decision.queries) if decision else [],
        },
        "queries": [
            {
                "text": q.text,
                "root": q.root,
                "attempt": q.attempt,
                "status": q.status,
                "hits": len(q.hits),
                "best_score": q.best_score,
                "error": q.error,
                "hop": q.hop,
            }
            for q in state.queries.values()
        ],
        "fast_path": state.fast_path,
        "grades": [
            {
                "query": g.query,
                "chunk_id": g.hit.id,
                "label": g.verdict.label,
                "reason": g.verdict.reason,
                "fail_open": g.verdict.fail_open,
            }
            for g in state.graded
        ],
        "fail_open": len(state.fail_open),
        "live": [dict(e) for e in state.live],
        "rewrites": [dict(e) for e in state.rewrites],
        "hops": [dict(e) for e in state.hops],
        "outcome": state.outcome or "none",
        "missing": list(state.missing),
        "llm_calls": sum(1 for c in calls if c.model != "offline"),
        "tokens": {"prompt": prompt, "completion": completion, "total": prompt + completion},
        "calls": [
            {"judge": c.judge, "model": c.model, "seconds": round(c.seconds, 6), "error": c.error} for c in calls
        ],
        "errors": list(state.errors),
    }


def turn_record(result: RunResult) -> TurnRecord:
    """The decision record of a finished turn."""
    s = turn_summary(result.state)
    return TurnRecord(
        run_id=result.run_id,
        path=result.path,
        timings={k: round(v, 6) for k, v in result.timings.items()},
        stopped_by=result.stopped_by,
        seconds=round(result.duration, 6),
        decision=s["decision"],
        queries=tuple(s["queries"]),
        fast_path=s["fast_path"],
        grades=tuple(s["grades"]),
        fail_open=s["fail_open"],
        live=tuple(s["live"]),
        rewrites=tuple(s["rewrites"]),
        hops=tuple(s["hops"]),
        outcome=s["outcome"],
        missing=tuple(s["missing"]),
        llm_calls=s["llm_calls"],
        tokens=s["tokens"],
        calls=tuple(s["calls"]),
        errors=(*s["errors"], *(f"{step.node}: {step.error}" for step in result.trace if step.error)),
    )
