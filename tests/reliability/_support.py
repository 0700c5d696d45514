"""Shared helpers of the reliability suite: a small hash-embedded index, soak sizing, leak checks."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Iterator, Sequence

import anyio
from attrs import define, field

from ragloop.chat import ChatRAG
from ragloop.llm.offline import OfflineAnswerer, OfflineDecider, OfflineGrader, OfflineRewriter
from ragloop.retrievers.base import Retriever
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.live import LiveSource
from ragloop.state import Chunk, Hit
from ragloop.text.terms import CorpusStats
from ragloop.turn import TurnSettings

__all__ = [
    "FIGURES",
    "SOAK",
    "TOPICS",
    "FaultyRetriever",
    "count",
    "offline_rag",
    "scale",
    "small_chunks",
    "small_index",
    "turn_tasks",
]

#: ``RAGLOOP_SOAK=1`` runs the larger variants (more turns, kills, examples); never on by default.
SOAK = os.environ.get("RAGLOOP_SOAK", "") not in ("", "0")


#: Figures for the closing note, filled by the tests (see conftest.py and README.md).
FIGURES: dict[str, object] = {}


def count(key: str, n: int = 1, *, group: str | None = None) -> None:
    """Add ``n`` to figure ``key`` (inside the ``group`` dict when given)."""
    target: dict[str, object] = FIGURES
    if group is not None:
        target = FIGURES.setdefault(group, {})  # type: ignore[assignment]
    target[key] = int(target.get(key, 0)) + n  # type: ignore[call-overload]


def scale(default: int, soak: int) -> int:
    """``default`` in the normal run, ``soak`` when ``RAGLOOP_SOAK=1``."""
    return soak if SOAK else default


#: One short page per topic: (file name, title, text). Every page names a distinct fact.
TOPICS: tuple[tuple[str, str, str], ...] = (
    ("webhooks.md", "Webhooks", "Failed webhook deliveries are retried 8 times with exponential backoff."),
    ("api-keys.md", "API keys", "Rotate an API key from Settings, then revoke the old key within 24 hours."),
    ("sso.md", "Single sign-on", "SAML single sign-on is configured by uploading the identity provider metadata."),
    ("export.md", "Data export", "Workspace data export produces a zip archive of CSV files within one hour."),
    ("audit.md", "Audit log", "The audit log keeps every administrator action for 400 days."),
    ("billing.md", "Billing", "Invoices are emailed to the billing contact on the first day of each month."),
    ("import.md", "CSV import", "A CSV import file may be at most 50 megabytes with 100000 rows."),
    ("mobile.md", "Mobile apps", "The mobile apps support offline drafts that sync when the phone reconnects."),
    ("twofa.md", "Two-factor", "Two-factor authentication codes come from an authenticator app or hardware key."),
    ("slack.md", "Slack", "The Slack integration posts task updates to a channel chosen per project."),
    ("trash.md", "Trash", "Deleted tasks stay in the trash for 30 days before permanent removal."),
    ("limits.md", "Rate limits", "The REST API allows 600 requests per minute per token before answering 429."),
)


def small_chunks() -> list[Chunk]:
    """One chunk per topic page."""
    out = []
    for source, title, text in TOPICS:
        cid = hashlib.sha256(text.encode()).hexdigest()[:16]
        out.append(Chunk(cid, text, source=source, title=title, doc_id=source))
    return out


def small_index(extra: list[Chunk] | None = None) -> KnowledgeIndex:
    """A KnowledgeIndex over :data:`TOPICS` (plus ``extra``) with a 256-dim hash embedder; builds in ms."""
    return KnowledgeIndex.build([*small_chunks(), *(extra or [])], HashEmbedder(256))


def turn_tasks(exclude: set[asyncio.Task[object]]) -> Iterator[asyncio.Task[object]]:
    """Tasks alive now that were not in ``exclude`` (the caller's baseline), other than the current one."""
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not current and task not in exclude and not task.done():
            yield task


def offline_rag(
    index: KnowledgeIndex | None = None,
    *,
    retriever: Retriever | None = None,
    live_sources: Sequence[LiveSource] = (),
    settings: TurnSettings = TurnSettings(),
) -> ChatRAG:
    """A ChatRAG with the offline judges over ``index`` (default :func:`small_index`), optionally another retriever."""
    idx = index if index is not None else small_index()
    texts = [c.text for c in idx.chunks]
    stats = CorpusStats.from_texts(texts)
    return ChatRAG(
        retriever=retriever if retriever is not None else idx.retriever("hybrid"),
        decider=OfflineDecider(stats, max_queries=settings.max_queries),
        grader=OfflineGrader.calibrate(stats, texts),
        rewriter=OfflineRewriter(stats),
        answerer=OfflineAnswerer(stats),
        live_sources=live_sources,
        settings=settings,
    )


@define
class FaultyRetriever:
    """Wraps a retriever: queries containing a word of ``raise_on`` raise, of ``hang_on`` hang until cancelled.

    Attributes:
        inner: The real retriever.
        raise_on: Lower-case words whose queries raise ``OSError``.
        hang_on: Lower-case words whose queries never return.
        started: Queries whose search started.
        cancelled: Monotonic times at which hanging searches saw their cancellation.
    """

    inner: Retriever
    raise_on: frozenset[str] = frozenset()
    hang_on: frozenset[str] = frozenset()
    started: list[str] = field(factory=list)
    cancelled: list[float] = field(factory=list)
    hanging: anyio.Event = field(factory=anyio.Event)

    async def search(self, query: str, k: int = 10) -> Sequence[Hit]:
        """Search, raise or hang, by the words of ``query``."""
        self.started.append(query)
        words = set(query.lower().split())
        if words & self.raise_on:
            raise OSError(f"index shard for {query!r} is unavailable")
        if words & self.hang_on:
            self.hanging.set()
            try:
                await anyio.sleep_forever()
            finally:
                self.cancelled.append(time.monotonic())
        return list(await self.inner.search(query, k))
