"""In-memory fakes of every seam of a chat turn, for unit-testing nodes and custom graphs.

Public through :mod:`ragloop.testing`. Each fake is deterministic, records how it was called, and can be
told to fail or to be slow for a given input::

    from ragloop.testing import FakeRetriever, FakeGrader, make_hit

    retriever = FakeRetriever({"sso": [make_hit("SSO uses SAML.")]}, errors={"billing": OSError("down")})
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import anyio
from attrs import define, field

from ragloop.retrievers.filters import matches
from ragloop.retrievers.live import LiveRecord
from ragloop.state import Caller, Chunk, ContextBlock, Decision, Hit, Message, Outcome, PageContext, Verdict

__all__ = [
    "FakeAnswerer",
    "FakeBridger",
    "FakeDecider",
    "FakeGrader",
    "FakeLiveSource",
    "FakeRetriever",
    "FakeRewriter",
    "make_hit",
]


def make_hit(
    text: str,
    *,
    score: float = 1.0,
    confidence: float = 0.5,
    source: str = "doc.md",
    title: str = "",
    chunk_id: str | None = None,
) -> Hit:
    """A hit over a chunk of ``text`` whose id is the hash of the text unless given."""
    cid = chunk_id or hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return Hit(Chunk(cid, text, source=source, title=title or source, doc_id=source), score, confidence)


@define
class _Concurrency:
    now: int = 0
    peak: int = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


@define
class FakeRetriever:
    """Answers from a query → hits mapping (or function); can fail or stall per query.

    Attributes:
        results: Query → hits, or a function of the query.
        errors: Query → exception to raise.
        delays: Query → seconds to sleep first (to trigger timeouts).
        calls: Queries searched, in order.
    """

    results: Mapping[str, Sequence[Hit]] | Callable[[str], Sequence[Hit]] = field(factory=dict)
    errors: Mapping[str, BaseException] = field(factory=dict)
    delays: Mapping[str, float] = field(factory=dict)
    calls: list[str] = field(factory=list)
    concurrency: _Concurrency = field(factory=_Concurrency)

    async def search(
        self, query: str, k: int = 10, filters: Mapping[str, tuple[str, ...]] | None = None
    ) -> Sequence[Hit]:
        """Return the scripted hits for ``query`` (at most ``k``) whose chunk metadata matches ``filters``."""
        self.calls.append(query)
        self.concurrency.enter()
        try:
            if query in self.delays:
                await anyio.sleep(self.delays[query])
            if query in self.errors:
                raise self.errors[query]
            found = self.results(query) if callable(self.results) else self.results.get(query, ())
            if filters:
                found = [h for h in found if matches(h.chunk, filters)]
            return list(found)[:k]
        finally:
            self.concurrency.leave()


@define
class FakeDecider:
    """Decides with a function of the question (default: search the question as asked)."""

    fn: Callable[[str], Decision] = lambda q: Decision(queries=(q,))
    calls: list[tuple[str, tuple[Message, ...], PageContext]] = field(factory=list)

    async def decide(self, question: str, history: Sequence[Message], page: PageContext) -> Decision:
        """Return ``fn(question)``; an exception from ``fn`` propagates."""
        self.calls.append((question, tuple(history), page))
        return self.fn(question)


@define
class FakeGrader:
    """Grades with a function of (query, hit); the function may raise, or return a delay to stall."""

    fn: Callable[[str, Hit], Verdict] = lambda q, h: Verdict("relevant", reason="fake")
    delay_s: float = 0.0
    calls: list[tuple[str, str]] = field(factory=list)
    concurrency: _Concurrency = field(factory=_Concurrency)

    async def grade(self, query: str, hit: Hit) -> Verdict:
        """Return ``fn(query, hit)`` after ``delay_s``."""
        self.calls.append((query, hit.id))
        self.concurrency.enter()
        try:
            if self.delay_s:
                await anyio.sleep(self.delay_s)
            return self.fn(query, hit)
        finally:
            self.concurrency.leave()


@define
class FakeRewriter:
    """Rewrites with a function of (question, failed query, tried queries)."""

    fn: Callable[[str, str, Sequence[str]], str] = lambda question, failed, tried: (
        f"{question} alternative {len(tried)}"
    )
    calls: list[tuple[str, str, tuple[str, ...]]] = field(factory=list)

    async def rewrite(self, question: str, failed_query: str, tried: Sequence[str]) -> str:
        """Return ``fn(question, failed_query, tried)``."""
        self.calls.append((question, failed_query, tuple(tried)))
        return self.fn(question, failed_query, tried)


@define
class FakeBridger:
    """Proposes follow-up queries from a function of (question, found passages, tried queries)."""

    fn: Callable[[str, Sequence[str], Sequence[str]], str | None] = lambda question, found, tried: None
    calls: list[tuple[str, int]] = field(factory=list)

    async def follow_up(self, question: str, found: Sequence[str], tried: Sequence[str]) -> str | None:
        """Return ``fn(question, found, tried)``."""
        self.calls.append((question, len(found)))
        return self.fn(question, found, tried)


@define
class FakeAnswerer:
    """Streams a reply naming the outcome and citing every block; can fail after ``fail_after`` tokens."""

    fail_after: int | None = None
    calls: list[tuple[str, Outcome, tuple[int, ...], tuple[str, ...]]] = field(factory=list)

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
        """Yield ``"<outcome>: "``, then ``"[n] "`` per block, then ``"missing: …"`` when some are missing."""
        self.calls.append((question, outcome, tuple(b.n for b in blocks), tuple(missing)))
        tokens = [direct_reply or f"{outcome}: "] if outcome == "direct" else [f"{outcome}: "]
        tokens += [f"[{b.n}] " for b in blocks]
        if missing:
            tokens.append("missing: " + "; ".join(missing))
        for i, token in enumerate(tokens):
            if self.fail_after is not None and i >= self.fail_after:
                raise RuntimeError("fake answerer failure")
            yield token


_TICKET = re.compile(r"#(\d{3,7})\b")


@define
class FakeLiveSource:
    """A ticket-like live source over a dict; ``wrong`` maps a requested id to the id it returns instead.

    Attributes:
        records: Id → record.
        wrong: Requested id → the (different) id this source wrongly returns, to exercise mismatch rejection.
        fail_times: Fail this many lookups before answering.
        name: Source name.
    """

    records: Mapping[str, LiveRecord] = field(factory=dict)
    wrong: Mapping[str, str] = field(factory=dict)
    fail_times: int = 0
    name: str = "tickets"
    lookups: list[tuple[str, ...]] = field(factory=list)
    callers: list[Caller | None] = field(factory=list)

    def signals(self, query: str) -> tuple[str, ...]:
        """Ticket ids (``#1234``) in the query."""
        return tuple(dict.fromkeys(_TICKET.findall(query)))

    async def lookup(self, query: str, ids: Sequence[str], *, caller: Caller | None = None) -> Sequence[LiveRecord]:
        """Records for ``ids`` (or the wrong ones); the caller of each lookup is kept in ``callers``."""
        self.lookups.append(tuple(ids))
        self.callers.append(caller)
        if self.fail_times > 0:
            self.fail_times -= 1
            raise ConnectionError("fake live source is down")
        out = []
        for i in ids:
            rid = self.wrong.get(i, i)
            if rid in self.records:
                out.append(self.records[rid])
        return out

    async def aclose(self) -> None:
        """Nothing to close."""
