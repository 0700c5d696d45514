"""The chat loop: questions and ``/commands`` line by line, each turn in flight cancellable with Ctrl-C.

The event loop runs in a blocking portal's thread (:func:`anyio.from_thread.start_blocking_portal`) for the
whole chat, so the model client and the live sources keep one loop; lines are read in the main thread, where
Ctrl-C arrives as ``KeyboardInterrupt``:

- during a turn it cancels the turn's task (its cancel scope reaches every model call and search in flight),
  waits for it to unwind, says "(cancelled)" and shows the prompt again; the turn leaves no trace in the
  conversation;
- at the prompt it clears the line, typed or empty, and prompts again, as Python's REPL and bash do (the first
  time, it says how to leave); when the input is not a terminal it ends the chat (exit status 0);
- Ctrl-D (end of input) or ``/quit`` ends the chat.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from attrs import define, field

from ragloop.cli._chat._input import LineReader
from ragloop.cli._chat._terminal import Terminal, sources_lines

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from ragloop.chat import Reply

__all__ = ["COMMANDS", "ChatSession"]

#: The chat commands and what each does, as ``/help`` lists them.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("/help", "this list"),
    ("/reset", "forget the conversation: the next question starts afresh"),
    ("/sources", "the last reply's sources, with their links"),
    ("/record", "the last reply's decision record (queries, grades, timings), as JSON"),
    ("/quit", "leave the chat (also Ctrl-D)"),
)
_ALIASES = {"/exit": "/quit", "/q": "/quit", "/?": "/help", "/clear": "/reset"}
#: Words that end the chat when they are the whole line (kept from before the commands existed).
_QUIT_WORDS = frozenset({"exit", "quit", ":q"})
#: Longest wait for a cancelled turn to unwind before the prompt comes back anyway.
CANCEL_WAIT_S = 10.0

Turn = Callable[[str, list[dict[str, str]]], Awaitable["Reply | None"]]


def help_text() -> str:
    """What ``/help`` prints."""
    width = max(len(name) for name, _ in COMMANDS)
    lines = ["Ask a question, or type a command:"]
    lines += [f"  {name.ljust(width)}  {what}" for name, what in COMMANDS]
    lines.append("Ctrl-C stops an answer; a question that starts with '/' needs a space before it.")
    return "\n".join(lines)


@define
class ChatSession:
    """One chat: the conversation so far and the last reply, the commands, and turns in the portal.

    Attributes:
        terminal: Where everything is shown.
        reader: Where lines come from.
        turn: Streams one turn (question, history) and returns its reply (``None``: refused input).
        history: The conversation sent with each question (user and assistant messages).
        last: The last finished reply (for ``/sources`` and ``/record``).
    """

    terminal: Terminal
    reader: LineReader
    turn: Turn
    history: list[dict[str, str]] = field(factory=list)
    last: Reply | None = None
    told_how_to_leave: bool = False

    def run(self, portal: BlockingPortal) -> int:
        """Read lines until the user leaves; the exit status (0)."""
        while True:
            try:
                line = self.reader.read("you> ")
            except EOFError:
                if self.reader.interactive:
                    self.terminal.say("")
                return 0
            except UnicodeDecodeError:
                self.terminal.notice("(that line is not UTF-8 text; type it again)")
                continue
            except KeyboardInterrupt:
                self.terminal.say("")
                if self.reader.interactive:  # the line is cleared and the chat goes on, as in Python's REPL
                    if not self.told_how_to_leave:
                        self.terminal.notice("(to leave: Ctrl-D or /quit)")
                        self.told_how_to_leave = True
                    continue
                return 0
            if not self.reader.interactive and line.strip():
                self.terminal.say(f"you> {line}")  # a piped transcript shows what was asked
            if not line.strip():
                continue
            if line.startswith("/") or line.strip().lower() in _QUIT_WORDS:
                if not self.command(line.strip()):
                    self.reader.forget_last()
                    return 0
                continue
            self._ask(portal, line)

    def command(self, line: str) -> bool:
        """Run a ``/command``; ``False`` when the chat should end. An unknown command gets the list."""
        name = line.split()[0].lower() if line.split() else line
        name = _ALIASES.get(name, name)
        if name in _QUIT_WORDS or name == "/quit":
            return False
        if name == "/help":
            self.terminal.say(help_text())
        elif name == "/reset":
            self.history.clear()
            self.last = None
            self.terminal.say("Conversation forgotten; the next question starts afresh.")
        elif name == "/sources":
            self._sources()
        elif name == "/record":
            if self.last is None:
                self.terminal.say("No reply yet: ask a question first.")
            else:
                self.terminal.json(self.last.record.as_dict())
        else:
            known = " ".join(n for n, _ in COMMANDS)
            self.terminal.say(f"Unknown command {name!r}. Commands: {known} (/help explains them).")
        return True

    def _sources(self) -> None:
        if self.last is None:
            self.terminal.say("No reply yet: ask a question first.")
            return
        lines = sources_lines(self.last.citations, self.terminal.link)
        if not lines:
            self.terminal.say("The last reply cited no sources.")
            return
        for line in lines:
            self.terminal.say(line)

    def _ask(self, portal: BlockingPortal, question: str) -> None:
        """One turn in the portal; Ctrl-C cancels it (module docstring)."""
        finished = threading.Event()

        async def run() -> Reply | None:
            try:
                return await self.turn(question, list(self.history))
            finally:
                finished.set()

        future = portal.start_task_soon(run)
        reply = _wait(future, finished, self.terminal)
        if reply is not None:
            self.last = reply
            self.history.extend(({"role": "user", "content": question}, {"role": "assistant", "content": reply.text}))


def _wait(future: concurrent.futures.Future[Any], finished: threading.Event, terminal: Terminal) -> Any:
    """The turn's reply; on Ctrl-C the turn is cancelled and ``None`` returned once it has unwound."""
    while True:
        try:
            return future.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue
        except concurrent.futures.CancelledError:
            break
        except KeyboardInterrupt:
            future.cancel()  # the portal cancels the turn's scope: its model calls and searches stop
            break
    deadline = time.monotonic() + CANCEL_WAIT_S
    while not finished.is_set() and time.monotonic() < deadline:
        try:
            finished.wait(0.05)
        except KeyboardInterrupt:  # a second Ctrl-C while the turn unwinds changes nothing
            continue
    terminal.cancel()
    return None
