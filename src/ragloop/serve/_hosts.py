"""The ``Host`` allowlist: a request naming another host gets 400 before any endpoint runs.

Without it, a server on 127.0.0.1 can be reached from a web page through DNS rebinding (a name of the attacker's
that first resolves to their server, then to 127.0.0.1): the browser then treats the page and the API as one
origin. ``ragloop serve`` on a loopback address allows only the loopback names unless ``--allowed-host`` says
otherwise. Patterns are host names (``docs.example.com``), ``*.example.com`` for any subdomain, or addresses
(``127.0.0.1``, ``::1``); the port is ignored. ``GET /healthz`` and ``GET /readyz`` answer whatever the host (a
load balancer or Kubernetes probes by address, and they say nothing but "ok" and the checks' words).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from ragloop.serve._stream import Rejected

__all__ = ["LOOPBACK_HOSTS", "HostAllowlist", "host_of"]

#: What ``ragloop serve`` allows on a loopback address when no ``--allowed-host`` is given.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
_PROBES = frozenset({"/healthz", "/readyz"})
_DRAIN_LIMIT = 64 * 1024
_DRAIN_S = 1.0


def host_of(header: str) -> str:
    """The host name of a ``Host`` header value, lower-cased, without the port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else ""
    name, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        return name.rstrip(".")
    return value.rstrip(".")


def _allowed(host: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        if pattern == "*" or host == pattern:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
            return True
    return False


class HostAllowlist:
    """ASGI middleware: HTTP requests whose ``Host`` is not in ``allowed`` get a 400 JSON error.

    Args:
        app: The app behind it.
        allowed: Host patterns (see the module docstring); compared case-insensitively, port ignored.
    """

    def __init__(self, app: Any, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = tuple(host_of(p) if not p.startswith("*") else p.lower() for p in allowed)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Refuse a request for another host; pass everything else on."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope.get("headers", ()) if k == b"host"), b"")
        host = host_of(raw.decode("latin-1"))
        path, root = scope.get("path", ""), scope.get("root_path", "")
        probe = scope.get("method") in ("GET", "HEAD") and path.removeprefix(root) in _PROBES
        if probe or (host and _allowed(host, self.allowed)):
            await self.app(scope, receive, send)
            return
        error = Rejected(
            400,
            f"Host {host or 'missing'!r:.80} is not served here; "
            "add it with --allowed-host (ServeSettings.allowed_hosts)",
            param="host",
            code="host_not_allowed",
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json")]
        if not await _drain(receive):
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": error.body()})


async def _drain(receive: Any, limit: int = _DRAIN_LIMIT) -> bool:
    """Read and drop a refused request's body, up to ``limit`` bytes; whether all of it was read.

    A server that answers and closes while the client's body is still unread in the socket makes the kernel reset
    the connection, and the client may then see a reset instead of the 400 (seen in CI on a 1-byte JSON POST).
    A body over the limit, or one still arriving after :data:`_DRAIN_S`, is not read: the connection is closed after
    the answer instead (the same bounds as the body checks' drain in ``_validate``).
    """
    seen = 0
    with anyio.move_on_after(_DRAIN_S):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
            if seen > limit:
                return False
    return False
