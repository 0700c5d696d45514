"""The ``ragloop handoff resend`` and ``ragloop handoff list`` commands: the hand-off webhook deliveries that
exhausted their retries (registered by :mod:`ragloop.cli`).

``ragloop handoff resend --turn-log URL`` reads the deliveries a server kept in the turn log's database
(``ragloop_handoff_outbox``: a receiver was down or refused every attempt) and POSTs each once more to the URL it
was meant for: the same body and ``Idempotency-Key``, signed now with ``RAGLOOP_HANDOFF_SECRET`` (the server's
secret: after a rotation, the new one); one accepted is never sent again. First it marks dead the deliveries tried
``--dead-after`` times (1,000) or kept ``--dead-after-days`` (3), as the server does; a dead one is kept, never
re-sent on its own, and ``--dead`` re-tries only the dead ones (one accepted is delivered; one that fails again
stays dead). It claims each row while it sends it, so a running server (which re-sends on its own every
``Handoff.resend_every_s``) never sends the same one at the same time. Prints what it re-sent, what still waits
and how many are dead; ``--json`` prints one object. Exit 0 when nothing sent failed, 1 when some delivery failed
again (retry later), 2 on a bad option, a missing secret or an unreachable log.

``ragloop handoff list --turn-log URL [--dead] [--json]`` lists the waiting deliveries (``--dead``: the dead ones):
hand-off id, URL, attempts, when the first gave up, the latest error, when it was marked dead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragloop.cli._common import positive_int

__all__ = ["add_handoff", "cmd_list", "cmd_resend"]


def add_handoff(sub: Any) -> None:
    """Register ``ragloop handoff resend`` and ``ragloop handoff list``."""
    p = sub.add_parser("handoff", help="hand-offs to a person: re-send or list given-up webhook deliveries")
    actions = p.add_subparsers(dest="handoff_action", required=True, metavar="ACTION")
    r = actions.add_parser(
        "resend",
        help="re-send the webhook deliveries that exhausted their retries",
        description="Re-send the hand-off webhook deliveries kept in the turn log's database after every retry "
        "failed, signed with $RAGLOOP_HANDOFF_SECRET. Exit 1 when some still fail.",
    )
    r.add_argument("--turn-log", required=True, metavar="URL", help="the turn log: sqlite:PATH or postgresql://…")
    r.add_argument("--limit", type=positive_int, default=1000, metavar="N", help="most deliveries re-sent (1,000)")
    r.add_argument("--timeout", type=float, default=10.0, metavar="S", help="time limit per delivery (10 s)")
    r.add_argument("--dead", action="store_true", help="re-try only the deliveries marked dead")
    r.add_argument("--dead-after", type=positive_int, default=1_000, metavar="N", help="mark dead after N (1,000)")
    r.add_argument("--dead-after-days", type=float, default=3.0, metavar="D", help="... or after D days (3)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_resend)
    ls = actions.add_parser("list", help="list the kept webhook deliveries (--dead: the dead ones)")
    ls.add_argument("--turn-log", required=True, metavar="URL", help="the turn log: sqlite:PATH or postgresql://…")
    ls.add_argument("--dead", action="store_true", help="list the deliveries marked dead")
    ls.add_argument("--json", action="store_true", help="print a JSON array")
    ls.set_defaults(func=cmd_list)


def _backend(url: str) -> Any:
    from ragloop.errors import ConfigError
    from ragloop.turnlog import backend_for

    if url.startswith("sqlite:"):  # never create an empty log at a mistyped path
        path = Path(url.removeprefix("sqlite:").removeprefix("//"))
        if not path.is_file():
            raise ConfigError(f"no turn log at {path}: give the --turn-log URL `ragloop serve` writes to")
    return backend_for(url)


@contextmanager
def _opened(url: str) -> Iterator[Any]:
    """The turn log's backend at ``url``, closed after; a driver error is one line (ConfigError) without the URL's
    password, never a traceback."""
    from ragloop._redact import hide_password
    from ragloop.errors import ConfigError, error_text

    backend = _backend(url)
    try:
        yield backend
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 — the driver's own error: one line and exit 2
        raise ConfigError(hide_password(f"the turn log at {url} cannot be read: {error_text(exc)}")) from None
    finally:
        backend.close()


def cmd_resend(args: argparse.Namespace) -> int:
    """Re-send the kept deliveries once each; the exit status (0: none still failing, 1: some)."""
    import anyio
    import httpx

    from ragloop.errors import ConfigError
    from ragloop.serve._webhook import bury, resend

    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if not args.dead_after_days > 0:
        raise ConfigError(f"--dead-after-days must be a positive number of days, got {args.dead_after_days}")
    secret = os.environ.get("RAGLOOP_HANDOFF_SECRET", "")
    if len(secret) < 16:
        raise ConfigError(
            "set RAGLOOP_HANDOFF_SECRET (16 characters or more) to the secret the receiver verifies with (the "
            "server's): each delivery is signed when it is sent"
        )

    async def run(backend: Any) -> tuple[int, int, int]:
        buried = await bury(backend, max_attempts=args.dead_after, max_days=args.dead_after_days, strict=True)
        async with httpx.AsyncClient() as client:
            done, failed = await resend(
                backend, client, secret.encode(), timeout_s=args.timeout, limit=args.limit, strict=True, dead=args.dead
            )
        return done, failed, buried

    with _opened(args.turn_log) as backend:
        delivered, failed, buried = anyio.run(run, backend)
        waiting, dead = backend.undelivered(), backend.undelivered(dead=True)
    if args.json:
        out = {"delivered": delivered, "failed": failed, "waiting": waiting, "dead": dead, "marked_dead": buried}
        print(json.dumps(out))
    else:
        print(f"re-sent {delivered} delivered, {failed} failed again; {waiting} waiting, {dead} dead", end="")
        print(f" ({buried} marked dead now; `ragloop handoff list --dead`)" if buried else "")
    return 1 if failed else 0


def _when(at: float | None) -> str | None:
    return None if at is None else dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")


def cmd_list(args: argparse.Namespace) -> int:
    """Print the kept deliveries (``--dead``: the dead ones); exit 0."""
    from ragloop._redact import hide_password

    with _opened(args.turn_log) as backend:
        rows = backend.parked(dead=args.dead)
    items = [
        {
            "handoff_id": r.handoff_id,
            "url": hide_password(r.url),
            "attempts": r.attempts,
            "first_failed": _when(r.failed_at),
            "last_error": r.last_error,
            "dead_since": _when(r.dead_at),
        }
        for r in rows
    ]
    if args.json:
        print(json.dumps(items, ensure_ascii=False))
        return 0
    if not items:
        print("no dead deliveries" if args.dead else "no deliveries waiting")
    for i in items:
        dead = f", dead since {i['dead_since']}" if i["dead_since"] else ""
        print(f"{i['handoff_id']}  {i['url']}  {i['attempts']} attempts, first failed {i['first_failed']}{dead}; "
              f"last error: {i['last_error']}")  # fmt: skip
    return 0
