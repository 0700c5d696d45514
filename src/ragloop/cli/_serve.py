"""The ``ragloop serve`` command: run the chat app (:func:`ragloop.serve.create_app`) with uvicorn.

Registered by :mod:`ragloop.cli`; this module imports nothing heavy at import time, so ``ragloop --help``
stays fast. Environment (read here, nowhere else in the library): ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``
with ``RAGLOOP_MODEL`` select a model (as for ``ragloop ask``); ``RAGLOOP_API_KEYS`` (comma-separated)
turns on bearer authentication, each key its own principal; ``--keys keys.toml`` maps keys to principals,
tenants and filters.

Without any key the server is open to whoever reaches it, so it serves a loopback address only: a
non-loopback ``--host`` without keys is refused (exit 2, one line) unless ``--allow-no-keys`` says that
something in front of it authenticates. On a loopback address the ``Host`` header must name loopback
(``localhost``, ``127.0.0.1``, ``::1``; DNS rebinding) unless ``--allowed-host`` says otherwise. SIGINT and
SIGTERM cancel the turns in flight (each ends with an error frame) and exit 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ragloop.cli._turnlog import add_turn_log_options

__all__ = ["add_serve", "cmd_serve"]


def add_serve(sub: Any) -> None:
    """Register ``ragloop serve``."""
    p = sub.add_parser(
        "serve",
        help="serve the chat over HTTP: OpenAI-compatible API, SSE, chat page",
        description=(
            "Serve the chat over HTTP (needs the [serve] extra). Environment: OPENAI_BASE_URL and/or "
            "OPENAI_API_KEY with RAGLOOP_MODEL select a model (offline without them); RAGLOOP_API_KEYS "
            "(comma-separated) requires 'Authorization: Bearer <key>' on the API. Without keys it serves "
            "loopback only."
        ),
    )
    add_knowledge_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000)")
    p.add_argument("--max-concurrency", type=int, default=64, metavar="N", help="turns at once; more get 429")
    add_quota_options(p)
    p.add_argument(
        "--workers", type=_workers, default=1, metavar="N",
        help="worker processes sharing the port, each with its own pools and turn slots (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--sessions",
        default="memory",
        metavar="WHERE",
        help="session store: memory (default), sqlite:PATH, or a postgresql:// URL",
    )
    p.add_argument(
        "--keys", metavar="TOML", help="API keys file: key -> principal, tenant, filters (see docs/serving.md)"
    )
    p.add_argument(
        "--allow-no-keys",
        action="store_true",
        help="serve a non-loopback --host without API keys (only behind a proxy that authenticates)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="serve requests whose Host header is HOST (repeatable; *.example.com for subdomains)",
    )
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S", help="request head timeout (10 s)")
    p.add_argument("--body-timeout", type=float, default=10.0, metavar="S", help="request body timeout (10 s)")
    p.add_argument("--write-timeout", type=float, default=30.0, metavar="S",
                   help="a client that reads none of its response for S seconds is disconnected (30 s)")  # fmt: skip
    p.add_argument(
        "--keepalive", type=float, default=15.0, metavar="S",
        help="send an SSE comment on a stream idle for S seconds, so proxies keep it open (15 s; 0: never)",
    )  # fmt: skip
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN", help="allow this browser origin")
    p.add_argument("--source-base-url", metavar="URL", help="link citations to URL + source (e.g. your docs site)")
    p.add_argument("--no-page", action="store_true", help="do not serve the chat page at /")
    p.add_argument("--title", metavar="TEXT", help='the chat page\'s title and heading (default "Ask the docs")')
    p.add_argument(
        "--colour", "--color", dest="colour", metavar="COLOUR", help="the chat page's accent colour (#0b5fcc, teal)"
    )
    p.add_argument("--no-mcp", action="store_true", help="do not serve MCP at /mcp")
    add_turn_log_options(p)
    p.add_argument(
        "--handoff-drafts",
        metavar="DIR",
        help="serve POST /v1/handoff and its resolution (needs --turn-log); answers become draft pages in DIR "
        "(e.g. docs/_drafts, which `ragloop index docs --include-drafts` reads)",
    )
    p.add_argument(
        "--handoff-url",
        metavar="URL",
        help="POST each hand-off's packet to URL, signed with $RAGLOOP_HANDOFF_SECRET (X-Ragloop-Signature)",
    )
    p.add_argument(
        "--handoff-resend-every",
        type=float,
        default=60.0,
        metavar="S",
        help="re-send the deliveries that exhausted their retries every S seconds (default 60; 0: only after a "
        "later hand-off and by `ragloop handoff resend`)",
    )
    dead = "mark a kept delivery dead (no longer re-sent; `ragloop handoff list --dead`) after"
    p.add_argument("--handoff-dead-after", type=int, default=1_000, metavar="N", help=f"{dead} N attempts (1,000)")
    p.add_argument("--handoff-dead-after-days", type=float, default=3.0, metavar="D", help=f"{dead} D days (3)")
    p.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="uvicorn log level (default warning)",
    )
    p.set_defaults(func=cmd_serve)


def add_quota_options(p: argparse.ArgumentParser) -> None:
    """The per-key limits (docs/serving.md, "Per-key limits"); each has a ``ServeSettings`` twin."""
    q = p.add_argument_group("per-key limits (one key never spends another's share)")
    q.add_argument(
        "--max-concurrency-per-key",
        type=int,
        metavar="N",
        help="turns one key may run at once (default: --max-concurrency shared over the keys, up to a quarter)",
    )
    q.add_argument("--sessions-per-key", type=int, default=1_000, metavar="N",
                   help="sessions one key keeps; its own oldest goes over it (1000)")  # fmt: skip
    q.add_argument("--max-sessions", type=int, default=100_000, metavar="N",
                   help="sessions kept in all; a new one gets 429 over it (100000)")  # fmt: skip
    q.add_argument("--session-idle", type=float, default=86_400.0, metavar="S",
                   help="a session with no turn for S seconds is deleted (86400: a day)")  # fmt: skip
    q.add_argument("--mcp-sessions-per-key", type=int, default=100, metavar="N",
                   help="MCP sessions one key may hold open; another initialize gets 429 (100)")  # fmt: skip
    q.add_argument("--mcp-idle", type=float, default=1_800.0, metavar="S",
                   help="an MCP session with no request for S seconds is closed (1800)")  # fmt: skip
    q.add_argument("--feedback-per-minute", type=int, default=60, metavar="N",
                   help="ratings one key may send per minute; more get 429 (60)")  # fmt: skip


def add_knowledge_options(p: argparse.ArgumentParser) -> None:
    """``--index DIR`` or ``--store URL`` (with its collection and pool size): what ``serve`` and ``mcp`` read."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--index", metavar="DIR", help="index directory (default: the bundled sample knowledge base)")
    where.add_argument(
        "--store", metavar="URL", help="a PostgreSQL knowledge store (postgresql://…; see `ragloop index --store`)"
    )
    p.add_argument("--collection", default="ragloop", help="collection (table prefix) in the store")
    p.add_argument("--pool-size", type=int, default=10, help="most connections to the store")
    p.add_argument("--mode", choices=("hybrid", "bm25", "dense"), default="hybrid", help="retrieval mode")
    p.add_argument("--tickets", metavar="SQLITE", help="ticket database for the live ticket source")
    p.add_argument("--no-live", action="store_true", help="no live sources")
    p.add_argument("--no-plan", action="store_true", help="no retrieval planner over the sample CRM database")
    p.add_argument("--cache-dir", metavar="DIR", help="where the sample index is cached (~/.cache/ragloop)")
    p.add_argument("--deadline", type=float, default=60.0, metavar="S", help="time limit per turn (default 60 s)")
    from ragloop.cli._chat import RERANKER_HELP

    p.add_argument("--reranker", metavar="URL|PATH", help=RERANKER_HELP)


