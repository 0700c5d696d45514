"""Corpus-derived judges per caller scope: no tenant's words reach another tenant's turn.

The offline judges know the corpus: its term statistics (IDF, co-occurrence), the abbreviations it defines (the
glossary), the grader's thresholds calibrated on its texts, and which names it mentions at all. Built over the
whole index, that knowledge crosses tenants: a globex caller asking "What does QLR stand for?" had acme's
"QLR (quantum lattice relay)" expanded into its queries, its ``missing`` and its decision record.

A turn's **scope** is its filters (a principal's server-side tenant and filters, narrowed by the client's own):
exactly the chunks its searches can find. :class:`ScopedKnowledge` builds the corpus-derived judges over the
chunks one scope can see (:meth:`~ragloop.retrievers.scope.Corpus.visible`), on the first turn of that scope,
and keeps them for the next turns (``max_scopes`` of them, least recently used first out); the judges of a
scope that sees every chunk (no filters, or filters every chunk passes) are the ones built at start-up. Scopes
that see the same chunks share one build. The build runs in a worker thread, off the event loop, and at most
:data:`MAX_CONCURRENT_BUILDS` run at once in a process: a caller that sends many distinct narrowing filters
waits for its own builds and cannot take every worker thread the other callers' searches need.

:func:`~ragloop.retrievers.scope.turn_scope` installs the running turn's filters in a context variable (the
turn graph does, around every run); the scoped judges (:class:`ScopedDecider`, :class:`ScopedGrader`,
:class:`ScopedRewriter`, :class:`ScopedBridger`, :class:`ScopedAnswerer`) look the turn's judges up once per
turn and hand every call to them. Outside a turn (a judge called directly) the scope is empty: the whole
corpus, as before.
"""

from __future__ import annotations

import array
import hashlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
from attrs import define

from ragloop.errors import ConfigError
from ragloop.retrievers.filters import FilterKey, Filters, filter_key
from ragloop.retrievers.scope import Corpus, current_scope, running_scope, turn_scope
from ragloop.state import Abstention, ContextBlock, Decision, Hit, Message, Outcome, PageContext, Verdict

__all__ = [
    "MAX_CONCURRENT_BUILDS",
    "ScopedAnswerer",
    "ScopedBridger",
    "ScopedDecider",
    "ScopedGrader",
    "ScopedKnowledge",
    "ScopedRewriter",
    "current_scope",
    "turn_scope",
]  # current_scope and turn_scope live in ragloop.retrievers.scope (the caches below the judges read them too)

T = TypeVar("T")

#: Scope builds that may run at once in a process (each is CPU work in a worker thread).
MAX_CONCURRENT_BUILDS = 2
# A thread semaphore taken without blocking (and polled): it works in every event loop and backend at once.
_build_slots = threading.BoundedSemaphore(MAX_CONCURRENT_BUILDS)


class _Abandoned(Exception):
    """The waiting turn gave its build slot back before the worker thread started."""


async def _in_build_slot(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread once a build slot is free. The thread gives the slot back when ``fn`` ends,
    so a turn cancelled meanwhile (its deadline, a client gone) stops waiting at once while the build goes on
    and is kept for the scope's next turn, and no more than :data:`MAX_CONCURRENT_BUILDS` ever run."""
    delay = 0.001
    while not _build_slots.acquire(blocking=False):
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.05)
    owner = threading.Lock()  # whoever takes it gives the slot back: the thread, or the turn if it never ran

    def run() -> T:
        if not owner.acquire(blocking=False):
            raise _Abandoned
        try:
            return fn()
        finally:
            _build_slots.release()

    try:
        return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except BaseException:
        if owner.acquire(blocking=False):  # cancelled before the thread started: it never will build
            _build_slots.release()
        raise


def _signature(positions: Sequence[int]) -> bytes:
    return hashlib.blake2b(array.array("q", positions).tobytes(), digest_size=16).digest()


