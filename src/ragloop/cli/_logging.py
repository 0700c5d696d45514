"""How the ``ragloop`` command logs: one short, redacted line per event, storms counted, never a stalled loop.

structlog's default console renderer shows an exception as a rich traceback *with every frame's local
variables*: a database password six times and ~500 lines per failure, rendered on the event loop. The command
configures instead:

- :func:`short_exception`: an exception becomes one field, ``error="Type: message (at file:line in function)"``
  plus its causes, never a traceback and never a local variable;
- :class:`StormLimit`: the same event (and error type) more than ``burst`` times in ``window_s`` is dropped and
  counted; the next one let through carries ``suppressed=N``;
- :func:`redact_line`: the rendered line passes :func:`ragloop._redact.hide_password` (URL user info,
  ``password=``, bearer tokens, API keys) — the one processor every structlog line goes through; the standard
  library's records (uvicorn, the MCP SDK) pass :class:`RedactingFilter`, which does the same to them;
- :class:`BackgroundWriter`: lines go to a bounded queue that a thread writes to stderr, so a slow or full stderr
  pipe drops lines (counted) instead of blocking the server's event loop.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import IO, Any

from ragloop._redact import bounded, hide_password

__all__ = ["BackgroundWriter", "RedactingFilter", "StormLimit", "configure", "describe_exception", "redact_line"]


def describe_exception(exc: BaseException, *, max_chars: int = 600) -> str:
    """``exc`` on one line: ``Type: first line of its message (at file:line in function)``, then each cause.

    No traceback beyond the frame that raised, no local variables; redacted and at most ``max_chars``.
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 3:
        seen.add(id(current))
        message = str(current).strip().splitlines()[0] if str(current).strip() else ""
        where = ""
        frames = traceback.extract_tb(current.__traceback__) if current.__traceback__ else []
        if frames:
            last = frames[-1]
            where = f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
        parts.append(f"{type(current).__name__}: {message[:300]}{where}" if message else type(current).__name__ + where)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return bounded(hide_password("; caused by ".join(parts)), max_chars)


def _exception_of(exc_info: Any) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and isinstance(exc_info[1], BaseException):
        return exc_info[1]
    if exc_info:
        return sys.exc_info()[1]
    return None


