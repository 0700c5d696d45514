"""The hand-off webhook: each packet POSTed signed, retried with backoff, and — when every retry failed — kept in
the turn log's database and re-sent later, the same body, until the receiver accepts it or it is marked dead.

A delivery is the packet's exact body, its signature ``X-Ragloop-Signature: sha256=<HMAC-SHA256 of the body>``
and its idempotency key (``Idempotency-Key`` and ``X-Ragloop-Handoff``: the hand-off id). One that exhausted its
:attr:`~ragloop.serve.Handoff.attempts` is *parked* in ``ragloop_handoff_outbox`` (SQLite or Postgres: it survives
a restart) with the URL it was meant for — its body, not its signature —, and re-sent by :func:`resend`, the same
body and key (a receiver that deduplicates by the key sees it once) signed at send time with the secret of that
day (a receiver whose secret was rotated meanwhile verifies it):

- after each later hand-off's own delivery;
- every :attr:`~ragloop.serve.Handoff.resend_every_s` seconds while the server runs (its lifespan);
- by ``ragloop handoff resend --turn-log URL`` (with ``RAGLOOP_HANDOFF_SECRET``, as the server).

A delivery tried :attr:`~ragloop.serve.Handoff.dead_after_attempts` times (the first delivery with its retries is
one; each re-send one more) or first parked :attr:`~ragloop.serve.Handoff.dead_after_days` ago is marked *dead*
(:func:`bury`): kept, never re-sent on its own again, counted (``ragloop_handoff_webhook_total{result="dead"}``),
listed by ``ragloop handoff list --dead`` and re-tried on demand by ``ragloop handoff resend --dead``.

A sender *claims* the rows it re-sends (for twice the attempt's time limit) so that two senders (two replicas,
the CLI beside a server) never send one at the same time; an accepted one is never sent again (its row is deleted
a week later). Delivery is at least once: a receiver that took a packet but whose answer never arrived gets it
again, with the same key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
import httpx

from ragloop._log import get_logger

__all__ = ["DEAD_AFTER_ATTEMPTS", "DEAD_AFTER_DAYS", "Outbox", "Settings", "Webhook", "bury", "resend", "sign"]

log = get_logger("ragloop.serve.handoff")

#: Deliveries tried (the first, with its retries, and each re-send) before a parked one is marked dead: about 17
#: hours of the server's re-sends every 60 s.
DEAD_AFTER_ATTEMPTS = 1_000
#: Days after its first delivery gave up that a parked one is marked dead, however few times it was tried.
DEAD_AFTER_DAYS = 3.0


def sign(body: bytes, secret: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of ``body`` under ``secret``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class Settings(Protocol):
    """What a webhook is configured with (:class:`~ragloop.serve.Handoff`)."""

    @property
    def url(self) -> str | None:
        """Where packets go."""

    @property
    def secret(self) -> bytes | None:
        """The shared secret they are signed with."""

    @property
    def attempts(self) -> int:
        """Deliveries tried per packet."""

    @property
    def backoff_s(self) -> float:
        """Wait before the second attempt (doubled after)."""

    @property
    def timeout_s(self) -> float:
        """Time limit of one attempt."""

    @property
    def max_pending(self) -> int:
        """Packets being delivered at once."""

    @property
    def dead_after_attempts(self) -> int:
        """Deliveries tried before a parked one is marked dead."""

    @property
    def dead_after_days(self) -> float:
        """Days after it was parked that a delivery is marked dead."""


class Outbox(Protocol):
    """Where given-up deliveries wait (the turn log's backend: :class:`~ragloop.turnlog.SQLBackend`)."""

    def park_delivery(self, handoff_id: str, url: str, body: str, at: float, error: str) -> bool:
        """Keep a delivery's body that exhausted its retries; ``False`` when its hand-off is gone (purged)."""
        ...

    def bury_deliveries(self, now: float, max_attempts: int, max_age_s: float) -> int:
        """Mark dead the waiting ones tried ``max_attempts`` times or parked ``max_age_s`` ago; how many."""
        ...

    def claim_deliveries(
        self, now: float, hold_s: float, limit: int, *, dead: bool = False
    ) -> list[tuple[str, str, str]]:
        """Claim up to ``limit`` undelivered ones (``dead``: dead ones): ``(handoff_id, url, body)``."""
        ...

    def settle_delivery(self, handoff_id: str, delivered: bool, at: float, error: str | None = None) -> None:
        """Record a re-send's result."""

    def undelivered(self, *, dead: bool = False) -> int:
        """How many wait to be re-sent (``dead``: how many are marked dead), whoever parked or marked them."""
        ...


def _headers(handoff_id: str, signature: str) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "x-ragloop-signature": signature,
        "x-ragloop-handoff": handoff_id,
        "idempotency-key": handoff_id,
    }


