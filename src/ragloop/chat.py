"""The public chat API: one object that answers questions over a knowledge index.

::

    rag = ChatRAG.from_index("kb-index/")                 # offline judges: no model, no network
    reply = await rag.ask("Compare plan pricing and SSO setup", page_url="https://…/docs/sso")
    reply.text, reply.citations, reply.outcome, reply.record

    async for event in rag.stream("How do I rotate an API key?"):   # progress events + tokens, for SSE
        ...

With ``llm=openai.AsyncOpenAI(...)`` the same graph uses OpenAI-compatible judges, with the offline decider
and answerer as fallbacks, so a failing model still yields an answer. The turn itself is assembled by
:class:`ragloop.turn.Turn` (``ChatRAG(turn)``); this module keeps only its use: questions in, replies out.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from attrs import evolve, frozen

from ragloop.errors import ConfigError
from ragloop.events import Event, EventStream
from ragloop.retrievers.base import Retriever
from ragloop.retrievers.filters import FiltersArg, check_retriever_filters
from ragloop.retrievers.live import LiveSource
from ragloop.runner import Graph, Node, RunResult
from ragloop.state import Caller, Citation, ContextBlock, Message, Outcome, TurnState
from ragloop.text.safety import client_url
from ragloop.turn import (
    BuiltTurn,
    IndexOptions,
    RetrieverOptions,
    StoreOptions,
    Turn,
    TurnRecord,
    TurnWiring,
    turn_record,
)
from ragloop.turn._settings import TurnSettings, turn_deadline
from ragloop.turn.request import (
    MAX_HISTORY_CHARS,
    MAX_HISTORY_MESSAGES,
    MAX_QUESTION_CHARS,
    turn_state,
    validate_question,
)

if TYPE_CHECKING:
    import openai

    from ragloop.caches import Caches
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.postgres import PostgresStore
    from ragloop.retrievers.scope import Corpus
    from ragloop.turnlog import Rating, TurnLog

__all__ = ["MAX_QUESTION_CHARS", "AskOptions", "ChatRAG", "Reply", "ReplyReady", "client_url", "validate_question"]


@frozen
class Reply:
    """The answer to one question.

    Attributes:
        text: The reply, with ``[n]`` citations.
        outcome: ``context``, ``partial``, ``none`` or ``direct``.
        citations: The ``[n]`` markers the reply streamed, resolved to their sources: one per page, numbered
            ``1..n`` in the order of first citation, each with the sections of the page it cites (the numbers
            the tokens streamed with; a page whose sentence verify took back stays listed).
        blocks: The numbered context the answer was written from (the answerer's block numbers, which are not
            the citation numbers: several blocks of one page share its citation).
        missing: Parts of the question that found no context.
        record: The per-turn decision record.
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
            "citations": [c.as_dict(c.url or None) for c in self.citations],
            "missing": list(self.missing),
            "record": self.record.as_dict(),
        }

    def client_dict(self, source_url: Callable[[str], str | None] | None = None) -> dict[str, Any]:
        """The reply as it may be sent to an end user: text, outcome, citations and what is missing.

        Never the decision record (queries, grades, errors, model names): keep that for your logs. A citation's
        ``url`` is an ``http(s)://`` URL or a relative path, or ``None``: a ``javascript:``, ``data:`` or other
        link (from a document's front matter or ``source_url``) never reaches the client.

        Args:
            source_url: Maps a citation's source to a link; by default a source that is itself an
                ``http(s)://`` URL links to itself and any other source has ``url`` ``None``.
        """
        link = source_url or _own_url
        return {
            "turn_id": self.turn_id,
            "text": self.text,
            "outcome": self.outcome,
            "citations": [c.as_dict(client_url(c.url or link(c.source)), client_url) for c in self.citations],
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


class AskOptions(TypedDict, total=False):
    """The keywords of :meth:`ChatRAG.ask` and :meth:`ChatRAG.stream`, besides the question.

    Attributes:
        history: Earlier messages (``Message`` or ``{"role", "content"}`` dicts), oldest first.
        page_url: URL of the page the user asks from (resolves "this page/project").
        page_title: Its title.
        deadline_s: Time limit for the turn (default: ``settings.deadline_s``).
        filters: Metadata filters for every search of the turn: ``{"tenant": "acme"}`` (equality) or
            ``{"version": ["1.0", "1.1"]}`` (any of); see :mod:`ragloop.retrievers.filters`.
        caller: Who asks (``Caller(tenant="Acme", user="u1")``); every live lookup receives it, so a source
            shows the user only what their organisation may see.
        principal: Who is authenticated, for the turn log: only they may rate the turn (default ``anonymous``).
    """

    history: Sequence[Message | Mapping[str, str]] | None
    page_url: str | None
    page_title: str | None
    deadline_s: float | None
    filters: FiltersArg | None
    caller: Caller | None
    principal: str | None


class ChatRAG:
    """Answers chat questions with a built turn: ``ask``, ``stream``, the reply cache and ``aclose``.

    ``ChatRAG(turn)`` runs a :class:`~ragloop.turn.Turn` (built here) or a :class:`~ragloop.turn.BuiltTurn`,
    reading its graph, settings, live sources, caches and store through ``self.turn`` (replace that and the next
    turn runs the new one); ``ChatRAG(retriever=..., decider=..., ...)``, the compatibility path, builds the default
    turn from its collaborators one by one (:class:`~ragloop.turn.TurnWiring`, :meth:`~ragloop.turn.Turn.of`);
    :meth:`from_index`, :meth:`from_store`, :meth:`from_retriever` and :meth:`sample` open one.

    Args:
        turn: The turn to run.
        max_question_chars: Longest question accepted.
        max_history_messages: Most earlier messages accepted as ``history``.
        max_history_chars: Longest history message accepted (characters).
        turn_log: Where finished turns go (:class:`~ragloop.turnlog.TurnLog`; ``None``: nothing is stored), for
            ``ragloop gaps`` and :meth:`feedback`; it never slows or fails a turn (a use of the chat, not a node).
        **wiring: Without ``turn``: the turn's collaborators (``retriever``, ``decider``, ``grader``,
            ``rewriter``, ``answerer`` required; see :class:`~ragloop.turn.TurnWiring`). With ``caches``
            whose ``replies`` cache is set, whole replies of :meth:`ask` to a question without history (same page,
            filters, caller and index version) are reused.

    Raises:
        ConfigError: Both a turn and wiring keywords, or neither (a required collaborator missing).
    """

    def __init__(
        self,
        turn: Turn | BuiltTurn | None = None,
        /,
        *,
        max_question_chars: int = MAX_QUESTION_CHARS,
        max_history_messages: int = MAX_HISTORY_MESSAGES,
        max_history_chars: int = MAX_HISTORY_CHARS,
        turn_log: TurnLog | None = None,
        **wiring: Unpack[TurnWiring],
    ) -> None:
        if turn is not None and wiring:
            raise ConfigError(f"pass a turn or its collaborators ({', '.join(sorted(wiring))}), not both")
        #: The turn this chat runs (``rag.turn = attrs.evolve(rag.turn, ...)``: the next turn runs the new one).
        self.turn: BuiltTurn = (turn or Turn.of(**wiring)).build() if not isinstance(turn, BuiltTurn) else turn
        self.max_question_chars = max_question_chars
        self.max_history_messages = max_history_messages
        self.max_history_chars = max_history_chars
        #: The turn log, if any (see ``turn_log``); :meth:`aclose` closes it.
        self.turn_log = turn_log

    @property
    def graph(self) -> Graph:
        """The graph the next turn runs (``turn.graph``; :func:`ragloop.otel.instrument` replaces it in ``turn``)."""
        return self.turn.graph

    @property
    def settings(self) -> TurnSettings:
        """The turn's settings (``turn.settings``)."""
        return self.turn.settings

    @property
    def live_sources(self) -> tuple[LiveSource, ...]:
        """The live sources the turn consults (``turn.live_sources``); :meth:`aclose` closes them."""
        return self.turn.live_sources

    @property
    def caches(self) -> Caches | None:
        """The turn's caches (``turn.caches``); :meth:`ask` uses the reply cache, when there is one."""
        return self.turn.caches

    @property
    def offline(self) -> bool:
        """True when every judge is offline (no model calls)."""
        return self.turn.offline

    @property
    def store(self) -> PostgresStore | None:
        """The Postgres store the turn opened (:meth:`from_store`); :meth:`aclose` closes it."""
        return self.turn.store

    @property
    def nodes(self) -> Mapping[str, Node]:
        """The nodes of the graph this chat runs, by name (read-only)."""
        return self.graph.nodes

    @classmethod
    def from_index(
        cls,
        index: str | os.PathLike[str] | KnowledgeIndex,
        llm: openai.AsyncOpenAI | None = None,
        **options: Unpack[IndexOptions],
    ) -> ChatRAG:
        """``ChatRAG(Turn.from_index(index, llm, **options))``: see :meth:`~ragloop.turn.Turn.from_index`."""
        return cls(Turn.from_index(index, llm, **options))

    @classmethod
    def from_store(cls, url: str, llm: openai.AsyncOpenAI | None = None, **options: Unpack[StoreOptions]) -> ChatRAG:
        """``ChatRAG(Turn.from_store(url, llm, **options))`` (:meth:`~ragloop.turn.Turn.from_store`).

        :meth:`aclose` closes the store's pool.
        """
        return cls(Turn.from_store(url, llm, **options))

    @classmethod
    def from_retriever(
        cls,
        retriever: Retriever,
        texts: Sequence[str] | Corpus,
        llm: openai.AsyncOpenAI | None = None,
        **options: Unpack[RetrieverOptions],
    ) -> ChatRAG:
        """``ChatRAG(Turn.from_retriever(retriever, texts, llm, **options))``: see
        :meth:`~ragloop.turn.Turn.from_retriever` (``texts`` feed the offline judges)."""
        return cls(Turn.from_retriever(retriever, texts, llm, **options))

    @classmethod
    def sample(
        cls,
        llm: openai.AsyncOpenAI | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[IndexOptions],
    ) -> ChatRAG:
        """A chat over the bundled sample knowledge base and its live ticket source (see
        :meth:`~ragloop.turn.Turn.sample`; built on first use, cached in ``cache_dir``)."""
        return cls(Turn.sample(llm, cache_dir=cache_dir, **options))

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
        """The validated state a turn starts from (raises :class:`InputError` on unusable input; see
        :func:`ragloop.turn.request.turn_state`; a filter key no chunk has is
        :class:`~ragloop.errors.UnknownFilterKey`)."""
        state = turn_state(
            question,
            history=history,
            page_url=page_url,
            page_title=page_title,
            filters=filters,
            caller=caller,
            max_question_chars=self.max_question_chars,
            max_history_messages=self.max_history_messages,
            max_history_chars=self.max_history_chars,
        )
        self.check_filters(state.filters)
        return state

    def check_filters(self, filters: Mapping[str, tuple[str, ...]] | None) -> None:
        """Refuse filters on a metadata key that no indexed chunk has (a misspelled key would find nothing).

        Nothing is checked while the retriever does not know its keys (an empty index, a store not yet read).

        Raises:
            UnknownFilterKey: A key no chunk has; the message lists the known keys.
        """
        check_retriever_filters(self.turn.retriever, filters)

    def _start(self, question: str, options: AskOptions) -> tuple[TurnState, float | None]:
        """The turn's validated state and deadline (``ask`` and ``stream`` check their input alike)."""
        state = self.new_state(
            question,
            history=options.get("history"),
            page_url=options.get("page_url"),
            page_title=options.get("page_title"),
            filters=options.get("filters"),
            caller=options.get("caller"),
        )
        return state, turn_deadline(self.settings, options.get("deadline_s"))

    async def ask(self, question: str, **options: Unpack[AskOptions]) -> Reply:
        """Answer one question.

        Args:
            question: The user's message.
            **options: ``history``, ``page_url``, ``page_title``, ``deadline_s``, ``filters``, ``caller``,
                ``principal``: see :class:`AskOptions`.

        Raises:
            InputError: The question, history, page context or filters are unusable (a filter key no chunk has
                is :class:`~ragloop.errors.UnknownFilterKey`); the message says why.
        """
        state, deadline = self._start(question, options)
        if self.store is not None and self.caches is not None and self.caches.replies is not None:
            await self.store.check_version()  # another replica's write changes the reply key at once
        key, replies = self._reply_key(state), self.caches.replies if self.caches is not None else None
        found = replies.get(key) if key is not None and replies is not None else None
        if isinstance(found, Reply):
            reply = _from_reply_cache(found)
        else:
            result = await self.graph.run(state, deadline_s=deadline)
            reply, state = _reply(result), result.state
            if key is not None and replies is not None and _reusable(reply):
                replies.set(key, reply)
        self._log_turn(reply, state, options.get("principal"))
        return reply

    def _log_turn(self, reply: Reply, state: TurnState, principal: str | None) -> None:
        if self.turn_log is not None:  # never raises, never blocks
            self.turn_log.record_turn(state, reply.record, reply.citations, principal=principal)

    async def feedback(
        self, turn_id: str, rating: Rating, *, comment: str | None = None, principal: str | None = None
    ) -> bool:
        """Rate ``principal``'s turn ``turn_id`` ``"up"`` or ``"down"``, with an optional ``comment``; ``False`` when
        the log holds no such turn of theirs (another principal's turn counts as unknown).

        Raises:
            ConfigError: The chat keeps no turn log.
            InputError: A bad rating or comment.
            TurnLogError: The log's database cannot be reached.
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
        return cache_key("reply", state.question, page, filters, caller, self.turn.index_version())

    def stream(self, question: str, **options: Unpack[AskOptions]) -> EventStream:
        """Answer one question as a stream of events: progress, answer tokens, then :class:`ReplyReady`.

        The input is checked here, before any event (an :class:`InputError` is raised by this call). Use it as
        ``async for event in rag.stream(q)`` or ``async with rag.stream(q) as events``; stopping the iteration
        (``break`` — even while the stream is still referenced —, ``aclose()``, cancellation, a client that
        disconnects) cancels the turn's in-flight work. The keywords are as in :meth:`ask`.
        """
        state, deadline = self._start(question, options)
        principal = options.get("principal")

        def ready(result: RunResult) -> tuple[Event, ...]:
            event = ReplyReady(_reply(result), run_id=result.run_id)  # ends the stream, after RunFinished
            self._log_turn(event.reply, result.state, principal)
            return (event,)

        return self.graph.stream(state, deadline_s=deadline, then=ready)

    async def aclose(self) -> None:
        """Close the live sources' connections, the store's pool, the turn log and a ranker's client."""
        for source in self.live_sources:
            await source.aclose()
        if (closer := getattr(getattr(self.nodes.get("answer"), "ranker", None), "aclose", None)) is not None:
            await closer()
        if self.store is not None:
            await self.store.aclose()
        if self.turn_log is not None:
            await self.turn_log.aclose()


def _reusable(reply: Reply) -> bool:
    """A reply worth caching: found in the documents, finished, with nothing failed along the way."""
    record = reply.record
    return reply.outcome in ("context", "partial") and record.stopped_by == "end" and not record.errors


def _from_reply_cache(reply: Reply) -> Reply:
    """A cached reply as this turn's: no calls, no tokens, no cost, and a record that says it came from the cache."""
    from ragloop.turn._record import replayed_record

    return evolve(reply, record=replayed_record(reply.record, uuid.uuid4().hex[:16]))


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
