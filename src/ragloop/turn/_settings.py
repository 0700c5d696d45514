"""The knobs of the default chat turn (:class:`TurnSettings`) and the routing policy they make."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
from attrs import frozen

from ragloop.errors import InputError
from ragloop.policy import RoutingPolicy
from ragloop.prompt_budget import PromptBudget
from ragloop.retrievers.fusion import FusionSettings
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.rerank import RerankSettings
from ragloop.usage import Price

__all__ = ["TurnSettings", "turn_deadline"]


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
        fusion: How the default ranker fuses the turn's searches and weighs the grades
            (:class:`~ragloop.retrievers.fusion.FusionSettings`).
        rerank: How the default ranker reorders the fused head by passage features
            (:class:`~ragloop.retrievers.rerank.RerankSettings`; zero weights keep the fused order).
        rank_timeout_s: Time limit of a ranker of your own (``Turn.ranker``; at most half the time left in the
            turn); past it, or when it fails, the default ranking is used and the fault recorded.
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
        stale_after_days: A cited page whose ``updated`` metadata is older than this counts as stale, as one past
            its ``valid_until`` always does; the reply says so (:mod:`ragloop.freshness`). ``None``: age alone
            never makes a page stale.
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
    fusion: FusionSettings = attrs.field(factory=FusionSettings)
    rerank: RerankSettings = attrs.field(factory=RerankSettings)
    rank_timeout_s: float = 10.0
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
    stale_after_days: float | None = None

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


def turn_deadline(settings: TurnSettings, deadline_s: float | None) -> float | None:
    """A turn's deadline in seconds: the caller's, else the settings' (``None``: no deadline).

    Raises:
        InputError: Not a positive, finite number of seconds (``True`` is not a 1 s deadline).
    """
    value = settings.deadline_s if deadline_s is None else deadline_s
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if value is not None and not (number and math.isfinite(value) and value > 0):
        raise InputError(f"deadline_s must be a positive number of seconds, got {value!r}")
    return value
