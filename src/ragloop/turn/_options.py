"""The keyword arguments of the turn's constructors, each list written once.

``ChatRAG(...)`` and :meth:`ragloop.turn.Turn.of` take a turn's collaborators one by one (:class:`TurnWiring`,
the compatibility path; :func:`wiring_judges` maps it onto :class:`~ragloop.turn.Judges`);
``Turn.from_retriever`` / ``from_index`` / ``from_store`` / ``sample`` (and the ``ChatRAG`` constructors of the
same names) take a retriever, an index or a store plus the options below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import attrs

from ragloop.errors import ConfigError
from ragloop.llm.planner import Planner
from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.nodes.answer import Verifier
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.ranking import Ranker
from ragloop.retrievers.sources import Source
from ragloop.turn._judges import Judges
from ragloop.turn._settings import TurnSettings

if TYPE_CHECKING:
    from ragloop.caches import Caches

__all__ = [
    "IndexOptions",
    "RetrieverOptions",
    "StoreOptions",
    "TurnWiring",
    "check_options",
    "require",
    "wiring_judges",
]


class TurnWiring(TypedDict, total=False):
    """A turn's collaborators one by one: the keywords of ``ChatRAG(...)`` and ``Turn.of``.

    A compatibility path, kept for code written before the builder: the one way to list a turn's parts is
    ``Turn(retriever, Judges(...), settings=...)`` (its judges in :class:`~ragloop.turn.Judges`, a ranker with
    ``Turn.ranker``, sources with ``Turn.add_source``), which ``ChatRAG(turn)`` runs and
    :func:`~ragloop.turn.default_nodes` wires. Its judge keys are :class:`~ragloop.turn.Judges`' fields of the
    same names, mapped in one place (``Turn.of``); the first five keys are required.

    Attributes:
        retriever: Where to search (required).
        decider: Decide judge (required).
        grader: Grade judge (required).
        rewriter: Rewrite judge (required).
        answerer: Answer judge (required).
        live_sources: Live sources for the live node.
        settings: Turn settings.
        embedder: Optional embedder, for semantic near-duplicate checks of rewrites.
        fallback_decider: Used when ``decider`` fails (e.g. offline behind an LLM).
        fallback_answerer: Used when ``answerer`` fails before its first token; an extractive one (the offline
            answerer) also ends a reply the deadline cut short.
        bridger: Proposes follow-up (second-hop) searches for multi-hop questions; ``None``: no hops.
        planner: Plans retrieval across ``plan_sources`` in dependency waves; ``None``: no plan node.
        plan_sources: The plan sources by name, the document source included, as the plan node gets them.
        fallback_planner: Used when ``planner`` fails or plans something invalid (the offline planner).
        verifier: Checks each finished reply (offline: :class:`~ragloop.llm.offline.verify.OfflineVerifier`).
        ranker: Orders the turn's passages for the answer (:class:`~ragloop.retrievers.ranking.Ranker`);
            ``None``: the default ranking of ``settings.fusion`` and ``settings.rerank``.
        caches: Caches for query embeddings, search results and grades (and replies, for a chat).
        index_version: The index's current version, which cached search results are keyed on; default: the
            retriever's ``version`` attribute, if it has one.
    """

    retriever: Retriever
    decider: Decider
    grader: Grader
    rewriter: Rewriter
    answerer: Answerer
    live_sources: Sequence[LiveSource]
    settings: TurnSettings
    embedder: Embedder | None
    fallback_decider: Decider | None
    fallback_answerer: Answerer | None
    bridger: Bridger | None
    planner: Planner | None
    plan_sources: Mapping[str, Source] | None
    fallback_planner: Planner | None
    verifier: Verifier | None
    ranker: Ranker | None
    caches: Caches | None
    index_version: Callable[[], str] | None


def require(wiring: TurnWiring) -> None:
    """Check the five collaborators no turn goes without are there.

    Raises:
        ConfigError: Which are missing, and how to pass them.
    """
    missing = [k for k in ("retriever", "decider", "grader", "rewriter", "answerer") if wiring.get(k) is None]
    if missing:
        raise ConfigError(
            f"a turn needs {', '.join(missing)}: pass retriever=, decider=, grader=, rewriter= and answerer=, "
            "or a built turn (ChatRAG(Turn.from_index(...).build()))"
        )


def wiring_judges(wiring: TurnWiring) -> Judges:
    """The compatibility path's one mapping: the :class:`~ragloop.turn.Judges` a flat :class:`TurnWiring` names
    (each of its keys that is a ``Judges`` field; the others are the builder's arguments).

    Raises:
        ConfigError: A required collaborator is missing.
    """
    require(wiring)
    flat: Mapping[str, Any] = wiring
    return Judges(**{f.name: flat[f.name] for f in attrs.fields(Judges) if f.name in flat})


class _Common(TypedDict, total=False):
    fast_model: str | None
    answer_model: str | None
    live_sources: Sequence[LiveSource]
    settings: TurnSettings
    glossary: Mapping[str, str] | None
    timeout_s: float
    embedder: Embedder | None
    plan_sources: Sequence[Source]
    caches: Caches | None
    ranker: Ranker | None


class RetrieverOptions(_Common, total=False):
    """Options of a turn over a retriever (``from_retriever``).

    Attributes:
        fast_model: Model for decide, grade, rewrite and plan (required with an ``llm`` client).
        answer_model: Model for the answer (default: ``fast_model``).
        live_sources: Live sources (e.g. :class:`~ragloop.retrievers.live.SQLiteTicketSource`).
        settings: Turn settings.
        glossary: Extra abbreviations (``{"SSO": "single sign-on"}``), over those mined from the texts.
        timeout_s: Per-call timeout of the model judges (default 20 s).
        embedder: The query embedder (semantic checks of rewrites and of the reply's support).
        plan_sources: Structured sources to plan over besides the documents and the live sources (e.g. a
            :class:`~ragloop.retrievers.sql.SQLiteSource`); given, the turn starts with the ``plan`` node.
        caches: Caches (:class:`~ragloop.caches.Caches`); search results are keyed on ``index_version``.
        ranker: Orders the turn's passages for the answer (:class:`~ragloop.retrievers.ranking.Ranker`; e.g.
            a cross-encoder, :mod:`ragloop.retrievers.cross_encoder`); default: the built-in ranking.
        index_version: The index's current version; default: the retriever's ``version`` attribute.
    """

    index_version: Callable[[], str] | None


class IndexOptions(_Common, total=False):
    """Options of a turn over an index directory or a loaded index (``from_index``, ``sample``).

    Attributes:
        mode: Retrieval mode: ``hybrid`` (default), ``bm25`` or ``dense``.
        fast_model: As in :class:`RetrieverOptions`.
        answer_model: As in :class:`RetrieverOptions`.
        live_sources: As in :class:`RetrieverOptions`.
        settings: Turn settings.
        glossary: As in :class:`RetrieverOptions`.
        timeout_s: As in :class:`RetrieverOptions`.
        embedder: Query embedder; by default the one the index was built with.
        plan_sources: As in :class:`RetrieverOptions`.
        caches: As in :class:`RetrieverOptions` (search results keyed on the index's version).
        ranker: As in :class:`RetrieverOptions`.
    """

    mode: str


class StoreOptions(_Common, total=False):
    """Options of a turn over a PostgreSQL collection (``from_store``; the ``[postgres]`` extra).

    Attributes:
        collection: The collection name given to ``ragloop index --collection`` (default ``ragloop``).
        pool_size: Most connections this process opens to the database (default 10).
        mode: ``hybrid`` (the store's only mode).
        fast_model: As in :class:`RetrieverOptions`.
        answer_model: As in :class:`RetrieverOptions`.
        live_sources: As in :class:`RetrieverOptions`.
        settings: Turn settings; the store's statement timeout is ``settings.retrieve_timeout_s``.
        glossary: As in :class:`RetrieverOptions`.
        timeout_s: As in :class:`RetrieverOptions`.
        embedder: Query embedder; by default the one the collection was built with.
        plan_sources: As in :class:`RetrieverOptions`.
        caches: As in :class:`RetrieverOptions` (search results keyed on the store's version).
        ranker: As in :class:`RetrieverOptions`.
    """

    collection: str
    pool_size: int
    mode: str


def check_options(options: Mapping[str, object], kind: Any, where: str) -> None:
    """Refuse an option ``kind`` (one of the option TypedDicts) does not name: a misspelt or misplaced
    keyword must not be silently ignored.

    Raises:
        ConfigError: Which options are unknown, and the known ones.
    """
    known: frozenset[str] = kind.__required_keys__ | kind.__optional_keys__
    unknown = sorted(set(options) - known)
    if unknown:
        hint = " (a turn log belongs to the chat: ChatRAG(turn, turn_log=...))" if "turn_log" in unknown else ""
        raise ConfigError(
            f"{where}() got unknown option(s) {', '.join(map(repr, unknown))}{hint}; known: {', '.join(sorted(known))}"
        )
