"""Server-side conversation memory: a small store protocol, the history caps and the in-memory store.

A chat client that starts a session (``new_session``) and then sends its ``session_id`` (instead of the whole
conversation) gets its earlier turns from a :class:`SessionStore`. Every session belongs to one **owner** (the
principal of the API key that started it) and is found by ``(owner, session_id)`` only: another owner's id is,
to a caller, exactly an id that does not exist. The history kept per session is capped by message count and
by characters (:class:`SessionLimits`), oldest messages dropped first, so a long conversation never grows a
prompt without bound.

- :class:`MemorySessionStore`: in-process, least-recently-used eviction; the default (one replica).
- :class:`~ragloop.serve.SQLiteSessionStore`: a file on disk; survives restarts, shared by processes on one host.
- :class:`~ragloop.serve.PostgresSessionStore`: for replicas behind a load balancer (``psycopg``, async).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from attrs import define, field, frozen

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
        """Start an empty session; ``False`` (and nothing changed) when ``owner`` already has one by that id."""
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
    """Sessions in this process's memory, least recently used evicted first.

    Attributes:
        limits: History caps per session.
        max_sessions: Sessions kept before the least recently used one is dropped.
    """

    limits: SessionLimits = SessionLimits()
    max_sessions: int = 10_000
    _data: OrderedDict[tuple[str, str], tuple[Message, ...]] = field(factory=OrderedDict, init=False)

    async def create(self, owner: str, session_id: str) -> bool:
        """Start an empty session (evicting the least recently used ones over ``max_sessions``)."""
        key = (owner, session_id)
        if key in self._data:
            return False
        self._data[key] = ()
        while len(self._data) > self.max_sessions:
            self._data.popitem(last=False)
        return True

    async def load(self, owner: str, session_id: str) -> tuple[Message, ...] | None:
        """The session's history (and mark it recently used); ``None`` when there is none."""
        key = (owner, session_id)
        history = self._data.get(key)
        if history is not None:
            self._data.move_to_end(key)
        return history

    async def append(self, owner: str, session_id: str, messages: Sequence[Message]) -> bool:
        """Add messages and cap the history; ``False`` when the session does not exist (or was evicted)."""
        key = (owner, session_id)
        history = self._data.get(key)
        if history is None:
            return False
        self._data[key] = self.limits.cap((*history, *messages))
        self._data.move_to_end(key)
        return True

    async def ping(self) -> None:
        """Always usable."""

    async def aclose(self) -> None:
        """Nothing to release."""

    def __len__(self) -> int:
        return len(self._data)
