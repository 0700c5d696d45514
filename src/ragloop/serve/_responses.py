"""``POST /v1/responses``: a turn as an OpenAI Responses API response, whole or as typed events.

One ``message`` output item holds one ``output_text`` part: the answer with its ``[n]`` markers, and one
annotation per citation — a ``url_citation`` (``url``, ``title``, the marker's ``start_index``/``end_index``)
for a source with a link, a ``file_citation`` (``file_id`` the source, ``filename`` its title, ``index`` after
the marker) for one without. The stream is the API's own sequence::

    response.created, response.in_progress, response.output_item.added, response.content_part.added,
    response.output_text.delta …, response.output_text.annotation.added …, response.output_text.done,
    response.content_part.done, response.output_item.done, response.completed | response.incomplete

``response.incomplete`` says the turn stopped at its deadline or step cap (``incomplete_details.reason``
``deadline`` / ``step_cap``) and answered with what it had; a turn that fails after the stream started ends
with ``response.failed`` (``error.code`` ``server_error``, the reason in ``error.message``). The client-safe
reply (outcome, citations, missing parts) also travels in the extension field ``ragloop`` of the response.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from ragloop.chat import ReplyReady
from ragloop.events import Token
from ragloop.serve._replies import _JSON, _SSE_HEADERS, _sse, _usage
from ragloop.serve._responses_request import ResponsesRequest, response_id, unknown_response
from ragloop.serve._server import _Server
from ragloop.serve._stream import Body, Rejected, Start, json_bytes

if TYPE_CHECKING:
    from ragloop.chat import Reply

_INCOMPLETE = {"deadline": "deadline", "step_cap": "step_cap"}


def citation_notes(text: str, citations: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One annotation per citation, placed on the first ``[n]`` marker of ``text`` (or its end, without one)."""
    out: list[dict[str, Any]] = []
    for c in citations:
        found = re.search(rf"\[{int(c['n'])}\]", text)
        start, end = (found.start(), found.end()) if found else (len(text), len(text))
        if c.get("url"):
            out.append(
                {"type": "url_citation", "url": c["url"], "title": c["title"], "start_index": start, "end_index": end}
            )
        else:
            out.append({"type": "file_citation", "file_id": c["source"], "filename": c["title"], "index": end})
    return out


def _usage_obj(reply: Reply | None) -> dict[str, Any]:
    tokens: dict[str, Any] = _usage(reply) if reply is not None else {"prompt_tokens": 0, "completion_tokens": 0}
    prompt, completion = tokens["prompt_tokens"], tokens["completion_tokens"]
    cached = tokens.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class _Response:
    """One Responses API response over one turn."""

    def __init__(self, server: _Server, request: ResponsesRequest) -> None:
        self.server = server
        self.request = request
        self.turn = request.turn
        self.id = response_id(None)
        self.item_id = "msg_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.sequence = 0

    async def _prepare(self) -> None:
        try:
            self.turn = await self.server.prepare(self.turn)
        except Rejected as exc:
            if exc.code == "unknown_session" and self.request.previous_response_id is not None:
                raise unknown_response(self.request.previous_response_id) from None
            raise
        if self.request.store:
            self.id = response_id(self.turn.session_id)

    def envelope(self, status: str, **extra: Any) -> dict[str, Any]:
        """The ``response`` object in ``status``."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.server.settings.model_name,
            "output": [],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "store": self.request.store,
            "background": False,
            "previous_response_id": self.request.previous_response_id,
            "metadata": dict(self.request.metadata),
            "text": {"format": {"type": "text"}},
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **extra,
        }

    def _message(self, text: str, notes: list[dict[str, Any]], status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": notes, "logprobs": []}
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}

    def finished(self, reply: Reply) -> dict[str, Any]:
        """The final ``response`` object of a turn that produced ``reply``."""
        client = self.server.client_reply(reply, None)
        stopped = _INCOMPLETE.get(reply.record.stopped_by)
        message = self._message(reply.text, citation_notes(reply.text, client["citations"]), "completed")
        return self.envelope(
            "incomplete" if stopped else "completed",
            output=[message],
            usage=_usage_obj(reply),
            incomplete_details={"reason": stopped} if stopped else None,
            completed_at=None if stopped else int(time.time()),
            ragloop=client,
        )

    def event(self, kind: str, **fields: Any) -> bytes:
        """One server-sent event of ``kind``, numbered."""
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _sse(kind, payload)

    def failed(self, exc: Rejected) -> bytes:
        """The last event of a stream whose turn failed after it started: ``response.failed`` with the reason."""
        error = {"code": "server_error", "message": exc.message}
        return self.event("response.failed", response=self.envelope("failed", error=error))

    async def stream(self, start: Start, body: Body) -> None:
        """The turn as Responses API events."""
        await self._prepare()
        where = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        async with aclosing(self.server.events(self.turn)) as events:
            event = await anext(events, None)  # bad input raises here, before any byte
            await start(200, _SSE_HEADERS)
            await body(self.event("response.created", response=self.envelope("in_progress")))
            await body(self.event("response.in_progress", response=self.envelope("in_progress")))
            item = self._message("", [], "in_progress")
            item["content"] = []
            await body(self.event("response.output_item.added", output_index=0, item=item))
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            await body(self.event("response.content_part.added", part=empty, **where))
            streamed = False
            while event is not None:
                if isinstance(event, Token) and event.text:
                    streamed = True
                    await body(self.event("response.output_text.delta", delta=event.text, logprobs=[], **where))
                elif isinstance(event, ReplyReady):
                    await self._finish(body, event.reply, streamed, where)
                event = await anext(events, None)

    async def _finish(self, body: Body, reply: Reply, streamed: bool, where: Mapping[str, Any]) -> None:
        if not streamed and reply.text:
            await body(self.event("response.output_text.delta", delta=reply.text, logprobs=[], **where))
        final = self.finished(reply)
        message = final["output"][0]
        part = message["content"][0]
        for n, note in enumerate(part["annotations"]):
            await body(
                self.event("response.output_text.annotation.added", annotation_index=n, annotation=note, **where)
            )
        await body(self.event("response.output_text.done", text=reply.text, logprobs=[], **where))
        await body(self.event("response.content_part.done", part=part, **where))
        await body(self.event("response.output_item.done", output_index=0, item=message))
        await body(self.event(f"response.{final['status']}", response=final))

    async def once(self, start: Start, body: Body) -> None:
        """Run the turn, then write one ``response`` object."""
        await self._prepare()
        reply = await self.server.reply(self.turn)
        await start(200, _JSON)
        await body(json_bytes(self.finished(reply)))
