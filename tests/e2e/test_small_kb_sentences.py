"""A user's four-page knowledge base, asked in a customer's words: the one sentence that answers counts.

``fixtures/climbing_kb`` holds four one-paragraph pages of a made-up climbing gym. On a knowledge base this small
the grader keeps a passage one of whose *sentences* means the question (:attr:`OfflineGrader.small_meaning_at
<ragloop.llm.offline.grade.OfflineGrader.small_meaning_at>`), but the abstention used to weigh only the whole
passage's cosine, which the page's other sentences dilute: "My daughter is 11, can she climb alone?" is far from
the memberships page and close to its "Climbers under 14 must be supervised by an adult", and was refused. Now
the abstention weighs the sentences too (:meth:`OfflineAnswerer.weigh
<ragloop.llm.offline.answer.OfflineAnswerer.weigh>`), and the questions the pages do not answer are still refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.chat import ChatRAG, Reply
from ragloop.retrievers.embed import MiniLMEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path

pytestmark = pytest.mark.anyio

KB = Path(__file__).parent / "fixtures" / "climbing_kb"
#: Things a climbing gym could offer that these pages never mention.
OUTSIDE = (
    "Is there a sauna?",
    "Can I bring my dog?",
    "Do you have a cafe?",
    "Is there parking?",
    "Do you offer yoga classes?",
)


@pytest.fixture(scope="module")
def climbing_index() -> KnowledgeIndex:
    return KnowledgeIndex.build(ingest_path(KB).chunks, MiniLMEmbedder())


async def _ask(index: KnowledgeIndex, question: str) -> Reply:
    rag = ChatRAG.from_index(index)
    try:
        return await rag.ask(question)
    finally:
        await rag.aclose()


class TestTheSentenceThatAnswers:
    async def test_a_question_one_sentence_means_is_answered_by_it(self, climbing_index: KnowledgeIndex) -> None:
        """The memberships page as a whole is far from the question; its one sentence about children is close:
        the reply leads with that sentence and cites the page (refused before the abstention weighed it)."""
        reply = await _ask(climbing_index, "My daughter is 11, can she climb alone?")
        assert reply.outcome in ("context", "partial"), reply.text
        assert reply.text.startswith("Climbers under 14 must be supervised by an adult")
        assert Path(reply.citations[0].source).name == "memberships.md"
        assert reply.record.abstention is None

    @pytest.mark.parametrize("question", OUTSIDE)
    async def test_a_question_the_pages_do_not_answer_is_still_refused(
        self, climbing_index: KnowledgeIndex, question: str
    ) -> None:
        """No sentence of these pages means these questions: nothing is quoted."""
        reply = await _ask(climbing_index, question)
        assert reply.outcome == "none", reply.text
        assert not reply.citations
