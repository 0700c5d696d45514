"""Issue 30, item 1: what a turn knows of the corpus is scoped like the documents it may read.

The attack: acme's page defines "QLR (quantum lattice relay)"; a globex key asks "What does QLR stand for?".
Before, the offline judges' glossary, term statistics and calibration were built over the whole index, so
globex's turn expanded the question with acme's definition and carried it into its queries, its ``missing``,
its decision record and its turn-log row, on every endpoint and on the Postgres store too. Now every turn's
judges know only the chunks its filters let it find.

The property (hypothesis): for the offline judges, tenant B's reply, citations, outcome, ``missing`` and
decision record are the same whether or not tenant A's documents are in the index; with a model, no term only
A's documents hold appears in any request sent for B.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragloop.chat import ChatRAG, Reply
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.serve import ApiKey, ServeSettings, create_app
from ragloop.state import Chunk
from ragloop.testing import RecordedRequest, ScriptedOpenAIServer, ScriptedResponse, reply, stream, verdicts
from ragloop.turnlog import TurnLog
from tests.serve.conftest import serving, sse_events

pytestmark = pytest.mark.anyio

QUESTION = "What does QLR stand for?"
#: Words only acme's page holds: none may reach a globex turn in any form.
ACME_ONLY = ("quantum", "lattice", "relay", "ACME-QLR-7731")
ACME = ApiKey("acme-user", key="acme-key-5f1c2a9e77d0", tenant="acme")
GLOBEX = ApiKey("globex-user", key="globex-key-3b8d0e6f1a42", tenant="globex")


def _chunk(cid: str, text: str, tenant: str | None, title: str) -> Chunk:
    source = f"{tenant or 'shared'}/{cid}.md"
    meta = {"tenant": tenant} if tenant else {}
    return Chunk(cid, text, source=source, title=title, doc_id=source, metadata=meta)


def qlr_chunks() -> list[Chunk]:
    """acme's page defines QLR (with a secret token); globex's pages and an untenanted page do not."""
    return [
        _chunk(
            "acme-relay",
            "The QLR (quantum lattice relay) forwards rack telemetry. Its pairing token is ACME-QLR-7731.",
            "acme",
            "Telemetry relay",
        ),
        _chunk("acme-billing", "Acme invoices are paid by card at the start of each month.", "acme", "Billing"),
        _chunk("globex-billing", "Globex invoices are paid by wire within thirty days.", "globex", "Billing"),
        _chunk("globex-dash", "The Globex dashboard shows usage per project and per month.", "globex", "Dashboard"),
        _chunk("shared-status", "The status page lists incidents and planned maintenance.", None, "Status"),
    ]


def qlr_rag(**kwargs: Any) -> ChatRAG:
    return ChatRAG.from_index(KnowledgeIndex.build(qlr_chunks(), HashEmbedder(128)), **kwargs)


def traces(text: str) -> list[str]:
    """The acme-only words found in ``text`` (case-insensitive)."""
    low = text.lower()
    return [w for w in ACME_ONLY if w.lower() in low]


def everything(reply_: Reply) -> str:
    """Every part of a reply a caller or its logs can see, as one text."""
    return json.dumps([reply_.as_dict(), reply_.client_dict(), [b.text for b in reply_.blocks]])


class TestLocalIndex:
    async def test_globex_learns_nothing_of_acmes_abbreviation(self, tmp_path: Path) -> None:
        """globex's turn (ask and stream) has no trace of acme's definition: not in the reply, citations,
        outcome, ``missing``, the decision record, its rewrites or the turn-log row (before: ``missing`` was
        ``['What does QLR (quantum lattice relay) stand for']``)."""
        log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
        rag = qlr_rag()
        rag.turn_log = log
        asked = await rag.ask(QUESTION, filters={"tenant": "globex"}, principal="globex-user")
        streamed = None
        async for event in rag.stream(QUESTION, filters={"tenant": "globex"}, principal="globex-user"):
            streamed = getattr(event, "reply", streamed)
        assert streamed is not None
        await log.flush()
        for got in (asked, streamed):
            assert traces(everything(got)) == [], everything(got)
            assert got.outcome == "none" and not got.citations
            assert all("QLR" in m for m in got.missing)
            assert not any("quantum" in q.text for q in got.record.queries)
        rows = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
        assert len(rows) == 2
        for row in rows:
            assert traces(repr(row)) == [], repr(row)
        await rag.aclose()

    async def test_acme_still_gets_its_own_expansion(self) -> None:
        """The tenant whose page defines QLR still has it expanded in its queries."""
        rag = qlr_rag()
        got = await rag.ask(QUESTION, filters={"tenant": "acme"})
        assert any("quantum lattice relay" in q.text for q in got.record.queries), got.record.queries

    async def test_a_scope_that_finds_nothing_knows_nothing(self) -> None:
        """A tenant with no pages yet gets an honest "not found", built from an empty corpus, with no trace of
        anyone else's pages (and its first turn does not fail on the empty statistics)."""
        rag = qlr_rag()
        got = await rag.ask(QUESTION, filters={"tenant": "initech"})
        assert got.outcome == "none" and not got.citations and not got.record.errors
        assert traces(everything(got)) == [], everything(got)

    async def test_untenanted_pages_stay_visible_to_an_unfiltered_caller(self) -> None:
        """A caller without filters reads every page, untenanted ones included, with the whole corpus's
        statistics, as before; a tenant reads its own pages only."""
        rag = qlr_rag()
        everyone = await rag.ask("What does the status page list?")
        assert {c.source for c in everyone.citations} == {"shared/shared-status.md"}
        globex = await rag.ask("What does the Globex dashboard show?", filters={"tenant": "globex"})
        assert {c.source for c in globex.citations} == {"globex/globex-dash.md"}

    async def test_a_filtered_search_scores_as_in_an_index_of_its_own(self) -> None:
        """globex's BM25 scores and confidences are those of an index holding globex's pages alone (before:
        acme's pages moved globex's IDF, so its scores told acme's word counts)."""
        shared = KnowledgeIndex.build(qlr_chunks(), HashEmbedder(128))
        alone = KnowledgeIndex.build([c for c in qlr_chunks() if c.meta().get("tenant") == "globex"], HashEmbedder(128))
        for mode in ("bm25", "hybrid"):
            a = await shared.search("invoices paid wire", mode=mode, filters={"tenant": ("globex",)})
            b = await alone.search("invoices paid wire", mode=mode, filters={"tenant": ("globex",)})
            assert [(h.chunk.id, h.score, h.confidence, h.scores) for h in a] == [
                (h.chunk.id, h.score, h.confidence, h.scores) for h in b
            ]


