"""The ASGI response that runs one chat turn: validation first, then a stream the client can cancel.

Starlette's own ``StreamingResponse`` only notices a departed client when a write fails (ASGI 2.4) — but
a turn can spend seconds in a model call without writing anything. This response listens for
``http.disconnect`` for the whole turn and cancels the turn the moment it arrives, which cancels every
model call in flight.

A server-sent-events response that has written nothing for ``keepalive_s`` gets a comment line
(``: keep-alive``), which every SSE parser skips: a proxy that cuts idle streams (nginx after 60 s by
default, many load balancers sooner) keeps the stream open while a slow model thinks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

__all__ = ["KEEPALIVE", "Rejected", "StreamedResponse", "error_body", "json_bytes"]

#: The comment an idle event stream is sent: a line starting with ``:`` is no event (the SSE specification).
KEEPALIVE = b": keep-alive\n\n"

#: Produces the response: ``start(status, headers)`` must be awaited before ``body(chunk)``.
Start = Callable[[int, Mapping[str, str]], Awaitable[None]]
Body = Callable[[bytes], Awaitable[None]]


def json_bytes(obj: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def error_body(message: str, *, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An error in the OpenAI shape (``{"error": {"message", "type", "param", "code"}}``), which its SDK reads."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Rejected(Exception):
    """A request refused before anything was streamed; becomes a JSON error response.

    Args:
        status: HTTP status.
        message: What was wrong and what to do (names the field and the limit).
        kind: Error type (``invalid_request_error``, ``rate_limit_error``, …).
        param: The request field at fault.
        code: A short machine-readable code.
        headers: Extra headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        """The JSON body."""
        return json_bytes(error_body(self.message, kind=self.kind, param=self.param, code=self.code))


class _Writer:
    """The response's one way to the socket: frames written one at a time, the time of the last one kept.

    The turn's frames take no lock (a lock costs every token an event-loop round): the keep-alive writer only
    writes while no frame is being written, and a frame that comes while a keep-alive is being written waits for it.
    """

    def __init__(self, send: Any) -> None:
        self.send = send
        self.last = time.monotonic()
        self.busy = False
        self.pinging: anyio.Event | None = None
        self.keepalive = anyio.CancelScope()

    async def write(self, message: dict[str, Any]) -> None:
        while self.pinging is not None:  # rare: a keep-alive comment is on its way out
            await self.pinging.wait()
        self.busy = True
        try:
            await self.send(message)
        finally:
            self.busy = False
            self.last = time.monotonic()

    async def keep_alive(self, interval: float, gone: Callable[[], None]) -> None:
        """Write :data:`KEEPALIVE` whenever nothing was written for ``interval`` s, until :attr:`keepalive` is
        cancelled; ``gone()`` when the socket is found closed."""
        with self.keepalive:
            while True:
                idle = time.monotonic() - self.last
                if idle < interval or self.busy:
                    await anyio.sleep(max(interval - idle, interval / 10))
                    continue
                self.pinging = pinging = anyio.Event()
                try:
                    await self.send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                except OSError:  # the client left while the turn was quiet
                    gone()
                    return
                finally:
                    self.pinging = None
                    self.last = time.monotonic()
                    pinging.set()


def _event_stream(headers: Mapping[str, str]) -> bool:
    return any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in headers.items())


class StreamedResponse:
    """An ASGI response whose body is produced by ``produce(start, body)`` while the client stays connected.

    ``produce`` decides the status itself (so it can still answer 400 when the turn rejects its input
    before the first byte); if the client disconnects, ``produce`` is cancelled and ``on_disconnect`` runs.

    Args:
        produce: Writes the response through ``start`` and ``body``.
        on_disconnect: Called once when the client went away before the response was complete.
        on_done: Called once when the response is over, however it ended.
        keepalive_s: Once an event stream (``text/event-stream``) has started, a :data:`KEEPALIVE` comment is
            written whenever nothing else was for this many seconds; ``None``: never.
    """

    def __init__(
        self,
        produce: Callable[[Start, Body], Awaitable[None]],
        *,
        on_disconnect: Callable[[], None] | None = None,
        on_done: Callable[[], None] | None = None,
        keepalive_s: float | None = None,
    ) -> None:
        self.produce = produce
        self.on_disconnect = on_disconnect
        self.on_done = on_done
        self.keepalive_s = keepalive_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Run ``produce`` and a disconnect listener together; whichever ends first stops the other."""
        started = False
        finished = False
        gone = False
        out = _Writer(send)

        def departed() -> None:
            nonlocal gone
            if not gone and not finished and self.on_disconnect is not None:
                gone = True
                self.on_disconnect()

        async def start(status: int, headers: Mapping[str, str]) -> None:
            nonlocal started
            started = True
            raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            await out.write({"type": "http.response.start", "status": status, "headers": raw})
            if self.keepalive_s is not None and _event_stream(headers):

                def lost() -> None:
                    departed()
                    tg.cancel_scope.cancel()

                tg.start_soon(out.keep_alive, self.keepalive_s, lost)

        async def body(chunk: bytes) -> None:
            await out.write({"type": "http.response.body", "body": chunk, "more_body": True})

        try:
            async with anyio.create_task_group() as tg:

                async def listen() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            departed()
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(listen)
                try:
                    await self.produce(start, body)
                    finished = True
                    out.keepalive.cancel()
                    if not started:
                        await start(500, {"content-type": "application/json"})
                    await out.write({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    # The socket is gone (ASGI servers raise on writes to a closed connection).
                    departed()
                finally:
                    finished = True
                    tg.cancel_scope.cancel()
        finally:
            if self.on_done is not None:
                self.on_done()
