"""The ``ragloop`` command line (``ragloop = "ragloop.cli:main"``; ``python -m ragloop.cli`` runs it too).

One module per group of subcommands: :mod:`ragloop.cli._main` (the parser, ``index``, ``search``, ``eval`` and
:func:`main`), :mod:`~ragloop.cli.chat` (``ask``, ``chat``), :mod:`~ragloop.cli.ingest` (what ``index`` reads),
:mod:`~ragloop.cli.store` (``--store``), :mod:`~ragloop.cli.serve`, :mod:`~ragloop.cli.mcp`,
:mod:`~ragloop.cli.doctor`, :mod:`~ragloop.cli.gaps`, :mod:`~ragloop.cli.check` and
:mod:`~ragloop.cli.turnlog`; what several of them share is in :mod:`ragloop.cli._common`, which imports none of
them. This is the only layer that reads environment variables, prints, or configures logging.
"""

from __future__ import annotations

from ragloop.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
