"""The ``--turn-log`` options of ``ragloop ask``, ``chat`` and ``serve`` (nothing is logged without them).

``--turn-log URL`` (``sqlite:PATH`` or ``postgresql://…``) logs every finished turn for ``ragloop gaps`` and
feedback; ``--turn-log-retention DAYS`` deletes turns older than that; ``--turn-log-no-questions`` keeps only the
questions' hashes, key terms and embeddings. Environment (read here, as every variable is, by the CLI):
``RAGLOOP_TURN_LOG_SALT`` salts the hashes of principals, users and tenants.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ragloop.cli._common import positive_int

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder
    from ragloop.turnlog import TurnLog

__all__ = ["add_turn_log_options", "open_turn_log"]


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of days, got {text!r}")
    return value


def add_turn_log_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--turn-log``, ``--turn-log-retention``, ``--turn-log-per-key`` and ``--turn-log-no-questions``."""
    parser.add_argument(
        "--turn-log", metavar="URL", help="log finished turns (sqlite:PATH or postgresql://…) for `ragloop gaps`"
    )
    parser.add_argument(
        "--turn-log-retention", type=_days, metavar="DAYS", help="delete logged turns older than DAYS (default: keep)"
    )
    parser.add_argument(
        "--turn-log-per-key",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="most turns kept per API key: a key over it loses its own oldest turns (default: %(default)s)",
    )
    parser.add_argument(
        "--turn-log-no-questions",
        action="store_true",
        help="log only the questions' hashes, key terms and embeddings, never their text",
    )


def open_turn_log(args: argparse.Namespace, embedder: Embedder | None = None) -> TurnLog | None:
    """The turn log ``args`` ask for (``None`` without ``--turn-log``); a private log embeds with ``embedder``
    (the chat's: ``rag.turn.embedder``), so that ``ragloop gaps`` can group questions it never sees."""
    url = getattr(args, "turn_log", None)
    if not url:
        return None
    from ragloop.turnlog import LogPolicy, TurnLog

    private = bool(getattr(args, "turn_log_no_questions", False))
    policy = LogPolicy(capture_questions=not private, identity_salt=os.environ.get("RAGLOOP_TURN_LOG_SALT", ""))
    return TurnLog.open(
        url,
        policy=policy,
        retention_days=getattr(args, "turn_log_retention", None),
        max_turns_per_principal=getattr(args, "turn_log_per_key", 100_000),
        embedder=embedder if private else None,
    )
