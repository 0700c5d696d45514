"""The ``ragloop`` command line (``ragloop = "ragloop.cli:main"``; ``python -m ragloop.cli`` runs it too).

:func:`main` runs one command line and returns its exit status; :func:`build_parser` is its argument parser (every
subcommand and flag, as ``ragloop --help`` shows them). The modules behind them are private, one per group of
subcommands: ``_main`` (the parser, ``index``, ``search``, ``eval`` and :func:`main`), ``_chat`` (``ask``,
``chat``), ``_ingest`` (what ``index`` reads), ``_store`` (``--store``), ``_serve``, ``_mcp``, ``_doctor``,
``_gaps``, ``_check``, ``_replay``, ``_handoff`` and ``_turnlog``; what several of them share is in ``_common``,
which imports none of them. This is the only layer that reads environment variables, prints, or configures
logging.
"""

from __future__ import annotations

from ragloop.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
