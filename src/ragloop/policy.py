"""The chat turn's routing policy: one pure function decides what follows grade, live, rewrite and hop.

The nodes do the work (grading, lookups, rewrites, hops) and then ask :func:`next_step` where the turn goes;
none of them routes on its own. The rules, in one place:

- a query is *short* (:func:`is_short`) when it was graded short or its search failed, and it is not a
  follow-up hop query (a hop only adds context, so its coming up empty never sends the turn anywhere);
- after **grade**: nothing short → ``hop`` while hops are left, else ``answer``; a short query carrying a live
  source's signal that was not looked up yet → ``live``; a short query with rewrites left → ``rewrite``;
  otherwise ``answer``;
- after **live**: the same, without ``live`` or ``hop`` (a turn that needed a system of record is answered);
- after **rewrite** and **hop**: ``retrieve`` when they queued a query, else ``answer``.

Every step either ends the turn or uses up something finite (a rewrite attempt, a hop, a query's live
lookup), so a turn always reaches ``answer``; ``tests/test_policy.py`` checks both properties with hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, Literal

from attrs import field, frozen, validators

from ragloop.runner import END
from ragloop.state import QueryState, TurnState

__all__ = [
    "ANSWER",
    "DECIDE",
    "EDGES",
    "GRADE",
    "HOP",
    "LIVE",
    "PLAN",
    "RETRIEVE",
    "REWRITE",
    "ROUTES",
    "After",
    "RoutingPolicy",
    "can_rewrite",
    "is_short",
    "most_runs",
    "next_step",
    "short_queries",
    "wants_live",
]

#: The default turn's node names (what its nodes return, and what the policy routes to): the ``plan`` node's.
PLAN: Final = "plan"
#: The ``decide`` node's name.
DECIDE: Final = "decide"
#: The ``retrieve`` node's name.
RETRIEVE: Final = "retrieve"
#: The ``grade`` node's name.
GRADE: Final = "grade"
#: The ``live`` node's name.
LIVE: Final = "live"
#: The ``rewrite`` node's name.
REWRITE: Final = "rewrite"
#: The ``hop`` node's name.
HOP: Final = "hop"
#: The ``answer`` node's name.
ANSWER: Final = "answer"

#: The default turn's edges, the one place they are written: each node → the routes it may return, each
#: leading to the node of that name (``plan`` only in a turn that plans). Every default node's ``routes`` is its
#: entry here (``tests/test_policy.py`` checks); :class:`ragloop.turn.Turn` rewires a copy when a node is
#: inserted, so the names below, the ones the nodes and :func:`next_step` return, never change.
EDGES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        PLAN: (DECIDE, RETRIEVE, GRADE, ANSWER),
        DECIDE: (RETRIEVE, ANSWER),
        RETRIEVE: (GRADE, ANSWER),  # answer: the fast path (one query, all hits confident) skips grading
        GRADE: (LIVE, REWRITE, HOP, ANSWER),
        LIVE: (REWRITE, ANSWER),
        REWRITE: (RETRIEVE, ANSWER),
        HOP: (RETRIEVE, ANSWER),
        ANSWER: (END,),
    }
)

#: The nodes that route through the policy.
After = Literal["grade", "live", "rewrite", "hop"]

#: Where each of them may send the turn: their entries of :data:`EDGES`.
ROUTES: Mapping[After, tuple[str, ...]] = {after: EDGES[after] for after in (GRADE, LIVE, REWRITE, HOP)}


@frozen
class RoutingPolicy:
    """The limits routing needs, built once per turn graph (see ``TurnSettings.policy``).

    Attributes:
        max_attempts: Rewrites per decide query before it is given up as ``no_context``.
        max_hops: Follow-up (second-hop) searches per turn; 0 when there is no bridger.
        live_signal: Whether a query's text carries the signal of some live source (a ticket id …);
            ``None`` when the turn has no live sources.
    """

    max_attempts: int = field(validator=validators.ge(0))
    max_hops: int = field(validator=validators.ge(0))
    live_signal: Callable[[str], bool] | None = field(default=None, eq=False)

    @property
    def has_live(self) -> bool:
        """Whether the turn has live sources at all."""
        return self.live_signal is not None


def is_short(query: QueryState) -> bool:
    """A query that still needs context: graded short or failed, and not a follow-up hop query."""
    return query.status in ("short", "failed") and not query.hop


def short_queries(state: TurnState) -> list[QueryState]:
    """The turn's short queries, in the order they were made."""
    return [q for q in state.queries.values() if is_short(q)]


def can_rewrite(query: QueryState, policy: RoutingPolicy) -> bool:
    """Whether a short query has rewrite attempts left."""
    return query.attempt < policy.max_attempts


def wants_live(query: QueryState, policy: RoutingPolicy) -> bool:
    """Whether a short query should be looked up in the live sources (it carries a signal, never tried)."""
    return policy.live_signal is not None and not query.live_tried and policy.live_signal(query.text)


def next_step(state: TurnState, policy: RoutingPolicy, *, after: After) -> str:
    """The node that follows ``after``, from the turn state alone; always one of ``ROUTES[after]``."""
    if after in (REWRITE, HOP):
        return RETRIEVE if state.pending else ANSWER
    short = short_queries(state)
    if not short:
        return HOP if after == GRADE and len(state.hops) < policy.max_hops else ANSWER
    if after == GRADE and any(wants_live(q, policy) for q in short):
        return LIVE
    if any(can_rewrite(q, policy) for q in short):
        return REWRITE
    return ANSWER


def most_runs(node: str, policy: RoutingPolicy) -> int:
    """How often one turn of the default graph runs ``node`` at most.

    Plan, decide and answer run once. Every rewrite round and every hop sends the turn through retrieve and grade
    once more, and a rewrite round raises the attempt count of every short query, so there are at most
    ``max_attempts`` of them; live runs at most once per round that leaves a query short (hop rounds leave none).
    A builder that inserts a node after another raises the step cap by this much (:class:`ragloop.turn.Turn`).
    """
    rounds = 1 + policy.max_attempts + policy.max_hops
    runs = {RETRIEVE: rounds, GRADE: rounds, LIVE: 1 + policy.max_attempts, REWRITE: policy.max_attempts}
    return runs.get(node, policy.max_hops if node == HOP else 1)
