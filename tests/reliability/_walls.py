"""Shared pieces of the issue-20 wall suites: a two-tenant corpus, keys for its principals, a chat over it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import attrs

from ragloop.chat import ChatRAG
from ragloop.llm.offline import OfflineAnswerer, OfflineGrader, OfflineRewriter
from ragloop.plan import Plan, SubQuery
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.live import LiveSource
from ragloop.retrievers.sources import DocumentSource
from ragloop.serve import ApiKey
from ragloop.state import Chunk, Message
from ragloop.testing import FakeDecider
from ragloop.text.terms import CorpusStats
from tests.reliability._support import small_chunks

__all__ = [
    "ALICE",
    "BOB",
    "CAROL",
    "KEYS",
    "SECRETS",
    "DocumentsPlanner",
    "bearer",
    "tenant_chunks",
    "tenant_index",
    "tenant_rag",
]

#: Each tenant's pages: (tenant, product, file, title, text with a marker no other tenant's page has).
_PAGES = (
    ("acme", "integrations", "webhooks.md", "Webhook signing", "The webhook signing secret prefix is ACME-7731."),
    ("acme", "billing", "invoices.md", "Invoice payments", "Invoices are paid by wire to account ACME-IBAN-5520."),
    ("globex", "integrations", "webhooks.md", "Webhook signing", "The webhook signing secret prefix is GLOBEX-4412."),
    ("globex", "billing", "invoices.md", "Invoice payments", "Invoices are paid by wire to account GLOBEX-IBAN-9031."),
)
#: Tenant → the markers only its pages hold.
SECRETS = {"acme": ("ACME-7731", "ACME-IBAN-5520"), "globex": ("GLOBEX-4412", "GLOBEX-IBAN-9031")}

ALICE = ApiKey("alice", key="alice-key-7f3a9c2e41d8", tenant="acme")
BOB = ApiKey("bob", key="bob-key-0b6e5d4c3a21", tenant="globex")
CAROL = ApiKey("carol", key="carol-key-93ab1c7d5e02", tenant="acme", filters={"product": "billing"})
KEYS = (ALICE, BOB, CAROL)


def bearer(key: ApiKey) -> dict[str, str]:
    """The ``Authorization`` header of ``key``."""
    assert key.key is not None
    return {"authorization": f"Bearer {key.key}"}


def tenant_chunks() -> list[Chunk]:
    """The tenants' pages, with ``tenant`` and ``product`` metadata."""
    out = []
    for tenant, product, name, title, text in _PAGES:
        source = f"{tenant}/{name}"
        cid = hashlib.sha256(source.encode()).hexdigest()[:16]
        out.append(
            Chunk(cid, text, source=source, title=title, doc_id=source, metadata={"tenant": tenant, "product": product})
        )
    return out


def tenant_index(extra: Sequence[Chunk] = ()) -> KnowledgeIndex:
    """A hash-embedded index of the shared topic pages, the tenants' pages and ``extra``."""
    return KnowledgeIndex.build([*small_chunks(), *tenant_chunks(), *extra], HashEmbedder(256))


@attrs.define
class DocumentsPlanner:
    """A planner that plans every question as one document search (so the turn takes the plan path)."""

    name: str = "documents-only"
    calls: int = 0

    async def plan(self, question: str, history: Sequence[Message]) -> Plan | None:
        """One ``documents`` sub-query: the question as asked."""
        self.calls += 1
        return Plan((SubQuery("d1", "documents", question),), intent="look it up")


def tenant_rag(
    index: KnowledgeIndex | None = None,
    *,
    decider: FakeDecider | None = None,
    live_sources: Sequence[LiveSource] = (),
    plan: bool = False,
    **kwargs: Any,
) -> ChatRAG:
    """A chat over :func:`tenant_index`: the decider searches the question as asked (recording each turn's
    history); grading, rewriting and answering are the offline judges. ``plan`` starts every turn with a plan
    node whose one source is the document search."""
    idx = index if index is not None else tenant_index()
    texts = [c.text for c in idx.chunks]
    stats = CorpusStats.from_texts(texts)
    retriever = idx.retriever("hybrid")
    extra: dict[str, Any] = {}
    if plan:
        extra = {"planner": DocumentsPlanner(), "plan_sources": {"documents": DocumentSource(retriever)}}
    return ChatRAG(
        retriever=retriever,
        decider=decider or FakeDecider(),
        grader=OfflineGrader.calibrate(stats, texts),
        rewriter=OfflineRewriter(stats),
        answerer=OfflineAnswerer(stats),
        live_sources=live_sources,
        **extra,
        **kwargs,
    )
