"""hop: one more search when every query found something but the question is not covered yet (multi-hop)."""

from __future__ import annotations

import anyio
from attrs import define, field

from ragloop._log import get_logger
from ragloop.errors import error_text
from ragloop.events import Progress
from ragloop.llm.protocols import Bridger
from ragloop.policy import EDGES, HOP, RoutingPolicy, next_step
from ragloop.runner import emit
from ragloop.state import HopAttempt, QueryState, TurnState

__all__ = ["Hop"]

log = get_logger("ragloop.nodes.hop")


@define
class Hop:
    """Asks the bridger for a follow-up query built from the relevant passages found so far.

    The follow-up joins the first decide query's lineage as a ``hop`` query: its hits add context, and
    coming up empty never makes the turn's outcome worse.

    Attributes:
        bridger: The judge; ``None`` disables hops (the node routes straight to answer).
        policy: Where the turn goes next (:func:`ragloop.policy.next_step`).
        timeout_s: Time limit for the bridger.
    """

    bridger: Bridger | None
    policy: RoutingPolicy = field(kw_only=True)
    timeout_s: float = field(kw_only=True)
    routes: tuple[str, ...] = field(default=EDGES[HOP], init=False)

    async def __call__(self, state: TurnState) -> str:
        roots = state.roots()
        if self.bridger is None or not roots:
            return next_step(state, self.policy, after=HOP)
        found = [g.hit.text for g in state.graded if g.verdict.label == "relevant"]
        failure = None
        try:
            with anyio.fail_after(self.timeout_s):
                query = await self.bridger.follow_up(state.question, found, list(state.queries))
        except Exception as exc:  # noqa: BLE001 — fail-open: a failed hop only means no extra context
            query, failure = None, f"bridger failed: {error_text(exc)}"
        query = " ".join(query.split()) if query else None
        accepted = bool(query) and query not in state.queries
        reason = failure or ("follow-up from the relevant passages" if accepted else "no follow-up needed")
        state.hops.append(HopAttempt(query, len(found), accepted, reason))
        if not accepted or query is None:
            return next_step(state, self.policy, after=HOP)
        log.info("hop.follow_up", query=query)
        state.queries[query] = QueryState(text=query, root=roots[0], attempt=0, hop=True)
        state.pending = [query]
        await emit(Progress(node="hop", kind="hop", message=f"following up: {query}", data={"query": query}))
        return next_step(state, self.policy, after=HOP)
