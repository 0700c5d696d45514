"""Issue #33 (d): a changelog does not outrank the page that explains what the question asks about."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.llm.offline.answer import OfflineAnswerer
from ragloop.llm.offline.answer._pages import CHANGELOG_WEIGHT, asks_about_changes, is_changelog, page_weight
from ragloop.state import ContextBlock
from ragloop.text.terms import CorpusStats

NOTES = ContextBlock(
    1,
    "## 0.95.0\n\n- Background tasks now run after the response is sent, so use Celery for heavy background "
    "work instead of background tasks.",
    title="Release Notes",
    source="docs/en/docs/release-notes.md",
)
GUIDE = ContextBlock(
    2,
    "If you need to perform heavy background computation you might benefit from using bigger tools like Celery "
    "instead of background tasks. Background tasks suit small work such as sending an email notification.",
    title="Background Tasks",
    source="docs/en/docs/tutorial/background-tasks.md",
)
STATS = CorpusStats.from_texts([NOTES.text, GUIDE.text, "Dependencies are declared with Depends.", "CORS."])


class TestPageKind:
    @pytest.mark.parametrize(
        "block",
        [
            NOTES,
            ContextBlock(1, "x", title="What’s New In Python 3.12"),
            ContextBlock(1, "x", title="Changes", url="https://example.com/CHANGELOG.md#v2"),
            ContextBlock(1, "x", title="News", source="whatsnew/3.12.html"),
        ],
    )
    def test_a_changelog_is_known_by_its_title_or_path(self, block: ContextBlock) -> None:
        """Release notes, What's New, a CHANGELOG file: changelogs, by title, address or source."""
        assert is_changelog(block)

    @pytest.mark.parametrize(
        "block",
        [
            GUIDE,
            ContextBlock(1, "x", title="History, Design and Future", source="docs/history-design-future.md"),
            ContextBlock(1, "x", title="Newsletter settings", source="settings/newsletter.md"),
        ],
    )
    def test_other_pages_are_not(self, block: ContextBlock) -> None:
        """A guide, a history-of-the-project page or a newsletter page is no changelog."""
        assert not is_changelog(block)

    @pytest.mark.parametrize(
        "question",
        ["Which release added passkeys?", "What changed in 3.2?", "Since which version can I use it?",
         "Is X deprecated?", "When did passkeys ship?"],
    )  # fmt: skip
    def test_a_question_about_a_change_keeps_the_changelog(self, question: str) -> None:
        """A question about a version or a change weighs the changelog in full."""
        assert asks_about_changes(question)
        assert page_weight(NOTES, question) == 1.0

    def test_the_guide_leads_not_the_release_note(self) -> None:
        """ "When should I use Celery instead of background tasks?" leads with the guide's sentence, not the
        release note that says the same words in passing (failed before: the note led, as on the FastAPI set)."""
        question = "When should I use Celery instead of background tasks?"
        reply = OfflineAnswerer(STATS).compose(question, [NOTES, GUIDE], "context")
        assert reply.startswith("If you need to perform heavy background computation"), reply
        asked = OfflineAnswerer(STATS).compose("Which release changed background tasks?", [NOTES, GUIDE], "context")
        assert asked.startswith("0.95.0: Background tasks now run after the response"), asked

    @given(st.text(max_size=60), st.sampled_from([NOTES, GUIDE]))
    def test_the_weight_is_one_of_two_values(self, question: str, block: ContextBlock) -> None:
        """Property: a page weighs 1 or ``CHANGELOG_WEIGHT``, and only a changelog ever weighs less."""
        weight = page_weight(block, question)
        assert weight in (1.0, CHANGELOG_WEIGHT)
        assert weight == 1.0 or is_changelog(block)
