"""What the ``ragloop`` subcommands share: the embedder ``--embedder`` names and the progress line.

Imported by :mod:`ragloop.cli._main`, :mod:`ragloop.cli._ingest` and :mod:`ragloop.cli._store` (it imports none of
them, so the CLI modules form no cycle).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from ragloop.errors import ConfigError

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder

__all__ = ["Progress", "close_embedder", "embedder_for_index", "make_embedder", "positive_int"]


def make_embedder(kind: str, base_url: str | None = None) -> Embedder:
    """The embedder ``--embedder`` names; ``openai:MODEL`` reads ``$OPENAI_API_KEY`` and learns its dimension."""
    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder, OpenAIEmbedder, default_embedder

    if kind == "hash":
        return HashEmbedder()
    if kind == "minilm":
        return MiniLMEmbedder()
    if kind == "auto":
        return default_embedder()
    if not kind.startswith("openai:") or not kind[len("openai:") :]:
        raise ConfigError(f"unknown --embedder {kind!r}; use auto, minilm, hash or openai:MODEL")
    import anyio
    import openai

    url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    key = os.environ.get("OPENAI_API_KEY") or "not-needed"
    model = kind[len("openai:") :]

    async def learn_dim() -> int:
        # Its own client: an AsyncOpenAI's connections belong to the event loop that opened them.
        async with openai.AsyncOpenAI(base_url=url, api_key=key) as client:
            resp = await client.embeddings.create(model=model, input=["dimension probe"])
            return len(resp.data[0].embedding)

    try:
        dim = anyio.run(learn_dim)
    except openai.OpenAIError as exc:
        raise ConfigError(
            f"the embeddings API at {url or 'api.openai.com'} failed for model {model!r}: {exc}; check "
            "--embedder-base-url, the model name and $OPENAI_API_KEY"
        ) from exc
    return OpenAIEmbedder(openai.AsyncOpenAI(base_url=url, api_key=key), model, dim=dim)


async def close_embedder(embedder: Embedder) -> None:
    """Close an API embedder's client, inside the event loop that used it (a no-op for local embedders)."""
    client = getattr(embedder, "client", None)
    close = getattr(client, "close", None)
    if close is not None:
        await close()


def embedder_for_index(directory: str, base_url: str | None = None) -> Embedder | None:
    """The embedder to search an index with when ragloop cannot rebuild it by name (``openai:MODEL``), else None."""
    import json as _json
    from pathlib import Path

    try:
        manifest = _json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # KnowledgeIndex.load reports a missing or broken index itself
    name = manifest.get("embedder", {}).get("name", "") if isinstance(manifest.get("embedder"), dict) else ""
    return make_embedder(name, base_url) if isinstance(name, str) and name.startswith("openai:") else None


class Progress:
    """Progress of long work on stderr: ``done/total``, rate and time left.

    On a terminal, one line redrawn in place. Elsewhere (a pipe, CI, ``nohup``, a log file) plain lines, no
    carriage returns: none in the first :attr:`quiet_s` seconds (a short run stays silent), then one at every
    10 % step or every :attr:`every_plain_s` seconds, whichever comes first, and a last one at the end.
    ``quiet=True`` writes nothing at all.

    Args:
        desc: What is being counted (``"reading"``, ``"embedding (minilm-l6-v2-int8)"``).
        stream: Where to write (default stderr).
        every_s: Least seconds between two redraws on a terminal.
        quiet: Write nothing.
        clock: Seconds, monotonic (tests pass a fake one).
    """

    #: Seconds before the first plain line.
    quiet_s = 2.0
    #: Most seconds between two plain lines.
    every_plain_s = 10.0

    def __init__(
        self,
        desc: str,
        *,
        stream: IO[str] | None = None,
        every_s: float = 0.5,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.quiet = quiet
        self.clock = clock
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._started = clock()
        self._last = -1.0
        self._drawn = False
        self._step = 0  # the last 10 % step a plain line reported
        self._plain = 0  # plain lines written
        self._seen = (0, 0)

    def _line(self, done: int, total: int, now: float) -> str:
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (total - done) / rate if rate > 0 else 0.0
        eta = f"{int(left // 60)}:{int(left % 60):02d} left" if done < total else f"{elapsed:.0f}s"
        share = f" {100 * done // total}%," if total and not self.tty else ""
        return f"{self.desc}: {done}/{total} ({share} {rate:.1f}/s, {eta})".replace("( ", "(")

    def __call__(self, done: int, total: int) -> None:
        if self.quiet:
            return
        now = self.clock()
        self._seen = (done, total)
        if not self.tty:
            self._plain_line(done, total, now)
            return
        if done < total and now - self._last < self.every_s:
            return
        self._last = now
        self.stream.write(f"\r{self._line(done, total, now)}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def _plain_line(self, done: int, total: int, now: float) -> None:
        step = 10 * done // total if total else 0
        if now - self._started < self.quiet_s or done >= total:
            return
        if step > self._step or now - max(self._last, self._started) >= self.every_plain_s:
            self._step, self._last = step, now
            self.stream.write(self._line(done, total, now) + "\n")
            self.stream.flush()
            self._plain += 1

    def close(self) -> None:
        """End the progress: a newline on a terminal; the final count where plain lines were written."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
        if self._plain and not self.quiet:
            done, total = self._seen
            self.stream.write(self._line(done, total, self.clock()) + "\n")
            self.stream.flush()
            self._plain = 0


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1 (a clear usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value
