"""TurnState: the one mutable object a turn shares between its nodes."""

from __future__ import annotations

from collections.abc import Mapping

from attrs import define, field

from ragloop.plan import PlanRun
from ragloop.state._records import (
    Abstention,
    Citation,
    HopAttempt,
    LiveLookup,
    PromptCuts,
    RewriteAttempt,
    StaleSource,
    Verification,
)
from ragloop.state._values import (
    Caller,
    ContextBlock,
    Decision,
    Graded,
    Hit,
    Message,
    Outcome,
    PageContext,
    QueryState,
)
from ragloop.usage import UsageMeter

__all__ = ["TurnState"]


@define
class TurnState:
    """The shared state of one chat turn; each field names the node that writes it.

    Attributes:
        question: The user's question (caller).
        history: Earlier messages of the conversation (caller).
        page: Page the user asks from (caller).
        filters: Metadata filters every search of the turn applies: key → allowed values (caller).
        caller: Who asks; every live lookup receives it (caller).
        decision: decide's choice (decide).
        plan: The retrieval plan, its waves and each sub-query's fate, when the turn planned (plan).
        queries: Every query of the turn, by text, in the order they were made (decide, rewrite).
        pending: Queries the next retrieve must run (decide, rewrite; retrieve clears it).
        shown: Chunk ids already retrieved this turn; the thrash guard (retrieve).
        searches: Every search's hits as the retriever ranked them, by query, before the merge and the
            thrash guard; the answer's final ranking fuses them (retrieve).
        fast_path: True when retrieve skipped grading (retrieve).
        graded: Every graded hit, per query (grade, live); a grader failure is a verdict with ``fail_open``.
        live: Every live-source lookup (live).
        rewrites: Every rewrite attempt (rewrite).
        hops: Every follow-up hop attempt (hop).
        verification: What the verify step found in the reply, when it ran (answer).
        ranked: The turn's passages in the order its ranker gave them, best first; the blocks are the graded
            ones in this order (answer, through the turn's :class:`~ragloop.retrievers.ranking.Ranker`).
        prompt_cuts: What the answer prompt's token budget left out, when a budget is set (answer).
        abstention: Why the answer step abstained on passages the search found, when it did (answer).
        stale: Cited pages past their ``valid_until`` or older than the configured age (answer).
        outcome: How the turn ended up (answer).
        missing: Queries left unanswered, for a partial or none outcome (answer).
        blocks: The numbered context handed to the answerer (answer).
        cited: Block numbers in the order the reply first cited them, which gives the citation numbers a client
            sees: one per page, in that order (answer).
        answer: The reply text; while answer streams, the text sent so far (answer).
        citations: The ``[n]`` references of the reply, resolved, one per page (answer).
        errors: ``node: error`` notes of failures nodes absorbed (any node).
        usage: The judge calls of the turn (every judge, through :func:`ragloop.usage.record_call`).
    """

    question: str
    history: tuple[Message, ...] = ()
    page: PageContext = field(factory=PageContext)
    filters: Mapping[str, tuple[str, ...]] = field(factory=dict)
    caller: Caller | None = None
    decision: Decision | None = None
    plan: PlanRun | None = None
    queries: dict[str, QueryState] = field(factory=dict)
    pending: list[str] = field(factory=list)
    shown: set[str] = field(factory=set)
    searches: dict[str, list[Hit]] = field(factory=dict)
    fast_path: bool = False
    graded: list[Graded] = field(factory=list)
    live: list[LiveLookup] = field(factory=list)
    rewrites: list[RewriteAttempt] = field(factory=list)
    hops: list[HopAttempt] = field(factory=list)
    verification: Verification | None = None
    ranked: tuple[Hit, ...] | None = None
    prompt_cuts: PromptCuts | None = None
    abstention: Abstention | None = None
    stale: tuple[StaleSource, ...] = ()
    outcome: Outcome | None = None
    missing: tuple[str, ...] = ()
    blocks: tuple[ContextBlock, ...] = ()
    cited: list[int] = field(factory=list)
    answer: str = ""
    citations: tuple[Citation, ...] = ()
    errors: list[str] = field(factory=list)
    usage: UsageMeter = field(factory=UsageMeter)

    def roots(self) -> list[str]:
        """decide's queries, in order."""
        return [q.text for q in self.queries.values() if q.attempt == 0 and not q.hop]

    def lineage(self, root: str) -> list[QueryState]:
        """A root query and its rewrites, in order."""
        return [q for q in self.queries.values() if q.root == root]
