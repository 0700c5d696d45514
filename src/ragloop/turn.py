"""The default chat turn: its settings, its nodes, its graph and its decision record.

``decide → retrieve → grade → live → rewrite → retrieve … → answer``; any node or judge can be swapped by
building the nodes yourself and passing them to :class:`ragloop.Graph` (see :func:`default_nodes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from attrs import frozen

from ragloop._redact import redact
from ragloop.caches import Caches
from ragloop.events import StoppedBy
from ragloop.llm.cached import CachedGrader
from ragloop.llm.planner import Planner
from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.nodes.answer import Abstainer, Answer, Extractive, Verifier
from ragloop.nodes.decide import Decide
from ragloop.nodes.grade import Grade
from ragloop.nodes.hop import Hop
from ragloop.nodes.live import Live
from ragloop.nodes.plan import PlanNode
from ragloop.nodes.retrieve import Retrieve
from ragloop.nodes.rewrite import Rewrite
from ragloop.plan import PlanRun
from ragloop.policy import RoutingPolicy
from ragloop.prompt_budget import PromptBudget
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.cached import CachedEmbedder, CachedRetriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.sources import Source
from ragloop.runner import Graph, Node, RunResult
from ragloop.state import (
    Abstention,
    HopAttempt,
    Label,
    LiveLookup,
    Outcome,
    PromptCuts,
    QueryStatus,
    RewriteAttempt,
    TurnState,
    Verification,
)
from ragloop.usage import Price, cost_of, metering

__all__ = [
    "CallRecord",
    "DecisionRecord",
    "GradeRecord",
    "QueryRecord",
    "TokenCounts",
    "TurnRecord",
    "TurnSettings",
    "build_graph",
    "default_nodes",
    "turn_record",
]


@frozen
class TurnSettings:
    """Knobs of the default chat turn: the one place their defaults are written (the nodes take them as
    required arguments).

    Attributes:
        max_queries: Most queries decide may start.
        k: Hits per query (as deep as a single search: the final ranking fuses every query's list).
        per_query_budget: Merged hits kept for one query.
        total_budget: Most merged hits kept per retrieve, however many queries.
        retrieve_concurrency: Queries searched at once.
        fast_path_confidence: Confidence a hit needs to count for the fast path.
        fast_path_min_hits: A single query with this many confident hits skips grading (only those are kept).
        min_relevant: Relevant hits a query needs to count as answered (partial hits never suffice alone).
        grade_concurrency: Grades run at once.
        per_passage_grading: Grade each passage in its own model call, as before batch grading (by default a
            grader that can grades all of a query's passages in one call: ``OpenAIGrader.grade_batch``).
        max_attempts: Rewrites per decide query before it is given up as ``no_context``.
        overlap_threshold: Normalised-term overlap at or above which a rewrite repeats a tried query.
        cosine_threshold: Embedding cosine at or above which a rewrite repeats a tried query (with an embedder).
        max_hops: Follow-up (second-hop) searches per turn once every query found something; they run
            only with a bridger.
        max_blocks: Most context blocks handed to the answerer.
        retrieve_timeout_s: Time limit per query's search.
        grade_timeout_s: Time limit per grade (past it the chunk is kept: fail-open).
        rewrite_timeout_s: Time limit per rewrite.
        hop_timeout_s: Time limit for the bridger's follow-up query.
        live_timeout_s: Time limit per live lookup.
        max_subqueries: Most sub-queries a retrieval plan may hold (with a planner).
        plan_timeout_s: Time limit per plan sub-query (a SQL statement, a search, a lookup).
        plan_concurrency: Plan sub-queries running at once within a wave.
        max_steps: The runner's step cap. The longest regular turn with the defaults is 15 steps (decide; the
            first retrieve/grade round; two rewrite rounds, each after a live lookup; a hop round; answer:
            ``tests/test_policy.py`` checks the bound), so 16 leaves room and a cap means something went wrong.
        deadline_s: Default time limit for a whole turn (``None``: no limit).
        prompt_budget: Token budgets of the answer prompt (context blocks, history) and how tokens are counted
            (:class:`~ragloop.prompt_budget.PromptBudget`: the model's tokenizer, or the calibrated estimate);
            ``None``: no budget.
        prices: The application's price table, model name → :class:`~ragloop.usage.Price` (per million input
            and output tokens); each turn's record then carries its cost (``TurnRecord.cost``).
    """

    max_queries: int = 4
    k: int = 30
    per_query_budget: int = 6
    total_budget: int = 12
    retrieve_concurrency: int = 8
    fast_path_confidence: float = 0.75
    fast_path_min_hits: int = 2
    min_relevant: int = 1
    grade_concurrency: int = 16
    per_passage_grading: bool = False
    max_attempts: int = 2
    overlap_threshold: float = 0.6
    cosine_threshold: float = 0.95
    max_hops: int = 1
    max_blocks: int = 8
    retrieve_timeout_s: float = 5.0
    grade_timeout_s: float = 10.0
    rewrite_timeout_s: float = 10.0
    hop_timeout_s: float = 10.0
    live_timeout_s: float = 5.0
    max_subqueries: int = 6
    plan_timeout_s: float = 5.0
    plan_concurrency: int = 4
    max_steps: int = 16
    deadline_s: float | None = 60.0
    prompt_budget: PromptBudget | None = attrs.field(factory=PromptBudget)
    prices: Mapping[str, Price] = attrs.field(factory=dict, hash=False)

    def policy(self, *, live_sources: Sequence[LiveSource] = (), hops: bool = True) -> RoutingPolicy:
        """The routing policy for a turn with these live sources (and a bridger, when ``hops``)."""
        sources = tuple(live_sources)

        def live_signal(text: str) -> bool:
            return any(source.signals(text) for source in sources)

        return RoutingPolicy(
            max_attempts=self.max_attempts,
            max_hops=self.max_hops if hops else 0,
            live_signal=live_signal if sources else None,
        )


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
    planner: Planner | None = None,
    plan_sources: Mapping[str, Source] | None = None,
    fallback_planner: Planner | None = None,
    verifier: Verifier | None = None,
    caches: Caches | None = None,
    index_version: Callable[[], str] | None = None,
) -> dict[str, Node]:
    """The seven nodes of the default turn, wired to the given collaborators (no bridger: no hops).

    With a ``planner`` (and the ``plan_sources`` it plans over, the document source included), an eighth node,
    ``plan``, starts the turn: it runs multi-source plans in dependency waves and sends every other question
    to ``decide`` (see :mod:`ragloop.nodes.plan`).

    A ``fallback_answerer`` that can also compose a reply without I/O (the offline one: an
    :class:`~ragloop.nodes.answer.Extractive`) ends a reply the deadline cut short (``Answer.salvage``).
    A ``verifier`` checks every finished reply (:func:`ragloop.nodes.answer.verify_reply`). An answerer (or
    fallback answerer) that can also say when the passages do not support an answer (the offline one: an
    :class:`~ragloop.nodes.answer.Abstainer`) makes the turn abstain before it answers
    (:func:`ragloop.nodes.answer.abstain`).

    With ``caches`` (:class:`~ragloop.caches.Caches`) the grader, the rewrite check's embedder and, when the
    index's version is known (``index_version``, or a ``version`` attribute of the retriever), the retriever
    remember their answers across turns (see :mod:`ragloop.caches`).
    """
    s = settings
    if caches is not None:
        version = index_version or _version_of(retriever)
        if caches.retrieval is not None and version is not None:
            retriever = CachedRetriever(retriever, caches.retrieval, version)
        if caches.grades is not None:
            grader = CachedGrader(grader, caches.grades)
        if caches.embeddings is not None and embedder is not None:
            embedder = CachedEmbedder(embedder, caches.embeddings)
    policy = s.policy(live_sources=live_sources, hops=bridger is not None)
    nodes: dict[str, Node] = {}
    if planner is not None:  # the retrieval planner goes first; questions it does not plan go on to decide
        nodes["plan"] = PlanNode(
            planner,
            dict(plan_sources or {}),
            fallback=fallback_planner,
            max_subqueries=s.max_subqueries,
            timeout_s=s.plan_timeout_s,
            max_concurrency=s.plan_concurrency,
        )
    return nodes | {
        "decide": Decide(decider, max_queries=s.max_queries, fallback=fallback_decider),
        "retrieve": Retrieve(
            retriever,
            k=s.k,
            per_query_budget=s.per_query_budget,
            total_budget=s.total_budget,
            timeout_s=s.retrieve_timeout_s,
            max_concurrency=s.retrieve_concurrency,
            fast_path_confidence=s.fast_path_confidence,
            fast_path_min_hits=s.fast_path_min_hits,
        ),
        "grade": Grade(
            grader,
            policy=policy,
            min_relevant=s.min_relevant,
            timeout_s=s.grade_timeout_s,
            max_concurrency=s.grade_concurrency,
            per_passage=s.per_passage_grading,
        ),
        "hop": Hop(bridger, policy=policy, timeout_s=s.hop_timeout_s),
        "live": Live(live_sources, policy=policy, timeout_s=s.live_timeout_s),
        "rewrite": Rewrite(
            rewriter,
            policy=policy,
            overlap_threshold=s.overlap_threshold,
            cosine_threshold=s.cosine_threshold,
            timeout_s=s.rewrite_timeout_s,
            embedder=embedder,
        ),
        "answer": Answer(
            answerer,
            max_blocks=s.max_blocks,
            fallback=fallback_answerer,
            extractive=fallback_answerer if isinstance(fallback_answerer, Extractive) else None,
            verifier=verifier,
            abstainer=_abstainer(answerer, fallback_answerer),
            budget=s.prompt_budget,
        ),
    }


def _abstainer(*answerers: Answerer | None) -> Abstainer | None:
    """The first answerer that can also say when the passages do not support an answer."""
    for answerer in answerers:
        if isinstance(answerer, Abstainer):
            return answerer
    return None


def _version_of(retriever: Retriever) -> Callable[[], str] | None:
    """A reader of the retriever's ``version`` attribute (an index or a store), or ``None`` without one."""
    if not isinstance(getattr(retriever, "version", None), str):
        return None
    return lambda: str(getattr(retriever, "version", ""))


def build_graph(nodes: Mapping[str, Node], settings: TurnSettings = TurnSettings()) -> Graph:
    """The default chat-turn graph over ``nodes`` (see :func:`default_nodes`).

    Its ``summarize`` hook is :func:`turn_record`: the runner builds the decision record once per run, logs it
    as the ``turn.finished`` event and keeps it as ``RunResult.record`` (which ``Reply.record`` is).
    """
    planned = "plan" in nodes
    return Graph(
        nodes,
        start="plan" if planned else "decide",
        finish="answer",
        max_steps=settings.max_steps + (1 if planned else 0),  # the plan step precedes the longest regular turn
        summarize=functools.partial(turn_record, prices=settings.prices) if settings.prices else turn_record,
        context=lambda state: metering(state.usage),
    )


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
    """

    judge: str
    model: str
    seconds: float
    error: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@frozen
class TokenCounts:
    """Tokens the turn's model calls used.

    Attributes:
        prompt: Prompt tokens.
        completion: Completion tokens.
        total: Both.
    """

    prompt: int
    completion: int
    total: int


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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (nested records as dicts, tuples as lists)."""
        return attrs.asdict(self)


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
        tokens=TokenCounts(prompt, completion, prompt + completion),
        calls=tuple(
            CallRecord(c.judge, c.model, round(c.seconds, 6), _redacted(c.error), c.prompt_tokens, c.completion_tokens)
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
    )