def _port(text: str) -> int:
    """A TCP port number for argparse (0: any free port)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return port


def _workers(text: str) -> int:
    """A number of worker processes for argparse (1 to 64)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"must be a number of processes from 1 to 64, got {text!r}")
    return n


def _api_keys(raw: str) -> tuple[str, ...]:
    """The keys in ``RAGLOOP_API_KEYS``; refuses a value that names no usable key rather than serving openly."""
    from ragloop.errors import ConfigError

    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    if raw.strip() and not keys:
        raise ConfigError(f"RAGLOOP_API_KEYS is set but holds no key ({raw!r}); unset it to serve without keys")
    for n, key in enumerate(keys, 1):
        if not (key.isascii() and key.isprintable()) or " " in key:
            raise ConfigError(
                f"RAGLOOP_API_KEYS key {n} must be printable ASCII without spaces (an HTTP header carries it)"
            )
    return keys


def _is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _access(args: argparse.Namespace, keys: int) -> tuple[tuple[str, ...], str]:
    """The ``Host`` allowlist and the line that says who may call; refuses an open non-loopback server."""
    from ragloop.errors import ConfigError
    from ragloop.serve._hosts import LOOPBACK_HOSTS

    loopback = _is_loopback(args.host)
    if not keys and not loopback and not args.allow_no_keys:
        raise ConfigError(
            f"--host {args.host} without API keys would let anyone who reaches it read the knowledge base; "
            "set RAGLOOP_API_KEYS or --keys keys.toml (or pass --allow-no-keys when a proxy in front authenticates)"
        )
    hosts = tuple(args.allowed_host) or (LOOPBACK_HOSTS if loopback else ())
    if keys:
        who = f"API keys required ({keys})"
    elif loopback:
        who = "no API keys: loopback only, anyone on this machine may call it"
    else:
        who = "no API keys (--allow-no-keys): anyone who reaches it may call it"
    return hosts, who