async def _post(client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> str:
    """One attempt: ``""`` when accepted (2xx), else why not."""
    try:
        with anyio.fail_after(timeout_s):
            r = await client.post(url, content=body, headers=dict(headers), timeout=timeout_s)
        return "" if 200 <= r.status_code < 300 else f"status {r.status_code}"
    except (httpx.HTTPError, TimeoutError) as exc:
        return type(exc).__name__


async def bury(
    outbox: Outbox,
    *,
    max_attempts: int = DEAD_AFTER_ATTEMPTS,
    max_days: float = DEAD_AFTER_DAYS,
    clock: Callable[[], float] = time.time,
    strict: bool = False,
) -> int:
    """Mark dead the parked deliveries tried ``max_attempts`` times or parked ``max_days`` ago; how many now.

    The outbox's own errors are logged and count none (the next pass tries again), or, with ``strict``, raised.
    """
    try:
        buried = await anyio.to_thread.run_sync(outbox.bury_deliveries, clock(), max_attempts, max_days * 86_400)
    except Exception as exc:
        if strict:
            raise
        log.warning("handoff.outbox_unavailable", error=type(exc).__name__)
        return 0
    if buried:
        log.warning("handoff.deliveries_dead", count=buried, attempts=max_attempts, days=max_days)
    return int(buried)


async def resend(
    outbox: Outbox,
    client: httpx.AsyncClient,
    secret: bytes,
    *,
    timeout_s: float = 5.0,
    limit: int = 100,
    clock: Callable[[], float] = time.time,
    strict: bool = False,
    dead: bool = False,
) -> tuple[int, int]:
    """Re-send up to ``limit`` parked deliveries that are not dead (``dead``: only the dead ones) once each,
    oldest first, each signed now with ``secret``; ``(delivered, still failing)``.

    The outbox's own errors (a dead database) are logged and end the pass (what was not claimed waits for the
    next), or, with ``strict``, raised.
    """
    try:
        claimed = await anyio.to_thread.run_sync(
            lambda: outbox.claim_deliveries(clock(), 2 * timeout_s, limit, dead=dead)
        )
    except Exception as exc:
        if strict:
            raise
        log.warning("handoff.outbox_unavailable", error=type(exc).__name__)
        return 0, 0
    delivered = failed = 0
    for handoff_id, url, text in claimed:
        body = text.encode("utf-8")
        why = await _post(client, url, body, _headers(handoff_id, sign(body, secret)), timeout_s)
        try:
            await anyio.to_thread.run_sync(outbox.settle_delivery, handoff_id, not why, clock(), why or None)
        except Exception as exc:  # noqa: BLE001 — its claim lapses and a later pass sends it again (same key)
            log.warning("handoff.outbox_unavailable", error=type(exc).__name__)
        if why:
            failed += 1
            log.warning("handoff.resend_failed", reason=why, handoff=handoff_id)
        else:
            delivered += 1
    return delivered, failed


class Webhook:
    """Delivers packets to :attr:`~ragloop.serve.Handoff.url`, bounded, retried, counted, parked in ``outbox``
    when every attempt failed and re-sent from it; never raises."""

    def __init__(
        self,
        handoff: Settings,
        client: httpx.AsyncClient | None = None,
        outbox: Outbox | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.handoff = handoff
        self.client = client
        self.outbox = outbox
        self.clock = clock
        self.pending = 0
        self._resending = anyio.Lock()
        #: Packets delivered, given up on after every attempt, not sent (too many pending), parked for a later
        #: re-send, delivered by a re-send, and parked ones marked dead (no longer re-sent).
        self.counts = {"delivered": 0, "failed": 0, "dropped": 0, "parked": 0, "resent": 0, "dead": 0}
        #: The outbox's rows by state (``waiting``, ``dead``) as the last re-send pass read them from the database:
        #: rows another replica or ``ragloop handoff resend`` parked or marked are counted too. Empty until then.
        self.rows: dict[str, int] = {}

    def admit(self) -> bool:
        """Take a delivery slot; ``False`` (counted as dropped) when ``max_pending`` are in flight."""
        if self.pending >= self.handoff.max_pending:
            self.counts["dropped"] += 1
            return False
        self.pending += 1
        return True

    async def deliver(self, packet: Mapping[str, Any]) -> bool:
        """POST ``packet`` (after :meth:`admit`), retrying a refused, failed or slow attempt with backoff; given
        up, it is parked in the outbox. Once it is delivered (the receiver is up), the outbox's earlier deliveries
        are re-sent (:meth:`resend`), outside the delivery slot."""
        h = self.handoff
        assert h.url is not None and h.secret is not None
        body = json.dumps(packet, ensure_ascii=False, sort_keys=True).encode("utf-8")
        handoff_id = str(packet.get("handoff_id", ""))
        signature = sign(body, h.secret)
        client = self.client or httpx.AsyncClient()
        try:
            try:
                wait, why = h.backoff_s, ""
                for attempt in range(1, h.attempts + 1):
                    why = await _post(client, h.url, body, _headers(handoff_id, signature), h.timeout_s)
                    if not why:
                        break
                    log.warning("handoff.webhook_retry", attempt=attempt, reason=why, handoff=handoff_id)
                    if attempt < h.attempts:
                        await anyio.sleep(wait)
                        wait *= 2
            finally:
                self.pending -= 1
            if why:
                self.counts["failed"] += 1
                await self._park(handoff_id, h.url, body, why)
                return False
            self.counts["delivered"] += 1
            await self.resend(client)
            return True
        finally:
            if self.client is None:
                await client.aclose()

    async def keep(self, packet: Mapping[str, Any]) -> None:
        """Park ``packet`` unsent (it found ``max_pending`` deliveries in flight): a re-send takes it."""
        h = self.handoff
        assert h.url is not None and h.secret is not None
        body = json.dumps(packet, ensure_ascii=False, sort_keys=True).encode("utf-8")
        await self._park(str(packet.get("handoff_id", "")), h.url, body, "too many pending")

    async def _park(self, handoff_id: str, url: str, body: bytes, why: str) -> None:
        if self.outbox is None:
            return
        text = body.decode("utf-8")
        try:
            kept = await anyio.to_thread.run_sync(self.outbox.park_delivery, handoff_id, url, text, self.clock(), why)
        except Exception as exc:  # noqa: BLE001 — a dead database loses this delivery (logged, counted as failed)
            log.warning("handoff.outbox_unavailable", error=type(exc).__name__, handoff=handoff_id)
            return
        if kept:
            self.counts["parked"] += 1
        else:  # retention purged the hand-off while this delivery was in flight: its question goes with it
            log.info("handoff.delivery_of_purged_handoff_dropped", handoff=handoff_id)

    async def resend(self, client: httpx.AsyncClient | None = None, limit: int = 100) -> tuple[int, int]:
        """One re-send pass over the outbox (one pass at a time per server), after marking dead the deliveries
        past :attr:`~ragloop.serve.Handoff.dead_after_attempts` or ``dead_after_days``; ``(delivered, still
        failing)``."""
        if self.outbox is None:
            return 0, 0
        h = self.handoff
        assert h.secret is not None
        async with self._resending:
            self.counts["dead"] += await bury(
                self.outbox, max_attempts=h.dead_after_attempts, max_days=h.dead_after_days, clock=self.clock
            )
            own = client or self.client or httpx.AsyncClient()
            try:
                done, failed = await resend(
                    self.outbox, own, h.secret, timeout_s=h.timeout_s, limit=limit, clock=self.clock
                )
            finally:
                if client is None and self.client is None:
                    await own.aclose()
        self.counts["resent"] += done
        await self._read_rows()
        return done, failed

    async def _read_rows(self) -> None:
        outbox = self.outbox
        assert outbox is not None
        try:
            waiting, dead = await anyio.to_thread.run_sync(
                lambda: (outbox.undelivered(), outbox.undelivered(dead=True))
            )
        except Exception as exc:  # noqa: BLE001 — a dead database: the last figures stay
            log.warning("handoff.outbox_unavailable", error=type(exc).__name__)
            return
        self.rows = {"waiting": int(waiting), "dead": int(dead)}

    async def resend_every(self, seconds: float) -> None:
        """Re-send the outbox every ``seconds`` until cancelled (the server's lifespan runs it)."""
        while True:
            await anyio.sleep(seconds)
            await self.resend()
