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
import re
import sys
from typing import IO, Any

__all__ = ["MAX_LINE_BYTES", "CappedLines", "add_mcp", "cmd_mcp"]

#: Longest JSON-RPC line read from stdin by default (a tool call is a few kilobytes).
MAX_LINE_BYTES = 1_048_576
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")')


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
    from ragloop.cli._serve import add_knowledge_options

    add_knowledge_options(p)
    p.add_argument("--max-concurrency", type=int, default=8, metavar="N", help="turns at once (default 8)")
    p.add_argument("--source-base-url", metavar="URL", help="link citations to URL + source (e.g. your docs site)")
    p.add_argument(
        "--max-line-bytes",
        type=int,
        default=MAX_LINE_BYTES,
        metavar="N",
        help="longest JSON-RPC line read from stdin; a longer one is refused with an error (default 1 MiB)",
    )
    p.set_defaults(func=cmd_mcp)


class CappedLines:
    """stdin's lines for the MCP SDK, none longer than ``max_bytes``: memory stays bounded whatever a client sends.

    A longer line is read to its end in pieces and dropped; in its place the server receives a call of the
    method ``ragloop/line_too_long`` with the same JSON-RPC id (when one shows in the line's first kilobyte), which
    it answers with an error, so the client is not left waiting; stderr says why.

    Args:
        raw: The binary stream (``sys.stdin.buffer``).
        max_bytes: Longest line accepted, newline included.
    """

    def __init__(self, raw: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> None:
        self.raw = raw
        self.max_bytes = max_bytes
        #: Lines dropped for their length.
        self.dropped = 0

    def __aiter__(self) -> CappedLines:
        return self

    async def __anext__(self) -> str:
        import anyio.to_thread

        line = await anyio.to_thread.run_sync(self.read_line, abandon_on_cancel=True)
        if line is None:
            raise StopAsyncIteration
        return line

    def read_line(self) -> str | None:
        """The next line (``None`` at the end), or the stand-in call for one over the cap."""
        data = self.raw.readline(self.max_bytes + 1)
        if not data:
            return None
        if len(data) <= self.max_bytes:
            return data.decode("utf-8", "replace")
        head = data[:1024]
        while not data.endswith(b"\n"):  # the rest of the line, piece by piece, thrown away
            data = self.raw.readline(65_536)
            if not data:
                break
        self.dropped += 1
        print(f"ragloop mcp: refused a JSON-RPC line over {self.max_bytes:,} bytes (--max-line-bytes)", file=sys.stderr)
        found = _ID.search(head)
        if found is None:
            return '{"jsonrpc": "2.0", "method": "notifications/ragloop/line_too_long"}\n'
        return f'{{"jsonrpc": "2.0", "id": {found.group(1).decode()}, "method": "ragloop/line_too_long"}}\n'


def cmd_mcp(args: argparse.Namespace) -> int:
    """Build the chat, then serve MCP over stdio until the client closes stdin."""
    try:
        from mcp.server.stdio import stdio_server

        from ragloop.serve import ServeSettings, create_mcp_server
    except ImportError as exc:
        from ragloop.errors import ConfigError

        raise ConfigError(f"ragloop mcp needs the [serve] extra: pip install 'ragloop[serve]' ({exc})") from exc
    import anyio

    from ragloop.cli._serve import _chat_args, _source_url, build_with_documents

    settings = ServeSettings(max_concurrent_turns=args.max_concurrency, deadline_s=args.deadline, page=False)
    rag, client, documents = build_with_documents(_chat_args(args))
    server = create_mcp_server(
        rag, documents=documents, settings=settings, source_url=_source_url(args.source_base_url)
    )

    async def run() -> None:
        try:
            stdin = CappedLines(sys.stdin.buffer, args.max_line_bytes)
            async with stdio_server(stdin=stdin) as (read, write):  # type: ignore[arg-type]
                await server.run(read, write, server.create_initialization_options())
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()

    anyio.run(run)
    return 0
