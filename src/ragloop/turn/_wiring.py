"""The default turn's nodes (:func:`default_nodes`) and graph (:func:`build_graph`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from ragloop.freshness import Freshness
from ragloop.llm.cached import CachedGrader
from ragloop.llm.protocols import Answerer
from ragloop.nodes.answer import Abstainer, Answer, Extractive
from ragloop.nodes.decide import Decide
from ragloop.nodes.grade import Grade
from ragloop.nodes.hop import Hop
from ragloop.nodes.live import Live
from ragloop.nodes.plan import PlanNode
from ragloop.nodes.retrieve import Retrieve
from ragloop.nodes.rewrite import Rewrite
from ragloop.policy import ANSWER, DECIDE, PLAN
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.cached import CachedEmbedder, CachedRetriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.ranking import FusionRanker, Ranker
from ragloop.retrievers.scope import turn_scope
from ragloop.retrievers.sources import Source
from ragloop.runner import Graph, Node
from ragloop.state import TurnState
from ragloop.turn._judges import Judges
from ragloop.turn._record import turn_record
from ragloop.turn._settings import TurnSettings
from ragloop.usage import metering

if TYPE_CHECKING:
    from ragloop.caches import Caches

__all__ = ["build_graph", "default_nodes"]


def default_nodes(  # noqa: PLR0913 — the turn's collaborators, by keyword after the two it needs
    retriever: Retriever,
    judges: Judges,
    *,
    settings: TurnSettings = TurnSettings(),
    live_sources: Sequence[LiveSource] = (),
    embedder: Embedder | None = None,
    plan_sources: Mapping[str, Source] | None = None,
    caches: Caches | None = None,
    index_version: Callable[[], str] | None = None,
    ranker: Ranker | None = None,
) -> dict[str, Node]:
    """The seven nodes of the default turn over ``retriever``, judged by ``judges`` (no bridger: no hops).

    The one place :class:`~ragloop.turn.TurnSettings` meets the nodes' constructors (the settings hold the
    defaults; the nodes take them as arguments). With a ``judges.planner`` (and the ``plan_sources`` it plans
    over, the document source included), an eighth node, ``plan``, starts the turn: it runs multi-source plans in
    dependency waves and sends every other question to ``decide`` (see :mod:`ragloop.nodes.plan`).

    A ``judges.fallback_answerer`` that can also compose a reply without I/O (the offline one: an
    :class:`~ragloop.nodes.answer.Extractive`) ends a reply the deadline cut short (``Answer.salvage``).
    A ``ranker`` orders the passages the answer numbers and cites (default: the built-in ranking of
    ``settings.fusion`` and ``settings.rerank``). A ``judges.verifier`` checks every finished reply
    (:func:`ragloop.nodes.answer.verify_reply`). An answerer (or fallback answerer) that can also say when the
    passages do not support an answer (the offline one: an :class:`~ragloop.nodes.answer.Abstainer`) makes the
    turn abstain before it answers (:func:`ragloop.nodes.answer.abstain`).

    Args:
        retriever: Where the turn searches.
        judges: The turn's judges, their fallbacks, its bridger, verifier and planners.
        settings: The turn's knobs.
        live_sources: Live sources for the live node (they shape the routing policy too).
        embedder: The query embedder, for semantic near-duplicate checks of rewrites.
        plan_sources: The plan node's sources by name, the document source included (with a planner).
        caches: With caches (:class:`~ragloop.caches.Caches`) the grader, the rewrite check's embedder and,
            when the index's version is known (``index_version``, or a ``version`` attribute of the retriever),
            the retriever remember their answers across turns (see :mod:`ragloop.caches`).
        index_version: The index's current version, which cached search results are keyed on.
        ranker: Orders the turn's passages for the answer (:class:`~ragloop.retrievers.ranking.Ranker`).
    """
    s, grader, bridger, planner = settings, judges.grader, judges.bridger, judges.planner
    fallback_answerer = judges.fallback_answerer
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
            fallback=judges.fallback_planner,
            max_subqueries=s.max_subqueries,
            timeout_s=s.plan_timeout_s,
            max_concurrency=s.plan_concurrency,
        )
    return nodes | {
        "decide": Decide(judges.decider, max_queries=s.max_queries, fallback=judges.fallback_decider),
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
            judges.rewriter,
            policy=policy,
            overlap_threshold=s.overlap_threshold,
            cosine_threshold=s.cosine_threshold,
            timeout_s=s.rewrite_timeout_s,
            embedder=embedder,
        ),
        "answer": Answer(
            judges.answerer,
            max_blocks=s.max_blocks,
            fallback=fallback_answerer,
            extractive=fallback_answerer if isinstance(fallback_answerer, Extractive) else None,
            verifier=judges.verifier,
            abstainer=_abstainer(judges.answerer, fallback_answerer),
            budget=s.prompt_budget,
            freshness=Freshness(max_age_days=s.stale_after_days),
            ranker=ranker,
            default_ranking=FusionRanker(s.fusion, s.rerank),
            rank_timeout_s=s.rank_timeout_s,
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


@contextlib.contextmanager
def turn_context(state: TurnState) -> Iterator[None]:
    """What every run of a turn graph runs inside: the turn's usage meter and its scope (its filters, which the
    scoped judges of :mod:`ragloop.llm.scoped` know the corpus by)."""
    with metering(state.usage), turn_scope(state.filters):
        yield


def build_graph(
    nodes: Mapping[str, Node],
    settings: TurnSettings = TurnSettings(),
    *,
    edges: Mapping[str, Mapping[str, str]] | None = None,
    extra_steps: int = 0,
) -> Graph:
    """The default chat-turn graph over ``nodes`` (see :func:`default_nodes`).

    Its ``summarize`` hook is :func:`turn_record`: the runner builds the decision record once per run, logs it
    as the ``turn.finished`` event and keeps it as ``RunResult.record`` (which ``Reply.record`` is).

    Args:
        nodes: The turn's nodes; with a ``plan`` node the turn starts there, otherwise at ``decide``.
        settings: Turn settings (the step cap, the price table).
        edges: Routes that lead elsewhere than the node of their name (see :class:`~ragloop.runner.Graph`).
        extra_steps: Steps added to the cap for nodes the default turn does not have (``Turn.insert_after``).
    """
    planned = PLAN in nodes
    return Graph(
        nodes,
        start=PLAN if planned else DECIDE,
        finish=ANSWER,
        edges=edges,
        # the plan step precedes the longest regular turn
        max_steps=settings.max_steps + (1 if planned else 0) + extra_steps,
        summarize=functools.partial(turn_record, prices=settings.prices) if settings.prices else turn_record,
        context=turn_context,
    )
