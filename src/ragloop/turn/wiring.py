"""The default turn's nodes (:func:`default_nodes`) and graph (:func:`build_graph`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from ragloop.caches import Caches
from ragloop.llm.cached import CachedGrader
from ragloop.llm.planner import Planner
from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.nodes.answer import Answer, Extractive, Verifier
from ragloop.nodes.decide import Decide
from ragloop.nodes.grade import Grade
from ragloop.nodes.hop import Hop
from ragloop.nodes.live import Live
from ragloop.nodes.plan import PlanNode
from ragloop.nodes.retrieve import Retrieve
from ragloop.nodes.rewrite import Rewrite
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.cached import CachedEmbedder, CachedRetriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.sources import Source
from ragloop.runner import Graph, Node
from ragloop.turn.record import turn_record
from ragloop.turn.settings import TurnSettings
from ragloop.usage import metering

__all__ = ["build_graph", "default_nodes"]


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
    A ``verifier`` checks every finished reply (:func:`ragloop.nodes.answer.verify_reply`).

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
            budget=s.prompt_budget,
        ),
    }


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
