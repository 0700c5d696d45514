"""The ASGI response that runs one chat turn: validation first, then a stream the client can cancel.

Starlette's own ``StreamingResponse`` only notices a departed client when a write fails (ASGI 2.4) — but
a turn can spend seconds in a model call without writing anything. This response listens for
``http.disconnect`` for the whole turn and cancels the turn the moment it arrives, which cancels every
model call in flight.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

__all__ = ["Rejected", "TurnResponse", "error_body", "json_bytes"]

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


class TurnResponse:
    """An ASGI response whose body is produced by ``produce(start, body)`` while the client stays connected.

    ``produce`` decides the status itself (so it can still answer 400 when the turn rejects its input
    before the first byte); if the client disconnects, ``produce`` is cancelled and ``on_disconnect`` runs.

    Args:
        produce: Writes the response through ``start`` and ``body``.
        on_disconnect: Called once when the client went away before the response was complete.
        on_done: Called once when the response is over, however it ended.
    """

    def __init__(
        self,
        produce: Callable[[Start, Body], Awaitable[None]],
        *,
        on_disconnect: Callable[[], None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.produce = produce
        self.on_disconnect = on_disconnect
        self.on_done = on_done

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Run ``produce`` and a disconnect listener together; whichever ends first stops the other."""
        started = False
        finished = False
        gone = False

        def departed() -> None:
            nonlocal gone
            if not gone and not finished and self.on_disconnect is not None:
                gone = True
                self.on_disconnect()

        async def start(status: int, headers: Mapping[str, str]) -> None:
            nonlocal started
            started = True
            raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            await send({"type": "http.response.start", "status": status, "headers": raw})

        async def body(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

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
                    if not started:
                        await start(500, {"content-type": "application/json"})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    # The socket is gone (ASGI servers raise on writes to a closed connection).
                    departed()
                finally:
                    finished = True
                    tg.cancel_scope.cancel()
        finally:
            if self.on_done is not None:
                self.on_done()
