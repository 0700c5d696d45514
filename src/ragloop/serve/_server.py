"""The app's state and one turn's run: slots, the session history, metrics, readiness."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio

from ragloop._log import get_logger
from ragloop.chat import ReplyReady
from ragloop.errors import InputError
from ragloop.events import Event, EventStream, NodeFinished, Token
from ragloop.serve._metrics import Metrics
from ragloop.serve._sessions import SessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected
from ragloop.serve._validate import _Turn
from ragloop.state import Message

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

log = get_logger("ragloop.serve")


class _Server:
    """The app's state: the rag, the limits, the session store, the metrics, the slots in use."""

    def __init__(
        self,
        rag: ChatRAG,
        settings: ServeSettings,
        sessions: SessionStore,
        source_url: Callable[[str], str | None] | None,
        model_check: Callable[[], Awaitable[bool]] | None,
    ) -> None:
        self.rag = rag
        self.settings = settings
        self.sessions = sessions
        self.source_url = source_url
        self.model_check = model_check
        self.metrics = Metrics()
        self.metrics.watch_turn_log(lambda: getattr(self.rag, "turn_log", None))
        self.active = 0
        self._ready_at = 0.0
        self._ready = False

    def take_slot(self) -> None:
        limit = self.settings.max_concurrent_turns
        if self.active >= limit:
            self.metrics.rejected.labels(reason="busy").inc()
            raise Rejected(
                429,
                f"server busy: {limit} turns in flight (the limit); retry after {self.settings.retry_after_s} s",
                kind="rate_limit_error",
                code="busy",
                headers={"retry-after": str(self.settings.retry_after_s)},
            )
        self.active += 1
        self.metrics.in_flight.inc()

    def release_slot(self) -> None:
        self.active -= 1
        self.metrics.in_flight.dec()

    # --- running a turn -------------------------------------------------------------------------------

    async def events(self, turn: _Turn) -> AsyncGenerator[Event, None]:
        """The turn's events, counted in the metrics; raises :class:`Rejected` (before the first event) on bad input.

        The first event comes as soon as the input is accepted (so a caller can send its status line then);
        callers use :class:`Progress`, :class:`Token` and :class:`ReplyReady` and skip the rest.
        """
        started = time.perf_counter()
        first_token = True
        history = turn.history
        if turn.session_id is not None:
            history = self.settings.history.cap(await self._recall(turn.session_id))
        metrics = self.metrics
        try:  # ChatRAG.stream checks its input when called; an override written as a generator checks it later
            stream: EventStream | AsyncGenerator[Event, None] = self.rag.stream(
                turn.question,
                history=history,
                page_url=turn.page_url,
                page_title=turn.page_title,
                deadline_s=self.settings.deadline_s,
                principal=turn.principal,
            )
        except InputError as exc:
            metrics.rejected.labels(reason="invalid").inc()
            raise Rejected(400, str(exc), param=turn.question_param) from None
        async with aclosing(stream):
            try:
                event = await anext(stream)
            except InputError as exc:
                metrics.rejected.labels(reason="invalid").inc()
                raise Rejected(400, str(exc), param=turn.question_param) from None
            while True:
                if isinstance(event, NodeFinished):
                    metrics.node_seconds.labels(node=event.node).observe(event.duration)
                elif first_token and isinstance(event, Token) and event.text:
                    metrics.first_token_seconds.observe(time.perf_counter() - started)
                    first_token = False
                if isinstance(event, ReplyReady):
                    reply = event.reply
                    metrics.observe_record(reply.outcome, reply.record.as_dict())
                    if turn.session_id is not None:
                        await self._remember(turn, reply.text)
                yield event
                try:
                    event = await anext(stream)
                except StopAsyncIteration:
                    return

    async def _recall(self, session_id: str) -> tuple[Message, ...]:
        try:
            return await self.sessions.load(session_id)
        except Exception:  # a session store outage costs the turn its history, not its answer (logged, counted)
            log.exception("session store failed", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()
            return ()

    async def _remember(self, turn: _Turn, answer: str) -> None:
        assert turn.session_id is not None
        try:
            await self.sessions.append(turn.session_id, (Message("user", turn.question), Message("assistant", answer)))
        except Exception:  # a session store outage must not cost the user the answer in hand (logged)
            log.exception("session store failed", session_store=type(self.sessions).__name__)
            self.metrics.session_errors.inc()

    def client_reply(self, reply: Reply, session_id: str | None) -> dict[str, Any]:
        out = reply.client_dict(self.source_url)
        if getattr(self.rag, "turn_log", None) is not None:  # the chat page shows thumbs only then
            out["feedback"] = True
        if session_id is not None:
            out["session_id"] = session_id
        return out

    async def ready(self) -> tuple[bool, dict[str, str]]:
        checks = {"index": "ok"}
        if self.model_check is None:
            checks["model"] = "not configured"
            return True, checks
        now = time.monotonic()
        if now - self._ready_at > 5.0:  # a probe at most every 5 s, however often /readyz is polled
            try:
                with anyio.fail_after(3.0):
                    self._ready = await self.model_check()
            except Exception:  # noqa: BLE001 — fail-open: any probe failure means "not ready", never a 500
                self._ready = False
            self._ready_at = now
        checks["model"] = "ok" if self._ready else "unreachable"
        return self._ready, checks
