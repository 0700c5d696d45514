"""The app's state and one turn's run: slots, the principal's session, clean text, store outages, readiness."""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from ragloop._log import get_logger
from ragloop.chat import ReplyReady, client_url
from ragloop.errors import InputError, StoreBusy, UnknownFilterKey
from ragloop.events import Event, EventStream, NodeFinished, Progress, Token
from ragloop.serve._metrics import Metrics
from ragloop.serve._outage import refusal, searches
from ragloop.serve._quota import KeyedRate, KeyedSlots, QuotaCounts, SessionQuota, SessionsFull
from ragloop.serve._scrub import TextScrubber, scrub
from ragloop.serve._sessions import SessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected
from ragloop.serve._validate import _ChatRequest
from ragloop.state import Chunk, Message

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

log = get_logger("ragloop.serve")


_PYTHON_ADVICE = re.compile(r"[,;]?\s*(?:or )?pass a larger \w+ to ChatRAG|[,;]?\s*e\.g\. rag\.\w+\(.*?\)(?=$|[;.])")


def for_clients(message: str, param: str) -> str:
    """A library error's message as an HTTP client should read it: the Python advice (``rag.ask(...)``, a
    ``ChatRAG`` argument) left out, since such a client can neither call nor configure that."""
    if message.startswith("question is empty"):
        return f"the question ({param}) is empty or only control characters: send the user's message"
    return _PYTHON_ADVICE.sub("", message).rstrip(" ,;") or message


def _clean(reply: Reply) -> Reply:
    """The reply with its text, titles (the sections' too), sources and missing parts scrubbed of escapes and
    control characters."""
    citations = tuple(
        attrs.evolve(
            c,
            title=scrub(c.title),
            source=scrub(c.source),
            sections=tuple(attrs.evolve(s, title=scrub(s.title)) for s in c.sections),
        )
        for c in reply.citations
    )
    return attrs.evolve(
        reply, text=scrub(reply.text), citations=citations, missing=tuple(scrub(m) for m in reply.missing)
    )


class _ClientView:
    """What the client of one turn is shown: metrics counted, text scrubbed, tokens held after a failed search."""

    def __init__(self, server: _Server, turn: _ChatRequest) -> None:
        self.server = server
        self.turn = turn
        self.started = time.perf_counter()
        self.first_token = True
        self.scrubber = TextScrubber()
        #: Tokens kept back once a search failed, until the reply shows whether the knowledge base was down.
        self.held: list[Token] | None = None
        self.failed = self.answered = self.busy = 0

    async def show(self, event: Event) -> list[Event]:
        """The events to pass on for ``event`` (none while tokens are held); :class:`Rejected` 503 on an outage."""
        metrics = self.server.metrics
        if isinstance(event, NodeFinished):
            metrics.node_seconds.labels(node=event.node).observe(event.duration)
        elif isinstance(event, Progress):
            failed, answered, busy = searches(event)
            self.failed, self.answered, self.busy = self.failed + failed, self.answered + answered, self.busy + busy
            if failed and self.held is None:
                self.held = []
            event = attrs.evolve(event, message=scrub(event.message))
        elif isinstance(event, Token):
            event = attrs.evolve(event, text=self.scrubber.feed(event.text))
            if self.first_token and event.text:
                metrics.first_token_seconds.observe(time.perf_counter() - self.started)
                self.first_token = False
            if self.held is not None:
                self.held.append(event)
                return []
        elif isinstance(event, ReplyReady):
            reply = _clean(event.reply)
            metrics.observe_record(reply.outcome, reply.record.as_dict())
            refused = refusal(reply.outcome, self.failed, self.answered, self.busy, self.server.settings.retry_after_s)
            if refused is not None:
                metrics.rejected.labels(reason=refused.code).inc()
                log.error(refused.message, errors=list(reply.record.errors)[:5])
                raise refused
            if self.turn.session_id is not None:
                await self.server.remember(self.turn, reply.text)
            held, self.held = self.held or [], None
            return [*held, ReplyReady(reply, run_id=event.run_id)]
        return [event]


@attrs.frozen
class _Bounds:
    """The two ways :meth:`_Server.bounded` ends a turn early."""

    stopping: anyio.CancelScope
    limit: anyio.CancelScope

    @property
    def stopped(self) -> bool:
        """The server is shutting down and cancelled the turn."""
        return self.stopping.cancelled_caught

    @property
    def timed_out(self) -> bool:
        """The turn ran past its deadline and grace."""
        return self.limit.cancelled_caught


