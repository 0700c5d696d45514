"""The ``ragloop handoff resend`` command: re-send the hand-off webhook deliveries that exhausted their retries
(registered by :mod:`ragloop.cli`).

``ragloop handoff resend --turn-log URL`` reads the deliveries a server kept in the turn log's database
(``ragloop_handoff_outbox``: a receiver was down or refused every attempt) and POSTs each once more, exactly as it
was first sent (the same body, ``X-Ragloop-Signature`` and ``Idempotency-Key``: no secret is needed here), to
the URL it was meant for; one accepted is never sent again. It claims each row while it sends it, so a running
server (which re-sends on its own every ``Handoff.resend_every_s``) never sends the same one at the same time.
Prints what it re-sent and what still waits; ``--json`` prints one object. Exit 0 when nothing still fails, 1 when
some delivery failed again (retry later), 2 on a bad option or an unreachable log.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ragloop.cli._common import positive_int

__all__ = ["add_handoff", "cmd_resend"]


def add_handoff(sub: Any) -> None:
    """Register ``ragloop handoff resend``."""
    p = sub.add_parser("handoff", help="hand-offs to a person: re-send given-up webhook deliveries")
    actions = p.add_subparsers(dest="handoff_action", required=True, metavar="ACTION")
    r = actions.add_parser(
        "resend",
        help="re-send the webhook deliveries that exhausted their retries",
        description="Re-send, unchanged, the hand-off webhook deliveries kept in the turn log's database after "
        "every retry failed. Exit 1 when some still fail.",
    )
    r.add_argument("--turn-log", required=True, metavar="URL", help="the turn log: sqlite:PATH or postgresql://…")
    r.add_argument("--limit", type=positive_int, default=1000, metavar="N", help="most deliveries re-sent (1,000)")
    r.add_argument("--timeout", type=float, default=10.0, metavar="S", help="time limit per delivery (10 s)")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_resend)


def cmd_resend(args: argparse.Namespace) -> int:
    """Re-send the kept deliveries once each; the exit status (0: none still failing, 1: some)."""
    import anyio
    import httpx

    from ragloop.errors import ConfigError
    from ragloop.serve._webhook import resend
    from ragloop.turnlog import backend_for

    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.turn_log.startswith("sqlite:"):  # never create an empty log at a mistyped path
        path = Path(args.turn_log.removeprefix("sqlite:").removeprefix("//"))
        if not path.is_file():
            raise ConfigError(f"no turn log at {path}: give the --turn-log URL `ragloop serve` writes to")
    backend = backend_for(args.turn_log)

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient() as client:
            return await resend(backend, client, timeout_s=args.timeout, limit=args.limit, strict=True)

    try:
        delivered, failed = anyio.run(run)
        waiting = backend.undelivered()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 — the driver's own error: one line and exit 2, never a traceback
        raise ConfigError(f"the turn log at {args.turn_log} cannot be read: {type(exc).__name__}: {exc}") from None
    finally:
        backend.close()
    if args.json:
        print(json.dumps({"delivered": delivered, "failed": failed, "waiting": waiting}))
    else:
        print(f"re-sent {delivered} delivered, {failed} failed again; {waiting} waiting")
    return 1 if failed else 0
