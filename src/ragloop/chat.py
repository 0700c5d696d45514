"""The public chat API: one object that answers questions over a knowledge index.

::

    rag = ChatRAG.from_index("kb-index/")                 # offline judges: no model, no network
    reply = await rag.ask("Compare plan pricing and SSO setup", page_url="https://…/docs/sso")
    reply.text, reply.citations, reply.outcome, reply.record

    async for event in rag.stream("How do I rotate an API key?"):   # progress events + tokens, for SSE
        ...

With ``llm=openai.AsyncOpenAI(...)`` the same graph uses OpenAI-compatible judges, with the offline decider
and answerer as fallbacks, so a failing model still yields an answer.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from ragloop.errors import ConfigError, InputError
from ragloop.events import Event, EventStream
from ragloop.llm.protocols import Answerer, Bridger, Decider, Grader, Rewriter
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.filters import FiltersArg, normalize_filters
from ragloop.retrievers.live import LiveSource
from ragloop.runner import RunResult
from ragloop.state import Caller, Citation, ContextBlock, Message, Outcome, PageContext, TurnState
from ragloop.turn import TurnRecord, TurnSettings, build_graph, default_nodes, turn_record

if TYPE_CHECKING:
    import openai

    from ragloop.caches import Caches
    from ragloop.llm.planner import Planner
    from ragloop.nodes.answer import Verifier
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.postgres import PostgresStore
    from ragloop.retrievers.sources import Source
    from ragloop.turnlog import Rating, TurnLog

__all__ = ["ChatRAG", "Reply", "ReplyReady", "validate_question"]

#: Longest question accepted by default (characters).
MAX_QUESTION_CHARS = 8_000
_MAX_URL_CHARS = 2_048


@frozen
class Reply:
    """The answer to one question.

    Attributes:
        text: The reply, with ``[n]`` citations.
        outcome: ``context``, ``partial``, ``none`` or ``direct``.
        citations: The ``[n]`` markers of the text, resolved to their sources.
        blocks: The numbered context the answer was written from.
        missing: Parts of the question that found no context.
        record: The per-turn decision record.

    Its :attr:`turn_id` names the turn for feedback (:meth:`ChatRAG.feedback`).
    """

    text: str
    outcome: Outcome
    citations: tuple[Citation, ...]
    blocks: tuple[ContextBlock, ...]
    missing: tuple[str, ...]
    record: TurnRecord

    @property
    def turn_id(self) -> str:
        """The turn's id (its run id): what feedback on this reply names."""
        return self.record.run_id

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape printed by ``ragloop ask --json``."""
        return {
            "turn_id": self.turn_id,
            "text": self.text,
            "outcome": self.outcome,
            "citations": [
                {"n": c.n, "source": c.source, "title": c.title, "url": c.url or None} for c in self.citations
            ],
            "missing": list(self.missing),
            "record": self.record.as_dict(),
        }

    def client_dict(self, source_url: Callable[[str], str | None] | None = None) -> dict[str, Any]:
        """The reply as it may be sent to an end user: text, outcome, citations and what is missing.

        Never the decision record (queries, grades, errors, model names): keep that for your logs.

        Args:
            source_url: Maps a citation's source to a link; by default a source that is itself an
                ``http(s)://`` URL links to itself and any other source has ``url`` ``None``.
        """
        link = source_url or _own_url
        return {
            "turn_id": self.turn_id,
            "text": self.text,
            "outcome": self.outcome,
            "citations": [
                {"n": c.n, "title": c.title, "source": c.source, "url": c.url or link(c.source)} for c in self.citations
            ],
            "missing": list(self.missing),
        }


def _own_url(source: str) -> str | None:
    return source if source.startswith(("https://", "http://")) else None


@frozen
class ReplyReady(Event):
    """Last event of :meth:`ChatRAG.stream`: the finished reply.

    Attributes:
        reply: The reply.
    """

    reply: Reply


_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


#: Unicode's control characters (category ``Cc``: U+0000-U+001F and U+007F-U+009F) but newline and tab.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _clean_text(text: str) -> str:
    # Terminal escape sequences are pasted noise, not words: drop them whole. Lone surrogates cannot be
    # encoded or sent anywhere: each becomes U+FFFD. Other control characters become spaces. (Two regex passes,
    # not a per-character category lookup: every question and history message of every turn goes through here.)
    text = _ANSI.sub("", text)
    return _SURROGATE.sub("\ufffd", _CONTROL.sub(" ", text))


def validate_question(question: object, *, max_chars: int = MAX_QUESTION_CHARS) -> str:
    """The question, cleaned; :class:`InputError` if it is not usable.

    Nothing is truncated: an over-long question is an error that says the limit.
    """
    if not isinstance(question, str):
        raise InputError(f"question must be a string, got {type(question).__name__}")
    if len(question) > max_chars:
        raise InputError(
            f"question is {len(question):,} characters; the limit is {max_chars:,}. "
            "Shorten it, or pass a larger max_question_chars to ChatRAG."
        )
    cleaned = " ".join(_clean_text(question).split())
    if not cleaned:
        raise InputError("question is empty; pass the user's message, e.g. rag.ask('How do I reset 2FA?')")
    return cleaned


#: Most earlier messages accepted as history, and the longest one (characters), by default.
MAX_HISTORY_MESSAGES = 50
MAX_HISTORY_CHARS = 32_000
#: What a turn keeps of each history message: its last this-many characters (judging a megabyte of history
#: would hold the event loop; the latest words are what a follow-up refers to).
KEPT_HISTORY_CHARS = 8_000


def _history(
    history: object, *, max_messages: int = MAX_HISTORY_MESSAGES, max_chars: int = MAX_HISTORY_CHARS
) -> tuple[Message, ...]:
    """Validated history: roles ``user``/``assistant`` only, string content, within the count and size caps.

    ``Message`` objects are checked like dicts (a ``Message("system", …)`` is refused, not passed on). Each
    message keeps its last :data:`KEPT_HISTORY_CHARS` characters.
    """
    if history is None:
        return ()
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InputError(
            f"history must be a list of messages like {{'role': 'user', 'content': '…'}}, got {type(history).__name__}"
        )
    if len(history) > max_messages:
        raise InputError(
            f"history has {len(history):,} messages; the limit is {max_messages:,} (max_history_messages). "
            "Send only the latest messages."
        )
    out = []
    for i, item in enumerate(history):
        role: object
        content: object
        if isinstance(item, Message):
            role, content = item.role, item.content
        elif isinstance(item, Mapping):
            role, content = item.get("role"), item.get("content")
        else:
            role = content = None
        if role not in ("user", "assistant") or not isinstance(content, str):
            shown = f"role {role!r}" if isinstance(role, str) else f"{item!r:.80}"
            raise InputError(
                f"history[{i}] must be a Message or a dict with role 'user'/'assistant' and string content, got {shown}"
            )
        if len(content) > max_chars:
            raise InputError(
                f"history[{i}] is {len(content):,} characters; the limit is {max_chars:,} (max_history_chars). "
                "Shorten or drop it."
            )
        kept = content[-KEPT_HISTORY_CHARS:]  # cut before cleaning: the cost stays bounded whatever the cap
        out.append(Message("user" if role == "user" else "assistant", _clean_text(kept)))
    return tuple(out)


def _filters(filters: object) -> dict[str, tuple[str, ...]]:
    try:
        return normalize_filters(filters)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise InputError(str(exc)) from exc


def _page(url: object, title: object) -> PageContext:
    for name, value in (("page_url", url), ("page_title", title)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{name} must be a string or None, got {type(value).__name__}")
        if isinstance(value, str) and len(value) > _MAX_URL_CHARS:
            raise InputError(f"{name} is {len(value):,} characters; the limit is {_MAX_URL_CHARS:,}")
    return PageContext(
        url=_clean_text(url).strip() or None if isinstance(url, str) else None,
        title=_clean_text(title).strip() or None if isinstance(title, str) else None,
    )


class ChatRAG:
    """Answers chat questions with the default agentic-RAG turn.

    Args:
        retriever: Where to search.
        decider: Decide judge.
        grader: Grade judge.
        rewriter: Rewrite judge.
        answerer: Answer judge.
        live_sources: Live sources for the live node.
        settings: Turn settings.
        embedder: Optional embedder, for semantic near-duplicate checks of rewrites.
        fallback_decider: Used when ``decider`` fails (e.g. offline behind an LLM).
        fallback_answerer: Used when ``answerer`` fails before its first token.
        bridger: Proposes follow-up (second-hop) searches for multi-hop questions; ``None``: no hops.
        planner: Plans retrieval across ``plan_sources`` (SQL, documents, live) in dependency waves; ``None``:
            no plan node (see :mod:`ragloop.nodes.plan`).
        plan_sources: The plan sources by name, the document source included.
        fallback_planner: Used when ``planner`` fails or plans something invalid (the offline planner).
        max_question_chars: Longest question accepted.
        max_history_messages: Most earlier messages accepted as ``history``.
        max_history_chars: Longest history message accepted (characters).
        verifier: Checks each finished reply (offline: :class:`~ragloop.llm.offline.verify.OfflineVerifier`).
        caches: Caches for query embeddings, search results and grades (:class:`~ragloop.caches.Caches`),
            and, only when its ``replies`` cache is set, whole replies of :meth:`ask` to a question without
            history (same page, filters, caller and index version); ``None``: nothing is cached.
        index_version: The index's current version (e.g. ``lambda: index.version``), which search results
            are cached under; default: the retriever's ``version`` attribute, if it has one.
        turn_log: Where finished turns are logged (:class:`~ragloop.turnlog.TurnLog`, opt-in), for ``ragloop
            gaps`` and :meth:`feedback`; logging never slows or fails a turn. ``None``: nothing is stored.
    """

    def __init__(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        self,
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
        max_question_chars: int = MAX_QUESTION_CHARS,
        verifier: Verifier | None = None,
        max_history_messages: int = MAX_HISTORY_MESSAGES,
        max_history_chars: int = MAX_HISTORY_CHARS,
        caches: Caches | None = None,
        index_version: Callable[[], str] | None = None,
        turn_log: TurnLog | None = None,
    ) -> None:
        self.settings = settings
        #: The turn log, if any (see ``turn_log``); :meth:`aclose` closes it.
        self.turn_log = turn_log
        #: The embedder given (the index's, from :meth:`from_index`), if any.
        self.embedder = embedder
        self.live_sources = tuple(live_sources)
        self.max_question_chars = max_question_chars
        self.max_history_messages = max_history_messages
        self.max_history_chars = max_history_chars
        self.nodes = default_nodes(
            retriever=retriever,
            decider=decider,
            grader=grader,
            rewriter=rewriter,
            answerer=answerer,
            live_sources=self.live_sources,
            settings=settings,
            embedder=embedder,
            fallback_decider=fallback_decider,
            fallback_answerer=fallback_answerer,
            bridger=bridger,
            planner=planner,
            plan_sources=plan_sources,
            fallback_planner=fallback_planner,
            verifier=verifier,
            caches=caches,
            index_version=index_version,
        )
        self.graph = build_graph(self.nodes, settings)
        #: The caches given (:meth:`ask` uses the reply cache, when there is one).
        self.caches = caches
        self._index_version = index_version or (lambda: str(getattr(retriever, "version", "")))
        #: True when every judge is offline (no model calls).
        self.offline = False
        #: The Postgres store this chat opened (:meth:`from_store`); :meth:`aclose` closes it.
        self.store: PostgresStore | None = None

    @classmethod
    def from_index(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        cls,
        index: str | os.PathLike[str] | KnowledgeIndex,
        llm: openai.AsyncOpenAI | None = None,
        *,
        fast_model: str | None = None,
        answer_model: str | None = None,
        mode: str = "hybrid",
        live_sources: Sequence[LiveSource] = (),
        settings: TurnSettings = TurnSettings(),
        glossary: Mapping[str, str] | None = None,
        timeout_s: float = 20.0,
        embedder: Embedder | None = None,
        plan_sources: Sequence[Source] = (),
        caches: Caches | None = None,
        turn_log: TurnLog | None = None,
    ) -> ChatRAG:
        """A chat over an index directory (or a loaded :class:`~ragloop.retrievers.index.KnowledgeIndex`).

        Args:
            index: Index directory written by ``ragloop index``, or an index object.
            llm: An ``openai.AsyncOpenAI`` client; ``None`` runs the offline judges (no model, no network).
            fast_model: Model for decide, grade and rewrite (required with ``llm``).
            answer_model: Model for the answer (default: ``fast_model``).
            mode: Retrieval mode: ``hybrid``, ``bm25`` or ``dense``.
            live_sources: Live sources (e.g. :class:`~ragloop.retrievers.live.SQLiteTicketSource`).
            settings: Turn settings.
            glossary: Extra abbreviations (``{"SSO": "single sign-on"}``), over those mined from the index.
            timeout_s: Per-call timeout of the LLM judges.
            embedder: Query embedder; by default the one the index was built with.
            plan_sources: Structured sources to plan over besides the documents and the live sources (e.g. a
                :class:`~ragloop.retrievers.sql.SQLiteSource`); given, the turn starts with the ``plan`` node.
            caches: Caches (:class:`~ragloop.caches.Caches`); search results are keyed on the index's version.
            turn_log: Where finished turns are logged (see :class:`ChatRAG`).
        """
        from ragloop.retrievers.index import KnowledgeIndex

        idx = index if isinstance(index, KnowledgeIndex) else KnowledgeIndex.load(index, embedder)
        searched = idx
        if caches is not None and caches.embeddings is not None:  # the searches' query embeddings are cached too
            from ragloop.retrievers.cached import CachedEmbedder

            cached = CachedEmbedder(idx.embedder, caches.embeddings)
            searched = KnowledgeIndex(idx.chunks, idx.bm25, idx.dense, cached, weights=idx.weights, rrf_k=idx.rrf_k)
        return cls.from_retriever(
            searched.retriever(mode),  # type: ignore[arg-type]
            [c.text for c in idx.chunks],
            llm,
            embedder=idx.embedder,
            fast_model=fast_model,
            answer_model=answer_model,
            live_sources=live_sources,
            settings=settings,
            glossary=glossary,
            timeout_s=timeout_s,
            plan_sources=plan_sources,
            caches=caches,
            index_version=lambda: idx.version,
            turn_log=turn_log,
        )

    @classmethod
    def from_store(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        cls,
        url: str,
        llm: openai.AsyncOpenAI | None = None,
        *,
        collection: str = "ragloop",
        pool_size: int = 10,
        mode: str = "hybrid",
        fast_model: str | None = None,
        answer_model: str | None = None,
        live_sources: Sequence[LiveSource] = (),
        settings: TurnSettings = TurnSettings(),
        glossary: Mapping[str, str] | None = None,
        timeout_s: float = 20.0,
        embedder: Embedder | None = None,
        plan_sources: Sequence[Source] = (),
        caches: Caches | None = None,
        turn_log: TurnLog | None = None,
    ) -> ChatRAG:
        """A chat over a PostgreSQL collection written by ``ragloop index DIR --store URL`` (``[postgres]`` extra).

        Every replica of a service can point at the same database. The store's statement timeout is the
        turn's ``settings.retrieve_timeout_s``. This call reads the collection's texts (for the offline
        judges) on a connection of its own; the connection pool opens on the first search, in the event loop
        that serves, and :meth:`aclose` closes it.

        Args:
            url: ``postgresql://`` URL of a database with the ``vector`` extension.
            llm: As in :meth:`from_index`.
            collection: The collection name given to ``ragloop index --collection``.
            pool_size: Most connections this process opens to the database.
            mode: ``hybrid`` (the store's only mode).
            fast_model: As in :meth:`from_index`.
            answer_model: As in :meth:`from_index`.
            live_sources: As in :meth:`from_index`.
            settings: Turn settings.
            glossary: As in :meth:`from_index`.
            timeout_s: Per-call timeout of the LLM judges.
            embedder: Query embedder; by default the one the collection was built with.
            plan_sources: As in :meth:`from_index`.
            caches: As in :meth:`from_index` (search results keyed on the store's version).
            turn_log: As in :meth:`from_index`.
        """
        import concurrent.futures

        import anyio

        from ragloop.retrievers.postgres import PostgresStore

        if mode != "hybrid":
            raise ConfigError(f"the Postgres store searches in hybrid mode only, not {mode!r}")
        store = PostgresStore(
            url,
            embedder,
            collection=collection,
            pool_size=pool_size,
            statement_timeout_s=settings.retrieve_timeout_s,
            create=False,
        )

        # A thread of its own: this works whether or not the caller is inside an event loop.
        def read() -> list[str]:
            return anyio.run(store.prepare)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            texts = pool.submit(read).result()
        rag = cls.from_retriever(
            store,
            texts,
            llm,
            embedder=store.embedder,
            fast_model=fast_model,
            answer_model=answer_model,
            live_sources=live_sources,
            settings=settings,
            glossary=glossary,
            timeout_s=timeout_s,
            plan_sources=plan_sources,
            caches=caches,
            turn_log=turn_log,
        )
        rag.store = store
        return rag

    @classmethod
    def from_retriever(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        cls,
        retriever: Retriever,
        texts: Sequence[str],
        llm: openai.AsyncOpenAI | None = None,
        *,
        embedder: Embedder | None = None,
        fast_model: str | None = None,
        answer_model: str | None = None,
        live_sources: Sequence[LiveSource] = (),
        settings: TurnSettings = TurnSettings(),
        glossary: Mapping[str, str] | None = None,
        timeout_s: float = 20.0,
        plan_sources: Sequence[Source] = (),
        caches: Caches | None = None,
        index_version: Callable[[], str] | None = None,
        turn_log: TurnLog | None = None,
    ) -> ChatRAG:
        """A chat over any retriever; ``texts`` (every chunk's text) feed the offline judges' corpus statistics.

        Other arguments are as in :meth:`from_index`.
        """
        from ragloop.llm.offline import OfflineAnswerer, OfflineDecider, OfflineGrader, OfflineRewriter
        from ragloop.llm.offline.bridge import OfflineBridger
        from ragloop.llm.offline.verify import OfflineVerifier
        from ragloop.text.terms import CorpusStats

        stats = CorpusStats.from_texts(texts)
        offline_decider = OfflineDecider(stats, glossary=dict(glossary or {}), max_queries=settings.max_queries)
        offline_answerer = OfflineAnswerer(stats)
        common: dict[str, Any] = dict(
            retriever=retriever,
            live_sources=live_sources,
            settings=settings,
            embedder=embedder,
            caches=caches,
            index_version=index_version,
            turn_log=turn_log,
            **_planning(retriever, live_sources, plan_sources, llm, fast_model, timeout_s),
        )
        if llm is None:
            rag = cls(
                decider=offline_decider,
                grader=OfflineGrader.calibrate(stats, texts),
                rewriter=OfflineRewriter(stats),
                answerer=offline_answerer,
                bridger=OfflineBridger(stats),  # with a model, the LLM decider writes bridge queries itself
                verifier=OfflineVerifier(embedder=embedder),
                **common,
            )
            rag.offline = True
            return rag
        if not fast_model:
            raise ConfigError("pass fast_model (and optionally answer_model) together with an llm client")
        from ragloop.llm.openai_judges import OpenAIJudges

        judges = OpenAIJudges.create(
            llm,
            fast_model=fast_model,
            answer_model=answer_model or fast_model,
            timeout_s=timeout_s,
            glossary=offline_decider.terms_glossary,
        )
        return cls(
            decider=judges.decider,
            grader=judges.grader,
            rewriter=judges.rewriter,
            answerer=judges.answerer,
            fallback_decider=offline_decider,
            fallback_answerer=offline_answerer,
            **common,
        )

    @classmethod
    def sample(
        cls, llm: openai.AsyncOpenAI | None = None, *, cache_dir: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> ChatRAG:
        """A chat over the bundled sample knowledge base and its live ticket source.

        The sample index is built on first use and cached in ``cache_dir`` (default ``~/.cache/ragloop``).
        Other keyword arguments go to :meth:`from_index`.
        """
        from ragloop.retrievers.live import SQLiteTicketSource
        from ragloop.sample import sample_index

        index = sample_index(Path(cache_dir) if cache_dir is not None else None)
        kwargs.setdefault("live_sources", (SQLiteTicketSource(),))
        return cls.from_index(index, llm, **kwargs)

    def new_state(
        self,
        question: object,
        *,
        history: object = None,
        page_url: object = None,
        page_title: object = None,
        filters: FiltersArg | None = None,
        caller: Caller | None = None,
    ) -> TurnState:
        """The validated state a turn starts from (raises :class:`InputError` on unusable input)."""
        if caller is not None and not isinstance(caller, Caller):
            raise InputError(f"caller must be a ragloop.state.Caller or None, got {type(caller).__name__}")
        return TurnState(
            question=validate_question(question, max_chars=self.max_question_chars),
            history=_history(history, max_messages=self.max_history_messages, max_chars=self.max_history_chars),
            page=_page(page_url, page_title),
            filters=_filters(filters),
            caller=caller,
        )

    def _deadline(self, deadline_s: float | None) -> float | None:
        value = self.settings.deadline_s if deadline_s is None else deadline_s
        if value is not None and (not isinstance(value, int | float) or not math.isfinite(value) or value <= 0):
            raise InputError(f"deadline_s must be a positive number of seconds, got {value!r}")
        return value

    async def ask(
        self,
        question: str,
        *,
        history: Sequence[Message | Mapping[str, str]] | None = None,
        page_url: str | None = None,
        page_title: str | None = None,
        deadline_s: float | None = None,
        filters: FiltersArg | None = None,
        caller: Caller | None = None,
        principal: str | None = None,
    ) -> Reply:
        """Answer one question.

        Args:
            question: The user's message.
            history: Earlier messages (``Message`` or ``{"role", "content"}`` dicts), oldest first.
            page_url: URL of the page the user asks from (resolves "this page/project").
            page_title: Its title.
            deadline_s: Time limit for the turn (default: ``settings.deadline_s``).
            filters: Metadata filters for every search of the turn: ``{"tenant": "acme"}`` (equality) or
                ``{"version": ["1.0", "1.1"]}`` (any of); see :mod:`ragloop.retrievers.filters`.
            caller: Who asks (``Caller(tenant="Acme", user="u1")``); every live lookup receives it, so a source
                shows the user only what their organisation may see.
            principal: Who is authenticated (e.g. an API key's principal), for the turn log: feedback on this
                turn is accepted only from them (default ``anonymous``).

        Raises:
            InputError: The question, history, page context or filters are unusable; the message says why.
        """
        state = self.new_state(
            question, history=history, page_url=page_url, page_title=page_title, filters=filters, caller=caller
        )
        key = self._reply_key(state)
        if key is not None and self.caches is not None and self.caches.replies is not None:
            found = self.caches.replies.get(key)
            if isinstance(found, Reply):
                reply = _from_reply_cache(found)
                self._log_turn(reply, state, principal)
                return reply
        result = await self.graph.run(state, deadline_s=self._deadline(deadline_s))
        reply = _reply(result)
        if key is not None and self.caches is not None and self.caches.replies is not None and _reusable(reply):
            self.caches.replies.set(key, reply)
        self._log_turn(reply, result.state, principal)
        return reply

    def _log_turn(self, reply: Reply, state: TurnState, principal: str | None) -> None:
        """Hand the finished turn to the turn log (never raises: a row that cannot be built is counted)."""
        if self.turn_log is None:
            return
        from ragloop.turnlog import pending_turn

        try:
            turn = pending_turn(
                turn_id=reply.turn_id,
                question=state.question,
                record=reply.record,
                citations=reply.citations,
                graded=state.graded,
                searches=state.searches,
                stale=reply.record.stale,
                principal=principal,
                caller=state.caller,
                at=self.turn_log.clock(),
            )
        except Exception as exc:  # noqa: BLE001 — the log costs its row, never the answer
            self.turn_log.count_error(exc)
            return
        self.turn_log.record(turn)

    async def feedback(
        self, turn_id: str, rating: Rating, *, comment: str | None = None, principal: str | None = None
    ) -> bool:
        """Record ``rating`` (``"up"`` or ``"down"``) on a reply of ``principal``'s, by its ``turn_id``.

        Returns ``False`` when the turn log holds no such turn of theirs (another principal's turn counts as
        unknown). Raises :class:`ConfigError` without a turn log, :class:`InputError` on a bad rating or comment,
        and :class:`~ragloop.errors.TurnLogError` when the log's database cannot be reached.
        """
        if self.turn_log is None:
            raise ConfigError("this chat keeps no turn log to rate turns in; pass turn_log=TurnLog.open(URL)")
        return await self.turn_log.feedback(turn_id, rating, comment=comment, principal=principal)

    def _reply_key(self, state: TurnState) -> str | None:
        """The reply cache's key for a question without history (``None``: no reply cache, or history)."""
        if self.caches is None or self.caches.replies is None or state.history:
            return None
        from ragloop.caches import cache_key

        filters = sorted((k, list(v)) for k, v in state.filters.items())
        caller = (state.caller.tenant, state.caller.user) if state.caller is not None else None
        page = (state.page.url, state.page.title)
        return cache_key("reply", state.question, page, filters, caller, self._index_version())

    def stream(
        self,
        question: str,
        *,
        history: Sequence[Message | Mapping[str, str]] | None = None,
        page_url: str | None = None,
        page_title: str | None = None,
        deadline_s: float | None = None,
        filters: FiltersArg | None = None,
        caller: Caller | None = None,
        principal: str | None = None,
    ) -> EventStream:
        """Answer one question as a stream of events: progress, answer tokens, then :class:`ReplyReady`.

        The input is checked here, before any event (an :class:`InputError` is raised by this call). Use it as
        ``async for event in rag.stream(q)`` or ``async with rag.stream(q) as events``; stopping the iteration
        (``break`` — even while the stream is still referenced —, ``aclose()``, cancellation, a client that
        disconnects) cancels the turn's in-flight work. ``filters``, ``caller`` and ``principal`` are as in
        :meth:`ask`.
        """
        state = self.new_state(
            question, history=history, page_url=page_url, page_title=page_title, filters=filters, caller=caller
        )

        def ready(result: RunResult) -> tuple[Event, ...]:
            events = _reply_ready(result)
            self._log_turn(events[0].reply, result.state, principal)
            return events

        return self.graph.stream(state, deadline_s=self._deadline(deadline_s), then=ready)

    async def aclose(self) -> None:
        """Close the live sources' connections (and the store's pool, for :meth:`from_store`); write what the turn
        log still holds, within its bound, and close it."""
        for source in self.live_sources:
            await source.aclose()
        if self.store is not None:
            await self.store.aclose()
        if self.turn_log is not None:
            await self.turn_log.aclose()


def _planning(
    retriever: Retriever,
    live_sources: Sequence[LiveSource],
    plan_sources: Sequence[Source],
    llm: openai.AsyncOpenAI | None,
    model: str | None,
    timeout_s: float,
) -> dict[str, Any]:
    """The plan node's collaborators when the application gives plan sources (none: no plan node).

    The documents (``documents``) and every live source (by its name) join ``plan_sources``; the offline planner
    plans over the first source with a schema, and backs up the model planner when there is a model.
    """
    if not plan_sources:
        return {}
    from ragloop.llm.planner import OfflinePlanner, SchemaSource
    from ragloop.retrievers.sources import DocumentSource, LiveLookupSource

    sources: dict[str, Source] = {"documents": DocumentSource(retriever)}
    sources.update({s.name: LiveLookupSource(s) for s in live_sources})
    sources.update({s.name: s for s in plan_sources})
    sql = next((s for s in plan_sources if isinstance(s, SchemaSource)), None)
    offline = OfflinePlanner(sql, live={s.name: s.name for s in live_sources})
    if llm is None or not model:
        return {"planner": offline, "plan_sources": sources}
    from ragloop.llm.openai_planner import OpenAIPlanner

    planner = OpenAIPlanner(llm, model, tuple(sources.values()), timeout_s=timeout_s)
    return {"planner": planner, "fallback_planner": offline, "plan_sources": sources}


def _reply_ready(result: RunResult) -> tuple[ReplyReady]:
    """The event that ends a chat stream, after the runner's :class:`RunFinished`."""
    return (ReplyReady(_reply(result), run_id=result.run_id),)


def _reusable(reply: Reply) -> bool:
    """A reply worth caching: found in the documents, finished, with nothing failed along the way."""
    record = reply.record
    return reply.outcome in ("context", "partial") and record.stopped_by == "end" and not record.errors


def _from_reply_cache(reply: Reply) -> Reply:
    """A cached reply as this turn's: no calls, no tokens, no cost, and a record that says it came from the cache."""
    import uuid

    import attrs

    from ragloop.turn import TokenCounts

    record = attrs.evolve(
        reply.record,
        run_id=uuid.uuid4().hex[:16],
        llm_calls=0,
        calls=(),
        tokens=TokenCounts(0, 0, 0),
        cost=None if reply.record.cost is None else 0.0,
        cache_hits={"reply": 1},
    )
    return attrs.evolve(reply, record=record)


def _reply(result: RunResult) -> Reply:
    """The turn's reply; its record is the one the runner built and logged (``turn.finished``)."""
    state: TurnState = result.state
    record = result.record if isinstance(result.record, TurnRecord) else turn_record(result)
    return Reply(
        text=state.answer,
        outcome=state.outcome or "none",
        citations=state.citations,
        blocks=state.blocks,
        missing=state.missing,
        record=record,
    )
