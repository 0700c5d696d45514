"""Shared by ``bench_turn.py`` and ``bench_concurrency.py``: a simulated model deployment and timing wrappers.

* :func:`matcher` answers every request of the OpenAI judges the way a model would, by looking at the
  request: ``tools`` present → decide (a direct reply for small talk, else one ``search`` call per topic);
  ``response_format`` present → grade (``relevant`` when the chunk shares a content word with the query,
  ``partial`` otherwise, and ``irrelevant`` for the queries a scenario marks as coming up short; a per-query
  batch request gets one such verdict per passage, and takes ``grade_per_verdict`` longer per verdict past
  the first, for its longer output);
  ``stream=True`` → answer (a cited reply streamed token by token); anything else → rewrite.
  Each answer carries the per-call latency of :data:`LATENCY` (a real deployment's ballpark).
* :class:`ModelServer` runs a :class:`ragloop.testing.ScriptedOpenAIServer` with that matcher in a child
  process, so the server's threads never compete with the measured event loop for the GIL.
* :class:`Timed` wrappers record when each judge call, search, embedding and live lookup started and ended
  (per turn, through a context variable), so a benchmark can split a turn's wall time into simulated model
  time, HTTP transport and ragloop's own orchestration.
"""

from __future__ import annotations

import contextvars
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

#: Simulated model latency per judge, in seconds: decide, grade, rewrite; answer: first token, then per token.
BASE_LATENCY = {
    "decide": 0.200,
    "grade": 0.150,
    "grade_per_verdict": 0.020,
    "rewrite": 0.180,
    "answer_first": 0.300,
    "answer_token": 0.010,
}
#: The latencies in use (:func:`set_scale` multiplies them, e.g. for quick smoke runs).
LATENCY = dict(BASE_LATENCY)


def set_scale(scale: float) -> None:
    """Multiply every simulated latency by ``scale`` (in this process)."""
    LATENCY.update({k: v * scale for k, v in BASE_LATENCY.items()})


#: Characters per streamed answer delta (one delta = one simulated token).
ANSWER_CHUNK = 4

#: The benchmark's questions → what the simulated decider does with them (a reply, or search queries).
DECIDE: dict[str, Any] = {
    "Hi there!": {"reply": "Hi! Ask me anything about Lumen."},
    "How much does the Business plan cost per seat?": {"queries": ["Business plan price per seat"]},
    "Compare the plan pricing and how to set up SSO with SAML.": {
        "queries": ["plan pricing comparison", "set up SAML single sign-on"]
    },
    "Does Lumen have a Salesforce connector?": {"queries": ["Salesforce connector"]},
    "What is the status of ticket #1234?": {"queries": ["status of ticket #1234"]},
}
#: Queries the simulated grader finds nothing relevant for (they need a rewrite, or the live source).
SHORT = {"Salesforce connector", "status of ticket #1234"}
#: The simulated rewriter's new angle for a failed query.
REWRITE = {"Salesforce connector": "CRM integrations list"}

_FANOUT_TOPICS = ["plan pricing", "SAML single sign-on", "API rate limits", "webhook signatures"]
_STOP = frozenset(
    "a an and the of to in on for with how do does what is are i my can be by at or from this that".split()  # noqa: SIM905
)
_WORD = re.compile(r"[a-z0-9]+")


def fanout_question(n: int) -> str:
    """A question the simulated decider splits into ``n`` topics (1–4)."""
    return "Tell me about " + ", ".join(_FANOUT_TOPICS[:n]) + "."


