"""Reading the chat's lines: line editing and history on a terminal, plain lines from a pipe.

Line editing is the standard library's ``readline`` (GNU readline or libedit): arrow keys, Emacs keys, Ctrl-R
search and the up-arrow history with no extra dependency, and it leaves a pseudo-terminal's byte stream plain
for tests (``prompt_toolkit`` would add a dependency and query the terminal for the cursor position). Where
``readline`` is missing (Windows without pyreadline) the line is read without editing.

The history file is ``$XDG_STATE_HOME/ragloop/chat_history`` (``~/.local/state/ragloop/chat_history``), at most
1,000 lines, readable by its owner only. It is read and written only when stdin is a terminal: questions piped
in are never recorded.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LineReader", "history_path"]

#: Most lines kept in the history file.
HISTORY_LINES = 1000


def history_path(environ: Mapping[str, str]) -> Path:
    """Where the chat history lives: ``$XDG_STATE_HOME/ragloop/chat_history``, else under ``~/.local/state``."""
    state = environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local" / "state"
    return base / "ragloop" / "chat_history"


def _readline() -> Any:
    try:
        import readline
    except ImportError:  # pragma: no cover - platform without readline
        return None
    return readline


class LineReader:
    """Reads one line at a time (``EOFError`` at the end, ``KeyboardInterrupt`` on Ctrl-C).

    Args:
        interactive: stdin is a terminal: edit lines with readline and keep a history.
        history: The history file (``None``: none), used only when ``interactive``.
    """

    def __init__(self, interactive: bool, history: Path | None = None) -> None:
        self.interactive = interactive
        self.history = history if interactive else None
        self.problem: str | None = None
        self._rl = _readline() if interactive else None
        if self._rl is not None:
            self._rl.set_history_length(HISTORY_LINES)
            self._rl.parse_and_bind("tab: self-insert")  # no file-name completion of questions
            if self.history is not None and self.history.is_file():
                try:
                    self._rl.read_history_file(str(self.history))
                except OSError as exc:
                    self.problem = f"could not read the chat history {self.history}: {exc.strerror or exc}"

    def read(self, prompt: str) -> str:
        """The next line, without its newline; the prompt is shown only on a terminal. Bytes that are not UTF-8
        become U+FFFD: a stray byte costs the character, never the chat."""
        if self.interactive:
            return input(prompt)
        stream = getattr(sys.stdin, "buffer", None)
        raw = stream.readline() if stream is not None else sys.stdin.readline()
        if not raw:
            raise EOFError
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return line.rstrip("\r\n")

    def pending(self) -> str:
        """What was typed on the line Ctrl-C interrupted ("" without readline: treated as an empty prompt)."""
        if self._rl is None:
            return ""
        try:
            return str(self._rl.get_line_buffer())
        except (AttributeError, OSError):  # libedit builds without it
            return ""

    def forget_last(self) -> None:
        """Drop the last history entry (a command such as /quit is not worth recalling)."""
        if self._rl is not None:
            n = self._rl.get_current_history_length()
            if n:
                with contextlib.suppress(ValueError, AttributeError):
                    self._rl.remove_history_item(n - 1)

    def save(self) -> str | None:
        """Write the history file (owner-only); the problem in one line when that failed, else ``None``."""
        if self._rl is None or self.history is None:
            return None
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.history, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
            os.chmod(self.history, 0o600)
            self._rl.write_history_file(str(self.history))
        except OSError as exc:
            return f"could not save the chat history to {self.history}: {exc.strerror or exc}"
        return None
