"""``POST /api/chat?format=ai-sdk``: the Vercel AI SDK's UI message stream (protocol ``v1``).

The request is what ``useChat`` sends (``DefaultChatTransport``): ``{"id", "messages": [UIMessage…], "trigger",
…}``, each message ``{"id", "role", "parts": [{"type": "text", "text"}, …]}``, plus whatever the app adds with
the transport's ``body`` (``filters``, ``page_url``, ``page_title``). The last message is the question, the
earlier ones the history; assistant messages keep only their text parts (the sources and data parts this server
sent come back and are dropped); a user message's ``file`` part is refused with a 400 naming it.

The response carries ``x-vercel-ai-ui-message-stream: v1``; each server-sent event is one JSON chunk::

    {"type":"start","messageId":"msg_…"}
    {"type":"data-progress","id":"progress","data":{"node","kind","text"},"transient":true}   (each progress event)
    {"type":"text-start","id":"text-1"}  {"type":"text-delta","id":"text-1","delta":"…"} …  {"type":"text-end",…}
    {"type":"source-url","sourceId":"cite-1","url":"…","title":"…"}        (a citation with a link)
    {"type":"source-document","sourceId":"cite-2","mediaType":"text/plain","title":"…","filename":"…"}  (without)
    {"type":"data-ragloop","data":{"turn_id","text","outcome","citations","missing"}}
    {"type":"finish","finishReason":"stop"}
    [DONE]

A turn that fails after the stream started ends with ``{"type":"error","errorText":"…"}`` and ``[DONE]``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from contextlib import aclosing
from typing import Any

from ragloop.chat import ReplyReady
from ragloop.events import Progress, Token
from ragloop.serve._principals import Principal
from ragloop.serve._replies import _SSE_HEADERS
from ragloop.serve._server import _Server
from ragloop.serve._stream import Body, Rejected, Start, json_bytes
from ragloop.serve._validate import _ChatRequest, _RequestChecks

HEADERS = {**_SSE_HEADERS, "x-vercel-ai-ui-message-stream": "v1"}
_DONE = b"data: [DONE]\n\n"
_TEXT = "text-1"


def _chunk(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def _parts_text(checks: _RequestChecks, message: Mapping[str, Any], where: str, limit: int | None) -> str:
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise Rejected(400, f"{where}.parts must be a list of message parts", param=f"{where}.parts")
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(checks._text(part.get("text"), f"{where}.parts[{j}].text", None))
        elif message.get("role") == "user" and not (isinstance(kind, str) and kind.startswith("data-")):
            raise Rejected(
                400,
                f"{where}.parts[{j}] is a {kind!r:.40} part: a question may hold text parts only (no files)",
                param=f"{where}.parts[{j}]",
            )
    return checks._text("\n".join(texts), f"{where}.parts", limit)


def ai_sdk_request(checks: _RequestChecks, body: Mapping[str, Any], principal: Principal) -> _ChatRequest:
    """The turn of an AI SDK ``useChat`` request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected(400, "messages must be a non-empty list of UI messages {id, role, parts}", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise Rejected(
                400,
                f"messages[{i}] must be a UI message with role 'user', 'assistant' or 'system'",
                param=f"messages[{i}]",
            )
    last = len(messages) - 1
    if messages[-1]["role"] != "user":
        raise Rejected(400, "the last message must have role 'user' (the question)", param=f"messages[{last}].role")
    history = [
        {"role": m["role"], "content": _parts_text(checks, m, f"messages[{i}]", checks.settings.max_message_chars)}
        for i, m in enumerate(messages[:-1])
    ]
    return _ChatRequest(
        _parts_text(checks, messages[-1], f"messages[{last}]", None),
        checks._history(history, "messages"),
        None,
        checks._page(body, "page_url"),
        checks._page(body, "page_title"),
        f"messages[{last}].parts",
        principal,
        checks._filters(body, principal),
    )


def ai_sdk_error(exc: Rejected) -> bytes:
    """The last chunks of a UI message stream whose turn failed after it started."""
    return _chunk({"type": "error", "errorText": exc.message}) + _DONE


def _sources(citations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for c in citations:
        sid = f"cite-{c['n']}"
        if c.get("url"):
            out.append({"type": "source-url", "sourceId": sid, "url": c["url"], "title": c["title"]})
        else:
            doc = {"type": "source-document", "sourceId": sid, "mediaType": "text/plain", "title": c["title"]}
            out.append({**doc, "filename": c["source"]})
    return out


async def ai_sdk_stream(server: _Server, turn: _ChatRequest, start: Start, body: Body) -> None:
    """Write the turn as a UI message stream."""
    turn = await server.prepare(turn)
    async with aclosing(server.events(turn)) as events:
        event = await anext(events, None)  # bad input raises here, before any byte
        await start(200, HEADERS)
        await body(_chunk({"type": "start", "messageId": "msg_" + secrets.token_hex(12)}))
        opened = False
        while event is not None:
            if isinstance(event, Progress):
                data = {"node": event.node, "kind": event.kind, "text": event.message}
                await body(_chunk({"type": "data-progress", "id": "progress", "data": data, "transient": True}))
            elif isinstance(event, Token) and event.text:
                if not opened:
                    opened = True
                    await body(_chunk({"type": "text-start", "id": _TEXT}))
                await body(_chunk({"type": "text-delta", "id": _TEXT, "delta": event.text}))
            elif isinstance(event, ReplyReady):
                if not opened:
                    await body(_chunk({"type": "text-start", "id": _TEXT}))
                    await body(_chunk({"type": "text-delta", "id": _TEXT, "delta": event.reply.text}))
                await body(_chunk({"type": "text-end", "id": _TEXT}))
                reply = server.client_reply(event.reply, None)
                for source in _sources(reply["citations"]):
                    await body(_chunk(source))
                await body(_chunk({"type": "data-ragloop", "data": reply}))
                await body(_chunk({"type": "finish", "finishReason": "stop"}))
            event = await anext(events, None)
    await body(_DONE)