DECIDE.update({fanout_question(n): {"queries": _FANOUT_TOPICS[:n]} for n in (1, 2, 3, 4)})


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def _answer_text(n_tokens: int = 60) -> str:
    base = "According to the documentation [1], this is how it works; see also [2] for the details. "
    text = (base * (1 + n_tokens * ANSWER_CHUNK // len(base)))[: n_tokens * ANSWER_CHUNK]
    return text


def matcher(request: Any) -> Any:
    """Answer one chat request of the OpenAI judges like a model would (see the module docstring)."""
    from ragloop.llm.prompts import FENCE_OPEN
    from ragloop.testing import reply, stream, tool_calls, verdicts

    body = request.body if isinstance(request.body, dict) else {}
    messages = request.messages
    user = str(messages[-1].get("content") or "") if messages else ""
    if body.get("stream"):
        return stream(
            _answer_text(),
            chunk_size=ANSWER_CHUNK,
            first_token_delay_s=LATENCY["answer_first"],
            token_delay_s=LATENCY["answer_token"],
        )
    if body.get("tools"):
        plan = DECIDE.get(user) or {"queries": [user]}
        if "reply" in plan:
            return reply(plan["reply"]).with_latency(LATENCY["decide"])
        return tool_calls([("search", {"query": q}) for q in plan["queries"]]).with_latency(LATENCY["decide"])
    if body.get("response_format"):
        head = user.partition("\n\n")[0]
        query = json.loads(head.removeprefix("Search query: ")) if head.startswith("Search query: ") else head

        def label(text: str) -> str:
            if query in SHORT:
                return "irrelevant"
            return "relevant" if _words(query) & _words(text) else "partial"

        n = user.count(f"{FENCE_OPEN} id=")  # passages in this request: 1 per-passage, all of a query's in a batch
        return verdicts(request, label, reason="simulated").with_latency(grade_seconds(n))
    failed = re.search(r"Query that failed: (.*)", user)
    old = failed.group(1).strip() if failed else user
    return reply(REWRITE.get(old, f"{old} overview")).with_latency(LATENCY["rewrite"])


def grade_seconds(n: int) -> float:
    """The simulated latency of grading ``n`` passages in one call."""
    return LATENCY["grade"] + LATENCY["grade_per_verdict"] * max(0, n - 1)


def simulated_seconds(judge: str, n_answer_tokens: int = 60) -> float:
    """The simulated model latency of one call to ``judge`` (for the answer: until its last chunk)."""
    if judge.startswith("grade_batch:"):
        return grade_seconds(int(judge.partition(":")[2]))
    if judge == "answer":
        # The server waits before every content delta after the first, and before the finish chunk.
        return LATENCY["answer_first"] + LATENCY["answer_token"] * n_answer_tokens
    return LATENCY[judge]


class ModelServer:
    """The scripted server with :func:`matcher`, in a child process (``with ModelServer(scale) as url:``)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.scale)],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http"):
            self.proc.kill()
            raise RuntimeError(f"simulated model server did not start: {line!r}")
        return line

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the child exits when its stdin closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _serve() -> None:
    import logging
    import socketserver

    from ragloop.testing import ScriptedOpenAIServer

    logging.disable(logging.CRITICAL)
    set_scale(float(sys.argv[sys.argv.index("--serve") + 1]))
    socketserver.TCPServer.request_queue_size = 4096  # 500 concurrent turns open many connections at once
    with ScriptedOpenAIServer(matcher=matcher) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


# -- chats


def build_chat(
    url: str, index: Any, settings: Any, max_connections: int | None = None, caches: Any = None
) -> tuple[Any, Any]:
    """``ChatRAG.from_index(index, llm)``'s wiring, with every external call wrapped in a timing span (and
    ``caches``, if given, keyed on the index's version)."""
    import openai

    from ragloop.chat import ChatRAG
    from ragloop.llm.offline import OfflineAnswerer, OfflineDecider
    from ragloop.llm.openai import OpenAIJudges
    from ragloop.retrievers.live import SQLiteTicketSource
    from ragloop.text.terms import CorpusStats
    from ragloop.turn import Judges, Turn

    stats = CorpusStats.from_texts([c.text for c in index.chunks])
    offline_decider = OfflineDecider(stats, max_queries=settings.max_queries)
    http_client = None
    if max_connections is not None:
        import httpx2 as httpx  # the HTTP library the openai SDK speaks through

        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        http_client = openai.DefaultAsyncHttpxClient(limits=limits)
    client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=60.0, http_client=http_client)
    judges = OpenAIJudges.create(
        client, fast_model="sim-fast", answer_model="sim-answer", glossary=offline_decider.terms_glossary
    )
    timed = Judges(
        Timed(judges.decider, "decide"),
        Timed(judges.grader, "grade"),
        Timed(judges.rewriter, "rewrite"),
        Timed(judges.answerer, "answer"),
        fallback_decider=offline_decider,
        fallback_answerer=OfflineAnswerer(stats),
    )
    turn = Turn(
        Timed(index.retriever("hybrid"), "search"),
        timed,
        settings=settings,
        embedder=Timed(index.embedder, "embed"),
        caches=caches,
        index_version=lambda: index.version,
    )
    rag = ChatRAG(turn.add_source(Timed(SQLiteTicketSource(require_caller=False), "live")))
    return rag, client


class Sleepy:
    """An offline judge that first waits its simulated model latency: a model deployment without the SDK.

    The answer is the simulated model's 60-token reply, streamed at the simulated rate.
    """

    def __init__(self, inner: Any, kind: str) -> None:
        self._inner, self._kind = inner, kind

    async def decide(self, *args: Any, **kw: Any) -> Any:
        await anyio.sleep(LATENCY["decide"])
        return await self._inner.decide(*args, **kw)

    async def grade(self, *args: Any, **kw: Any) -> Any:
        await anyio.sleep(LATENCY["grade"])
        return await self._inner.grade(*args, **kw)

    async def rewrite(self, *args: Any, **kw: Any) -> Any:
        await anyio.sleep(LATENCY["rewrite"])
        return await self._inner.rewrite(*args, **kw)

    async def answer(self, *args: Any, **kw: Any) -> AsyncIterator[str]:
        # A remote model writes the answer: stream the simulated 60-token reply. (Calling the offline
        # answerer here would add its sentence selection, ~30 ms of CPU on the event loop, to every turn.)
        await anyio.sleep(LATENCY["answer_first"])
        text = _answer_text()
        for i in range(0, len(text), ANSWER_CHUNK):
            if i:
                await anyio.sleep(LATENCY["answer_token"])
            yield text[i : i + ANSWER_CHUNK]


def build_sleepy_chat(index: Any, settings: Any) -> Any:
    """``ChatRAG.from_index(index)`` (offline judges), each judge first sleeping its simulated latency."""
    import attrs

    from ragloop.chat import ChatRAG
    from ragloop.turn import Judges, Turn

    texts = [c.text for c in index.chunks]
    offline = Judges.offline(texts, max_queries=settings.max_queries, embedder=index.embedder)
    judges = attrs.evolve(
        offline,
        decider=Sleepy(offline.decider, "decide"),
        grader=Sleepy(offline.grader, "grade"),
        rewriter=Sleepy(offline.rewriter, "rewrite"),
        answerer=Sleepy(offline.answerer, "answer"),
    )
    retriever, version = index.retriever("hybrid"), lambda: index.version
    return ChatRAG(Turn(retriever, judges, settings=settings, embedder=index.embedder, index_version=version))


# -- timing spans ---------------------------------------------------------------------------------------

#: Per turn: ``(kind, start, end)`` of every external wait (model call, search, embedding, live lookup).
SPANS: contextvars.ContextVar[list[tuple[str, float, float]]] = contextvars.ContextVar("spans")


def _span(kind: str, start: float) -> None:
    spans = SPANS.get(None)
    if spans is not None:
        spans.append((kind, start, time.perf_counter()))


class Timed:
    """Wraps a judge, retriever, embedder or live source and records a span per call."""

    def __init__(self, inner: Any, kind: str) -> None:
        self._inner, self._kind = inner, kind
        for attr in ("name", "dim"):
            if hasattr(inner, attr):
                setattr(self, attr, getattr(inner, attr))

    async def decide(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.decide(*args, **kw)
        finally:
            _span("decide", t)

    async def grade(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.grade(*args, **kw)
        finally:
            _span("grade", t)

    async def grade_batch(self, query: str, hits: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.grade_batch(query, hits)
        finally:
            _span(f"grade_batch:{len(hits)}", t)

    async def rewrite(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.rewrite(*args, **kw)
        finally:
            _span("rewrite", t)

    async def answer(self, *args: Any, **kw: Any) -> AsyncIterator[str]:
        # A direct reply from the decider is streamed as is, without a model call.
        direct = len(args) > 2 and args[2] == "direct" and bool(kw.get("direct_reply"))
        t = time.perf_counter()
        stream = self._inner.answer(*args, **kw)
        try:
            async for token in stream:
                yield token
        finally:
            await stream.aclose()
            _span("direct" if direct else "answer", t)

    async def search(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.search(*args, **kw)
        finally:
            _span("search", t)

    async def embed(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.embed(*args, **kw)
        finally:
            _span("embed", t)

    def signals(self, query: str) -> tuple[str, ...]:
        return tuple(self._inner.signals(query))

    async def lookup(self, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await self._inner.lookup(*args, **kw)
        finally:
            _span("live", t)

    async def aclose(self) -> None:
        await self._inner.aclose()


def union_seconds(spans: Sequence[tuple[str, float, float]]) -> float:
    """Total time covered by at least one span."""
    total, end = 0.0, float("-inf")
    for _, s, e in sorted(spans, key=lambda x: x[1]):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def simulated_critical_path(spans: Sequence[tuple[str, float, float]]) -> float:
    """The turn's unavoidable wait: per cluster of overlapping spans, its longest simulated member.

    A model call counts its scripted latency (not the measured one, which includes HTTP transport); a
    search, embedding or live lookup counts its measured time (it is real work, not simulated).
    """
    total = 0.0
    cluster_end, cluster_max = float("-inf"), 0.0
    for kind, s, e in sorted(spans, key=lambda x: x[1]):
        modelled = kind in ("decide", "grade", "rewrite", "answer") or kind.startswith("grade_batch:")
        cost = simulated_seconds(kind) if modelled else e - s
        if s > cluster_end:
            total += cluster_max
            cluster_end, cluster_max = e, cost
        else:
            cluster_end, cluster_max = max(cluster_end, e), max(cluster_max, cost)
    return total + cluster_max


if __name__ == "__main__" and "--serve" in sys.argv:
    _serve()
