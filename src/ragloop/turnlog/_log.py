"""The turn log: a bounded queue in front of a writer thread, so that logging never slows or fails a turn.

A turn hands over a :class:`~ragloop.turnlog.PendingTurn` (references only) with :meth:`TurnLog.record`, which
never blocks: when the queue is full the row is dropped and counted. One daemon thread drains the queue in
batches (it gathers rows for ``gather_s`` after the first, so its work comes in bursts few turns meet), prepares
each row (redaction, hashing, terms, passage checks: :func:`~ragloop.turnlog._prepare.prepare`) and writes the
batch in one transaction. Why a thread and not a task: the writes are blocking database calls, and
a thread serves every event loop the chat is used from (``ragloop ask`` runs one per question, a server one for
its life) without belonging to any of them. A write that fails costs its rows (counted, logged once per outage)
and the writer waits a little longer after each failure, up to 30 s, before it tries again.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from attrs import frozen

from ragloop._log import get_logger
from ragloop._redact import bounded, redact
from ragloop.errors import ConfigError, InputError, TurnLogError
from ragloop.turnlog._backends import SQLiteBackend, backend_for
from ragloop.turnlog._prepare import LogPolicy, hash_identity, prepare
from ragloop.turnlog._row import LoggedTurn, PendingTurn, Rating, pending_turn
from ragloop.turnlog._sql import FeedbackItem, SQLBackend, StoredRow

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder
    from ragloop.state import Citation, TurnState
    from ragloop.turn._record import TurnRecord

__all__ = ["TurnLog", "TurnLogStats"]

log = get_logger("ragloop.turnlog")

#: Longest feedback comment accepted (characters).
MAX_COMMENT_CHARS = 2_000
_MAX_TURN_ID = 128
_RECENT = 100_000


@frozen
class TurnLogStats:
    """The turn log's health, as ``/metrics`` shows it.

    Attributes:
        written: Rows written.
        dropped: Rows dropped because the queue was full (or the log closed).
        errors: Rows lost to failed writes (unreachable database, a redaction hook that raised …).
        queued: Rows waiting in the queue now.
        purged: Rows deleted by the retention setting.
        last_error: The latest write error (redacted), if any.
        trimmed: Rows deleted to keep a principal within ``max_turns_per_principal`` (its own oldest).
    """

    written: int = 0
    dropped: int = 0
    errors: int = 0
    queued: int = 0
    purged: int = 0
    last_error: str | None = None
    trimmed: int = 0


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class TurnLog:
    """An opt-in log of finished turns (nothing is stored unless a chat is given one).

    Args:
        backend: Where rows go (see :meth:`open` for the URL form).
        policy: What a row keeps (questions or only their terms, redaction, identity hashing); default
            :class:`LogPolicy`'s defaults.
        retention_days: Delete turns older than this many days, when the log opens and every
            ``retention_every_s`` after (``None``: keep everything).
        max_queue: Rows that may wait for the writer; more are dropped and counted.
        embedder: Embed each (redacted) question and store the vector, for ``ragloop gaps`` to cluster on even
            without the question text (``capture_questions=False``). ``None``: no embeddings.
        batch_size: Most rows per write.
        gather_s: How long the writer gathers rows after the first before it writes them (one transaction, and
            its work in one burst that a few turns meet, rather than a little in every turn).
        retention_every_s: Seconds between retention runs.
        max_turns_per_principal: Most turns kept per principal (API key): a principal over it loses its own
            oldest turns, never another's (``None``: no cap).
        clock: Seconds since the epoch (a test can fix it).
    """

    def __init__(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
        self,
        backend: SQLBackend,
        *,
        policy: LogPolicy | None = None,
        retention_days: float | None = None,
        max_queue: int = 10_000,
        embedder: Embedder | None = None,
        batch_size: int = 256,
        gather_s: float = 0.25,
        retention_every_s: float = 3_600.0,
        max_turns_per_principal: int | None = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if retention_days is not None and not retention_days > 0:
            raise ConfigError(f"retention_days must be a positive number of days (or None), got {retention_days!r}")
        if max_turns_per_principal is not None and max_turns_per_principal < 1:
            raise ConfigError(f"max_turns_per_principal must be at least 1 (or None), got {max_turns_per_principal!r}")
        if max_queue < 1 or batch_size < 1:
            raise ConfigError(f"max_queue and batch_size must be at least 1, got {max_queue} and {batch_size}")
        self.backend = backend
        self.policy = policy or LogPolicy()
        self.retention_days = retention_days
        self.embedder = embedder
        self.batch_size = batch_size
        self.gather_s = gather_s
        self.retention_every_s = retention_every_s
        self.max_turns_per_principal = max_turns_per_principal
        self.clock = clock
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self._counts = {"written": 0, "dropped": 0, "errors": 0, "purged": 0, "trimmed": 0}
        self._last_error: str | None = None
        self._recent: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._closed = False
        self._abort = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ragloop-turnlog", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, url: str, **kwargs: Any) -> TurnLog:
        """A turn log at ``sqlite:PATH`` or ``postgresql://…``; other keyword arguments as in the constructor.

        Nothing is written until the first turn, and an unreachable database never fails this call (its rows
        are counted as errors); a malformed URL, or a SQLite path whose folder does not exist, does.
        """
        backend = backend_for(url)
        if isinstance(backend, SQLiteBackend) and not backend.path.resolve().parent.is_dir():
            raise ConfigError(f"turn log {url!r}: the folder {backend.path.parent} does not exist; create it first")
        return cls(backend, **kwargs)

    # --- the turn's side: never blocks, never raises -------------------------------------------------

    def record(self, turn: PendingTurn) -> bool:
        """Queue a finished turn for writing; ``False`` when it was dropped (queue full, log closed)."""
        try:
            if self._closed:
                raise queue.Full
            self._queue.put_nowait(turn)
        except queue.Full:
            self._count("dropped")
            return False
        with self._lock:
            self._recent[turn.turn_id] = turn.principal
            if len(self._recent) > _RECENT:
                self._recent.popitem(last=False)
        return True

    def record_turn(
        self, state: TurnState, record: TurnRecord, citations: Sequence[Citation], *, principal: str | None = None
    ) -> bool:
        """Queue the turn that ended in ``state`` with ``record`` (its ``run_id`` is the turn id) and the reply's
        ``citations``, asked by ``principal``; never raises: a row that cannot be built is counted and lost.

        Returns:
            Whether the row was queued.
        """
        try:
            turn = pending_turn(
                turn_id=record.run_id,
                question=state.question,
                record=record,
                citations=citations,
                graded=state.graded,
                searches=state.searches,
                stale=record.stale,
                principal=principal,
                caller=state.caller,
                at=self.clock(),
                filters=state.filters,
            )
        except Exception as exc:  # noqa: BLE001 — the log costs its row, never the answer
            self.count_error(exc)
            return False
        return self.record(turn)

    def count_error(self, exc: BaseException) -> None:
        """Count a row its caller could not build (it is lost; the turn is not)."""
        self._failed(1, exc)

    def stats(self) -> TurnLogStats:
        """The log's counters now."""
        with self._lock:
            c = dict(self._counts)
            last = self._last_error
        return TurnLogStats(
            c["written"], c["dropped"], c["errors"], self._queue.qsize(), c["purged"], last, c["trimmed"]
        )

    # --- feedback ------------------------------------------------------------------------------------

    async def feedback(
        self, turn_id: str, rating: Rating, *, comment: str | None = None, principal: str | None = None
    ) -> bool:
        """Record ``rating`` on a turn of ``principal``'s; ``False`` when there is no such turn of theirs.

        A turn still waiting in the queue counts as known. Raises :class:`InputError` on a bad rating, id or
        comment, and :class:`~ragloop.errors.TurnLogError` when the database cannot be reached.
        """
        if not isinstance(turn_id, str) or not 0 < len(turn_id) <= _MAX_TURN_ID:
            raise InputError(f"turn_id must be the reply's turn_id (a string of 1 to {_MAX_TURN_ID} characters)")
        if rating not in ("up", "down"):
            raise InputError(f"rating must be 'up' or 'down', got {rating!r:.40}")
        if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT_CHARS):
            raise InputError(f"comment must be a string of at most {MAX_COMMENT_CHARS:,} characters")
        who = principal or "anonymous"
        with self._lock:
            recent = self._recent.get(turn_id)
        if recent is not None and recent != who:
            return False
        try:
            if recent is None:
                owner = await anyio.to_thread.run_sync(self.backend.owner, turn_id)
                mine = hash_identity(who, self.policy.identity_salt) if self.policy.hash_identities else who
                if owner is None or owner != mine:
                    return False
            scrubbed = self.policy.scrub(comment) if comment else None
            item = FeedbackItem(turn_id, self.clock(), rating, scrubbed)
            await anyio.to_thread.run_sync(self.backend.write, (), (item,))
        except (ConfigError, InputError):
            raise
        except Exception as exc:
            where = self.backend.where
            raise TurnLogError(f"the turn log at {where} could not record feedback: {_short(exc)}") from exc
        return True

    # --- reading -------------------------------------------------------------------------------------

    def turns(
        self,
        since: float = 0.0,
        until: float | None = None,
        *,
        brief_answered: bool = False,
        latest: int | None = None,
    ) -> list[LoggedTurn]:
        """Stored turns with ``since <= at < until`` (default: up to now), oldest first (blocking); with
        ``brief_answered``, turns answered in full come back without their queries, rewrites and hits; with
        ``latest``, only the latest that many (read as such: the rest of the period is never loaded)."""
        end = self.clock() + 1.0 if until is None else until
        try:
            return self.backend.turns(since, end, brief_answered=brief_answered, latest=latest)
        except (ConfigError, TurnLogError):
            raise
        except Exception as exc:
            raise TurnLogError(f"could not read the turn log at {self.backend.where}: {_short(exc)}") from exc

    # --- closing -------------------------------------------------------------------------------------

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every row queued before this call is written (or lost); ``False`` on timeout."""
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout_s)
        except queue.Full:
            return False
        done: bool = await anyio.to_thread.run_sync(marker.done.wait, timeout_s)
        return done

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, within ``timeout_s``, then stop (rows still queued after it are dropped)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            self._abort.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():  # a database that hangs: let the thread go, count what it held
            self._abort.set()
            self._count("dropped", self._queue.qsize())
            return
        self.backend.close()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """:meth:`close` without blocking the event loop."""
        await anyio.to_thread.run_sync(self.close, timeout_s)

    # --- the writer thread ---------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _failed(self, n: int, exc: BaseException) -> None:
        message = bounded(redact(_short(exc)), 300)
        with self._lock:
            self._counts["errors"] += n
            first = self._last_error is None
            self._last_error = message
        if first:
            log.warning("turnlog.write_failed", where=self.backend.where, error=message, rows=n)

    def _run(self) -> None:
        next_purge = 0.0
        failures = 0
        while True:
            if self.retention_days is not None and time.monotonic() >= next_purge:
                next_purge = time.monotonic() + self.retention_every_s
                self._purge()
            try:
                item = self._queue.get(timeout=min(1.0, self.retention_every_s))
            except queue.Empty:
                continue
            batch = [item]
            until = time.monotonic() + self.gather_s
            while len(batch) < self.batch_size and not isinstance(batch[-1], _Flush) and batch[-1] is not _STOP:
                left = until - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            turns = [b for b in batch if isinstance(b, PendingTurn)]
            if self._abort.is_set():
                self._count("dropped", len(turns))
            elif turns:
                failures = 0 if self._write(turns) else failures + 1
            for b in batch:
                if isinstance(b, _Flush):
                    b.done.set()
            if any(b is _STOP for b in batch) or self._abort.is_set():
                return
            if failures:  # back off, but wake up for close()
                self._wake.wait(min(30.0, 0.25 * 2 ** min(failures, 7)))

    def _write(self, turns: Sequence[PendingTurn]) -> bool:
        rows: list[StoredRow] = []
        for turn in turns:
            try:
                rows.append(StoredRow(prepare(turn, self.policy)))
            except Exception as exc:  # noqa: BLE001 — a row that cannot be prepared is lost, never the writer
                self._failed(1, exc)
        if not rows:
            return True
        if self.embedder is not None:
            rows = self._embed(rows)
        try:
            trimmed = self.backend.write(rows, (), keep_per_principal=self.max_turns_per_principal)
        except Exception as exc:  # noqa: BLE001 — an outage costs these rows (counted), never a turn
            self._failed(len(rows), exc)
            return False
        with self._lock:
            self._counts["trimmed"] += trimmed
            self._counts["written"] += len(rows)
            self._last_error = None
        return True

    def _embed(self, rows: list[StoredRow]) -> list[StoredRow]:
        import numpy as np

        embedder = self.embedder
        assert embedder is not None
        texts = [s.row.question or " ".join(s.row.terms) for s in rows]
        try:
            sync = getattr(embedder, "embed_sync", None)
            vectors = sync(texts) if callable(sync) else anyio.run(embedder.embed, texts)
            matrix = np.asarray(vectors, dtype=np.float32)
        except Exception as exc:  # noqa: BLE001 — rows without embeddings are still rows
            self._failed(0, exc)
            return rows
        return [StoredRow(s.row, matrix[i].tobytes(), embedder.name) for i, s in enumerate(rows)]

    def _purge(self) -> None:
        assert self.retention_days is not None
        try:
            gone = self.backend.purge(self.clock() - self.retention_days * 86_400)
        except Exception as exc:  # noqa: BLE001 — retention runs again later; the log keeps working
            self._failed(0, exc)
            return
        self._count("purged", gone)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text
