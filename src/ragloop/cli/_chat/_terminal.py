"""What ``ask`` and ``chat`` print: progress, the streamed answer and its sources, for a terminal or a pipe.

Two independent choices, made once from the streams and the environment (:meth:`Terminal.detect`):

- **Progress** goes to stderr. On a terminal it is one transient status line (a spinner with the latest step,
  erased when the answer starts); piped, one plain line per step (``  … searching…``); ``--quiet`` hides it.
- **The answer** goes to stdout. On a terminal it is rendered as markdown (tables, code blocks, lists) with
  ``rich``, streamed into a transient preview and printed whole at the end; piped, with ``NO_COLOR`` set or with
  ``TERM=dumb`` it is the plain text as it streams. Citations follow as a short numbered list.

Document and model text never carries terminal escape sequences to the screen (:func:`terminal_safe` first),
rich never reads it as markup (it is passed as ``Text``/``Markdown`` objects), and markdown links are not made
into terminal hyperlinks. ``rich`` is imported only when something is rendered with it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from attrs import define, field

from ragloop.text.safety import terminal_safe

if TYPE_CHECKING:
    from ragloop.chat import Reply
    from ragloop.state import Citation

__all__ = ["Terminal", "sources_lines"]

#: Lines longer than this in the streamed preview are cut (the final render is whole).
_PREVIEW_LINES = 20


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


#: What a reply's outcome means, for every outcome but ``context`` (a full answer from the sources).
_OUTCOMES = {
    "partial": "the sources answer only part of this",
    "none": "the sources do not answer this",
    "direct": "answered without searching the sources",
}


def sources_lines(citations: Sequence[Citation], link: Callable[[Citation], str]) -> list[str]:
    """One line per cited page, ``[n] title — link``, deduplicated by number, then an indented ``§ section —
    link`` line for each further section of the page the reply cites; terminal-safe."""
    seen: set[int] = set()
    lines = []
    for c in citations:
        if c.n in seen:
            continue
        seen.add(c.n)
        where = link(c)
        lines.append(terminal_safe(f"[{c.n}] {c.title or c.source}" + (f" — {where}" if where else "")))
        for section in c.sections[1:]:
            where = f" — {section.url}" if section.url else ""
            lines.append(terminal_safe(f"    § {section.title or c.title}{where}"))
    return lines


@define
class Terminal:
    """Where and how a turn is shown (see the module docstring).

    Attributes:
        out: The answer's stream (stdout).
        err: Progress and notices (stderr).
        spinner: Progress as one transient status line (stderr is a terminal).
        rich_answer: Render the answer as markdown with ``rich`` (stdout is a terminal, colour allowed).
        quiet: No progress at all.
        link: A citation's link: its URL, or where the source lives.
    """

    out: IO[str]
    err: IO[str]
    spinner: bool = False
    rich_answer: bool = False
    quiet: bool = False
    link: Callable[[Citation], str] = lambda c: c.url or c.source
    _status: Any = field(default=None, init=False)
    _live: Any = field(default=None, init=False)
    _text: list[str] = field(factory=list, init=False)
    _console: Any = field(default=None, init=False)

    @classmethod
    def detect(
        cls,
        *,
        quiet: bool = False,
        environ: Mapping[str, str] | None = None,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
    ) -> Terminal:
        """The terminal for these streams and this environment (``NO_COLOR``, ``TERM=dumb``: plain answers)."""
        env = os.environ if environ is None else environ
        out = sys.stdout if out is None else out
        err = sys.stderr if err is None else err
        dumb = env.get("TERM", "") == "dumb"
        plain = bool(env.get("NO_COLOR")) or dumb
        return cls(
            out=out,
            err=err,
            spinner=_is_tty(err) and not dumb and not quiet,
            rich_answer=_is_tty(out) and not plain,
            quiet=quiet,
        )

    # -- rich, on first use ----------------------------------------------------------------------------

    def _out_console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.out, highlight=False, soft_wrap=False)
        return self._console

    # -- a turn ------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """A turn starts: nothing shown yet."""
        self._text = []

    def progress(self, message: str) -> None:
        """One step of the turn ("searching…"): the status line, a plain line, or nothing."""
        if self.quiet or self._live is not None:
            return
        safe = terminal_safe(message).replace("\n", " ")
        if not self.spinner:
            print(f"  … {safe}", file=self.err, flush=True)
            return
        from rich.text import Text

        if self._status is None:
            from rich.console import Console
            from rich.status import Status

            console = Console(file=self.err, highlight=False)
            self._status = Status(Text(safe), console=console, spinner="dots")
            self._status.start()
        else:
            self._status.update(Text(safe))

    def token(self, text: str) -> None:
        """A piece of the answer: streamed as it comes (plain) or into the transient preview (rich)."""
        self._stop_status()
        safe = terminal_safe(text)
        self._text.append(safe)
        if not self.rich_answer:
            print(safe, end="", file=self.out, flush=True)
            return
        from rich.live import Live

        if self._live is None:
            self._live = Live(
                self._preview(), console=self._out_console(), transient=True, refresh_per_second=8, auto_refresh=True
            )
            self._live.start()
        else:
            self._live.update(self._preview())

    def _preview(self) -> Any:
        from rich.markdown import Markdown

        lines = "".join(self._text).splitlines()[-_PREVIEW_LINES:]
        return Markdown("\n".join(lines), hyperlinks=False)

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def finish(self, reply: Reply | None, *, prefix: str = "") -> None:
        """The turn ended: the whole answer (rich) or a newline (plain), then the sources; ``None``: cut off."""
        self._stop_status()
        if self._live is not None:
            self._live.stop()
            self._live = None
        if reply is None:
            if self._text and not self.rich_answer:
                print(file=self.out, flush=True)
            self._text = []
            return
        text = terminal_safe(reply.text)
        if self.rich_answer:
            from rich.markdown import Markdown

            console = self._out_console()
            console.print(Markdown(text, hyperlinks=False))
            self._print_outcome(reply)
            self._print_sources(reply)
        else:
            if not self._text:
                print(prefix + text, end="", file=self.out)
            print(file=self.out, flush=True)
            self._print_outcome(reply)
            self._print_sources(reply)
        self._text = []

    def cancel(self) -> None:
        """A turn was cancelled (Ctrl-C): clear what it showed and say so."""
        self.finish(None)
        self.notice("(cancelled)")

    def _print_outcome(self, reply: Reply) -> None:
        """A reply that is not a full answer from the sources says so, on its own line after it."""
        meaning = _OUTCOMES.get(reply.outcome)
        if meaning is None:
            return
        line = f"({reply.outcome}: {meaning})"
        if self.rich_answer:
            from rich.text import Text

            self._out_console().print(Text(line, style="dim italic"))
        else:
            print(line, file=self.out)
        self.out.flush()

    def _print_sources(self, reply: Reply) -> None:
        lines = sources_lines(reply.citations, self.link)
        if not lines:
            return
        if self.rich_answer:
            from rich.text import Text

            console = self._out_console()
            console.print(Text("Sources", style="bold"))
            for line in lines:
                console.print(Text("  " + line, style="dim"))
        else:
            print("\nSources:", file=self.out)
            for line in lines:
                print("  " + line, file=self.out)
        self.out.flush()

    # -- everything else ---------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A line for the user on stdout (command output)."""
        print(terminal_safe(text), file=self.out, flush=True)

    def notice(self, text: str) -> None:
        """A line about the program on stderr (start-up, errors, cancellation)."""
        print(terminal_safe(text), file=self.err, flush=True)

    def json(self, data: Any) -> None:
        """A JSON document on stdout, highlighted on a terminal."""
        text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
        if self.rich_answer:
            from rich.json import JSON

            self._out_console().print(JSON(terminal_safe(text)))
        else:
            print(terminal_safe(text), file=self.out, flush=True)

    def close(self) -> None:
        """Stop whatever is still live (an interrupted turn), restoring the cursor."""
        self._stop_status()
        if self._live is not None:
            self._live.stop()
            self._live = None
