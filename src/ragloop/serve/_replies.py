"""How a turn reaches the client: an OpenAI chat completion (whole or chunked) or ``/api/chat`` events."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from ragloop.chat import ReplyReady
from ragloop.events import Correction, Progress, Token
from ragloop.serve._server import _Server
from ragloop.serve._stream import Body, Rejected, Start, error_body, json_bytes
from ragloop.serve._validate import _ChatRequest

if TYPE_CHECKING:
    from ragloop.chat import Reply

_SSE_HEADERS = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # nginx: do not buffer the stream
}
_JSON = {"content-type": "application/json"}


def _footer(citations: Sequence[Mapping[str, Any]]) -> str:
    """The sources as text a person can read at the end of the answer: one line per page, ``[n] title — link``
    (its first cited section's), then an indented ``§ section — link`` line for each further section cited."""
    if not citations:
        return ""
    lines = []
    for c in citations:
        lines.append(f"[{c['n']}] {c['title']} — {c['url'] or c['source']}")
        for section in c.get("sections", [])[1:]:
            title, url = section.get("title") or c["title"], section.get("url")
            lines.append(f"    § {title}" + (f" — {url}" if url else ""))
    return "\n\nSources:\n" + "\n".join(lines)


def _usage(reply: Reply) -> dict[str, Any]:
    """The turn's model tokens in OpenAI's chat-completion ``usage`` shape (cached prompt tokens included)."""
    tokens = reply.record.tokens
    return {
        "prompt_tokens": tokens.prompt,
        "completion_tokens": tokens.completion,
        "total_tokens": tokens.total,
        "prompt_tokens_details": {"cached_tokens": tokens.cached},
    }


async def _write_rejected(start: Start, body: Body, exc: Rejected) -> None:
    await start(exc.status, {**_JSON, **exc.headers})
    await body(exc.body())


_INTERNAL = "the turn failed on the server; the error is in the server log"


def _sse(name: str | None, payload: Any) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + (payload if isinstance(payload, bytes) else json_bytes(payload)) + b"\n\n"


def _api_error(exc: Rejected) -> bytes:
    """The last frame of an ``/api/chat`` stream that failed after it started: an ``error`` event."""
    return _sse("error", error_body(exc.message, kind=exc.kind, code=exc.code))


def _completion_error(exc: Rejected) -> bytes:
    """The last frames of a streamed chat completion that failed after it started: an error chunk, ``[DONE]``."""
    return _sse(None, error_body(exc.message, kind=exc.kind, code=exc.code)) + b"data: [DONE]\n\n"


class _Completion:
    """One OpenAI-compatible chat completion, written whole or as ``chat.completion.chunk`` events."""

    def __init__(self, server: _Server, turn: _ChatRequest, include_usage: bool) -> None:
        self.server = server
        self.turn = turn
        self.include_usage = include_usage
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = server.settings.model_name

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: Mapping[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish}
        return _sse(None, {**self._envelope("chat.completion.chunk"), "choices": [choice], **extra})

    async def stream(self, start: Start, body: Body) -> None:
        """Stream the turn: a role chunk, the tokens, the sources footer, a stop chunk, usage, ``[DONE]``."""
        self.turn = await self.server.prepare(self.turn)
        async with aclosing(self.server.events(self.turn)) as events:
            event = await anext(events, None)  # bad input raises here, before any byte
            await start(200, _SSE_HEADERS)
            await body(self._chunk({"role": "assistant", "content": ""}))
            streamed = False
            while event is not None:
                if isinstance(event, Token) and event.text:
                    streamed = True
                    await body(self._chunk({"content": event.text}))
                elif isinstance(event, ReplyReady):
                    reply = self.server.client_reply(event.reply, self.turn.session_id)
                    text = ("" if streamed else event.reply.text) + _footer(reply["citations"])
                    if text:
                        await body(self._chunk({"content": text}))
                    await body(self._chunk({}, "stop", ragloop=reply))
                    if self.include_usage:
                        usage = {**self._envelope("chat.completion.chunk"), "choices": [], "usage": _usage(event.reply)}
                        await body(_sse(None, usage))
                event = await anext(events, None)
        await body(b"data: [DONE]\n\n")

    async def once(self, start: Start, body: Body) -> None:
        """Run the turn, then write one ``chat.completion``."""
        self.turn = await self.server.prepare(self.turn)
        reply = await self.server.reply(self.turn)
        client = self.server.client_reply(reply, self.turn.session_id)
        message = {"role": "assistant", "content": reply.text + _footer(client["citations"])}
        obj = {
            **self._envelope("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": _usage(reply),
            "ragloop": client,
        }
        await start(200, _JSON)
        await body(json_bytes(obj))


async def _api_stream(server: _Server, turn: _ChatRequest, start: Start, body: Body) -> None:
    """``/api/chat``: ``progress``, ``token``, ``correction`` (streamed words taken back) and a last ``reply``
    event, each one JSON payload."""
    turn = await server.prepare(turn)
    async with aclosing(server.events(turn)) as events:
        event = await anext(events, None)  # bad input raises here, before any byte
        await start(200, _SSE_HEADERS)
        while event is not None:
            if isinstance(event, Progress):
                await body(_sse("progress", {"node": event.node, "kind": event.kind, "text": event.message}))
            elif isinstance(event, Token) and event.text:
                await body(_sse("token", {"text": event.text}))
            elif isinstance(event, Correction):
                await body(
                    _sse("correction", {"removed": list(event.removed), "reason": event.reason, "text": event.note})
                )
            elif isinstance(event, ReplyReady):
                await body(_sse("reply", server.client_reply(event.reply, turn.session_id)))
            event = await anext(events, None)
