"""The ``ragloop ask`` and ``ragloop chat`` commands (registered by :mod:`ragloop.cli`).

Both run the default chat turn over an index (``--index DIR``), a Postgres store (``--store URL``) or, without
either, over the bundled sample
knowledge base and its ticket database, built on first use. With ``OPENAI_BASE_URL`` or ``OPENAI_API_KEY``
and ``RAGLOOP_MODEL`` set they use an OpenAI-compatible model; otherwise they run offline and say so.
Progress goes to stderr; the answer (or one JSON object with ``--json``) goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ragloop._redact import redact
from ragloop.cli_store import add_filter_option, add_store_options, parse_filters, store_url
from ragloop.cli_turnlog import add_turn_log_options, open_turn_log
from ragloop.text.safety import terminal_safe

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

__all__ = ["add_ask", "add_chat", "cmd_ask", "cmd_chat"]

_ENV_HELP = (
    "Environment: OPENAI_BASE_URL and/or OPENAI_API_KEY with RAGLOOP_MODEL (and optionally "
    "RAGLOOP_ANSWER_MODEL) select an OpenAI-compatible model; without them the turn runs offline."
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", metavar="DIR", help="index directory (default: the bundled sample knowledge base)")
    parser.add_argument("--page-url", metavar="URL", help="page the user asks from (resolves 'this page')")
    parser.add_argument("--page-title", metavar="TITLE", help="title of that page")
    parser.add_argument("--mode", choices=("hybrid", "bm25", "dense"), default="hybrid", help="retrieval mode")
    parser.add_argument("--tickets", metavar="SQLITE", help="ticket database for the live ticket source")
    parser.add_argument("--no-live", action="store_true", help="no live sources")
    parser.add_argument(
        "--no-plan", action="store_true", help="no retrieval planner over the sample CRM database (SQL, then documents)"
    )
    parser.add_argument("--deadline", type=float, metavar="S", help="time limit per turn, in seconds")
    parser.add_argument("--cache-dir", metavar="DIR", help="where the sample index is cached (~/.cache/ragloop)")
    add_store_options(parser)
    add_filter_option(parser)
    add_turn_log_options(parser)


def add_ask(sub: Any) -> None:
    """Register ``ragloop ask``."""
    p = sub.add_parser("ask", help="answer one question", description="Answer one question. " + _ENV_HELP)
    p.add_argument("question")
    _common(p)
    p.add_argument("--json", action="store_true", help="print one JSON object: text, outcome, citations, record")
    p.set_defaults(func=cmd_ask)


def add_chat(sub: Any) -> None:
    """Register ``ragloop chat``."""
    p = sub.add_parser("chat", help="interactive chat with history", description="Interactive chat. " + _ENV_HELP)
    _common(p)
    p.set_defaults(func=cmd_chat)


def _llm() -> tuple[Any, str | None, str | None]:
    """An AsyncOpenAI client and models from the environment, or ``(None, None, None)`` to run offline."""
    base_url, api_key = os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")
    model = os.environ.get("RAGLOOP_MODEL")
    if not (base_url or api_key) or not model:
        return None, None, None
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed", max_retries=2, timeout=60.0)
    return client, model, os.environ.get("RAGLOOP_ANSWER_MODEL") or model


def _build(args: argparse.Namespace) -> tuple[ChatRAG, Any]:
    from ragloop.chat import ChatRAG
    from ragloop.retrievers.live import SQLiteTicketSource

    client, fast, answer = _llm()
    live: tuple[Any, ...] = ()
    if not args.no_live and (args.tickets or not (args.index or store_url(args))):
        live = (SQLiteTicketSource(args.tickets) if args.tickets else SQLiteTicketSource(),)
    kwargs: dict[str, Any] = {"fast_model": fast, "answer_model": answer, "mode": args.mode, "live_sources": live}
    url = store_url(args)
    if url:
        rag = ChatRAG.from_store(url, client, collection=args.collection, pool_size=args.pool_size, **kwargs)
    elif args.index:
        rag = ChatRAG.from_index(args.index, client, **kwargs)
    else:
        if not (args.cache_dir and os.path.isdir(args.cache_dir)):
            print("ragloop: loading the sample knowledge base (built on first use)…", file=sys.stderr)
        if not args.no_plan:  # the sample's CRM database, for questions that need SQL before the documents
            from ragloop.retrievers.sql import SQLiteSource
            from ragloop.sample import SAMPLE_CRM_ALLOW, sample_crm_path

            kwargs["plan_sources"] = (SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW),)
        rag = ChatRAG.sample(client, cache_dir=args.cache_dir, **kwargs)
    rag.turn_log = open_turn_log(args, rag)
    if client is None:
        print("ragloop: running offline (no model configured): extractive answers from the index", file=sys.stderr)
    else:
        print(f"ragloop: using model {fast} (answers: {answer}) at {redact(str(client.base_url))}", file=sys.stderr)
    return rag, client


#: The progress events ``ask`` and ``chat`` print to stderr.
_SHOWN = ("plan", "wave", "search", "retrieved", "graded", "live", "rewrite")


def _print_sources(reply: Reply) -> None:
    if reply.citations:
        print("\nSources:")
        for c in reply.citations:
            print(terminal_safe(f"  [{c.n}] {c.title} — {c.url or c.source}"))


async def _turn(rag: ChatRAG, question: str, args: argparse.Namespace, history: list[dict[str, str]]) -> Reply:
    """Stream one turn: progress on stderr, tokens on stdout."""
    from ragloop.chat import ReplyReady
    from ragloop.events import Progress, Token

    reply = None
    async for event in rag.stream(
        question,
        history=history,
        page_url=args.page_url,
        page_title=args.page_title,
        deadline_s=args.deadline,
        filters=parse_filters(args.filter),
    ):
        if isinstance(event, Progress) and event.kind in _SHOWN:
            print(terminal_safe(f"  … {event.message}"), file=sys.stderr, flush=True)
        elif isinstance(event, Token):
            # Model and document text: no escape sequences (clipboard writes, clears, titles) reach the terminal.
            print(terminal_safe(event.text), end="", flush=True)
        elif isinstance(event, ReplyReady):
            reply = event.reply
    print()
    assert reply is not None
    _print_sources(reply)
    return reply


def cmd_ask(args: argparse.Namespace) -> int:
    """Answer one question."""
    import anyio

    rag, client = _build(args)

    async def run() -> int:
        try:
            if args.json:
                reply = await rag.ask(
                    args.question,
                    page_url=args.page_url,
                    page_title=args.page_title,
                    deadline_s=args.deadline,
                    filters=parse_filters(args.filter),
                )
                print(json.dumps(reply.as_dict(), ensure_ascii=False))
            else:
                await _turn(rag, args.question, args, [])
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()
        return 0

    return anyio.run(run)


def cmd_chat(args: argparse.Namespace) -> int:
    """Interactive chat: one question per line; ``exit`` or end of input stops."""
    import anyio

    from ragloop.errors import InputError

    rag, client = _build(args)
    history: list[dict[str, str]] = []

    async def run() -> int:
        try:
            while True:
                try:
                    line = await anyio.to_thread.run_sync(input, "you> ")
                except EOFError:
                    print()
                    return 0
                if line.strip().lower() in ("exit", "quit", ":q"):
                    return 0
                if not line.strip():
                    continue
                print("ragloop> ", end="", flush=True)
                try:
                    reply = await _turn(rag, line, args, history)
                except InputError as exc:
                    print(terminal_safe(f"\n(error: {exc})"), file=sys.stderr)
                    continue
                history.extend(({"role": "user", "content": line}, {"role": "assistant", "content": reply.text}))
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()

    return anyio.run(run)
