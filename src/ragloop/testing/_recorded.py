"""What the scripted server saw: :class:`RecordedRequest` (one request) and :class:`ServerStats` (counters)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen


@frozen
class RecordedRequest:
    """One request the server received.

    Attributes:
        index: 0-based arrival order over all endpoints.
        method: HTTP method.
        path: Request path, e.g. ``/v1/chat/completions``.
        headers: Request headers, names lower-cased.
        body: The parsed JSON body (``None`` if it was not JSON).
        received_at: ``time.monotonic()`` when the request arrived.
    """

    index: int
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    received_at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat ``messages`` sent (empty for other endpoints)."""
        if isinstance(self.body, dict):
            return list(self.body.get("messages", []))
        return []

    @property
    def model(self) -> str | None:
        """The ``model`` requested."""
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def judge(self) -> str:
        """Which ragloop judge sent this chat request, from its shape: ``decide`` offers tools, ``grade``
        asks for a ``response_format``, ``answer`` streams, ``rewrite`` is the plain completion left."""
        body = self.body if isinstance(self.body, dict) else {}
        if "tools" in body:
            return "decide"
        if "response_format" in body:
            return "grade"
        return "answer" if body.get("stream") else "rewrite"


@frozen
class ServerStats:
    """Connection and request counters, for checking that clients close what they open.

    Attributes:
        connections_opened: TCP connections accepted.
        connections_closed: TCP connections finished (by either side).
        requests_started: Requests whose body was read.
        requests_finished: Requests whose response was sent completely (a scripted cut counts here).
        requests_aborted: Requests the client gave up on (disconnected while the server waited or wrote).
    """

    connections_opened: int = 0
    connections_closed: int = 0
    requests_started: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0

    @property
    def open_connections(self) -> int:
        """Connections still open."""
        return self.connections_opened - self.connections_closed

    @property
    def in_flight(self) -> int:
        """Requests started but neither finished nor aborted."""
        return self.requests_started - self.requests_finished - self.requests_aborted
