"""Server-side conversation memory: a small store protocol, the history caps and the in-memory store.

A chat client that starts a session (``new_session``) and then sends its ``session_id`` (instead of the whole
conversation) gets its earlier turns from a :class:`SessionStore`. Every session belongs to one **owner** (the
principal of the API key that started it) and is found by ``(owner, session_id)`` only: another owner's id is,
to a caller, exactly an id that does not exist. The history kept per session is capped by message count and
by characters (:class:`SessionLimits`), oldest messages dropped first, so a long conversation never grows a
prompt without bound.

Every store caps the sessions it keeps per principal and in all, and forgets idle ones (:class:`SessionQuota`):
one principal's flood of sessions costs that principal its own oldest sessions, never another's.

- :class:`MemorySessionStore`: in-process; the default (one replica).
- :class:`~ragloop.serve.SQLiteSessionStore`: a file on disk; survives restarts, shared by processes on one host.
- :class:`~ragloop.serve.PostgresSessionStore`: for replicas behind a load balancer (``psycopg``, async).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from attrs import define, field, frozen

from ragloop.serve._quota import QuotaCounts, SessionQuota, SessionsFull
from ragloop.state import Message

__all__ = ["MemorySessionStore", "SessionLimits", "SessionStore"]


@frozen
class SessionLimits:
    """How much history a session keeps.

    Attributes:
        max_messages: Most messages kept (user and assistant together), newest first.
        max_chars: Most characters kept over those messages.
    """

    max_messages: int = 20
    max_chars: int = 16_000

    def cap(self, messages: Sequence[Message]) -> tuple[Message, ...]:
        """The newest messages that fit both caps, oldest first."""
        kept: list[Message] = []
        chars = 0
        for message in reversed(messages[-self.max_messages :] if self.max_messages > 0 else ()):
            chars += len(message.content)
            if chars > self.max_chars:
                break
            kept.append(message)
        return tuple(reversed(kept))


@runtime_checkable
class SessionStore(Protocol):
    """Where conversations live between requests, each owned by one principal.

    A store finds a session by ``(owner, session_id)`` and nothing else, so one owner can neither read nor
    append to another's session, whatever id it sends, and learns nothing about which ids others use.
    """

    async def create(self, owner: str, session_id: str) -> bool:
        """Start an empty session; ``False`` (and nothing changed) when ``owner`` already has one by that id.

        A store with quotas drops ``owner``'s own least recently used session when ``owner`` is at its cap, and
        raises :class:`~ragloop.serve.SessionsFull` when the store as a whole is.
        """
        ...

    async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        """The session's history, oldest first; ``None`` when ``owner`` has no session by that id."""
        ...

    async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Add messages to ``owner``'s session, keeping what the limits allow; ``False`` (nothing written) when
        it has no such session: an append never creates one."""
        ...

    async def ping(self) -> None:
        """Raise when the store cannot be used (``/readyz`` asks)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


def encode(messages: Sequence[Message]) -> str:
    """Messages as the JSON text the SQL stores keep."""
    return json.dumps([[m.role, m.content] for m in messages], ensure_ascii=False)


def decode(raw: str) -> tuple[Message, ...]:
    """Messages from :func:`encode`'s JSON text."""
    return tuple(Message(role, content) for role, content in json.loads(raw))


@define
class MemorySessionStore:
    """Sessions in this process's memory, capped per principal and in all, idle ones expired.

    A principal starting a session over ``quota.per_owner`` loses its own least recently used session; a store
    holding ``quota.total`` sessions (after dropping the idle ones) refuses a new one with
    :class:`~ragloop.serve.SessionsFull` (the API's 429); no principal's session is ever dropped for another's.

    Attributes:
        limits: History caps per session.
        quota: Sessions per principal and in all, and the idle time after which a session is gone.
        clock: Monotonic seconds (a test can drive it).
        counts: Sessions evicted (a principal over its cap), expired and refused, for ``/metrics``.
    """

    limits: SessionLimits = SessionLimits()
    quota: SessionQuota = field(factory=SessionQuota)
    clock: Callable[[], float] = time.monotonic
    counts: QuotaCounts = field(factory=QuotaCounts)
    #: Every session, least recently used first: ``(owner, id) -> (last use, history)``.
    _data: OrderedDict[tuple[str, str], tuple[float, tuple[Message, ...]]] = field(factory=OrderedDict, init=False)
    #: Each owner's session ids, least recently used first.
    _owners: dict[str, OrderedDict[str, None]] = field(factory=dict, init=False)

    def _drop(self, key: tuple[str, str]) -> None:
        del self._data[key]
        ids = self._owners[key[0]]
        del ids[key[1]]
        if not ids:
            del self._owners[key[0]]

    def _expire(self) -> None:
        cutoff = self.clock() - self.quota.idle_s
        while self._data:
            key, (used, _) = next(iter(self._data.items()))
            if used > cutoff:
                break
            self._drop(key)
            self.counts.add("sessions", "expired")

    def _use(self, key: tuple[str, str], history: tuple[Message, ...]) -> None:
        self._data[key] = (self.clock(), history)
        self._data.move_to_end(key)
        ids = self._owners.setdefault(key[0], OrderedDict())
        ids[key[1]] = None
        ids.move_to_end(key[1])

    def _live(self, key: tuple[str, str]) -> tuple[Message, ...] | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry[0] <= self.clock() - self.quota.idle_s:
            self._drop(key)
            self.counts.add("sessions", "expired")
            return None
        return entry[1]

    async def create(self, owner: str, session_id: str) -> bool:
        """Start an empty session: the owner's oldest goes over its cap; raises :class:`SessionsFull` when full."""
        key = (owner, session_id)
        if self._live(key) is not None:
            return False
        self._expire()
        ids = self._owners.get(owner)
        while ids is not None and len(ids) >= self.quota.per_owner:
            self._drop((owner, next(iter(ids))))
            self.counts.add("sessions", "evicted")
            ids = self._owners.get(owner)
        if len(self._data) >= self.quota.total:
            self.counts.add("sessions", "refused")
            raise SessionsFull(self.quota.full_message())
        self._use(key, ())
        return True

    async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        """The session's history (and mark it used); ``None`` when there is none, or it was idle too long."""
        key = (owner, session_id)
        history = self._live(key)
        if history is not None:
            self._use(key, history)
        return history

    async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Add messages and cap the history; ``False`` when the session does not exist (or was dropped)."""
        key = (owner, session_id)
        history = self._live(key)
        if history is None:
            return False
        self._use(key, self.limits.cap((*history, *messages)))
        return True

    def sessions_of(self, owner: str) -> int:
        """How many sessions ``owner`` holds (idle ones included until they are next looked at)."""
        return len(self._owners.get(owner, ()))

    async def ping(self) -> None:
        """Always usable."""

    async def aclose(self) -> None:
        """Nothing to release."""

    def __len__(self) -> int:
        return len(self._data)