def _ask(question: str) -> dict[str, Any]:
    return {"model": "ragloop", "messages": [{"role": "user", "content": question}]}


class TestServer:
    async def test_no_endpoint_tells_globex_what_qlr_stands_for(self) -> None:
        """Two keys, two tenants, a real uvicorn: the globex key's answers on /v1/chat/completions (plain and
        streamed), /v1/responses and /api/chat hold no acme-only word; the acme key's turn does expand QLR."""
        app = create_app(qlr_rag(), settings=ServeSettings(keys=(ACME, GLOBEX)))
        globex = {"authorization": f"Bearer {GLOBEX.key}"}
        with serving(app) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                bodies = []
                r = await client.post("/v1/chat/completions", headers=globex, json=_ask(QUESTION))
                assert r.status_code == 200, r.text
                bodies.append(r.text)
                r = await client.post("/v1/chat/completions", headers=globex, json={**_ask(QUESTION), "stream": True})
                bodies.append(r.text)
                r = await client.post("/v1/responses", headers=globex, json={"model": "ragloop", "input": QUESTION})
                assert r.status_code == 200, r.text
                bodies.append(r.text)
                r = await client.post("/api/chat", headers=globex, json={"message": QUESTION})
                assert r.status_code == 200 and sse_events(r.text), r.text
                bodies.append(r.text)
                for body in bodies:
                    assert traces(body) == [], body
                acme = {"authorization": f"Bearer {ACME.key}"}
                r = await client.post("/api/chat", headers=acme, json={"message": "What is the relay pairing token?"})
                assert r.status_code == 200 and "ACME-QLR-7731" in r.text, r.text  # acme reads its own page

    async def test_mcp_tells_globex_nothing_of_qlr(self) -> None:
        """Over /mcp (the SDK's streamable-HTTP client, the globex key), ``ask`` and ``search`` hold no acme-only
        word (before: ``ask``'s ``missing`` carried acme's expansion)."""
        pytest.importorskip("mcp")
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        from ragloop.serve import IndexDocuments

        index = KnowledgeIndex.build(qlr_chunks(), HashEmbedder(128))
        app = create_app(
            ChatRAG.from_index(index), settings=ServeSettings(keys=(ACME, GLOBEX)), documents=IndexDocuments(index)
        )
        with serving(app, lifespan="on") as url:
            headers = {"authorization": f"Bearer {GLOBEX.key}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(url + "/mcp", http_client=http)) as mcp,
            ):
                asked = await mcp.call_tool("ask", {"question": QUESTION})
                found = await mcp.call_tool("search", {"query": QUESTION})
        for result in (asked, found):
            text = json.dumps([result.structured_content, [getattr(c, "text", "") for c in result.content]])
            assert traces(text) == [], text


