"""What ``ragloop serve`` adds to uvicorn: a request-head timeout and a clean exit on SIGINT/SIGTERM.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a connection that sends part of a
request head and then nothing (slowloris) stays open for good, each one holding a socket and a file descriptor:
neither uvicorn (0.54) nor h11 has a head timeout (h11's ``max_incomplete_event_size``, uvicorn's
``h11_max_incomplete_event_size``, bound the head's size, not its time).
:func:`h11_protocol` is uvicorn's h11 protocol with a head timer: armed when a connection opens and after each
response, disarmed when a whole request head has arrived; when it fires the connection is closed. (A body that
trickles in is the app's ``body_timeout_s``; one the app never reads is cut by the same timer, re-armed after the
response.) It also has a write timeout: a client that stops reading its response (a stream it never consumes)
holds a socket, a descriptor and, through the app, a turn slot for as long as it likes; a write that waits
``write_timeout_s`` for the client to read aborts the connection instead. Use it with your own uvicorn as
``uvicorn.Config(app, http=h11_protocol(header_timeout_s=10, write_timeout_s=30))``.

uvicorn re-raises a caught SIGINT or SIGTERM once it has shut down, so the process ends by the signal (exit code
130, or killed by SIGTERM) even after a clean shutdown. :class:`CleanExitServer` calls ``on_signal`` (the app
cancels its turns in flight, each ending with an error frame) and returns normally: ``ragloop serve`` exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragloop.errors import ConfigError

__all__ = ["CleanExitServer", "h11_protocol"]


class _TimedFlow(FlowControl):
    """uvicorn's write flow control with a deadline: a write that waits ``timeout_s`` for the client to read
    aborts the connection (socket and descriptor freed at once; the app sees the client gone)."""

    def __init__(self, transport: asyncio.Transport, timeout_s: float) -> None:
        super().__init__(transport)
        self.timeout_s = timeout_s

    async def drain(self) -> None:
        try:
            await asyncio.wait_for(self._is_writable_event.wait(), self.timeout_s)
        except TimeoutError:
            self._transport.abort()  # close() would wait for the unread buffer to drain: forever
            self.resume_writing()


def h11_protocol(*, header_timeout_s: float = 10.0, write_timeout_s: float = 30.0) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a request-head timeout of ``header_timeout_s`` seconds and a write timeout of
    ``write_timeout_s`` (see the module)."""
    if not header_timeout_s > 0:
        raise ConfigError(f"header_timeout_s must be a positive number of seconds, got {header_timeout_s}")
    if not write_timeout_s > 0:
        raise ConfigError(f"write_timeout_s must be a positive number of seconds, got {write_timeout_s}")

    class HeadTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.flow = _TimedFlow(transport, write_timeout_s)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a whole request head arrived: its cycle runs
                self._disarm()

        def on_response_complete(self) -> None:
            self._arm()  # before: a pipelined request handled inside disarms it again
            super().on_response_complete()

    return HeadTimeoutProtocol


class CleanExitServer(uvicorn.Server):
    """A uvicorn server that shuts down on SIGINT/SIGTERM and returns, instead of re-raising the signal.

    Args:
        config: The uvicorn configuration.
        on_signal: Called in the server's event loop at the first signal (the app stops its turns).
    """

    def __init__(self, config: uvicorn.Config, on_signal: Callable[[], Any]) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Handle SIGINT and SIGTERM while serving (main thread only); restore the old handlers after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._loop = asyncio.get_running_loop()
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Start the shutdown (a second SIGINT forces it) and tell the app."""
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_signal)
