"""The extension contract: what your node, retriever, embedder, source or judge must be, in one place.

Everything here is a :class:`typing.Protocol` (nothing to inherit) or a value that flows through a turn. You
implement one, hand it to the turn's builder (:class:`ragloop.turn.Turn`) and build; ``docs/extending.md``
walks through a ranker, a joined second retriever and a live source of your own on the sample knowledge base.

**Node** (:class:`Node`): ``async def __call__(self, state: TurnState) -> str`` and a ``routes`` tuple.

- Return one of ``routes``: the name of the node that should run next, or :data:`END` (only the finish node,
  ``answer``, returns it). ``routes`` are *names*, not places: where each leads is the graph's business
  (``Turn.insert_after`` rewires them), so return the names of :data:`ragloop.policy.EDGES` and
  ``ragloop.policy``'s constants, never a name of your own invention. A name you did not declare is a
  :class:`~ragloop.errors.RouteError`.
- Read the state; write only what your node owns (each :class:`TurnState` field's docstring names its writer).
- Raise to fail: the runner records the error, and the turn goes to its finish node, which still answers. Catch
  the failures your node can absorb (one query of many) and note them in ``state.errors``.
- Be cancellable: the turn's deadline cancels a running node (anyio cancel scopes); use ``anyio`` primitives
  and task groups, and let ``Cancelled`` propagate. Blocking work goes to ``anyio.to_thread.run_sync``.
- Progress for users goes through ``await ragloop.emit(Progress(...))`` (a no-op unless the turn is streamed).

**Retriever** (:class:`Retriever`): ``async def search(query, k=10, filters=None) -> Sequence[Hit]``, at most
``k`` hits, best first, each with a ``confidence`` in [0, 1] (the fast path and the graders threshold it), among
chunks whose metadata matches ``filters`` (key → allowed values). Raise on failure: the retrieve node gives
each query its own time limit and records a failed query without cancelling the others.

**Embedder** (:class:`Embedder`): a stable ``name``, a ``dim``, and ``async def embed(texts)`` returning an
``(n, dim)`` float32 array of unit rows.

**Live source** (:class:`LiveSource`): a system of record looked up by exact id: ``name``,
``signals(query) -> ids`` (empty: not triggered), ``async lookup(query, ids, *, caller=None) -> records``
(:class:`LiveRecord`; the live node rejects records whose id was not asked for) and ``async aclose()``.
``Turn.add_source`` adds one.

**Ranker** (:class:`Ranker`): ``async def rank(candidates) -> Sequence[Hit]``: the turn's searches and grades
(:class:`Candidates`) in, its passages best first out. The answer numbers and cites the graded ones **in that
order** (it orders nothing itself); ``Turn.ranker(...)`` sets one. :class:`FusionRanker` is the default (rank
fusion of every search, grades as a factor, a feature rerank of the head): wrap it to reorder its result. A
ranker that raises or overruns ``TurnSettings.rank_timeout_s`` is replaced by the default for that turn, the
fault recorded in ``state.errors``.

**Several retrievers**: :class:`JoinedRetriever` searches named retrievers at once and joins their lists
(reciprocal-rank fusion by default, with weights; each hit keeps ``ranks[name]``); ``Turn.add_retriever(name,
retriever, weight=…)`` joins one to the turn's own search.

**Plan source** (:class:`Source`): what a retrieval plan's sub-query runs against: ``name``, ``description`` (what
a planner reads) and ``async run(query, filters) -> SourceResult``; raise :class:`~ragloop.errors.SourceError`.
:class:`DocumentSource` makes one of a retriever. ``Turn.add_source`` adds one; the first puts the plan node at
the start of the turn.

**Judges**: :class:`Decider`, :class:`Grader` (and :class:`BatchGrader`), :class:`Rewriter`, :class:`Bridger`,
:class:`Answerer`, :class:`Verifier` and :class:`Planner` judge and nothing else: the nodes own concurrency,
time limits, fail-open and provenance. Raise :class:`~ragloop.errors.JudgeError` (or a subclass) on failure; the
node decides what it means (a grade fails open, a failed decide falls back). Bundle them in
:class:`ragloop.turn.Judges`.

**Values**: :class:`TurnState` (the one mutable state of a turn), :class:`Hit` and :class:`Chunk` (what a
retriever returns), :class:`Verdict`, :class:`Decision`, :class:`ContextBlock`, :class:`Message`,
:class:`PageContext` and :class:`Caller` (frozen attrs values: make new ones with ``attrs.evolve``).
"""

from __future__ import annotations

from ragloop.events import Progress
from ragloop.llm.planner import Planner
from ragloop.llm.protocols import Answerer, BatchGrader, Bridger, Decider, Grader, Rewriter
from ragloop.nodes.answer import Verifier
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.join import JoinedRetriever
from ragloop.retrievers.live import LiveRecord, LiveSource
from ragloop.retrievers.ranking import Candidates, FusionRanker, Ranker
from ragloop.retrievers.sources import DocumentSource, Source, SourceResult
from ragloop.runner import END, Node, emit
from ragloop.state import Caller, Chunk, ContextBlock, Decision, Hit, Message, PageContext, TurnState, Verdict

__all__ = [
    "END",
    "Answerer",
    "BatchGrader",
    "Bridger",
    "Caller",
    "Candidates",
    "Chunk",
    "ContextBlock",
    "Decider",
    "Decision",
    "DocumentSource",
    "Embedder",
    "FusionRanker",
    "Grader",
    "Hit",
    "JoinedRetriever",
    "LiveRecord",
    "LiveSource",
    "Message",
    "Node",
    "PageContext",
    "Planner",
    "Progress",
    "Ranker",
    "Retriever",
    "Rewriter",
    "Source",
    "SourceResult",
    "TurnState",
    "Verdict",
    "Verifier",
    "emit",
]