class TestPostgresStore:
    async def test_globex_learns_nothing_of_acmes_abbreviation_on_the_store(
        self, tmp_path: Path, pg_url: str, collection: str
    ) -> None:
        """A real PostgreSQL holding both tenants (``ragloop index --store … --meta tenant=…`` per folder): the
        globex turn over ``ChatRAG.from_store`` has no trace of acme's definition, and acme's has it."""
        from ragloop.cli import main

        for tenant in ("acme", "globex"):
            folder = tmp_path / tenant
            folder.mkdir()
            for c in qlr_chunks():
                if c.meta().get("tenant") == tenant:
                    (folder / f"{c.id}.md").write_text(f"# {c.title}\n\n{c.text}\n", encoding="utf-8")
            command = ["index", str(folder), "--store", pg_url, "--collection", collection, "--embedder", "hash"]
            argv = [*command, "--meta", f"tenant={tenant}"]
            assert await anyio.to_thread.run_sync(main, argv) == 0
        rag = await anyio.to_thread.run_sync(lambda: ChatRAG.from_store(pg_url, collection=collection))
        try:
            globex = await rag.ask(QUESTION, filters={"tenant": "globex"})
            assert traces(everything(globex)) == [], everything(globex)
            assert globex.outcome == "none" and all("QLR" in m for m in globex.missing)
            acme = await rag.ask(QUESTION, filters={"tenant": "acme"})
            assert any("quantum lattice relay" in q.text for q in acme.record.queries), acme.record.queries
        finally:
            await rag.aclose()


# --- the property ------------------------------------------------------------------------------------------

_WORDS_A = ("zircon", "quasar", "marlin", "tundra", "saffron", "obelisk", "pylon", "cobalt")
_WORDS_B = ("harbor", "velvet", "meadow", "lantern", "granite", "willow", "ember", "falcon")
_SHARED = ("invoice", "dashboard", "export", "billing", "account", "report", "setup", "plan")