class _Server:
    """The app's state: the rag, the limits, the session store, the metrics, the slots in use."""

    def __init__(
        self,
        rag: ChatRAG,
        settings: ServeSettings,
        sessions: SessionStore,
        source_url: Callable[[str], str | None] | None,
        checks: dict[str, Callable[[], Awaitable[bool]]],
    ) -> None:
        self.rag = rag
        self.settings = settings
        self.sessions = sessions
        self.source_url = source_url
        self.checks = checks
        self.metrics = Metrics()
        self.metrics.watch_turn_log(lambda: getattr(self.rag, "turn_log", None))
        self.slots = KeyedSlots(settings.max_concurrent_turns, settings.turns_per_key())
        self.feedback_rate = KeyedRate(settings.feedback_per_key, settings.feedback_window_s)
        #: Refusals by the per-key limits of the serve layer (slots, MCP sessions, feedback), for ``/metrics``.
        self.quota_counts = QuotaCounts()
        self.metrics.watch_quotas(self._quota_events, self._quota_limits)
        #: Set by :meth:`shut_down`: new turns get 503 and the turns in flight are cancelled.
        self.closing = False
        self.in_flight: set[anyio.CancelScope] = set()
        self._ready_at = float("-inf")
        self._ready: tuple[bool, dict[str, str]] = (False, {})

    def _quota_events(self) -> list[tuple[tuple[str, str], int]]:
        store_counts = getattr(self.sessions, "counts", None)  # a store of one's own may keep none
        return [*self.quota_counts.items(), *(store_counts.items() if isinstance(store_counts, QuotaCounts) else ())]

    def _quota_limits(self) -> dict[str, float]:
        s = self.settings
        quota = getattr(self.sessions, "quota", None)
        quota = quota if isinstance(quota, SessionQuota) else None
        limits: dict[str, float] = {
            "turn_slots": s.max_concurrent_turns,
            "turn_slots_per_key": self.slots.per_key,
            "mcp_sessions_per_key": s.mcp_sessions_per_key,
            "mcp_sessions": s.mcp_max_sessions,
            "mcp_idle_seconds": s.mcp_idle_s,
            "feedback_per_key": s.feedback_per_key,
            "feedback_window_seconds": s.feedback_window_s,
        }
        if quota is not None:
            limits |= {"sessions_per_key": quota.per_owner, "sessions": quota.total}
            limits["session_idle_seconds"] = quota.idle_s
        return limits

    @property
    def active(self) -> int:
        """Turns in flight now, of every principal."""
        return self.slots.active

    def take_slot(self, principal: str) -> None:
        """Take one of ``principal``'s turn slots, or raise :class:`Rejected` 429 (503 while shutting down)."""
        retry = {"retry-after": str(self.settings.retry_after_s)}
        if self.closing:
            raise Rejected(
                503, "the server is shutting down; retry on another replica or in a moment", kind="server_error",
                code="shutting_down", headers=retry,
            )  # fmt: skip
        refused = self.slots.take(principal)
        if refused == "total":
            self.metrics.rejected.labels(reason="busy").inc()
            self.quota_counts.add("turn_slots", "refused")
            raise Rejected(
                429,
                f"server busy: {self.slots.total} turns in flight (the limit); retry after "
                f"{self.settings.retry_after_s} s",
                kind="rate_limit_error",
                code="busy",
                headers=retry,
            )
        if refused == "per_key":
            self.metrics.rejected.labels(reason="key_busy").inc()
            self.quota_counts.add("turn_slots_per_key", "refused")
            raise Rejected(
                429,
                f"this API key has {self.slots.per_key} turns in flight, its share of the server's "
                f"{self.slots.total} (max_turns_per_key); retry after {self.settings.retry_after_s} s",
                kind="rate_limit_error",
                code="key_busy",
                headers=retry,
            )
        self.metrics.in_flight.inc()

    def count_feedback(self, principal: str) -> None:
        """Count one feedback request of ``principal``'s, or raise :class:`Rejected` 429 over its rate."""
        wait = self.feedback_rate.allow(principal)
        if wait is not None:
            self.metrics.rejected.labels(reason="feedback_per_key").inc()
            self.quota_counts.add("feedback_per_key", "refused")
            s = self.settings
            raise Rejected(
                429,
                f"this API key sent {s.feedback_per_key} ratings in {s.feedback_window_s:g} s (feedback_per_key); "
                f"retry in {math.ceil(wait)} s",
                kind="rate_limit_error",
                code="feedback_rate",
                headers={"retry-after": str(max(1, math.ceil(wait)))},
            )

    def release_slot(self, principal: str) -> None:
        """Give back one of ``principal``'s turn slots."""
        self.slots.release(principal)
        self.metrics.in_flight.dec()

    @contextmanager
    def bounded(self) -> Iterator[_Bounds]:
        """A scope for one turn: cut off ``deadline_grace_s`` past its deadline, cancelled by :meth:`shut_down`.

        After the block, :attr:`_Bounds.stopped` says the server is stopping and :attr:`_Bounds.timed_out` that the
        turn overran; either way the work inside was cancelled.
        """
        deadline = self.settings.deadline_s
        # A turn overrunning its deadline by this much is stuck somewhere: cut it off.
        hard_limit = None if deadline is None else deadline + self.settings.deadline_grace_s
        with anyio.CancelScope() as stopping, anyio.move_on_after(hard_limit) as limit:
            bounds = _Bounds(stopping, limit)
            self.in_flight.add(stopping)
            try:
                yield bounds
            finally:
                self.in_flight.discard(stopping)

    def shut_down(self) -> None:
        """Refuse new turns and cancel the ones in flight (each ends with an error saying the server stops)."""
        self.closing = True
        for scope in tuple(self.in_flight):
            scope.cancel()

    # --- the session ------------------------------------------------------------------------------------

    async def prepare(self, turn: _ChatRequest) -> _ChatRequest:
        """The turn with its session resolved: a new session started, or an existing one's history loaded.

        Raises :class:`Rejected` 404 for a session the principal does not have — whether no one has it or another
        principal does: the same status, body and headers after the same one lookup, so nothing tells them apart.
        """
        owner = turn.principal.name
        if turn.new_session:
            sid = await self._start(owner, turn.session_id)
            return attrs.evolve(turn, session_id=sid, new_session=False, history=())
        if turn.session_id is None:
            return turn
        try:
            history = await self.sessions.load(owner, turn.session_id)
        except Exception:  # a session store outage costs the turn its history, not its answer (logged, counted)
            log.exception("session store failed", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()
            return attrs.evolve(turn, history=())
        if history is None:
            self.metrics.rejected.labels(reason="unknown_session").inc()
            raise Rejected(
                404,
                f'unknown session_id {turn.session_id!r}: start one with "new_session": true (the reply carries '
                "its session_id), or send the history yourself",
                param="session_id",
                code="unknown_session",
            )
        return attrs.evolve(turn, history=self.settings.history.cap(history))

    async def _start(self, owner: str, chosen: str | None) -> str:
        for _ in range(3):  # a server-made id (144 random bits) that exists already: practically never
            sid = chosen if chosen is not None else secrets.token_urlsafe(18)
            try:
                created = await self.sessions.create(owner, sid)
            except SessionsFull as exc:  # the store is full; no one else's session is dropped for this one
                self.metrics.rejected.labels(reason="sessions_full").inc()
                raise Rejected(
                    429,
                    str(exc),
                    kind="rate_limit_error",
                    code="sessions_full",
                    headers={"retry-after": str(max(self.settings.retry_after_s, 60))},
                ) from None
            except Exception:  # logged; the client asked for a session it cannot have now
                log.exception("session store failed", session_store=type(self.sessions).__name__)
                self.metrics.session_errors.inc()
                raise Rejected(
                    503,
                    "the session store is unavailable, so no session can start; retry, or send the history yourself",
                    kind="server_error",
                    code="sessions_unavailable",
                ) from None
            if created:
                return sid
            if chosen is not None:
                raise Rejected(
                    409,
                    f"session_id {chosen!r} exists already: leave out new_session to continue it",
                    param="session_id",
                    code="session_exists",
                )
        raise RuntimeError("three fresh random session ids all existed")  # pragma: no cover

    async def remember(self, turn: _ChatRequest, answer: str) -> None:
        """Append the question and the answer to the turn's session (a failure is logged and counted)."""
        assert turn.session_id is not None
        messages = (Message("user", turn.question), Message("assistant", answer))
        try:
            kept = await self.sessions.append(turn.principal.name, turn.session_id, messages)
        except Exception:  # a session store outage must not cost the user the answer in hand (logged)
            log.exception("session store failed", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()
            return
        if not kept:  # evicted (memory store) or deleted while the turn ran
            log.warning("session gone before its turn was saved", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()

    # --- running a turn -------------------------------------------------------------------------------

    def _stream(self, turn: _ChatRequest) -> EventStream | AsyncGenerator[Event, None]:
        return self.rag.stream(
            turn.question,
            history=turn.history,
            page_url=turn.page_url,
            page_title=turn.page_title,
            deadline_s=self.settings.deadline_s,
            filters=dict(turn.filters),
            caller=turn.caller,
            principal=turn.principal.name,
        )

    async def events(self, turn: _ChatRequest) -> AsyncGenerator[Event, None]:
        """The turn's events, counted and cleaned; raises :class:`Rejected` (before the first event) on bad input.

        ``turn`` has been through :meth:`prepare`. The first event comes as soon as the input is accepted (so a
        caller can send its status line then); callers use :class:`Progress`, :class:`Token` and
        :class:`ReplyReady` and skip the rest. Token and reply texts are scrubbed of escape sequences; once a
        search has failed, tokens are held back until the reply shows whether the knowledge base was down (then
        :class:`Rejected` 503, never a "found nothing" answer).
        """
        try:  # ChatRAG.stream checks its input when called; an override written as a generator checks it later
            stream = self._stream(turn)
        except InputError as exc:
            raise self._invalid(exc, turn) from None
        view = _ClientView(self, turn)
        async with aclosing(stream):
            try:
                event: Event | None = await anext(stream)
            except InputError as exc:
                raise self._invalid(exc, turn) from None
            while event is not None:
                for shown in await view.show(event):
                    yield shown
                event = await anext(stream, None)

    def _invalid(self, exc: InputError, turn: _ChatRequest) -> Rejected:
        """The 400 for input the chat refused: ``param`` names the field at fault, the message is for an HTTP
        client (no Python advice)."""
        self.metrics.rejected.labels(reason="invalid").inc()
        param = "filters" if isinstance(exc, UnknownFilterKey) else turn.question_param
        return Rejected(400, for_clients(str(exc), param), param=param)

    async def reply(self, turn: _ChatRequest) -> Reply:
        """Run ``turn`` (prepared) to its end: the reply, shown as :meth:`events` shows it."""
        async with aclosing(self.events(turn)) as events:
            async for event in events:
                if isinstance(event, ReplyReady):
                    return event.reply
        raise RuntimeError("the turn ended without a reply")

    def client_url(self, chunk: Chunk) -> str | None:
        """The link a client may follow to ``chunk``'s document, as citations get it (or ``None``)."""
        source = chunk.source
        if chunk.url:
            return client_url(chunk.url)
        if self.source_url is not None:
            return client_url(self.source_url(source))
        return client_url(source if source.startswith(("https://", "http://")) else None)

    def client_reply(self, reply: Reply, session_id: str | None) -> dict[str, Any]:
        out = reply.client_dict(self.source_url)
        if getattr(self.rag, "turn_log", None) is not None:  # the chat page shows thumbs only then
            out["feedback"] = True
        if session_id is not None:
            out["session_id"] = session_id
        return out

    async def ready(self) -> tuple[bool, dict[str, str]]:
        """Whether every probe passes, and each probe's word (``ok``, ``busy``, ``unavailable``, ``not configured``;
        ``busy``: a store that answers with every connection in use, which counts as ready)."""
        now = time.monotonic()
        if now - self._ready_at < self.settings.ready_interval_s:  # probes at most this often, however often polled
            return self._ready
        results: dict[str, str] = {"index": "ok"}

        async def probe(name: str, check: Callable[[], Awaitable[bool]]) -> None:
            ok = False
            try:
                with anyio.fail_after(3.0):
                    ok = await check()
            except StoreBusy:
                # Up, every connection in use: ready. Failing it would take every replica of a fleet on one
                # busy database out of rotation at once, moving the load nowhere.
                results[name] = "busy"
                return
            except Exception:  # noqa: BLE001 — fail-open: any probe failure means "not ready", never a 500
                ok = False
            results[name] = "ok" if ok else "unreachable" if name == "model" else "unavailable"

        async with anyio.create_task_group() as tg:
            for name, check in self.checks.items():
                tg.start_soon(probe, name, check)
        results.setdefault("model", "not configured")
        ok = all(v in ("ok", "busy", "not configured") for v in results.values())
        self._ready, self._ready_at = (ok, results), now
        return self._ready
