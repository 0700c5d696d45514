"""The MCP server: tools ``search`` and ``ask``, ``ragloop://doc/{id}`` resources, an "answer from the KB" prompt.

Built on the official ``mcp`` SDK's low-level :class:`mcp.server.Server` (its ``MCPServer`` configures the
process's logging, which a library must not do). One :class:`_Server` is behind it, so the MCP ``ask`` tool holds
one of the same turn slots as ``/v1/chat/completions``, runs under the same deadline and hard limit, is
cancelled by the server's shutdown, and is shown the same scrubbed text and store-outage verdict. Over HTTP each
request runs as the principal of its API key (its tenant and filters wall in ``search``, ``ask`` and resource
reads); over stdio as the principal the command was given.

A call with an unknown tool or arguments that break the tool's input schema is an MCP error (``-32602``) naming
the violation; a turn that cannot run (server busy, knowledge base down, deadline) is a tool result with
``isError`` and the reason, which a model can read. Cancelling the request (closing its stream, or
``notifications/cancelled``) cancels the turn and its model calls. Each progress event of the turn is sent as a
``notifications/progress`` when the client asked for progress.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import anyio
import jsonschema
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from ragloop._log import get_logger
from ragloop.chat import ReplyReady
from ragloop.errors import InputError, RagloopError
from ragloop.events import Progress
from ragloop.nodes.retrieve import waited_out
from ragloop.serve._documents import Documents
from ragloop.serve._mcp_schemas import ASK_INPUT, ASK_OUTPUT, PROMPT, SEARCH_INPUT, SEARCH_OUTPUT, prompt_text
from ragloop.serve._principals import ANONYMOUS, Principal
from ragloop.serve._replies import _INTERNAL, _footer
from ragloop.serve._scrub import scrub
from ragloop.serve._server import _Server
from ragloop.serve._sessions import MemorySessionStore
from ragloop.serve._settings import ServeSettings
from ragloop.serve._stream import Rejected
from ragloop.serve._validate import _ChatRequest, _RequestChecks

if TYPE_CHECKING:
    from ragloop.chat import ChatRAG, Reply

__all__ = ["DOC_URI", "build_mcp_server", "create_mcp_server"]

log = get_logger("ragloop.serve")

#: A document's resource URI: the document id, percent-encoded.
DOC_URI = "ragloop://doc/{id}"
_PREFIX = "ragloop://doc/"
_PAGE = 200
_SNIPPET = 400


def doc_uri(doc_id: str) -> str:
    """The resource URI of document ``doc_id``."""
    return _PREFIX + quote(doc_id, safe="")


def _invalid(message: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, message)


def _check(tool: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """:class:`MCPError` naming the first schema violation of ``arguments``."""
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        error = errors[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path).lstrip(".") or "arguments"
        raise _invalid(f"invalid arguments for tool {tool!r}: {where}: {error.message[:300]}")


def _tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


class _Tools:
    """The MCP handlers over one :class:`_Server`."""

    def __init__(
        self, server: _Server, documents: Documents | None, default: Principal, checks: _RequestChecks
    ) -> None:
        self.server = server
        self.documents = documents
        self.default = default
        self.checks = checks

    def principal(self, ctx: ServerRequestContext[Any, Any]) -> Principal:
        """The caller: the HTTP request's key (checked again here), or the command's own principal over stdio."""
        request = ctx.request
        if request is None or not hasattr(request, "headers"):
            return self.default
        try:
            return self.checks.authorize(request)
        except Rejected as exc:
            raise MCPError(types.INVALID_REQUEST, exc.message) from None

    def scope(self, principal: Principal, filters: object) -> dict[str, tuple[str, ...]]:
        """The principal's server-side filters narrowed by the call's ``filters`` (an error to widen them)."""
        try:
            return dict(self.checks._filters({"filters": filters}, principal))
        except Rejected as exc:
            raise _invalid(exc.message) from None

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name="ask",
                title="Ask the knowledge base",
                description=(
                    "Answer a question from the knowledge base with numbered citations; says when nothing relevant "
                    "was found (outcome 'none') or which parts are missing (outcome 'partial')."
                ),
                input_schema=ASK_INPUT,
                output_schema=ASK_OUTPUT,
            )
        ]
        if self.documents is not None:
            tools.append(
                types.Tool(
                    name="search",
                    title="Search the knowledge base",
                    description="The passages that best match a query, with their document, link and score.",
                    input_schema=SEARCH_INPUT,
                    output_schema=SEARCH_OUTPUT,
                )
            )
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        principal = self.principal(ctx)
        if params.name == "ask":
            _check("ask", ASK_INPUT, arguments)
            return await self._ask(ctx, principal, arguments)
        if params.name == "search" and self.documents is not None:
            _check("search", SEARCH_INPUT, arguments)
            return await self._search(principal, arguments)
        known = "ask, search" if self.documents is not None else "ask"
        raise _invalid(f"unknown tool {params.name!r:.80}; known: {known}")

    async def _search(self, principal: Principal, arguments: Mapping[str, Any]) -> types.CallToolResult:
        assert self.documents is not None
        filters = self.scope(principal, arguments.get("filters"))
        metrics = self.server.metrics
        try:
            with anyio.fail_after(self.server.settings.deadline_s):
                hits = await self.documents.search(arguments["query"], int(arguments.get("k", 5)), filters)
        except InputError as exc:  # a filter key no document has: the caller's mistake, said as such
            metrics.requests.labels(endpoint="mcp.search", status="400").inc()
            raise _invalid(f"filters: {exc}") from None
        except Exception as exc:  # a store outage or a timeout: the model reads the reason, the log has the details
            log.exception("mcp search failed")
            metrics.requests.labels(endpoint="mcp.search", status="503").inc()
            if waited_out(exc):
                return _tool_error("the knowledge base is busy (the search ran out of time); retry in a few seconds")
            return _tool_error("the knowledge base is unavailable (the search failed); retry in a moment")
        metrics.requests.labels(endpoint="mcp.search", status="200").inc()
        rows = [
            {
                "id": h.id,
                "doc_id": h.chunk.doc_id or h.chunk.source,
                "title": scrub(h.chunk.title),
                "url": self.server.client_url(h.chunk),
                "snippet": scrub(h.text[:_SNIPPET]),
                "score": round(float(h.score), 6),
                "resource": doc_uri(h.chunk.doc_id or h.chunk.source or h.id),
            }
            for h in hits
        ]
        out = {"hits": rows}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(out, ensure_ascii=False))], structured_content=out
        )

    async def _ask(
        self, ctx: ServerRequestContext[Any, Any], principal: Principal, arguments: Mapping[str, Any]
    ) -> types.CallToolResult:
        history = self.checks._history(arguments.get("history"), "history")
        filters = self.scope(principal, arguments.get("filters"))
        turn = _ChatRequest(
            arguments["question"], history, None, None, None, "question", principal, tuple(filters.items())
        )
        server, metrics = self.server, self.server.metrics
        try:
            server.take_slot(principal.name)
        except Rejected as exc:
            metrics.requests.labels(endpoint="mcp.ask", status=str(exc.status)).inc()
            return _tool_error(exc.message)
        status = "500"
        try:
            with server.bounded() as bounds:
                reply = await self._run(ctx, turn)
            if bounds.stopped or bounds.timed_out:
                metrics.turns_cancelled.inc() if bounds.stopped else metrics.turns_failed.inc()
                status = "503" if bounds.stopped else "504"
                return _tool_error(
                    "the server is shutting down; retry in a moment"
                    if bounds.stopped
                    else "the turn ran past its deadline"
                )
            status = "200"
            return self._answer(reply)
        except Rejected as exc:
            status = str(exc.status)
            if exc.status == 400:
                raise _invalid(exc.message) from None
            return _tool_error(exc.message)
        except anyio.get_cancelled_exc_class():
            status = "499"  # the client cancelled: the turn and its model calls are gone
            metrics.turns_cancelled.inc()
            raise
        except Exception:
            log.exception("turn failed", endpoint="mcp.ask")
            metrics.turns_failed.inc()
            return _tool_error(_INTERNAL)
        finally:
            server.release_slot(principal.name)
            metrics.requests.labels(endpoint="mcp.ask", status=status).inc()

    async def _run(self, ctx: ServerRequestContext[Any, Any], turn: _ChatRequest) -> Reply | None:
        reply = None
        steps = 0
        async with aclosing(self.server.events(turn)) as events:
            async for event in events:
                if isinstance(event, Progress):
                    steps += 1
                    await ctx.session.report_progress(steps, None, f"{event.node}: {event.message}")
                elif isinstance(event, ReplyReady):
                    reply = event.reply
        return reply

    def _answer(self, reply: Reply | None) -> types.CallToolResult:
        if reply is None:
            raise RuntimeError("the turn ended without a reply")
        out = self.server.client_reply(reply, None)
        text = out["text"] + _footer(out["citations"])
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=out)

    # --- resources and the prompt ---------------------------------------------------------------------

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        if self.documents is None:
            return types.ListResourcesResult(resources=[])
        filters = self.scope(self.principal(ctx), None)
        cursor = params.cursor if params is not None else None
        offset = int(cursor) if cursor and cursor.isdigit() else 0
        docs, more = await self.documents.listing(filters, offset, _PAGE)
        resources = [
            types.Resource(uri=doc_uri(d.doc_id), name=d.doc_id, title=scrub(d.title), mime_type="text/plain")
            for d in docs
        ]
        return types.ListResourcesResult(resources=resources, next_cursor=str(offset + _PAGE) if more else None)

    async def list_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            uri_template=DOC_URI,
            name="document",
            title="A knowledge-base document",
            description="The cleaned text of one document; {id} is its id, percent-encoded (see search hits)",
            mime_type="text/plain",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template] if self.documents else [])

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        filters = self.scope(self.principal(ctx), None)
        unknown = _invalid(f"unknown document {uri!r:.200}: take resource URIs from the search tool's hits")
        if not uri.startswith(_PREFIX) or self.documents is None:
            raise unknown
        try:
            doc = await self.documents.read(unquote(uri.removeprefix(_PREFIX)), filters)
        except RagloopError as exc:
            raise _invalid(str(exc)) from None
        if doc is None:  # no such document, or none of it inside the caller's scope: the same answer
            raise unknown
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=scrub(doc.text))]
        )

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[PROMPT])

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != PROMPT.name:
            raise _invalid(f"unknown prompt {params.name!r:.80}; known: {PROMPT.name}")
        question = (params.arguments or {}).get("question")
        if not isinstance(question, str) or not question.strip():
            raise _invalid(f"prompt {PROMPT.name!r} needs the argument 'question'")
        message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=prompt_text(question)))
        return types.GetPromptResult(description=PROMPT.description, messages=[message])


def build_mcp_server(
    server: _Server,
    documents: Documents | None,
    *,
    principal: Principal = ANONYMOUS,
    instructions: str | None = None,
) -> Server[Any]:
    """The MCP server over ``server`` (its rag, limits, slots and metrics) and ``documents``.

    Args:
        server: The app's state.
        documents: What ``search`` and the resources read; ``None``: the ``ask`` tool only.
        principal: Who a call without an HTTP request (stdio) runs as.
        instructions: What the server tells clients it is for.
    """
    tools = _Tools(server, documents, principal, _RequestChecks(server.settings))
    return Server(
        "ragloop",
        version=_version(),
        instructions=instructions
        or "Answers from a knowledge base: the ask tool answers with citations, search returns passages.",
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
        on_list_resources=tools.list_resources,
        on_list_resource_templates=tools.list_templates,
        on_read_resource=tools.read_resource,
        on_list_prompts=tools.list_prompts,
        on_get_prompt=tools.get_prompt,
    )


def create_mcp_server(
    rag: ChatRAG,
    *,
    documents: Documents | None = None,
    settings: ServeSettings = ServeSettings(),
    principal: Principal = ANONYMOUS,
    source_url: Callable[[str], str | None] | None = None,
) -> Server[Any]:
    """An MCP server over ``rag`` on its own (for stdio: ``ragloop mcp``); ``create_app`` mounts one at ``/mcp``.

    Run it with ``async with mcp.server.stdio.stdio_server() as (r, w): await server.run(r, w,
    server.create_initialization_options())``.

    Args:
        rag: The chat the ``ask`` tool runs.
        documents: What ``search`` and the resources read; ``None``: the ``ask`` tool only.
        settings: Limits (turn slots, deadline, message sizes, filters' tenant key).
        principal: Who every call runs as (its tenant and filters wall in every search).
        source_url: Maps a source to a link, as for :func:`~ragloop.serve.create_app`.
    """
    state = _Server(rag, settings, MemorySessionStore(settings.history, settings.session_quota), source_url, {})
    return build_mcp_server(state, documents, principal=principal)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ragloop")
    except PackageNotFoundError:  # pragma: no cover — a source tree without an install
        return "0"