def _pages(prefix: str, words: Sequence[str], draw: st.DrawFn) -> list[tuple[str, str]]:
    n = draw(st.integers(1, 4))
    pages = []
    for i in range(n):
        body = draw(st.lists(st.sampled_from((*words, *_SHARED)), min_size=4, max_size=12))
        if draw(st.booleans()):  # a definition "Long Form (LF)" the glossary mines
            a, b, c = draw(st.permutations(words))[:3]
            body += [f"{a} {b} {c} ({(a[0] + b[0] + c[0]).upper()})"]
        text = " ".join(body)
        pages.append((f"{prefix}{i}", text[:1].upper() + text[1:] + "."))
    return pages


@st.composite
def two_tenants(draw: st.DrawFn) -> tuple[list[Chunk], list[Chunk], str]:
    """Tenant A's pages, tenant B's pages (words of their own plus shared ones) and a question B asks, which
    may name A's words and abbreviations (a hostile B)."""
    a = [_chunk(cid, text, "a", cid) for cid, text in _pages("a", _WORDS_A, draw)]
    b = [_chunk(cid, text, "b", cid) for cid, text in _pages("b", _WORDS_B, draw)]
    acronyms_a = [w[:3].upper() for w in _WORDS_A]
    words = draw(st.lists(st.sampled_from((*_WORDS_A, *_WORDS_B, *_SHARED, *acronyms_a)), min_size=1, max_size=4))
    opener = draw(st.sampled_from(("What is", "How do I", "What does", "Tell me about")))
    return a, b, f"{opener} {' '.join(words)}?"


def _normal(got: Reply) -> Any:
    """A reply without what differs from run to run (ids, timings)."""
    record = got.record.as_dict()
    for key in ("run_id", "timings", "seconds"):
        record.pop(key, None)
    for call in record.get("calls", []):
        call.pop("seconds", None)
    return got.text, got.outcome, [c.as_dict(None) for c in got.citations], got.missing, record


def _offline_reply(chunks: list[Chunk], question: str) -> Any:
    rag = ChatRAG.from_index(KnowledgeIndex.build(chunks, HashEmbedder(64)))
    return _normal(anyio.run(lambda: rag.ask(question, filters={"tenant": "b"})))


class TestTenantProperty:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(two_tenants())
    def test_bs_turn_is_the_same_with_or_without_as_documents(
        self, tenants: tuple[list[Chunk], list[Chunk], str]
    ) -> None:
        """For the offline judges, B's reply, citations, outcome, ``missing`` and decision record do not
        depend on whether A's documents are in the index."""
        a, b, question = tenants
        assert _offline_reply([*a, *b], question) == _offline_reply(b, question)

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(two_tenants())
    def test_no_a_only_term_reaches_a_model_request_for_b(self, tenants: tuple[list[Chunk], list[Chunk], str]) -> None:
        """With model judges (the scripted server records every request), no word only A's pages hold — its
        words, its abbreviations' expansions — is in any request sent for B's turn, unless B's question
        says it itself."""
        a, b, question = tenants
        sent = anyio.run(_model_requests, [*a, *b], question)
        b_text = " ".join(c.text for c in b).lower() + " " + question.lower()
        a_only = {w for w in _WORDS_A if w not in b_text}
        leaked = {w for w in a_only for body in sent if w in body.lower()}
        assert not leaked, (leaked, sent)


def _model(request: RecordedRequest) -> ScriptedResponse:
    judge = request.judge
    if judge == "decide":
        from ragloop.testing import tool_calls

        question = str(request.messages[-1]["content"])
        return tool_calls([("search", {"query": question})])
    if judge == "grade":
        return verdicts(request, "relevant")
    if judge == "rewrite":
        return reply("another angle")
    return stream("From the docs [1].", chunk_size=6)


async def _model_requests(chunks: list[Chunk], question: str) -> list[str]:
    index = KnowledgeIndex.build(chunks, HashEmbedder(64))
    async with ScriptedOpenAIServer(matcher=_model) as server, server.client(max_retries=0) as client:
        rag = ChatRAG.from_index(index, client, fast_model="fast", answer_model="answer")
        await rag.ask(question, filters={"tenant": "b"})
        return [json.dumps(r.body) for r in server.chat_requests]
