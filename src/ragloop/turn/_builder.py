"""The one place a chat turn is assembled: the :class:`Turn` builder and the :class:`BuiltTurn` it makes.

A builder knows the default turn's nodes and edges (``ragloop.policy.EDGES``). Change it, then build once::

    turn = Turn.from_index("kb-index/")                       # or Turn(retriever, Judges.offline(texts))
    turn.ranker(MyRanker())                                   # orders what the answer cites
    turn.replace("grade", MyGrader())                         # same name, same edges
    turn.add_source(MyTicketSystem())                         # a live source (or a plan source)
    rag = ChatRAG(turn.build())

:meth:`Turn.build` validates everything once and returns an immutable :class:`~ragloop.runner.Graph` inside a
:class:`BuiltTurn`; changing the builder afterwards does not change what was built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from attrs import evolve, frozen

from ragloop.errors import ConfigError
from ragloop.policy import EDGES, RoutingPolicy, most_runs
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.ranking import Ranker
from ragloop.retrievers.scope import Corpus
from ragloop.retrievers.sources import Source
from ragloop.runner import Graph, Node
from ragloop.turn._edits import check_plan_routes, insert_node, plan_table, replace_node
from ragloop.turn._judges import Judges
from ragloop.turn._options import IndexOptions, RetrieverOptions, StoreOptions, TurnWiring, check_options, wiring_judges
from ragloop.turn._settings import TurnSettings
from ragloop.turn._wiring import build_graph, default_nodes

if TYPE_CHECKING:
    import openai

    from ragloop.caches import Caches
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.postgres import PostgresStore

__all__ = ["BuiltTurn", "Turn"]


@frozen
class BuiltTurn:
    """A validated turn: its immutable graph and what a chat needs to run it (what :meth:`Turn.build` returns).

    Attributes:
        graph: The turn's graph (start ``plan`` or ``decide``, finish ``answer``).
        settings: The turn's settings (deadline, limits).
        live_sources: The live sources its live node consults (a chat closes them).
        caches: The caches its nodes use (a chat keeps whole replies in ``caches.replies``).
        index_version: The index's current version (what cached searches and replies are keyed on).
        offline: True when no judge calls a model.
        store: The Postgres store :meth:`Turn.from_store` opened (a chat closes it).
        retriever: The retriever the turn searches, as given (before any cache): a chat checks the filter keys
            of a question against the metadata keys it knows.
        embedder: The query embedder the turn was given (the index's, for :meth:`Turn.from_index`), if any: a
            turn log can embed questions with it.
    """

    graph: Graph
    settings: TurnSettings
    live_sources: tuple[LiveSource, ...]
    caches: Caches | None
    index_version: Callable[[], str]
    offline: bool
    store: PostgresStore | None = None
    retriever: Retriever | None = None
    embedder: Embedder | None = None

    @property
    def nodes(self) -> Mapping[str, Node]:
        """The graph's nodes by name (read-only)."""
        return self.graph.nodes


class Turn:
    """Builds the default chat turn from a retriever and its judges, lets you change it, and validates it once.

    Args:
        retriever: Where the turn searches.
        judges: Its judges (:meth:`Judges.offline`, :meth:`Judges.openai`, or your own).
        settings: Its settings.
        embedder: The query embedder (semantic checks of rewrites and of the reply's support).
        caches: Caches for query embeddings, search results and grades (:class:`~ragloop.caches.Caches`).
        index_version: The index's current version; default: the retriever's ``version`` attribute.
        ranker: Orders the passages the answer cites (:meth:`ranker`); default: the built-in ranking.
    """

    def __init__(
        self,
        retriever: Retriever,
        judges: Judges,
        *,
        settings: TurnSettings = TurnSettings(),
        embedder: Embedder | None = None,
        caches: Caches | None = None,
        index_version: Callable[[], str] | None = None,
        ranker: Ranker | None = None,
    ) -> None:
        self.retriever, self.judges, self.settings = retriever, judges, settings
        self.embedder, self.caches, self.index_version = embedder, caches, index_version
        self._base, self._joined, self._base_version = retriever, dict[str, tuple[Retriever, float]](), index_version
        self._ranker: Ranker | None = None
        if ranker is not None:
            self.ranker(ranker)
        self._live: list[LiveSource] = []
        self._plan: dict[str, Source] = {}
        self._plan_table: dict[str, Source] | None = None  # Turn.of's complete table, used as it is
        self._changes: list[tuple[str, str, Node]] = []  # (after, name, node) to insert; after "" to replace
        self._store: PostgresStore | None = None

    # -- opening a turn -------------------------------------------------------------------------------------

    @classmethod
    def of(cls, **wiring: Unpack[TurnWiring]) -> Turn:
        """A builder from a turn's collaborators one by one (the keywords of ``ChatRAG(...)``).

        ``plan_sources`` here is the plan node's complete table by name, used as it is; the planner is the one
        given (none: no plan node).

        Raises:
            ConfigError: A required collaborator is missing.
        """
        judges = wiring_judges(wiring)
        turn = cls(
            wiring["retriever"],
            judges,
            settings=wiring.get("settings", TurnSettings()),
            embedder=wiring.get("embedder"),
            caches=wiring.get("caches"),
            index_version=wiring.get("index_version"),
            ranker=wiring.get("ranker"),
        )
        turn._live = list(wiring.get("live_sources", ()))
        if judges.planner is not None:
            turn._plan_table = dict(wiring.get("plan_sources") or {})
        return turn

    @classmethod
    def from_retriever(
        cls,
        retriever: Retriever,
        texts: Sequence[str] | Corpus,
        llm: openai.AsyncOpenAI | None = None,
        **options: Unpack[RetrieverOptions],
    ) -> Turn:
        """A turn over any retriever: offline judges without ``llm``, model judges (offline fallbacks) with it.

        Args:
            retriever: Where to search.
            texts: Every chunk's text: the offline judges' corpus statistics. Pass a
                :class:`~ragloop.retrievers.scope.Corpus` (texts with their metadata) when callers are scoped by
                filters (tenants): each turn's judges then know only the chunks its filters let it find.
            llm: An ``openai.AsyncOpenAI`` client; ``None`` runs the offline judges (no model, no network).
            **options: See :class:`~ragloop.turn.RetrieverOptions`.

        Raises:
            ConfigError: ``llm`` without ``fast_model``.
        """
        check_options(options, RetrieverOptions, "from_retriever")
        settings = options.get("settings", TurnSettings())
        embedder, glossary = options.get("embedder"), options.get("glossary")
        if llm is None:
            judges = Judges.offline(texts, glossary=glossary, max_queries=settings.max_queries, embedder=embedder)
        else:
            judges = Judges.openai(
                llm,
                texts,
                fast_model=options.get("fast_model"),
                answer_model=options.get("answer_model"),
                timeout_s=options.get("timeout_s", 20.0),
                glossary=glossary,
                max_queries=settings.max_queries,
            )
        turn = cls(
            retriever,
            judges,
            settings=settings,
            embedder=embedder,
            caches=options.get("caches"),
            index_version=options.get("index_version"),
            ranker=options.get("ranker"),
        )
        for live in options.get("live_sources", ()):
            turn.add_source(live)
        for plan in options.get("plan_sources", ()):
            turn.add_source(plan)
        return turn

    @classmethod
    def from_index(
        cls,
        index: str | os.PathLike[str] | KnowledgeIndex,
        llm: openai.AsyncOpenAI | None = None,
        **options: Unpack[IndexOptions],
    ) -> Turn:
        """A turn over an index directory written by ``ragloop index``, or a loaded index.

        Args:
            index: The index directory, or a :class:`~ragloop.retrievers.index.KnowledgeIndex`.
            llm: As in :meth:`from_retriever`.
            **options: See :class:`~ragloop.turn.IndexOptions`.
        """
        check_options(options, IndexOptions, "from_index")
        from ragloop.retrievers.index import KnowledgeIndex

        opts: dict[str, Any] = dict(options)
        idx = index if isinstance(index, KnowledgeIndex) else KnowledgeIndex.load(index, opts.pop("embedder", None))
        searched, caches = idx, opts.get("caches")
        if caches is not None and caches.embeddings is not None:  # the searches' query embeddings are cached too
            from ragloop.retrievers.cached import CachedEmbedder

            cached = CachedEmbedder(idx.embedder, caches.embeddings)
            searched = KnowledgeIndex(idx.chunks, idx.bm25, idx.dense, cached, weights=idx.weights, rrf_k=idx.rrf_k)
        retriever = searched.retriever(opts.pop("mode", "hybrid"))
        # the judges embed through the cache too (the answerer's sentences recur turn after turn)
        opts.update(embedder=searched.embedder, index_version=lambda: idx.version)
        return cls.from_retriever(retriever, Corpus.of(idx.chunks, idx.meaning_scales()), llm, **opts)

    @classmethod
    def from_store(cls, url: str, llm: openai.AsyncOpenAI | None = None, **options: Unpack[StoreOptions]) -> Turn:
        """A turn over a PostgreSQL collection written by ``ragloop index DIR --store URL`` (``[postgres]`` extra).

        Every replica of a service can point at the same database. The store's statement timeout is the
        turn's ``settings.retrieve_timeout_s``. This call reads the collection's texts and metadata (for the offline
        judges, per caller scope) on a connection of its own; the connection pool opens on the first search, in
        the event loop that serves, and ``ChatRAG.aclose`` closes it. With an embedder that has meaning (MiniLM),
        the offline judges measure each scope's dense threshold as over a local index
        (:mod:`ragloop.retrievers.meaning`): the whole collection's here, a scope's when its judges are built,
        each on a short-lived connection of its own that reads that scope's vectors.

        Args:
            url: ``postgresql://`` URL of a database with the ``vector`` extension.
            llm: As in :meth:`from_retriever`.
            **options: See :class:`~ragloop.turn.StoreOptions`.

        Raises:
            ConfigError: A mode other than ``hybrid``.
        """
        check_options(options, StoreOptions, "from_store")
        from ragloop.turn._store import open_store

        opts: dict[str, Any] = dict(options)
        store, corpus = open_store(url, opts)
        turn = cls.from_retriever(store, corpus, llm, embedder=store.embedder, **opts)
        turn._store = store
        return turn

    @classmethod
    def sample(
        cls,
        llm: openai.AsyncOpenAI | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[IndexOptions],
    ) -> Turn:
        """A turn over the bundled sample knowledge base and its live ticket source.

        The sample index is built on first use and cached in ``cache_dir`` (default ``~/.cache/ragloop``).

        Args:
            llm: As in :meth:`from_retriever`.
            cache_dir: Where the sample index is cached.
            **options: See :class:`~ragloop.turn.IndexOptions` (``live_sources`` defaults to the sample's
                :class:`~ragloop.retrievers.live.SQLiteTicketSource`).
        """
        from pathlib import Path

        from ragloop.retrievers.live import SQLiteTicketSource
        from ragloop.sample import sample_index

        index = sample_index(Path(cache_dir) if cache_dir is not None else None)
        options.setdefault("live_sources", (SQLiteTicketSource(),))
        return cls.from_index(index, llm, **options)

    # -- changing it ----------------------------------------------------------------------------------------

    def add_source(self, source: LiveSource | Source) -> Turn:
        """Add a source the turn consults; returns the builder.

        - A **live source** (:class:`~ragloop.retrievers.live.LiveSource`: ``name``, ``signals``, ``lookup``,
          ``aclose``) is looked up by the live node for every short query that carries its signal, and closed
          with the chat; in a turn that plans it is also a plan source under its own name (exact-id lookups).
        - A **plan source** (:class:`~ragloop.retrievers.sources.Source`: ``name``, ``description``, ``run``) is
          planned over by the plan node: a SQL database, or a document source over another retriever
          (``DocumentSource(other_retriever, name="manuals", description="…")``). The first one puts the plan
          node at the start of the turn, with the turn's retriever as the ``documents`` source (a plan source
          named ``documents`` replaces that one).

        Raises:
            ConfigError: ``source`` is neither (a bare retriever, say), both at once, or has the name of a
                source already added.
        """
        live, plan = isinstance(source, LiveSource), isinstance(source, Source)
        kind = type(source).__name__
        if live == plan:
            hint = (
                "a second retriever joins the turn's own search with add_retriever('manuals', retriever) (or, "
                "for a model planner, add_source(DocumentSource(retriever, name='manuals', description='…')))"
                if isinstance(source, Retriever)
                else "a live source has name, signals, lookup and aclose; a plan source has name, description, run"
            )
            what = "both a live source and a plan source" if live else "neither a live source nor a plan source"
            raise ConfigError(f"add_source() got a {kind}, which is {what}: {hint}")
        name = source.name
        if name in self._plan or any(s.name == name for s in self._live):
            raise ConfigError(f"a source named {name!r} was added already; give each source a name of its own")
        if live:
            self._live.append(source)  # type: ignore[arg-type]
        else:
            self._plan[name] = source  # type: ignore[assignment]
        return self

    def add_retriever(self, name: str, retriever: Retriever, *, weight: float = 1.0) -> Turn:
        """Join ``retriever`` to the turn's own search under ``name``; returns the builder.

        Every query then searches the turn's retriever (named ``documents``) and each added one at once, joined
        by weighted reciprocal-rank fusion (:class:`~ragloop.retrievers.join.JoinedRetriever`; each hit keeps
        ``hit.ranks[name]``; cached searches are keyed on every retriever's version). For other modes, pass a
        joiner of your own as the turn's retriever.

        Raises:
            ConfigError: ``name`` taken (``documents`` is the turn's), a negative weight, or no ``search``.
        """
        from ragloop.retrievers.join import JoinedRetriever

        joined = dict(self._joined)
        if name in joined or name == "documents":
            raise ConfigError(f"a retriever named {name!r} was added already; give each retriever a name of its own")
        joined[name] = (retriever, weight)
        table = {"documents": self._base, **{n: r for n, (r, _) in joined.items()}}
        weights = {"documents": 1.0, **{n: w for n, (_, w) in joined.items()}}
        self.retriever = search = JoinedRetriever(table, weights=weights)  # checks the retriever and its weight
        self._joined, base = joined, self._base_version
        if base is not None:  # an index's version alone would keep serving the other retrievers' cached results
            self.index_version = lambda: f"{base()}|{search.version}"
        return self

    def ranker(self, ranker: Ranker) -> Turn:
        """Order the passages the answer numbers and cites with ``ranker``; returns the builder.

        ``ranker.rank(candidates)`` gets the turn's searches and grades
        (:class:`~ragloop.retrievers.ranking.Candidates`) and returns the passages best first: the reply's
        blocks are the graded ones **in that order**, so block ``[1]`` is the first graded passage it returned.
        It runs once per turn within ``settings.rank_timeout_s``; when it fails or is late, that turn uses the
        built-in ranking (:class:`~ragloop.retrievers.ranking.FusionRanker`) and records the fault.

        Raises:
            ConfigError: ``ranker`` has no ``rank`` method.
        """
        if not isinstance(ranker, Ranker):
            raise ConfigError(
                f"ranker() got a {type(ranker).__name__}, which has no rank() method: a ranker is an object with "
                "async def rank(self, candidates) -> list[Hit] (see ragloop.extend.Ranker)"
            )
        self._ranker = ranker
        return self

    def insert_after(self, after: str, name: str, node: Node) -> Turn:
        """Run ``node``, named ``name``, right after the node ``after``; returns the builder.

        ``node`` takes over each route of ``after`` that it declares too, and its route of that name leads
        where ``after``'s did. So ``insert_after("retrieve", "trim", node)`` with ``node.routes ==
        ("grade",)`` sends retrieve's ``grade`` route to trim and trim's ``grade`` to grade, while the
        fast path (retrieve → answer) still skips both; a node that declares ``("grade", "answer")`` takes both
        routes and returns the one the turn should follow (``"answer" if state.fast_path else "grade"``).
        The names the nodes and the routing policy return do not change. Routes of ``node`` that ``after``
        does not have lead to the node of their name. The step cap grows by the most times ``after`` can run
        in a turn (:func:`ragloop.policy.most_runs`). Checked when the turn is built.
        """
        self._changes.append((after, name, node))
        return self

    def replace(self, name: str, node: Node) -> Turn:
        """Put ``node`` in the place of the node called ``name``: same name, same edges; returns the builder.

        Each of ``node``'s routes leads where the old node's route of that name led (the node of that name, or
        wherever an insertion rewired it). Checked when the turn is built: an unknown name is a
        :class:`~ragloop.errors.GraphError` that lists the turn's nodes.
        """
        self._changes.append(("", name, node))
        return self

    def policy(self) -> RoutingPolicy:
        """The routing policy the default nodes will route with (for a node of your own that routes like them)."""
        return self.settings.policy(live_sources=self._live, hops=self.judges.bridger is not None)

    # -- building it ----------------------------------------------------------------------------------------

    def build(self) -> BuiltTurn:
        """The validated turn with its immutable graph.

        Raises:
            GraphError: An insertion or replacement names a node the turn does not have, a name taken, an
                insertion after the finish node or one that would never run, or any graph error.
        """
        live, j = tuple(self._live), self.judges
        table = self._plan_table if self._plan_table is not None else plan_table(self.retriever, live, self._plan)
        planner, fallback = j.planners(table, live) if table is not None else (None, None)
        if table is not None and planner is not None and self._plan_table is None:
            check_plan_routes(table, planner, fallback)
        nodes = default_nodes(
            self.retriever,
            evolve(j, planner=planner, fallback_planner=fallback),
            settings=self.settings,
            live_sources=live,
            embedder=self.embedder,
            plan_sources=table,
            caches=self.caches,
            index_version=self.index_version,
            ranker=self._ranker,
        )
        edges: dict[str, dict[str, str]] = {}
        runs = {n: most_runs(n, self.policy()) for n in nodes}
        for after, name, node in self._changes:
            if after:
                insert_node(nodes, edges, runs, after, name, node)
            else:
                replace_node(nodes, edges, name, node)
        extra = sum(runs[n] for n in nodes if n not in EDGES)  # the cap counts the default nodes already
        graph = build_graph(nodes, self.settings, edges=edges, extra_steps=extra)
        version = self.index_version or (lambda: str(getattr(self.retriever, "version", "")))
        return BuiltTurn(
            graph, self.settings, live, self.caches, version, j.offline_only, self._store, self.retriever, self.embedder
        )
