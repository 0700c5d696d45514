"""The answer's ranking step: the turn's ranker orders its passages once, within a time limit, failing open."""

from __future__ import annotations

import anyio

from ragloop._log import get_logger
from ragloop.retrievers.ranking import FusionRanker, Ranker, candidates_of
from ragloop.state import Hit, TurnState

__all__ = ["rank", "ranked_hits"]

log = get_logger("ragloop.nodes.answer")


def ranked_hits(state: TurnState) -> list[Hit]:
    """The turn's ranked passages, best first: what the turn's ranker returned (``state.ranked``), or, before it
    ran (a state built by hand, a turn cut short), the default ranking
    (:class:`~ragloop.retrievers.ranking.FusionRanker`) of the recorded searches."""
    if state.ranked is not None:
        return list(state.ranked)
    return FusionRanker().order(candidates_of(state)) if state.searches else []


async def rank(state: TurnState, ranker: Ranker, default: FusionRanker, timeout_s: float) -> None:
    """Set ``state.ranked``: the ranker's order of the turn's searches and grades (nothing without searches).

    ``default`` runs in place, without a thread or a time limit (it is pure and fast). Any other ranker gets
    ``timeout_s``, or half of what is left of the turn's deadline when that is less (the reply still needs the
    rest); when it fails, overruns or returns something that is not a list of hits, the turn uses ``default``'s
    order and the fault goes to ``state.errors`` (fail-open: a reply is never lost to its ranker).
    """
    if not state.searches:
        state.ranked = None
        return
    candidates = candidates_of(state)
    if ranker is default:
        state.ranked = tuple(default.order(candidates))
        return
    name = type(ranker).__name__
    limit = min(timeout_s, max((anyio.current_effective_deadline() - anyio.current_time()) / 2, 0.0))
    try:
        with anyio.move_on_after(limit) as scope:
            ranked = await ranker.rank(candidates)
        if scope.cancelled_caught:
            raise TimeoutError(f"no ranking within {limit:.2f} s")
        items = () if isinstance(ranked, str | bytes) else tuple(ranked)  # a generator is read once, here
        if (not items and ranked) or not all(isinstance(h, Hit) for h in items):
            raise TypeError(f"rank() must return a sequence of Hit, got {type(ranked).__name__}")
        state.ranked = items
    except Exception as exc:  # noqa: BLE001 — fail-open: the default ranking orders this turn's context
        state.errors.append(f"answer: ranker {name}: {type(exc).__name__}: {exc}; the default ranking was used")
        log.warning("answer.ranker_failed", ranker=name, error=str(exc))
        state.ranked = tuple(default.order(candidates))