def short_exception(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: ``exc_info`` (``log.exception``) replaced by one ``error`` field, no traceback."""
    exc = _exception_of(event.pop("exc_info", None))
    event.pop("exception", None)
    if exc is not None:
        described = describe_exception(exc)
        event["error"] = f"{event['error']}; {described}" if isinstance(event.get("error"), str) else described
    return event


class StormLimit:
    """structlog processor: at most ``burst`` events of one kind per ``window_s``; the rest dropped and counted.

    An event's kind is its logger, its event name and, for a failure, the error's type. The first event of a
    kind let through after some were dropped carries ``suppressed=N``. At most ``max_kinds`` kinds are tracked.

    Args:
        burst: Events of one kind let through per window.
        window_s: The window, in seconds.
        clock: Monotonic seconds (a test can drive it).
        max_kinds: Kinds remembered (the oldest forgotten first).
    """

    def __init__(
        self,
        burst: int = 5,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        max_kinds: int = 1_000,
    ) -> None:
        self.burst = burst
        self.window_s = window_s
        self.clock = clock
        self.max_kinds = max_kinds
        #: Events dropped so far, every kind.
        self.dropped = 0
        self._kinds: dict[tuple[str, ...], list[float]] = {}  # kind -> [window start, let through, dropped]
        self._lock = threading.Lock()

    def _kind(self, event: MutableMapping[str, Any]) -> tuple[str, ...]:
        exc = _exception_of(event.get("exc_info"))
        error = type(exc).__name__ if exc is not None else ""
        return (str(event.get("logger", "")), str(event.get("event", ""))[:200], error)

    def __call__(self, _logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        import structlog

        kind, now = self._kind(event), self.clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is None or now - state[0] >= self.window_s:
                suppressed = int(state[2]) if state is not None else 0
                if len(self._kinds) >= self.max_kinds and kind not in self._kinds:
                    self._kinds.pop(next(iter(self._kinds)))
                self._kinds[kind] = [now, 1, 0]
                if suppressed:
                    event["suppressed"] = suppressed
                return event
            if state[1] < self.burst:
                state[1] += 1
                return event
            state[2] += 1
            self.dropped += 1
        raise structlog.DropEvent


def redact_line(render: Callable[..., Any]) -> Callable[..., Any]:
    """``render`` (structlog's last processor) with its line redacted: what every logged line passes."""

    def rendered(logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        line = render(logger, method, event)
        return hide_password(line) if isinstance(line, str) else line

    return rendered


class RedactingFilter(logging.Filter):
    """A :class:`logging.Filter` for the standard library's records (uvicorn, the MCP SDK, ragloop's fallback):
    the message redacted, an exception shortened to :func:`describe_exception`, storms dropped and counted."""

    def __init__(self, name: str = "", *, burst: int = 5, window_s: float = 60.0) -> None:
        super().__init__(name)
        self.limit = StormLimit(burst, window_s)

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place; ``False`` to drop it (a storm)."""
        import structlog

        exc = record.exc_info[1] if record.exc_info else None
        # The kind is the message's first line: asyncio's "Task was destroyed" names each task on the next one.
        first = str(record.msg).split("\n", 1)[0][:200]
        kind: dict[str, Any] = {"logger": record.name, "event": first}
        if exc is not None:
            kind["exc_info"] = exc
        try:
            kind = dict(self.limit(None, "", kind))
        except structlog.DropEvent:
            return False
        message = hide_password(record.getMessage())
        if exc is not None:
            message = f"{message} ({describe_exception(exc)})"
        if "suppressed" in kind:
            message += f" [{kind['suppressed']} more like this suppressed]"
        record.msg, record.args = bounded(message, 4_000), ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


class BackgroundWriter:
    """A file-like stderr that never blocks its caller: lines queue (at most ``max_lines``) for a writer thread.

    Args:
        out: Where the thread writes (default: ``sys.stderr`` at the time of writing).
        max_lines: Lines that may wait; more are dropped and counted in :attr:`dropped`.
    """

    def __init__(self, out: IO[str] | None = None, max_lines: int = 10_000) -> None:
        self.out = out
        self.dropped = 0
        self._queue: queue.Queue[str | None] = queue.Queue(max_lines)
        self._thread = threading.Thread(target=self._run, name="ragloop-log", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        """Queue ``text``; never blocks (a full queue drops it)."""
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            self.dropped += 1
        return len(text)

    def flush(self) -> None:
        """Nothing to do here: the thread flushes after each line."""

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (waiting at most ``timeout_s``) and stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (text := self._queue.get()) is not None:
            out = self.out or sys.stderr
            try:
                out.write(text)
                out.flush()
            except (OSError, ValueError):  # stderr closed: nothing left to tell
                self.dropped += 1


def configure() -> Callable[[], None] | None:
    """Configure structlog (warnings and worse, one short redacted line each, to stderr through a
    :class:`BackgroundWriter`) and give the standard library's root logger the same treatment, unless the host
    configured them already. Returns the function that undoes it (``None`` when nothing was configured)."""
    import structlog

    if structlog.is_configured():
        return None
    writer = BackgroundWriter()
    storms = StormLimit()
    records = RedactingFilter()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            storms,
            short_exception,
            redact_line(structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(writer),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    handler: logging.Handler | None = None
    if not root.handlers:
        handler = logging.StreamHandler(writer)
        handler.setLevel(logging.WARNING)
        handler.addFilter(records)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)

    def undo() -> None:
        dropped = storms.dropped + records.limit.dropped
        if dropped:  # the storms that were only counted, said once at the end
            writer.write(f"ragloop: {dropped:,} repeated log lines were suppressed (at most 5 of a kind a minute)\n")
        if writer.dropped:
            print(f"ragloop: {writer.dropped:,} log lines were dropped (stderr too slow)", file=sys.stderr)
        structlog.reset_defaults()
        if handler is not None:
            root.removeHandler(handler)
        writer.close()

    return undo