def _sessions(where: str, quota: Any = None) -> Any:
    from ragloop.errors import ConfigError
    from ragloop.serve import MemorySessionStore, PostgresSessionStore, SessionQuota, SQLiteSessionStore

    quota = quota if quota is not None else SessionQuota()
    if where == "memory":
        return MemorySessionStore(quota=quota)
    if where.startswith("sqlite:"):
        return SQLiteSessionStore(where.removeprefix("sqlite:"), quota=quota)
    if where.startswith(("postgresql://", "postgres://")):
        return PostgresSessionStore(where, quota=quota)
    raise ConfigError(f"--sessions must be memory, sqlite:PATH or a postgresql:// URL, got {where!r}")


async def _check_sessions(sessions: Any) -> None:
    """Refuse an old session table now, in one line; a store that is only down is reported, not fatal."""
    from ragloop.errors import ConfigError

    try:
        await sessions.ping()
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 — the server starts; /readyz says "sessions: unavailable" until it is up
        from ragloop._redact import redact

        print(f"ragloop: warning: the session store is not reachable yet ({redact(str(exc))[:200]})", file=sys.stderr)


def _source_url(base: str | None) -> Any:
    if not base:
        return None
    from urllib.parse import quote, urljoin

    prefix = base if base.endswith("/") else base + "/"

    def link(source: str) -> str | None:
        if source.startswith(("https://", "http://")):
            return source
        return urljoin(prefix, quote(source.lstrip("/")))

    return link


