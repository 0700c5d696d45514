"""Hand-off to a person: ``POST /v1/handoff`` and ``POST /v1/handoff/{id}/resolution`` (needs a turn log).

``POST /v1/handoff {"turn_id", "session_id"?, "note"?}`` hands one of the caller's own turns that found no full
answer (``none``, ``partial``) or was rated down to a person (an answered one is a 409): the hand-off is stored
in the turn log's database with its packet (question, outcome, the conversation, what was searched, what was
missing, the pages it cited, the nearest pages, the turn id, its gap id once ``ragloop gaps`` grouped it) and,
with a webhook, the packet is POSTed there as JSON, signed ``X-Ragloop-Signature:
sha256=<HMAC-SHA256 of the body with the shared secret>``, in the background after the response (retried with
exponential backoff; never holding up a turn or this request; one that exhausts its retries, or finds too many
deliveries in flight, is kept and re-sent later, signed when sent, until accepted or marked dead:
:mod:`ragloop.serve._webhook`). 202 with the hand-off id.

``POST /v1/handoff/{id}/resolution {"answer", "agent"}`` (same key) writes the person's answer as a **draft** page,
``<drafts>/handoff-<id>.md``, markdown with front matter (question, answer, agent, date, gap, turn, hand-off), which
``ragloop index --include-drafts`` indexes: a reviewed answer then closes its gap on the next replay. A hand-off is
resolved once (409 after). Walls: another key's turn or hand-off is a 404, as an unknown one.

The conversation: with ``session_id`` (a server-side session of the caller's, the one the turn was asked in),
the session's messages up to the handed-off question and its answer (later turns are left out), else the question
alone; bounded to the newest :attr:`Handoff.max_messages` messages (20) and :attr:`Handoff.max_bytes` UTF-8
bytes of their contents (32 KiB), oldest dropped first (``conversation_truncated`` says so), each message scrubbed
by the turn log's policy like the note. Another key's session is a 404, exactly as an unknown one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from attrs import frozen
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ragloop._log import get_logger
from ragloop.errors import ConfigError
from ragloop.serve._stream import Rejected
from ragloop.serve._webhook import DEAD_AFTER_ATTEMPTS, DEAD_AFTER_DAYS, Webhook, sign
from ragloop.state import Message
from ragloop.turnlog import hash_identity

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from ragloop.serve._sessions import SessionStore
    from ragloop.turnlog import LoggedTurn, TurnLog

__all__ = ["Handoff", "HandoffRoutes", "Webhook", "conversation", "handoff_packet", "resolution_page", "sign"]

log = get_logger("ragloop.serve.handoff")
_MAX_NOTE = 2_000
_MAX_ANSWER = 20_000
_ID = re.compile(r"^h-[0-9a-f]{16}$")


@frozen
class Handoff:
    """Where hand-offs go.

    Attributes:
        drafts: The folder resolutions are written to as draft pages (created if missing).
        url: The webhook that receives each packet (``None``: stored only).
        secret: The shared secret the webhook's signature is made with (required with ``url``).
        attempts: Deliveries tried per packet.
        backoff_s: Wait before the second attempt; doubled each time after.
        timeout_s: Time limit of one attempt.
        max_pending: Packets being delivered at once; one more is stored, not sent, and counted as dropped.
        max_messages: Most messages of the caller's session a packet carries (the newest).
        max_bytes: Most UTF-8 bytes of those messages' contents (older ones dropped first; a newest one alone
            past it is cut).
        resend_every_s: How often a serving app re-sends the deliveries that exhausted their attempts (kept in
            the turn log's database; :mod:`ragloop.serve._webhook`); ``0``: only after a later hand-off and by
            ``ragloop handoff resend``.
        dead_after_attempts: Deliveries tried (the first, with its retries, and each re-send) before a parked one
            is marked dead: kept, no longer re-sent, counted in ``/metrics``, listed by ``ragloop handoff list
            --dead``, re-tried by ``ragloop handoff resend --dead``.
        dead_after_days: Days after its first delivery gave up that a parked one is marked dead.
    """

    drafts: Path
    url: str | None = None
    secret: bytes | None = attrs.field(default=None, repr=False)
    attempts: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 5.0
    max_pending: int = 64
    max_messages: int = 20
    max_bytes: int = 32_768
    resend_every_s: float = 60.0
    dead_after_attempts: int = DEAD_AFTER_ATTEMPTS
    dead_after_days: float = DEAD_AFTER_DAYS

    def __attrs_post_init__(self) -> None:
        if self.dead_after_attempts < 1 or not self.dead_after_days > 0:
            raise ValueError(
                "dead_after_attempts must be at least 1 and dead_after_days a positive number of days, got "
                f"{self.dead_after_attempts!r} and {self.dead_after_days!r}"
            )
        if self.url is not None and not self.secret:
            raise ValueError("a hand-off webhook needs a shared secret to sign its packets (RAGLOOP_HANDOFF_SECRET)")


def _owner_of(log_: TurnLog, principal: str) -> str:
    policy = log_.policy
    return hash_identity(principal, policy.identity_salt) if policy.hash_identities else principal


def conversation(
    history: Sequence[Message],
    question: str | None,
    *,
    max_messages: int = 20,
    max_bytes: int = 32_768,
    scrub: Callable[[str], str] = lambda text: text,
) -> tuple[list[dict[str, str]], bool]:
    """The conversation a packet carries, and whether anything was dropped or cut.

    The history up to the last user message that is ``question`` (raw or scrubbed) and the answer after it — the
    turns that came later are not this hand-off's —, or, when ``question`` is not in it, the whole history and
    ``question`` after it; then the newest ``max_messages`` that fit ``max_bytes`` (UTF-8, contents), each
    scrubbed. A newest message alone past ``max_bytes`` is cut to it.
    """
    messages = list(history)
    at = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if messages[i].role == "user"
            and question is not None
            and question in (messages[i].content, scrub(messages[i].content))
        ),
        None,
    )
    if at is not None:
        end = at + 2 if at + 1 < len(messages) and messages[at + 1].role == "assistant" else at + 1
        messages = messages[:end]
    elif question is not None:
        messages.append(Message("user", question))
    kept: list[dict[str, str]] = []
    used = 0
    newest = messages[-max_messages:] if max_messages > 0 else []
    cut = len(newest) < len(messages)
    for message in reversed(newest):
        text = scrub(message.content)
        size = len(text.encode("utf-8"))
        if used + size > max_bytes:
            if not kept and max_bytes > 0:  # the newest alone is too long: its start
                kept.append(
                    {"role": message.role, "content": text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")}
                )
            cut = True
            break
        used += size
        kept.append({"role": message.role, "content": text})
    return list(reversed(kept)), cut


def handoff_packet(
    turn: LoggedTurn,
    handoff_id: str,
    gap_id: str | None,
    note: str | None,
    messages: Sequence[Message] = (),
    handoff: Handoff | None = None,
    scrub: Callable[[str], str] = lambda text: text,
) -> dict[str, Any]:
    """What a person needs to answer the turn: question, outcome, conversation (``messages``: the caller's
    session, bounded by ``handoff``'s limits), searches, what was missing, cited and nearest pages, the gap."""
    row = turn.row
    limits = handoff or Handoff(Path("."))
    talk, cut = conversation(
        messages, row.question, max_messages=limits.max_messages, max_bytes=limits.max_bytes, scrub=scrub
    )
    cited = {c.source: c.title for c in sorted(row.citations, key=lambda c: c.n)}
    return {
        "handoff_id": handoff_id,
        "turn_id": row.turn_id,
        "gap_id": gap_id,
        "question": row.question,
        "conversation": talk,
        "conversation_truncated": cut,
        "cited_pages": [{"source": source, "title": title} for source, title in cited.items()],
        "outcome": row.outcome,
        "rating": turn.rating,
        "searched": [q.text for q in row.queries],
        "missing": list(row.missing) or list(row.unfound),
        "nearest_pages": [{"source": h.source, "title": h.title, "confidence": h.confidence} for h in row.hits[:5]],
        "note": note,
        "at": dt.datetime.fromtimestamp(row.at, dt.UTC).isoformat(timespec="seconds"),
    }


def _front(value: str) -> str:
    """A front-matter scalar: one line, quoted as JSON (a YAML subset)."""
    return json.dumps(" ".join(value.split()), ensure_ascii=False)


def resolution_page(packet: Mapping[str, Any], answer: str, agent: str, when: dt.datetime) -> str:
    """The draft page of a resolved hand-off: front matter, the question as its title, the answer."""
    question = str(packet.get("question") or "(question not kept)")
    fields = {
        "question": question,
        "agent": agent,
        "date": when.date().isoformat(),
        "gap": str(packet.get("gap_id") or ""),
        "turn": str(packet.get("turn_id") or ""),
        "handoff": str(packet.get("handoff_id") or ""),
        "draft": "true",
    }
    front = "\n".join(f"{k}: {_front(v)}" for k, v in fields.items())
    title = " ".join(question.split()).lstrip("#").strip() or "Answer"
    return f"---\n{front}\n---\n# {title}\n\n{answer.strip()}\n"


def _text(body: Mapping[str, Any], name: str, limit: int, required: bool) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise Rejected(400, f"{name} must be a non-empty string of at most {limit:,} characters", param=name)
    return value


async def _read(call: Any, *args: Any) -> Any:
    """``call(*args)`` on the log's database in a thread: a log not written yet reads as empty (``None``); a
    database that cannot be reached is a 503."""
    try:
        return await anyio.to_thread.run_sync(call, *args)
    except ConfigError:  # no turn written yet: the file (or the tables) do not exist
        return None
    except Exception as exc:  # noqa: BLE001 — the driver's own errors (a dead database): a 503, never a traceback
        log.warning("handoff.log_unavailable", error=type(exc).__name__)
        raise Rejected(
            503, "the turn log cannot be reached just now; try again later", kind="server_error",
            code="turn_log_unavailable",
        ) from None  # fmt: skip


def _log_of(rag: Any) -> TurnLog:
    turn_log: TurnLog | None = getattr(rag, "turn_log", None)
    if turn_log is None:
        raise Rejected(404, "this server keeps no turn log, so there is no turn to hand off (serve --turn-log URL)")
    return turn_log


async def _session(sessions: SessionStore | None, principal: str, session_id: str | None) -> tuple[Message, ...]:
    """The caller's own session's messages (``()`` without ``session_id``); 404 for another's or an unknown one."""
    if session_id is None:
        return ()
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", session_id):
        raise Rejected(400, "session_id must be 1–128 characters of letters, digits and . _ : -", param="session_id")
    history = None
    if sessions is not None:
        try:
            history = await sessions.load(principal, session_id)
        except Exception as exc:  # noqa: BLE001 — the store's own errors: a 503 that says to retry
            log.warning("handoff.sessions_unavailable", error=type(exc).__name__)
            raise Rejected(
                503, "the session store cannot be reached just now; try again later, or leave out session_id",
                kind="server_error", code="sessions_unavailable",
            ) from None  # fmt: skip
    if history is None:
        raise Rejected(404, f"no session {session_id!r:.40} of yours", param="session_id", code="unknown_session")
    return tuple(history)


async def create_handoff(
    rag: Any,
    webhook: Webhook | None,
    body: Mapping[str, Any],
    principal: str,
    sessions: SessionStore | None = None,
    handoff: Handoff | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Store a hand-off of ``principal``'s turn; the response body, and the packet when the webhook is to get it."""
    unknown = sorted(set(body) - {"turn_id", "note", "session_id"})
    if unknown:
        raise Rejected(
            400, f"unknown field {unknown[0]!r:.60}; send turn_id, and optionally session_id and note", param=unknown[0]
        )
    turn_id = _text(body, "turn_id", 128, True)
    note = _text(body, "note", _MAX_NOTE, False)
    session_id = _text(body, "session_id", 128, False)
    assert turn_id is not None
    turn_log = _log_of(rag)
    backend = turn_log.backend
    turn = await _read(backend.turn, turn_id)
    if turn is None or turn.row.principal != _owner_of(turn_log, principal):
        raise Rejected(404, f"no turn {turn_id!r:.80} of yours to hand off", param="turn_id", code="unknown_turn")
    if turn.row.outcome not in ("none", "partial") and turn.rating != "down":
        raise Rejected(
            409,
            f"turn {turn_id} was answered ({turn.row.outcome}); a turn is handed off when it found no full answer "
            "or after a thumbs-down (POST /v1/feedback rating 'down')",
            param="turn_id",
            code="answered",
        )
    messages = await _session(sessions, principal, session_id)
    handoff_id = "h-" + secrets.token_hex(8)
    gap_id = await _read(backend.gap_of, turn_id)
    scrub = turn_log.policy.scrub
    packet = handoff_packet(turn, handoff_id, gap_id, scrub(note) if note else None, messages, handoff, scrub)
    text = json.dumps(packet, ensure_ascii=False)
    owner = _owner_of(turn_log, principal)
    at = turn_log.clock()
    await _read(lambda: backend.save_handoff(handoff_id, turn_id, owner, at, text))
    send = webhook is not None and webhook.admit()
    state = "queued" if send else ("not_configured" if webhook is None else "dropped")
    out = {"handoff_id": handoff_id, "turn_id": turn_id, "gap_id": gap_id, "webhook": state}
    return out, packet if webhook is not None else None


async def resolve(rag: Any, handoff: Handoff, handoff_id: str, body: Mapping[str, Any], principal: str) -> Path:
    """Write ``principal``'s hand-off's answer as a draft page; its path."""
    unknown = sorted(set(body) - {"answer", "agent"})
    if unknown:
        raise Rejected(400, f"unknown field {unknown[0]!r:.60}; send answer and agent", param=unknown[0])
    answer = _text(body, "answer", _MAX_ANSWER, True)
    agent = _text(body, "agent", 200, True)
    assert answer is not None and agent is not None
    turn_log = _log_of(rag)
    found = await _read(turn_log.backend.handoff, handoff_id) if _ID.match(handoff_id) else None
    if found is None or found[0] != _owner_of(turn_log, principal):
        raise Rejected(404, f"no hand-off {handoff_id!r:.40} of yours", code="unknown_handoff")
    when = dt.datetime.fromtimestamp(turn_log.clock(), dt.UTC)
    page = resolution_page(json.loads(found[1]), answer, agent, when)
    resolution = json.dumps({"agent": agent, "at": when.isoformat(timespec="seconds")})
    if not await _read(turn_log.backend.resolve_handoff, handoff_id, resolution):
        raise Rejected(409, f"hand-off {handoff_id} is already resolved", code="already_resolved")
    handoff.drafts.mkdir(parents=True, exist_ok=True)
    path = handoff.drafts / f"handoff-{handoff_id}.md"
    await anyio.Path(path).write_text(page, encoding="utf-8")
    return path


class HandoffRoutes:
    """The two endpoints over one app's handlers (request checks, metrics, sessions) and chat."""

    def __init__(self, handlers: Any, rag: Any, handoff: Handoff) -> None:
        self.handlers = handlers
        self.checks = handlers.checks
        self.rag = rag
        self.handoff = handoff
        self.sessions: SessionStore | None = handlers.server.sessions
        turn_log = getattr(rag, "turn_log", None)
        outbox = turn_log.backend if turn_log is not None else None
        self.webhook = Webhook(handoff, outbox=outbox) if handoff.url is not None else None
        if self.webhook is not None:
            webhook = self.webhook
            handlers.metrics.watch_handoffs(lambda: webhook.counts, lambda: webhook.rows)

    def routes(self) -> list[Route]:
        """``POST /v1/handoff`` and ``POST /v1/handoff/{handoff_id}/resolution``, guarded like every endpoint."""
        guarded = self.handlers.guarded
        return [
            Route("/v1/handoff", guarded("handoff", self.create), methods=["POST"]),
            Route(
                "/v1/handoff/{handoff_id}/resolution",
                guarded("handoff.resolution", self.resolution),
                methods=["POST"],
            ),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """While the app runs: the webhook's outbox re-sent every :attr:`Handoff.resend_every_s` seconds."""
        if self.webhook is None or self.webhook.outbox is None or self.handoff.resend_every_s <= 0:
            yield
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.webhook.resend_every, self.handoff.resend_every_s)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def create(self, request: Request) -> Response:
        """``POST /v1/handoff``: 202 and the hand-off id; the webhook is called after the response is sent."""
        principal = self.checks.authorize(request)
        body = await self.checks.read_json(request)
        out, packet = await create_handoff(self.rag, self.webhook, body, principal.name, self.sessions, self.handoff)
        task = None
        if packet is not None and self.webhook is not None:  # queued: sent now; dropped: kept, re-sent later
            send = self.webhook.deliver if out["webhook"] == "queued" else self.webhook.keep
            task = BackgroundTask(send, packet)
        return JSONResponse(out, status_code=202, background=task)

    async def resolution(self, request: Request) -> Response:
        """``POST /v1/handoff/{id}/resolution``: 201 and the draft page's name."""
        principal = self.checks.authorize(request)
        body = await self.checks.read_json(request)
        path = await resolve(self.rag, self.handoff, request.path_params["handoff_id"], body, principal.name)
        return JSONResponse({"status": "resolved", "draft": path.name}, status_code=201)
