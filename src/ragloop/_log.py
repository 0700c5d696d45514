"""ragloop's logger: structlog when the application configured structlog, the standard library otherwise.

structlog's unconfigured default prints every event to stdout. A library must not do that (the ``logging``
HOWTO's rule for libraries), so every ragloop logger checks :func:`structlog.is_configured` at each event:

- structlog configured by the application: the event goes through the application's structlog pipeline;
- not configured: the event is rendered as one JSON object and handed to the standard library logger of the
  same name (``ragloop.runner``, ``ragloop.nodes.decide`` …). The ``ragloop`` logger carries a
  :class:`logging.NullHandler`, so an application that configured neither sees nothing at all, and one that
  calls ``logging.basicConfig(level="INFO", format="%(message)s")`` gets JSON lines, the per-turn
  ``turn.finished`` decision record among them.

Nothing is configured globally, and nothing is bound at import time. Text values are redacted
(:func:`ragloop._redact.redact`) and cut to 2,000 characters, so a log line never carries a credential or a
megabyte of someone's input.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ragloop._redact import bounded, redact

__all__ = ["get_logger"]

logging.getLogger("ragloop").addHandler(logging.NullHandler())

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


class Logger:
    """A structlog-style logger (``log.info("event", key=value)``, ``bind``) that never prints by itself."""

    __slots__ = ("_context", "_name", "_stdlib")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = dict(context or {})
        self._stdlib = logging.getLogger(name)  # loggers live as long as the process: safe to keep

    def enabled(self, method: str) -> bool:
        """Whether an event at ``method``'s level would be handled: structlog is configured, or the standard
        library logger is enabled for that level (the check :meth:`info` and the others make first).

        Lets a caller skip building an event's fields when nothing would receive them.
        """
        structlog = sys.modules.get("structlog")  # not imported yet: not configured either
        return (structlog is not None and structlog.is_configured()) or self._stdlib.isEnabledFor(_LEVELS[method])

    def bind(self, **values: Any) -> Logger:
        """A logger whose events also carry ``values``."""
        return Logger(self._name, {**self._context, **values})

    def _emit(self, method: str, event: str, values: dict[str, Any]) -> None:
        import structlog

        # Text values (errors, queries) may hold credentials or a megabyte of user input: redacted and cut.
        values = {k: bounded(redact(v)) if isinstance(v, str) else v for k, v in values.items()}

        if structlog.is_configured():
            getattr(structlog.get_logger(self._name).bind(**self._context), method)(event, **values)
            return
        stdlib = self._stdlib
        if not stdlib.isEnabledFor(_LEVELS[method]):
            return
        if method == "exception":
            values.setdefault("exc_info", True)
        logger = structlog.wrap_logger(
            stdlib,
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(default=str),
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
            context_class=dict,
        )
        getattr(logger.bind(logger=self._name, **self._context), method)(event, **values)

    def debug(self, event: str, **values: Any) -> None:
        """Log ``event`` at DEBUG."""
        self._emit("debug", event, values)

    def info(self, event: str, **values: Any) -> None:
        """Log ``event`` at INFO."""
        self._emit("info", event, values)

    def warning(self, event: str, **values: Any) -> None:
        """Log ``event`` at WARNING."""
        self._emit("warning", event, values)

    def error(self, event: str, **values: Any) -> None:
        """Log ``event`` at ERROR."""
        self._emit("error", event, values)

    def exception(self, event: str, **values: Any) -> None:
        """Log ``event`` at ERROR with the current exception."""
        self._emit("exception", event, values)


def get_logger(name: str) -> Logger:
    """The logger for ``name`` (a dotted name under ``ragloop``)."""
    return Logger(name)
