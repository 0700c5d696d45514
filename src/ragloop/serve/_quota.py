"""Per-principal quotas: what one API key may hold of what every key shares.

Every limit here is counted **per principal first** and only then against a total, so one key that floods the
server spends its own allowance and never another key's: over its session cap it loses its *own* oldest
session; over its share of the turn slots, its MCP session cap or its feedback rate it gets 429 with
``Retry-After``; the totals (sessions in a store, turn slots, MCP sessions) are refused, never made room for by
evicting someone else. Principals come from the configured keys, so the per-key tables here hold at most one
entry per configured principal.

The counting lives in this one module (in-process, one replica), so that a fleet can later back it with a shared
store without touching the endpoints. Each refusal and eviction is counted in :class:`QuotaCounts`, which
``/metrics`` exposes as ``ragloop_quota_events{limit, action}``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

from attrs import define, field, frozen

from ragloop.errors import ConfigError, RagloopError

__all__ = ["KeyedRate", "KeyedSessions", "KeyedSlots", "QuotaCounts", "SessionQuota", "SessionsFull"]


class SessionsFull(RagloopError):
    """The session store holds its total of sessions (none of them idle long enough to expire); the API answers
    429: another principal's session is never dropped to make room."""


@frozen
class SessionQuota:
    """How many conversations a session store keeps, per principal and in all, and for how long.

    Attributes:
        per_owner: Most sessions one principal keeps; starting one more drops that principal's own least
            recently used session (never another principal's).
        idle_s: A session with no turn for this long is gone (reads as unknown, and its row is deleted).
        total: Most sessions the store keeps in all; when full (after the idle ones are deleted) a new session
            is refused (:class:`SessionsFull`, HTTP 429) rather than taking room from anyone.
    """

    per_owner: int = 1_000
    idle_s: float = 86_400.0
    total: int = 100_000

    def __attrs_post_init__(self) -> None:
        if self.per_owner < 1 or self.total < 1:
            raise ConfigError(
                f"session quotas must be at least 1, got per_owner={self.per_owner} and total={self.total}"
            )
        if not (self.idle_s > 0 and math.isfinite(self.idle_s)):
            raise ConfigError(f"idle_s must be a positive number of seconds, got {self.idle_s!r}")

    def full_message(self) -> str:
        """What a client refused by :class:`SessionsFull` is told."""
        return (
            f"the session store holds its limit of {self.total:,} conversations; retry later, or send the "
            "history yourself instead of a session_id"
        )


@define
class QuotaCounts:
    """Thread-safe counters of quota events, by limit and action (``evicted``, ``expired``, ``refused``)."""

    _counts: dict[tuple[str, str], int] = field(factory=dict, init=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False)

    def add(self, limit: str, action: str, n: int = 1) -> None:
        """Count ``n`` events of ``action`` on ``limit`` (nothing for ``n <= 0``)."""
        if n > 0:
            with self._lock:
                self._counts[limit, action] = self._counts.get((limit, action), 0) + n

    def get(self, limit: str, action: str) -> int:
        """How many events of ``action`` on ``limit`` were counted."""
        with self._lock:
            return self._counts.get((limit, action), 0)

    def items(self) -> Iterator[tuple[tuple[str, str], int]]:
        """Every ``((limit, action), count)``, a snapshot."""
        with self._lock:
            return iter(sorted(self._counts.items()))


