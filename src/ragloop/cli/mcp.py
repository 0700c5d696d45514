"""The ``ragloop mcp`` command: the knowledge base as an MCP server over stdio.

The server is :func:`ragloop.serve.create_mcp_server`.

Registered by :mod:`ragloop.cli`. An MCP client (an IDE assistant, an agent framework) starts it as a child
process and speaks JSON-RPC over its stdin and stdout, so **stdout carries the protocol and nothing else**:
every line this command or the library writes goes to stderr. Without ``--index`` or ``--store`` it serves the
bundled sample knowledge base, as ``ragloop serve`` does; the model is chosen by the same environment variables
(``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` with ``RAGLOOP_MODEL``).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_mcp", "cmd_mcp"]


def add_mcp(sub: Any) -> None:
    """Register ``ragloop mcp``."""
    p = sub.add_parser(
        "mcp",
        help="serve the knowledge base to MCP clients over stdio (tools search and ask)",
        description=(
            "Serve the knowledge base as an MCP server over stdin/stdout (needs the [serve] extra): tools search "
            "and ask, ragloop://doc/{id} resources, the prompt answer_from_kb. Environment: OPENAI_BASE_URL "
            "and/or OPENAI_API_KEY with RAGLOOP_MODEL select a model (offline without them)."
        ),
    )
    from ragloop.cli.serve import add_knowledge_options

    add_knowledge_options(p)
    p.add_argument("--max-concurrency", type=int, default=8, metavar="N", help="turns at once (default 8)")
    p.add_argument("--source-base-url", metavar="URL", help="link citations to URL + source (e.g. your docs site)")
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    """Build the chat, then serve MCP over stdio until the client closes stdin."""
    try:
        from mcp.server.stdio import stdio_server

        from ragloop.serve import ServeSettings, create_mcp_server
    except ImportError as exc:
        from ragloop.errors import ConfigError

        raise ConfigError(f"ragloop mcp needs the [serve] extra: pip install 'ragloop[serve]' ({exc})") from exc
    import anyio

    from ragloop.cli.serve import _chat_args, _source_url, build_with_documents

    settings = ServeSettings(max_concurrent_turns=args.max_concurrency, deadline_s=args.deadline, page=False)
    rag, client, documents = build_with_documents(_chat_args(args))
    server = create_mcp_server(
        rag, documents=documents, settings=settings, source_url=_source_url(args.source_base_url)
    )

    async def run() -> None:
        try:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()

    anyio.run(run)
    return 0
