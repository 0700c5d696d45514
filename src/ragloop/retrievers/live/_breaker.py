"""A circuit breaker for a live source: stop knocking on a dead database, and notice when it is back.

``closed`` (calls go through) → ``threshold`` failures in a row → ``open`` (calls fail at once for
``cooldown_s``) → ``half_open``: the next call is the probe, the only one let through; if it succeeds the
breaker closes, if it fails the breaker opens again for twice as long (at most ``max_cooldown_s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from attrs import define, field

from ragloop.errors import ConfigError, LiveSourceError

State = Literal["closed", "open", "half_open"]


class CircuitOpen(LiveSourceError):
    """The breaker refused a call: ``retry_in`` seconds until the next probe (0: a probe is running now)."""

    def __init__(self, retry_in: float, failures: int) -> None:
        when = f"the next call in {retry_in:.1f}s probes it" if retry_in > 0 else "a probe is running"
        super().__init__(f"failed {failures} time(s) in a row and is not asked for now ({when})")
        self.retry_in = retry_in
        self.failures = failures


@define
class CircuitBreaker:
    """Closed, open or half-open, with one probe at a time. Thread-safe.

    Attributes:
        threshold: Failures in a row that open the breaker.
        cooldown_s: How long it stays open the first time (doubled after each failed probe).
        max_cooldown_s: The longest it stays open.
        clock: Monotonic seconds (tests pass a fake one).
        state: ``closed``, ``open`` or ``half_open``.
        failures: Failures in a row so far.
        opened: Times it opened (for the record and tests).
    """

    threshold: int = 3
    cooldown_s: float = 1.0
    max_cooldown_s: float = 30.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    state: State = field(default="closed", init=False)
    failures: int = field(default=0, init=False)
    opened: int = field(default=0, init=False)
    _opened_at: float = field(default=0.0, init=False, repr=False)
    _cooldown: float = field(default=0.0, init=False, repr=False)
    _probing: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(factory=threading.Lock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.threshold < 1 or self.cooldown_s <= 0 or self.max_cooldown_s < self.cooldown_s:
            raise ConfigError("threshold must be at least 1, cooldown_s positive and max_cooldown_s >= cooldown_s")
        self._cooldown = self.cooldown_s

    @property
    def is_open(self) -> bool:
        """Whether calls are being refused (open, or half-open with its probe running)."""
        return self.state == "open" or (self.state == "half_open" and self._probing)

    def admit(self) -> bool:
        """Let a call through: ``True`` when it is the probe. Raises :class:`CircuitOpen` when it may not run."""
        with self._lock:
            if self.state == "closed":
                return False
            if self.state == "open":
                left = self._opened_at + self._cooldown - self.clock()
                if left > 0:
                    raise CircuitOpen(left, self.failures)
                self.state = "half_open"
            if self._probing:
                raise CircuitOpen(0.0, self.failures)
            self._probing = True
            return True

    def succeeded(self, probe: bool) -> None:
        """A call went through: the breaker closes (after a probe) and the failure count resets."""
        with self._lock:
            if probe or self.state == "closed":
                self.state, self.failures, self._cooldown = "closed", 0, self.cooldown_s
            if probe:
                self._probing = False

    def cancelled(self, probe: bool) -> None:
        """A call was cancelled by its caller: no evidence either way; a cancelled probe lets the next call probe."""
        with self._lock:
            if probe:
                self._probing = False

    def failed(self, probe: bool) -> None:
        """A call failed: count it; open at the threshold, or again (twice as long) after a failed probe."""
        with self._lock:
            self.failures += 1
            if probe:
                self._probing = False
                self._cooldown = min(self._cooldown * 2, self.max_cooldown_s)
            if probe or (self.state == "closed" and self.failures >= self.threshold):
                self.state, self._opened_at = "open", self.clock()
                self.opened += 1