@define
class KeyedSlots:
    """Turn slots: at most ``total`` in flight, of which at most ``per_key`` for any one principal.

    Attributes:
        total: Slots in all (``--max-concurrency``).
        per_key: Slots one principal may hold at once.
    """

    total: int
    per_key: int
    _held: dict[str, int] = field(factory=dict, init=False)
    _active: int = field(default=0, init=False)

    @property
    def active(self) -> int:
        """Slots held now, by every principal."""
        return self._active

    def held(self, key: str) -> int:
        """Slots ``key`` holds now."""
        return self._held.get(key, 0)

    def take(self, key: str) -> str | None:
        """Take a slot for ``key``; ``None`` when taken, else which limit refused it (``"total"``, ``"per_key"``)."""
        if self._active >= self.total:  # the server is full: say so, whoever holds the slots
            return "total"
        if self._held.get(key, 0) >= self.per_key:
            return "per_key"
        self._held[key] = self._held.get(key, 0) + 1
        self._active += 1
        return None

    def release(self, key: str) -> None:
        """Give back one of ``key``'s slots."""
        left = self._held.get(key, 0) - 1
        if left < 0:
            raise RuntimeError(f"released a turn slot {key!r} did not hold")
        if left:
            self._held[key] = left
        else:
            del self._held[key]
        self._active -= 1


@define
class KeyedSessions:
    """Open sessions (MCP) by principal, each with its last use, least recently used first.

    Attributes:
        per_key: Most sessions one principal may hold open.
        idle_s: A session unused this long is due to be closed.
        clock: Monotonic seconds (a test can drive it).
    """

    per_key: int
    idle_s: float
    clock: Callable[[], float] = time.monotonic
    _by_key: dict[str, OrderedDict[str, float]] = field(factory=dict, init=False)
    _owner: dict[str, str] = field(factory=dict, init=False)

    def count(self, key: str) -> int:
        """Sessions ``key`` holds open."""
        return len(self._by_key.get(key, ()))

    def __len__(self) -> int:
        return len(self._owner)

    def keys(self) -> list[str]:
        """The principals holding sessions now."""
        return list(self._by_key)

    def of(self, key: str) -> list[str]:
        """``key``'s sessions, least recently used first."""
        return list(self._by_key.get(key, ()))

    def owner(self, session_id: str) -> str | None:
        """The principal holding ``session_id`` (``None``: not tracked)."""
        return self._owner.get(session_id)

    def add(self, key: str, session_id: str) -> None:
        """Track a new session of ``key``'s."""
        self._by_key.setdefault(key, OrderedDict())[session_id] = self.clock()
        self._owner[session_id] = key

    def touch(self, session_id: str) -> None:
        """Mark ``session_id`` used now."""
        key = self._owner.get(session_id)
        if key is not None:
            sessions = self._by_key[key]
            sessions[session_id] = self.clock()
            sessions.move_to_end(session_id)

    def discard(self, session_id: str) -> None:
        """Forget ``session_id`` (closed, or terminated by its client)."""
        key = self._owner.pop(session_id, None)
        if key is not None:
            sessions = self._by_key[key]
            sessions.pop(session_id, None)
            if not sessions:
                del self._by_key[key]

    def idle(self) -> list[str]:
        """Sessions unused for ``idle_s`` or longer (to be closed), of every principal."""
        cutoff = self.clock() - self.idle_s
        out: list[str] = []
        for sessions in self._by_key.values():
            for sid, used in sessions.items():  # least recently used first: stop at the first fresh one
                if used > cutoff:
                    break
                out.append(sid)
        return out


@define
class KeyedRate:
    """At most ``limit`` events per principal in any ``window_s`` seconds (a sliding log per principal).

    Attributes:
        limit: Events allowed per window and principal.
        window_s: The window, in seconds.
        clock: Monotonic seconds (a test can drive it).
    """

    limit: int
    window_s: float
    clock: Callable[[], float] = time.monotonic
    _events: dict[str, list[float]] = field(factory=dict, init=False)

    def allow(self, key: str) -> float | None:
        """Count one event of ``key``'s: ``None`` when allowed, else the seconds until the next one would be."""
        now = self.clock()
        recent = [t for t in self._events.get(key, ()) if t > now - self.window_s]
        if len(recent) >= self.limit:
            self._events[key] = recent
            return max(0.0, recent[0] + self.window_s - now)
        recent.append(now)
        self._events[key] = recent
        return None