class ScopedKnowledge(Generic[T]):
    """``build(texts)`` over the chunks each scope can see, built on a scope's first use and kept after.

    Args:
        corpus: Every chunk's text and metadata.
        build: Builds the knowledge (a bundle of judges) from texts; called with the visible texts, in order
            (and, with ``positioned``, their positions in the corpus as a second argument).
        base: What ``build(corpus.texts)`` gives, if already built (built here otherwise): the knowledge of
            every scope that sees the whole corpus.
        max_scopes: Most scope builds kept (least recently used dropped first); each holds its own statistics.
        positioned: Call ``build(texts, positions)``: what a build derives from more than the texts (the
            corpus' :attr:`~ragloop.retrievers.scope.Corpus.meaning`) needs to know which chunks they are.

    Raises:
        ConfigError: ``max_scopes`` below 1.
    """

    def __init__(
        self,
        corpus: Corpus,
        build: Callable[..., T],
        *,
        base: T | None = None,
        max_scopes: int = 32,
        positioned: bool = False,
    ) -> None:
        if max_scopes < 1:
            raise ConfigError(f"max_scopes must be at least 1, got {max_scopes}")
        self.corpus, self.build, self.max_scopes, self.positioned = corpus, build, max_scopes, positioned
        #: The knowledge over the whole corpus.
        if base is None:
            base = build(list(corpus.texts), None) if positioned else build(list(corpus.texts))
        self.base: T = base
        #: Scope builds made so far (each a build over one scope's visible chunks).
        self.builds = 0
        self._lock = threading.Lock()
        self._signatures: OrderedDict[FilterKey, bytes | None] = OrderedDict()  # None: sees the whole corpus
        self._built: OrderedDict[bytes, T] = OrderedDict()

    def _cached(self, key: FilterKey) -> tuple[bool, T | None]:
        """``(known, knowledge)``: whether the scope was seen, and its knowledge when it is kept."""
        with self._lock:
            if key not in self._signatures:
                return False, None
            self._signatures.move_to_end(key)
            sig = self._signatures[key]
            if sig is None:
                return True, self.base
            found = self._built.get(sig)
            if found is not None:
                self._built.move_to_end(sig)
            return True, found

    def for_filters(self, filters: Filters | None) -> T:
        """The knowledge of the scope ``filters`` (built now, in this thread, when it is not kept)."""
        key = filter_key(filters or {})
        if not key:
            return self.base
        _, found = self._cached(key)
        return found if found is not None else self._build(key, filters or {})

    def _build(self, key: FilterKey, filters: Filters) -> T:
        positions = self.corpus.visible(filters)
        sig = None if len(positions) == len(self.corpus) else _signature(positions)
        with self._lock:
            self._signatures[key] = sig
            self._signatures.move_to_end(key)
            while len(self._signatures) > 4 * self.max_scopes:
                self._signatures.popitem(last=False)
            found = self.base if sig is None else self._built.get(sig)
        if found is not None:
            return found
        texts = self.corpus.texts_at(positions)
        value = self.build(texts, positions) if self.positioned else self.build(texts)
        with self._lock:
            self.builds += 1
            assert sig is not None
            self._built[sig] = value
            self._built.move_to_end(sig)
            while len(self._built) > self.max_scopes:
                self._built.popitem(last=False)
        return value

    def current(self) -> T:
        """The running turn's knowledge, resolved once per turn (built in this thread when not kept)."""
        turn = running_scope()
        if turn is None or not turn.key:
            return self.base
        found = turn.resolved.get(id(self))
        if found is None:
            found = turn.resolved[id(self)] = self.for_filters(turn.filters)
        return found

    async def acurrent(self) -> T:
        """:meth:`current`, with a build (or the first look at a new scope) in a worker thread."""
        turn = running_scope()
        if turn is None or not turn.key:
            return self.base
        found = turn.resolved.get(id(self))
        if found is None:
            known, kept = self._cached(turn.key)
            if not known or kept is None:
                kept = await _in_build_slot(lambda: self._build(turn.key, turn.filters))
            found = turn.resolved[id(self)] = kept
        return found


@define
class _Scoped:
    """A judge of the running turn's scope: ``role`` of the knowledge :attr:`knowledge` resolves."""

    knowledge: ScopedKnowledge[Any]
    role: str

    async def _judge(self) -> Any:
        return getattr(await self.knowledge.acurrent(), self.role)


class ScopedDecider(_Scoped):
    """A :class:`~ragloop.llm.protocols.Decider` whose glossary and statistics are the turn's scope's."""

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """The scope's decider's decision."""
        decision: Decision = await (await self._judge()).decide(question, history, page)
        return decision


class ScopedGrader(_Scoped):
    """A :class:`~ragloop.llm.protocols.Grader` whose statistics and thresholds are the turn's scope's."""

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """The scope's grader's verdict."""
        verdict: Verdict = await (await self._judge()).grade(query, hit)
        return verdict


class ScopedRewriter(_Scoped):
    """A :class:`~ragloop.llm.protocols.Rewriter` whose vocabulary and term association are the scope's."""

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """The scope's rewriter's query."""
        query: str = await (await self._judge()).rewrite(question, failed_query, tried)
        return query


class ScopedBridger(_Scoped):
    """A :class:`~ragloop.llm.protocols.Bridger` whose bridge entities are rare in the scope, not the index."""

    async def follow_up(self, question: str, found: Sequence[str], tried: Sequence[str]) -> str | None:
        """The scope's bridger's follow-up query."""
        query: str | None = await (await self._judge()).follow_up(question, found, tried)
        return query


class ScopedAnswerer(_Scoped):
    """An extractive answerer (and abstainer) whose weights and "never mentioned" checks are the scope's."""

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        """The scope's answerer's reply, streamed."""
        inner = (await self._judge()).answer(
            question, blocks, outcome, missing=missing, direct_reply=direct_reply, history=history
        )
        try:
            async for token in inner:
                yield token
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()

    def compose(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
    ) -> str:
        """The scope's answerer's whole reply (no I/O)."""
        judge = getattr(self.knowledge.current(), self.role)
        text: str = judge.compose(question, blocks, outcome, missing=missing, direct_reply=direct_reply)
        return text

    def abstain(self, question: str, blocks: Sequence[ContextBlock], hits: Sequence[Hit]) -> Abstention | None:
        """The scope's answerer's abstention: names the scope's chunks never mention."""
        found: Abstention | None = getattr(self.knowledge.current(), self.role).abstain(question, blocks, hits)
        return found
