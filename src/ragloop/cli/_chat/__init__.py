"""The ``ragloop ask`` and ``ragloop chat`` commands (registered by :mod:`ragloop.cli`).

Both run the default chat turn over an index (``--index DIR``), a Postgres store (``--store URL``) or, without
either, over the bundled sample knowledge base and its ticket database, built on first use. With
``OPENAI_BASE_URL`` or ``OPENAI_API_KEY`` and ``RAGLOOP_MODEL`` set they use an OpenAI-compatible model;
otherwise they run offline and say so. Progress goes to stderr (a transient status line on a terminal, plain
lines when piped, nothing with ``--quiet``); the answer (markdown rendered on a terminal, plain text when piped or
with ``NO_COLOR``; or one JSON object with ``--json``) and its numbered sources go to stdout
(:mod:`ragloop.cli._chat._terminal`). The chat loop, its commands and Ctrl-C are in
:mod:`ragloop.cli._chat._session`, line editing and history in :mod:`ragloop.cli._chat._input`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ragloop._redact import redact
from ragloop.cli._chat._terminal import Terminal
from ragloop.cli._store import add_filter_option, add_store_options, parse_filters, store_url
from ragloop.cli._turnlog import add_turn_log_options, open_turn_log

if TYPE_CHECKING:
    from collections.abc import Callable

    from ragloop.chat import ChatRAG, Reply
    from ragloop.state import Citation

__all__ = ["add_ask", "add_chat", "cmd_ask", "cmd_chat"]

_ENV_HELP = (
    "Environment: OPENAI_BASE_URL and/or OPENAI_API_KEY with RAGLOOP_MODEL (and optionally "
    "RAGLOOP_ANSWER_MODEL) select an OpenAI-compatible model; without them the turn runs offline."
)


#: ``--reranker``'s help (ask, chat and serve).
RERANKER_HELP = (
    "a cross-encoder that orders the context: the URL of a /rerank endpoint (llama.cpp --reranking, vLLM, TEI, "
    "Infinity, Cohere, Jina; key in RAGLOOP_RERANKER_API_KEY) or a folder with model.onnx and tokenizer.json; "
    "when it fails or is slow the built-in ranking is used"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", metavar="DIR", help="index directory (default: the bundled sample knowledge base)")
    parser.add_argument("--page-url", metavar="URL", help="page the user asks from (resolves 'this page')")
    parser.add_argument("--page-title", metavar="TITLE", help="title of that page")
    parser.add_argument("--mode", choices=("hybrid", "bm25", "dense"), default="hybrid", help="retrieval mode")
    parser.add_argument("--tickets", metavar="SQLITE", help="ticket database for the live ticket source")
    parser.add_argument(
        "--org", metavar="NAME", help="your organisation: tickets and CRM rows are shown only to it (without it, none)"
    )
    parser.add_argument("--no-live", action="store_true", help="no live sources")
    parser.add_argument(
        "--no-plan", action="store_true", help="no retrieval planner over the sample CRM database (SQL, then documents)"
    )
    parser.add_argument("--deadline", type=float, metavar="S", help="time limit per turn, in seconds")
    parser.add_argument("--reranker", metavar="URL|PATH", help=RERANKER_HELP)
    parser.add_argument("--cache-dir", metavar="DIR", help="where the sample index is cached (~/.cache/ragloop)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress (spinner or progress lines)")
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
    p = sub.add_parser(
        "chat",
        help="interactive chat with history",
        description="Interactive chat: follow-ups read against the conversation, /help lists the commands "
        "(/reset, /sources, /record, /quit), Ctrl-C stops an answer. " + _ENV_HELP,
    )
    _common(p)
    p.add_argument(
        "--no-history", action="store_true", help="keep no line history (default: $XDG_STATE_HOME/ragloop/chat_history)"
    )
    p.set_defaults(func=cmd_chat)


def _llm() -> tuple[Any, str | None, str | None]:
    """An AsyncOpenAI client and models from the environment, or ``(None, None, None)`` to run offline."""
    base_url, api_key = os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")
    model = os.environ.get("RAGLOOP_MODEL")
    if base_url and not model:
        from ragloop.errors import ConfigError

        raise ConfigError(
            "OPENAI_BASE_URL is set but RAGLOOP_MODEL is not: set RAGLOOP_MODEL to the model id the endpoint serves "
            "(or unset OPENAI_BASE_URL to run offline)"
        )
    if not (base_url or api_key) or not model:
        return None, None, None
    import openai

    _check_endpoint(openai.OpenAI(base_url=base_url, api_key=api_key or "not-needed", max_retries=0, timeout=3.0))
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed", max_retries=2, timeout=60.0)
    return client, model, os.environ.get("RAGLOOP_ANSWER_MODEL") or model


def _check_endpoint(probe: Any) -> None:
    """One ``GET /models`` within 3 s: an endpoint that does not answer is one line now, not retries per question.

    Any HTTP answer counts (a 401 or 404 comes from a live server); only no answer at all is refused.
    """
    import openai

    from ragloop.errors import ConfigError

    try:
        probe.models.list()
    except openai.APIStatusError:
        pass
    except openai.APIConnectionError as exc:
        reason = "no answer within 3 s" if isinstance(exc, openai.APITimeoutError) else "connection failed"
        raise ConfigError(
            f"the model endpoint {redact(str(probe.base_url))} does not answer ({reason}): check OPENAI_BASE_URL "
            "and that the server runs, or unset OPENAI_BASE_URL and OPENAI_API_KEY to run offline"
        ) from None
    finally:
        probe.close()


def _build(args: argparse.Namespace) -> tuple[ChatRAG, Any]:
    from ragloop.chat import ChatRAG
    from ragloop.retrievers.live import SQLiteTicketSource

    client, fast, answer = _llm()
    live: tuple[Any, ...] = ()
    if not args.no_live and (args.tickets or not (args.index or store_url(args))):
        live = (SQLiteTicketSource(args.tickets) if args.tickets else SQLiteTicketSource(),)
    kwargs: dict[str, Any] = {"fast_model": fast, "answer_model": answer, "mode": args.mode, "live_sources": live}
    if getattr(args, "reranker", None):
        from ragloop.retrievers.cross_encoder import cross_encoder

        kwargs["ranker"] = cross_encoder(args.reranker, api_key=os.environ.get("RAGLOOP_RERANKER_API_KEY"))
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
            from ragloop.sample import SAMPLE_CRM_ALLOW, SAMPLE_CRM_TENANTS, sample_crm_path

            kwargs["plan_sources"] = (SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW, tenants=SAMPLE_CRM_TENANTS),)
        rag = ChatRAG.sample(client, cache_dir=args.cache_dir, **kwargs)
    rag.turn_log = open_turn_log(args, rag.turn.embedder)
    if client is None:
        print("ragloop: running offline (no model configured): extractive answers from the index", file=sys.stderr)
    else:
        print(f"ragloop: using model {fast} (answers: {answer}) at {redact(str(client.base_url))}", file=sys.stderr)
    return rag, client


def _caller(args: argparse.Namespace) -> Any:
    """The caller of every turn: the ``--org`` organisation, or nobody (then no tickets and no CRM rows)."""
    from ragloop.state import Caller

    if not args.org:
        sample = not (args.index or store_url(args))
        if (not args.no_live and (args.tickets or sample)) or (not args.no_plan and sample):
            print("ragloop: no --org: tickets and CRM rows are shown only to their organisation: none", file=sys.stderr)
        return None
    return Caller(tenant=args.org)


#: The progress events ``ask`` and ``chat`` show (the status line also shows "writing the answer").
_SHOWN = ("plan", "wave", "search", "retrieved", "graded", "live", "rewrite")


def _link(sample: bool) -> Callable[[Citation], str]:
    """A citation's link: its URL, a source that is a URL, the bundled page's file (the sample), or the source."""
    root = None
    if sample:
        from ragloop.sample import sample_kb_path

        root = sample_kb_path()

    def link(c: Citation) -> str:
        if c.url:
            return c.url
        if c.source.startswith(("https://", "http://")) or root is None:
            return c.source
        page = root / c.source
        return page.as_uri() if page.is_file() else c.source

    return link


def _terminal(args: argparse.Namespace) -> Terminal:
    term = Terminal.detect(quiet=args.quiet)
    term.link = _link(not (args.index or store_url(args)))
    return term


async def _turn(
    rag: ChatRAG,
    question: str,
    args: argparse.Namespace,
    history: list[dict[str, str]],
    term: Terminal,
    caller: Any = None,
) -> Reply:
    """Stream one turn: progress to the status line or stderr, the answer to stdout, then its sources."""
    from ragloop.chat import ReplyReady
    from ragloop.events import Progress, Token

    reply = None
    term.begin()
    async for event in rag.stream(
        question,
        history=history,
        page_url=args.page_url,
        page_title=args.page_title,
        deadline_s=args.deadline,
        filters=parse_filters(args.filter),
        caller=caller,
    ):
        if isinstance(event, Progress) and (event.kind in _SHOWN or (term.spinner and event.kind == "answer")):
            term.progress(event.message)
        elif isinstance(event, Token):
            term.token(event.text)  # made terminal-safe there: no escape sequence reaches the screen
        elif isinstance(event, ReplyReady):
            reply = event.reply
    assert reply is not None
    term.finish(reply)
    return reply


def cmd_ask(args: argparse.Namespace) -> int:
    """Answer one question."""
    import anyio

    rag, client = _build(args)
    caller = _caller(args)

    async def run() -> int:
        term = _terminal(args)
        try:
            if args.json:
                reply = await rag.ask(
                    args.question,
                    page_url=args.page_url,
                    page_title=args.page_title,
                    deadline_s=args.deadline,
                    filters=parse_filters(args.filter),
                    caller=caller,
                )
                print(json.dumps(reply.as_dict(), ensure_ascii=False))
            else:
                await _turn(rag, args.question, args, [], term, caller)
        finally:
            term.close()
            await rag.aclose()
            if client is not None:
                await client.close()
        return 0

    return anyio.run(run)


def cmd_chat(args: argparse.Namespace) -> int:
    """Interactive chat: questions and ``/commands`` line by line (see :mod:`ragloop.cli._chat._session`)."""
    from anyio.from_thread import start_blocking_portal

    from ragloop.cli._chat._input import LineReader, history_path
    from ragloop.cli._chat._session import ChatSession
    from ragloop.errors import InputError

    rag, client = _build(args)
    caller = _caller(args)
    term = _terminal(args)
    interactive = sys.stdin.isatty()
    reader = LineReader(interactive, None if args.no_history else history_path(os.environ))
    if reader.problem:
        term.notice(f"ragloop: {reader.problem}")

    async def turn(question: str, history: list[dict[str, str]]) -> Reply | None:
        try:
            return await _turn(rag, question, args, history, term, caller)
        except InputError as exc:
            term.finish(None)
            term.notice(f"(error: {exc})")
            return None

    async def close() -> None:
        await rag.aclose()
        if client is not None:
            await client.close()

    if interactive:
        term.say("Ask a question; /help lists the commands, Ctrl-C stops an answer, Ctrl-D leaves.")
    with start_blocking_portal() as portal:
        try:
            return ChatSession(term, reader, turn).run(portal)
        finally:
            term.close()
            problem = reader.save()
            if problem:
                term.notice(f"ragloop: {problem}")
            portal.call(close)