def _handoff(args: argparse.Namespace) -> Any:
    """The hand-off settings of ``--handoff-drafts`` / ``--handoff-url``, checked before the index loads."""
    from ragloop.errors import ConfigError

    if args.handoff_url and not args.handoff_drafts:
        raise ConfigError("--handoff-url needs --handoff-drafts DIR: where the answers to hand-offs are written")
    if not args.handoff_drafts:
        return None
    if not args.turn_log:
        raise ConfigError("--handoff-drafts needs --turn-log URL: hand-offs are kept in the turn log's database")
    secret = os.environ.get("RAGLOOP_HANDOFF_SECRET", "")
    if args.handoff_url and len(secret) < 16:
        raise ConfigError("--handoff-url needs RAGLOOP_HANDOFF_SECRET (16 characters or more) to sign each packet")
    from pathlib import Path

    from ragloop.serve import Handoff

    every = float(getattr(args, "handoff_resend_every", 60.0))
    if not every >= 0:
        raise ConfigError(f"--handoff-resend-every must be 0 or a positive number of seconds, got {every}")
    attempts = int(getattr(args, "handoff_dead_after", 1_000))
    days = float(getattr(args, "handoff_dead_after_days", 3.0))
    if attempts < 1 or not days > 0:
        raise ConfigError(f"--handoff-dead-after must be >= 1 and --handoff-dead-after-days > 0: {attempts}, {days}")
    return Handoff(
        Path(args.handoff_drafts),
        url=args.handoff_url,
        secret=secret.encode() if secret else None,
        resend_every_s=every,
        dead_after_attempts=attempts,
        dead_after_days=days,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the chat, then serve it until interrupted."""
    try:
        import uvicorn

        from ragloop.serve import ServeSettings, create_app
    except ImportError as exc:
        from ragloop.errors import ConfigError

        raise ConfigError(f"ragloop serve needs the [serve] extra: pip install 'ragloop[serve]' ({exc})") from exc
    if args.store:
        from ragloop.chat import ChatRAG
        from ragloop.errors import ConfigError

        if not hasattr(ChatRAG, "from_store"):
            raise ConfigError("this ragloop has no Postgres knowledge store yet; use --index DIR")
    from ragloop.serve import CleanExitServer, SessionQuota, h11_protocol, load_keys

    env_keys = _api_keys(os.environ.get("RAGLOOP_API_KEYS", ""))
    file_keys = load_keys(args.keys) if args.keys else ()
    hosts, who = _access(args, len(env_keys) + len(file_keys))
    settings = ServeSettings(  # before the index loads: a bad setting fails in a moment
        max_concurrent_turns=args.max_concurrency,
        max_turns_per_key=args.max_concurrency_per_key,
        session_quota=SessionQuota(per_owner=args.sessions_per_key, idle_s=args.session_idle, total=args.max_sessions),
        mcp_sessions_per_key=args.mcp_sessions_per_key,
        mcp_idle_s=args.mcp_idle,
        feedback_per_key=args.feedback_per_minute,
        deadline_s=args.deadline,
        api_keys=env_keys,
        keys=file_keys,
        allowed_hosts=hosts,
        body_timeout_s=args.body_timeout,
        keepalive_s=args.keepalive or None,
        cors_origins=tuple(args.cors_origin),
        page=not args.no_page,
        page_title=args.title,
        page_colour=args.colour,
        mcp=not args.no_mcp,
    )
    if args.workers > 1:  # the options are checked; each worker builds its own chat, pools and slots
        from ragloop.cli._workers import serve_workers

        return serve_workers(args)
    handoff = _handoff(args)
    http = h11_protocol(header_timeout_s=args.header_timeout, write_timeout_s=args.write_timeout)
    rag, client, documents = build_with_documents(_chat_args(args))  # as `ragloop ask` builds it
    sessions = _sessions(args.sessions, settings.session_quota)
    app = create_app(
        rag,
        settings=settings,
        sessions=sessions,
        source_url=_source_url(args.source_base_url),
        llm=client,
        documents=documents,
        handoff=handoff,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        lifespan="on",  # runs the MCP endpoint's session manager
        http=http,
        ws="none",
    )
    import socket

    import anyio

    async def run() -> None:
        # One event loop for serving and for closing: pools opened while serving close in their own loop.
        try:
            await _check_sessions(sessions)
            print(f"ragloop: serving on http://{args.host}:{args.port}/ (chat page at /, API at /v1; {who})",
                  file=sys.stderr)  # fmt: skip
            inherited = getattr(args, "fd", None)  # a worker of `--workers N` serves its supervisor's socket
            sockets = [socket.socket(fileno=inherited)] if inherited is not None else None
            await CleanExitServer(config, app.state.ragloop_shut_down).serve(sockets=sockets)
        finally:
            await sessions.aclose()
            await rag.aclose()
            if client is not None:
                await client.close()

    anyio.run(run)
    return 0


def build_with_documents(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The chat as ``ragloop ask`` builds it, its model client, and the documents MCP reads (index or store).

    A ``--index`` is loaded once and shared by both; the sample index is small and loaded a second time.
    """
    from ragloop.cli._chat import _build
    from ragloop.serve import IndexDocuments, StoreDocuments

    if args.index and not args.store:
        from ragloop.retrievers.index import KnowledgeIndex

        args = argparse.Namespace(**{**vars(args), "index": KnowledgeIndex.load(args.index)})
    rag, client = _build(args)
    if rag.store is not None:
        return rag, client, StoreDocuments(rag.store)
    if args.index:
        return rag, client, IndexDocuments(args.index, args.mode)
    from pathlib import Path

    from ragloop.sample import sample_index

    return rag, client, IndexDocuments(sample_index(Path(args.cache_dir) if args.cache_dir else None), args.mode)


def _chat_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` completed with the defaults of every ``ragloop ask`` option that ``serve`` does not offer."""
    from ragloop.cli._chat import _common

    ask = argparse.ArgumentParser(add_help=False)
    _common(ask)
    merged = vars(ask.parse_args([]))
    merged.update({key: value for key, value in vars(args).items() if key in merged})
    return argparse.Namespace(**merged)


if __name__ == "__main__":  # a worker of `ragloop serve --workers N` (started by ragloop.cli._workers)
    from ragloop.cli._workers import worker_args
    from ragloop.errors import RagloopError

    try:
        sys.exit(cmd_serve(worker_args()))
    except RagloopError as exc:
        print(f"ragloop: {exc}", file=sys.stderr)
        sys.exit(2)
