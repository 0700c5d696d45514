"""A user's own 24-page knowledge base, asked in the user's words: answered by meaning, and still honest.

``fixtures/tasker_kb`` is the manual of a made-up command-line tool, one short page per topic. Twenty-four
pages are too many for the small-knowledge-base rules (the grader calibrates on them) and too few for IDF to
weigh a paraphrase: before the corpus measured its own dense threshold (:mod:`ragloop.retrievers.meaning`),
every question below that does not repeat its page's words was refused. Now a passage the question's own search
finds closer than nine uncovered topics in ten come to anything in this corpus is evidence, and the questions
the manual does not answer are still refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.chat import ChatRAG, Reply
from ragloop.retrievers.embed import MiniLMEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path

pytestmark = pytest.mark.anyio

KB = Path(__file__).parent / "fixtures" / "tasker_kb"

#: Questions in a user's words, none repeating its page's key words, and the page that answers each.
PARAPHRASES = {
    "How can I make several jobs go at once?": "parallel.md",
    "What does it mean when the program finishes with status 2?": "exit.md",
    "Can I be pinged on Slack when it's done?": "notify.md",
    "Does tasker phone home or collect data about me?": "telemetry.md",
}
#: Questions the manual does not answer: some near its topics (versions of a step, a licence's price).
OUTSIDE = (
    "How do I share my screen during a video call?",
    "Can tasker deploy my app to Kubernetes?",
    "How do I roll back a step to the result it had last week?",
    "Is there a graphical user interface?",
    "How much does a commercial licence cost?",
)


def assert_answered_from(reply: Reply, page: str) -> None:
    """The reply answers (``context`` or ``partial``, not abstained) and cites ``page`` first."""
    assert reply.outcome in ("context", "partial"), reply.text
    assert reply.citations and Path(reply.citations[0].source).name == page
    assert reply.record.abstention is None


@pytest.fixture(scope="module")
def tasker_index() -> KnowledgeIndex:
    return KnowledgeIndex.build(ingest_path(KB).chunks, MiniLMEmbedder())


class TestMeaningOnAUsersKnowledgeBase:
    def test_the_corpus_measures_its_scale(self, tasker_index: KnowledgeIndex) -> None:
        """48 headings (titles and sections, one document each) measure a threshold within its bounds."""
        scales = tasker_index.meaning_scales()
        assert scales is not None
        scale = scales(None)
        assert scale is not None and scale.questions == 48
        assert 0.40 <= scale.threshold < 0.55

    @pytest.mark.parametrize(("question", "page"), sorted(PARAPHRASES.items()))
    async def test_a_paraphrase_is_answered_from_its_page(
        self, tasker_index: KnowledgeIndex, question: str, page: str
    ) -> None:
        """A question that shares no key word with its page is answered, and its first citation is that page
        (each of these was refused before the scale)."""
        rag = ChatRAG.from_index(tasker_index)
        try:
            reply = await rag.ask(question)
        finally:
            await rag.aclose()
        assert_answered_from(reply, page)

    @pytest.mark.parametrize("question", OUTSIDE)
    async def test_a_question_the_manual_does_not_answer_is_refused(
        self, tasker_index: KnowledgeIndex, question: str
    ) -> None:
        """Nothing is quoted for a question the manual does not answer, however near its topic."""
        rag = ChatRAG.from_index(tasker_index)
        try:
            reply = await rag.ask(question)
        finally:
            await rag.aclose()
        assert reply.outcome == "none", reply.text
        assert not reply.citations

    async def test_a_reply_does_not_depend_on_the_turns_before_it(self, tasker_index: KnowledgeIndex) -> None:
        """The answerer keeps the sentence vectors it embedded; the same question gets the same reply on a fresh
        chat and on one that answered every other question first (real MiniLM: a small embedding call takes
        another path than a large one, so what is embedded together must not depend on the past)."""
        question = "How can I make several jobs go at once?"
        fresh = ChatRAG.from_index(tasker_index)
        used = ChatRAG.from_index(tasker_index)
        try:
            for other in [*PARAPHRASES, *OUTSIDE]:
                if other != question:
                    await used.ask(other)
            assert (await used.ask(question)).text == (await fresh.ask(question)).text
        finally:
            await fresh.aclose()
            await used.aclose()
