"""The one place a chat turn is assembled: the :class:`Turn` builder and the :class:`BuiltTurn` it makes.

A builder knows the default turn's nodes and edges (``ragloop.policy.EDGES``). Change it, then build once::

    turn = Turn.from_index("kb-index/")                       # or Turn(retriever, Judges.offline(texts))
    turn.insert_after("retrieve", "rerank", MyReranker())     # runs between retrieve and grade
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

from attrs import frozen

from ragloop.errors import ConfigError, GraphError
from ragloop.policy import EDGES, RoutingPolicy, most_runs
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.scope import Corpus
from ragloop.retrievers.sources import DocumentSource, LiveLookupSource, Source
from ragloop.runner import END, Graph, Node
from ragloop.turn.judges import Judges
from ragloop.turn.options import IndexOptions, RetrieverOptions, StoreOptions, TurnWiring, require
from ragloop.turn.settings import TurnSettings
from ragloop.turn.wiring import build_graph, default_nodes

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
    ) -> None:
        self.retriever, self.judges, self.settings = retriever, judges, settings
        self.embedder, self.caches, self.index_version = embedder, caches, index_version
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
        require(wiring)
        flat: dict[str, Any] = dict(wiring)
        judged: dict[str, Any] = {key: flat.get(key) for key in (*_JUDGED, "planner", "fallback_planner")}
        judges = Judges(**judged)
        turn = cls(
            wiring["retriever"],
            judges,
            settings=wiring.get("settings", TurnSettings()),
            embedder=wiring.get("embedder"),
            caches=wiring.get("caches"),
            index_version=wiring.get("index_version"),
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
            **options: See :class:`~ragloop.turn.options.RetrieverOptions`.

        Raises:
            ConfigError: ``llm`` without ``fast_model``.
        """
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
            **options: See :class:`~ragloop.turn.options.IndexOptions`.
        """
        from ragloop.retrievers.index import KnowledgeIndex

        opts: dict[str, Any] = dict(options)
        idx = index if isinstance(index, KnowledgeIndex) else KnowledgeIndex.load(index, opts.pop("embedder", None))
        searched, caches = idx, opts.get("caches")
        if caches is not None and caches.embeddings is not None:  # the searches' query embeddings are cached too
            from ragloop.retrievers.cached import CachedEmbedder

            cached = CachedEmbedder(idx.embedder, caches.embeddings)
            searched = KnowledgeIndex(idx.chunks, idx.bm25, idx.dense, cached, weights=idx.weights, rrf_k=idx.rrf_k)
        retriever = searched.retriever(opts.pop("mode", "hybrid"))
        opts.update(embedder=idx.embedder, index_version=lambda: idx.version)
        return cls.from_retriever(retriever, Corpus.of(idx.chunks), llm, **opts)

    @classmethod
    def from_store(cls, url: str, llm: openai.AsyncOpenAI | None = None, **options: Unpack[StoreOptions]) -> Turn:
        """A turn over a PostgreSQL collection written by ``ragloop index DIR --store URL`` (``[postgres]`` extra).

        Every replica of a service can point at the same database. The store's statement timeout is the
        turn's ``settings.retrieve_timeout_s``. This call reads the collection's texts and metadata (for the offline
        judges, per caller scope) on a connection of its own; the connection pool opens on the first search, in
        the event loop that serves, and ``ChatRAG.aclose`` closes it.

        Args:
            url: ``postgresql://`` URL of a database with the ``vector`` extension.
            llm: As in :meth:`from_retriever`.
            **options: See :class:`~ragloop.turn.options.StoreOptions`.

        Raises:
            ConfigError: A mode other than ``hybrid``.
        """
        import concurrent.futures

        import anyio

        from ragloop.retrievers.postgres import PostgresStore

        opts: dict[str, Any] = dict(options)
        mode = opts.pop("mode", "hybrid")
        if mode != "hybrid":
            raise ConfigError(f"the Postgres store searches in hybrid mode only, not {mode!r}")
        store = PostgresStore(
            url,
            opts.pop("embedder", None),
            collection=opts.pop("collection", "ragloop"),
            pool_size=opts.pop("pool_size", 10),
            statement_timeout_s=opts.get("settings", TurnSettings()).retrieve_timeout_s,
            create=False,
        )

        # A thread of its own: this works whether or not the caller is inside an event loop.
        def read() -> Corpus:
            return anyio.run(store.prepare_corpus)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            corpus = pool.submit(read).result()
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
            **options: See :class:`~ragloop.turn.options.IndexOptions` (``live_sources`` defaults to the sample's
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
                "a retriever is the turn's own search; wrap another one: add_source(DocumentSource(retriever, "
                "name='manuals', description='…'))"
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

    def insert_after(self, after: str, name: str, node: Node) -> Turn:
        """Run ``node``, named ``name``, right after the node ``after``; returns the builder.

        ``node`` takes over each route of ``after`` that it declares too, and its route of that name leads
        where ``after``'s did. So ``insert_after("retrieve", "rerank", node)`` with ``node.routes ==
        ("grade",)`` sends retrieve's ``grade`` route to rerank and rerank's ``grade`` to grade, while the
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
        table = self._plan_sources(live)
        planner, fallback = j.planners(table, live) if table is not None else (None, None)
        nodes = default_nodes(
            retriever=self.retriever,
            live_sources=live,
            settings=self.settings,
            embedder=self.embedder,
            planner=planner,
            plan_sources=table,
            fallback_planner=fallback,
            caches=self.caches,
            index_version=self.index_version,
            **{key: getattr(j, key) for key in _JUDGED},
        )
        edges: dict[str, dict[str, str]] = {}
        runs = {n: most_runs(n, self.policy()) for n in nodes}
        for after, name, node in self._changes:
            if after:
                _insert(nodes, edges, runs, after, name, node)
            else:
                _replace(nodes, edges, name, node)
        extra = sum(runs[n] for n in nodes if n not in EDGES)  # the cap counts the default nodes already
        graph = build_graph(nodes, self.settings, edges=edges, extra_steps=extra)
        version = self.index_version or (lambda: str(getattr(self.retriever, "version", "")))
        return BuiltTurn(
            graph, self.settings, live, self.caches, version, j.offline_only, self._store, self.retriever, self.embedder
        )

    def _plan_sources(self, live: tuple[LiveSource, ...]) -> dict[str, Source] | None:
        """The plan node's sources by name (``None``: the turn does not plan)."""
        if self._plan_table is not None:
            return self._plan_table
        if not self._plan:
            return None
        sources: dict[str, Source] = {"documents": DocumentSource(self.retriever)}
        sources.update({s.name: LiveLookupSource(s) for s in live})
        sources.update(self._plan)
        return sources


