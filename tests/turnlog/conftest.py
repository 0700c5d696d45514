"""Real turns for the turn log's tests: the offline chat over the sample knowledge base (hash embedder, built once)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ragloop.chat import ChatRAG
from ragloop.state import Caller
from ragloop.turn import turn_record
from ragloop.turnlog import PendingTurn, pending_turn

_ids = itertools.count()

#: A question the hash-embedder chat answers from the documents, with citations (its key terms: :data:`TERMS`).
#: Not "How do I rotate an API key?": under the hash embedder that one's answering section ranks outside the
#: graded hits and the reply is an honest none (MiniLM, the default embedder, answers it).
ANSWERED = "How many times does Lumen retry a failed webhook delivery?"
TERMS = ("many", "times", "lumen", "retry", "failed", "webhook", "delivery")


@pytest.fixture(scope="session")
def hash_rag() -> ChatRAG:
    """The offline chat over the sample knowledge base, indexed with the hash embedder (no model, a fraction of a
    second to build)."""
    from ragloop.retrievers.embed import HashEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path
    from ragloop.sample import sample_kb_path

    index = KnowledgeIndex.build(ingest_path(sample_kb_path()).chunks, HashEmbedder())
    return ChatRAG.from_index(index)


async def run_turn(
    rag: ChatRAG, question: str, *, principal: str = "anonymous", caller: Caller | None = None, at: float | None = None
) -> PendingTurn:
    """One real turn of ``rag``, as the turn log receives it."""
    result = await rag.graph.run(rag.new_state(question, caller=caller))
    state: Any = result.state
    return pending_turn(
        turn_id=f"t{next(_ids):06d}-{result.run_id}",
        question=state.question,
        record=turn_record(result),
        citations=state.citations,
        graded=state.graded,
        searches=state.searches,
        stale=state.stale,
        principal=principal,
        caller=state.caller,
        at=at,
    )
