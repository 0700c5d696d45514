"""A PDF's shape (ragloop.retrievers.ingest._pdf): paragraphs from lines, hyphenation, running heads, page
numbers, outline headings where they point, contents pages."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.retrievers.ingest import render
from ragloop.retrievers.ingest._blocks import Block
from ragloop.retrievers.ingest._loaders import pdf_blocks
from ragloop.retrievers.ingest._pdf import is_page_number, is_toc_page, join_lines, running_lines, shape_pages
from tests.reliability._hostile_docs import _text_ops, pdf_with_content

PAGE_1 = [
    "ACME Admin Guide",
    "Installing the agent",
    "The installer needs administrator rights for the man-",
    "agement service on the host and a stable and working",
    "network connection.",
    "Restart the host after the installer ends, then log in.",
    "- copy the key",
    "- run the installer",
    "1",
]
PAGE_2 = [
    "ACME Admin Guide",
    "2.1 Upgrades The agent upgrades itself once a day when the",
    "server has a newer version.",
    "2",
]
PAGE_3 = ["ACME Admin Guide", "Rolling back is manual: reinstall the previous package and restart it.", "3"]


class TestPieces:
    @pytest.mark.parametrize("line", ["12", "Page 3", "3 of 9", "page 4 / 10", "xiv", " 7 "])
    def test_page_numbers(self, line: str) -> None:
        """A line that is only a page number, in the usual forms."""
        assert is_page_number(line)

    @pytest.mark.parametrize("line", ["12 apples", "Version 3", "mix", "Section 2"])
    def test_not_page_numbers(self, line: str) -> None:
        """Words with a number are text."""
        assert not is_page_number(line)

    def test_a_contents_page_is_mostly_dot_leaders(self) -> None:
        """Five lines or more, most ending in dot leaders and a page number."""
        toc = ["Contents", "1 Introduction . . . . . . 1", "2 Setup ........ 3", "2.1 Keys ....... 4", "3 Use ..... 9"]
        assert is_toc_page(toc)
        assert not is_toc_page(["Intro", "We ship it.", "See page 3.", "More text here.", "And the end."])

    def test_hyphenation_joined_and_paragraphs_from_line_widths(self) -> None:
        """A hyphen at a line's end before a lower-case word joins it; a short line ending a sentence ends the
        paragraph; a list item starts its own."""
        assert join_lines(PAGE_1[1:8]) == [
            "Installing the agent",
            "The installer needs administrator rights for the management service on the host and a stable and "
            "working network connection.",
            "Restart the host after the installer ends, then log in.",
            "- copy the key",
            "- run the installer",
        ]

    def test_a_hyphen_before_a_capital_stays(self) -> None:
        """``Jean-`` before ``Paul`` is a compound across the line, not a hyphenated word."""
        assert join_lines(["The author was Jean-", "Paul Sartre in that long line of text."]) == [
            "The author was Jean- Paul Sartre in that long line of text."
        ]

    def test_running_heads_need_three_pages(self) -> None:
        """A line repeated at the top of half the pages is a running head; in two pages, nothing is."""
        assert running_lines([PAGE_1, PAGE_2, PAGE_3]) >= {"acme admin guide"}
        assert running_lines([PAGE_1, PAGE_2]) == set()

    @given(st.lists(st.text(st.characters(codec="ascii", categories=["L", "N", "P", "Zs"]), max_size=40), max_size=12))
    def test_joining_loses_no_word(self, lines: list[str]) -> None:
        """Joining lines keeps every word (a hyphenated pair becomes one word) in order."""
        joined = " ".join(join_lines(lines)).split()
        words = " ".join(" ".join(line.split()) for line in lines).split()
        assert "".join(joined).replace("-", "") == "".join(words).replace("-", "")


class TestShape:
    def test_pages_keep_their_shape(self) -> None:
        """Three pages: the running head and page numbers go, paragraphs and list items stay apart, the
        outline's headings stand where their titles are on the page (a numbered title run into its text
        included), each text block with its page."""
        headings = {
            1: [Block("heading", "Installing the agent", level=1, page=1)],
            2: [Block("heading", "Upgrades", level=2, page=2)],
            3: [Block("heading", "Rolling back", level=2, page=3)],
        }
        blocks = shape_pages(["\n".join(PAGE_1), "\n".join(PAGE_2), "\n".join(PAGE_3)], headings)
        assert render(blocks) == (
            "# Installing the agent\n\n"
            "The installer needs administrator rights for the management service on the host and a stable and "
            "working network connection.\n\n"
            "Restart the host after the installer ends, then log in.\n\n"
            "- copy the key\n\n"
            "- run the installer\n\n"
            "## Upgrades\n\n"
            "The agent upgrades itself once a day when the server has a newer version.\n\n"
            "## Rolling back\n\n"
            "Rolling back is manual: reinstall the previous package and restart it."
        )
        assert [b.page for b in blocks if b.kind == "text"] == [1, 1, 1, 1, 2, 3]

    def test_two_sections_on_one_page_each_get_their_text(self) -> None:
        """Two outline entries on one page split its text where each title is (not both at the page start)."""
        page = "Keys\nKeys rotate yearly.\nTokens\nTokens expire after an hour."
        headings = {1: [Block("heading", "Keys", level=2, page=1), Block("heading", "Tokens", level=2, page=1)]}
        assert render(shape_pages([page], headings)) == (
            "## Keys\n\nKeys rotate yearly.\n\n## Tokens\n\nTokens expire after an hour."
        )

    def test_a_contents_page_is_not_text(self) -> None:
        """A table-of-contents page adds no text (its outline headings still stand)."""
        toc = "Contents\n1 Intro ....... 1\n2 Setup ....... 2\n3 Use ....... 3\n4 Limits ....... 5\n"
        assert render(shape_pages([toc, "Intro\nWe ship it."], {})) == "Intro\n\nWe ship it."


class TestPdfFile:
    def test_a_generated_pdf_reads_with_its_shape(self, tmp_path: Path) -> None:
        """Through pypdf: a three-page PDF with a running head and page numbers, a hyphenated word and a contents
        page reads as paragraphs, without the head, the numbers or the contents."""
        toc = ["Contents", "1 Install ....... 2", "2 Upgrade ....... 3", "3 Roll back ....... 3", "4 Index ....... 4"]
        data = pdf_with_content([_text_ops(toc), _text_ops(PAGE_1), _text_ops(PAGE_2), _text_ops(PAGE_3)])
        _, blocks = pdf_blocks(data)
        text = render(blocks)
        assert "the management service" in text and "ACME Admin Guide" not in text and "...." not in text
        assert "\n\n1\n\n" not in text and not text.endswith("3")
        assert text.startswith("Installing the agent\n\nThe installer needs administrator rights for the management")