#: The judges a Judges bundle hands the default nodes, under the same names as TurnWiring's.
_JUDGED = ("decider", "grader", "rewriter", "answerer", "fallback_decider", "fallback_answerer", "bridger", "verifier")


def _known(nodes: Mapping[str, Node]) -> str:
    return ", ".join(nodes)


def _insert(
    nodes: dict[str, Node], edges: dict[str, dict[str, str]], runs: dict[str, int], after: str, name: str, node: Node
) -> None:
    """Insert ``node`` after ``after``: it takes over the routes of ``after`` that it declares."""
    where = f"insert_after({after!r}, {name!r}, …)"
    if after not in nodes:
        raise GraphError(f"{where}: the turn has no node {after!r}; its nodes: {_known(nodes)}")
    if name in nodes or name == END:
        raise GraphError(f"{where}: the name {name!r} is taken; give the new node a name of its own")
    declared = tuple(getattr(node, "routes", None) or ())
    theirs = tuple(getattr(nodes[after], "routes", ()))
    if theirs == (END,):
        raise GraphError(f"{where}: {after!r} ends the turn; nothing runs after it (insert before it instead)")
    taken = [r for r in declared if r in theirs and r != END]
    if not taken:
        raise GraphError(
            f"{where}: the node would never run: it declares none of {after!r}'s routes ({', '.join(theirs)}); "
            f"declare the routes it takes over, e.g. routes = ({theirs[0]!r},)"
        )
    for route in taken:
        edges.setdefault(name, {})[route] = edges.get(after, {}).get(route, route)
        edges.setdefault(after, {})[route] = name
    nodes[name], runs[name] = node, runs.get(after, 1)


def _replace(nodes: dict[str, Node], edges: dict[str, dict[str, str]], name: str, node: Node) -> None:
    """Put ``node`` in ``name``'s place; keep the old node's edges for the routes the new one declares."""
    if name not in nodes:
        raise GraphError(f"replace({name!r}, …): the turn has no node {name!r}; its nodes: {_known(nodes)}")
    declared = set(getattr(node, "routes", None) or ())
    if name in edges:
        edges[name] = {r: t for r, t in edges[name].items() if r in declared}
    nodes[name] = node
