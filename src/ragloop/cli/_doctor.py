"""``ragloop doctor``: probe the OpenAI-compatible endpoint the CLI would use, and say what it supports.

The endpoint, key and model are read as ``ragloop ask`` reads them (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``RAGLOOP_MODEL``); ``--base-url``, ``--api-key`` and ``--model`` override them.

``ragloop doctor --store URL [--collection C]`` checks a PostgreSQL store instead, read-only: the schema
version, the embedder, documents and chunks (per scope), the metadata keys, and missing indexes; exit 1 when
something needs doing (each problem says what).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ragloop.errors import ConfigError

__all__ = ["add_doctor", "cmd_doctor", "cmd_doctor_store"]


def add_doctor(sub: Any) -> None:
    """Register ``ragloop doctor``."""
    p = sub.add_parser(
        "doctor",
        help="probe an OpenAI-compatible endpoint: tools, json_schema, streaming, output caps",
        description=__doc__,
    )
    p.add_argument("--base-url", default=None, help="API root, e.g. http://127.0.0.1:8080/v1 (OPENAI_BASE_URL)")
    p.add_argument("--api-key", default=None, help="API key (OPENAI_API_KEY)")
    p.add_argument("--model", default=None, help="model name (RAGLOOP_MODEL)")
    p.add_argument("--max-tokens", type=int, default=48, help="output cap of each probe (default 48)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per probe request (default 120)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_store_options(p)
    p.set_defaults(func=cmd_doctor)


def _add_store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        metavar="URL",
        help="check a PostgreSQL store (postgresql://…) instead of a model endpoint: schema, embedder, counts, indexes",
    )
    p.add_argument("--collection", default=None, help="with --store: check only this collection (default: all)")


def cmd_doctor_store(args: argparse.Namespace) -> int:
    """``ragloop doctor --store URL``: the store's report; exit status 1 when something needs doing."""
    import anyio

    from ragloop.retrievers.postgres import diagnose_store

    report = anyio.run(diagnose_store, args.store, args.collection)
    _print(json.dumps(report.as_dict(), indent=2) if args.json else "\n".join(report.lines()))
    return 0 if report.healthy else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run the probes and print the report; exit status 1 when no decide mode but offline works."""
    if getattr(args, "store", None):
        return cmd_doctor_store(args)
    import anyio
    import openai

    from ragloop.llm.doctor import diagnose

    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    model = args.model or os.environ.get("RAGLOOP_MODEL")
    if not (base_url or api_key) or not model:
        raise ConfigError(
            "no endpoint to probe: set OPENAI_BASE_URL (or OPENAI_API_KEY for OpenAI) and RAGLOOP_MODEL, or pass "
            "--base-url and --model"
        )

    async def run() -> Any:
        client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", max_retries=0, timeout=args.timeout
        )
        async with client:
            return await diagnose(client, model, max_tokens=args.max_tokens)

    report = anyio.run(run)
    _print(json.dumps(report.as_dict(), indent=2) if args.json else "\n".join(report.lines()))
    return 0 if report.decide_mode != "offline" else 1


def _print(text: str) -> None:
    """Print a report with credentials redacted (the endpoint's user info, keys an error message quoted)."""
    from ragloop._redact import hide_password

    print(hide_password(text))
