"""nodes._citations: markers are checked and numbered before they stream, and the stream agrees with the final
text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.nodes._citations import CitationGate, Numbering
from ragloop.nodes.answer import resolve_citations
from ragloop.state import ContextBlock
from ragloop.text.citations import MARKER, MARKER_RUN

BLOCKS = tuple(ContextBlock(n, f"block {n}", f"s{n}.md") for n in (1, 2, 3))


def gated(pieces: list[str]) -> str:
    gate = CitationGate(b.n for b in BLOCKS)
    return "".join(gate.feed(p) for p in pieces) + gate.flush()


class TestCitationGate:
    def test_unknown_marker_split_across_tokens_never_shows(self) -> None:
        """``[4`` + ``2]`` is held, then dropped; ``[1, 9]`` keeps 1."""
        gate = CitationGate([1, 2])
        assert gate.feed("Yes [") == "Yes " and gate.feed("4") == "" and gate.feed("2] and [1, 9].") == " and [1]."
        assert gate.dropped == [42, 9]

    def test_code_brackets_are_text(self) -> None:
        """``arr[0]``, ``pair[1]``, ``matrix[1][2]`` and ``f(x)[3]`` stream as written."""
        text = "Use arr[0], sort(key=lambda pair: pair[1]), matrix[1][2] and f(x)[3] [2]."
        assert gated([text]) == text

    def test_giant_number_is_text(self) -> None:
        """``[`` + 5,000 digits + ``]`` streams as text and never raises."""
        text = "x [" + "9" * 5000 + "] y"
        assert gated([text[i : i + 7] for i in range(0, len(text), 7)]) == text

    @given(
        st.lists(
            st.sampled_from(["[", "]", "1", "2", "9", "42", ",", " ", "a", "(", ")", ".", "[1]", "[4]", "[2, 7]"]),
            max_size=30,
        ),
        st.lists(st.integers(1, 6), max_size=30),
    )
    def test_stream_agrees_with_final_resolution(self, parts: list[str], cuts: list[int]) -> None:
        """Whatever the text and however it is split into tokens, what streams is what the reply resolves to."""
        text = "".join(parts)
        pieces, i = [], 0
        for c in cuts:
            pieces.append(text[i : i + c])
            i += c
        pieces.append(text[i:])
        assert gated(pieces) == resolve_citations(text, BLOCKS)[0]


#: Blocks of three pages: 1, 3 and 4 are sections of one page (``a.md``), 2 and 5 pages of their own.
PAGED = (
    ContextBlock(1, "alpha one", "a.md", "A", "a1", url="a#one", section="One"),
    ContextBlock(2, "beta", "b.md", "B", "b1", url="b"),
    ContextBlock(3, "alpha two", "a.md", "A", "a2", url="a#two", section="Two"),
    ContextBlock(4, "alpha three", "a.md", "A", "a3", url="a#three", section="Three"),
    ContextBlock(5, "gamma", "c.md", "C", "c1", url="c"),
)


def numbered(pieces: list[str], cited: list[int] | None = None) -> tuple[str, Numbering]:
    """What streams when ``pieces`` pass a numbering gate over :data:`PAGED`, and the numbering."""
    numbering = Numbering(PAGED, [] if cited is None else cited)
    gate = CitationGate((b.n for b in PAGED), numbering)
    return "".join(gate.feed(p) for p in pieces) + gate.flush(), numbering


class TestNumbering:
    def test_one_number_per_page_in_order_of_first_citation(self) -> None:
        """The answerer's block numbers become the client's: ``[3]`` (page a) is 1, ``[2]`` (page b) is 2, a
        run naming one page twice shows it once, and a later block of page a shares its number."""
        text, numbering = numbered(["Rotate [3]. Deploy [2]. Revoke [1][3] and [4, 5]. Keys [9]."])
        assert text == "Rotate [1]. Deploy [2]. Revoke [1] and [1][3]. Keys ."
        assert [(p.n, p.source) for p in numbering.pages()] == [(1, "a.md"), (2, "b.md"), (3, "c.md")]
        assert [s.title for s in numbering.sections(1)] == ["Two", "One", "Three"]
        assert [s.url for s in numbering.sections(1)] == ["a#two", "a#one", "a#three"]

    def test_a_marker_split_across_tokens_gets_its_number_when_it_closes(self) -> None:
        """``[`` + ``4`` + ``]`` streams nothing until it closes, then the page's number; the held piece never
        takes a number of its own."""
        numbering = Numbering(PAGED, [])
        gate = CitationGate((b.n for b in PAGED), numbering)
        assert gate.feed("First [5]. Then [") == "First [1]. Then "
        assert gate.feed("4") == "" and numbering.cited == [5]
        assert gate.feed("] done.") == "[2] done." and numbering.cited == [5, 4]

    def test_rebuilt_numbering_gives_the_same_numbers(self) -> None:
        """A numbering rebuilt from the cited list (as the answer node does after streaming) numbers alike."""
        cited: list[int] = []
        _, first = numbered(["x [4] y [5] z [2] w [1]"], cited)
        again = Numbering(PAGED, list(cited))
        assert again.pages() == first.pages() and cited == [4, 5, 2, 1]
        assert [again.number(n) for n in (1, 2, 3, 4, 5)] == [1, 3, 1, 1, 2]

    @given(
        st.lists(
            st.sampled_from(["[", "]", "1", "2", "3", "4", "5", "9", ",", " ", "a", ".", "[1]", "[3]", "[2, 4]"]),
            max_size=40,
        ),
        st.lists(st.integers(1, 6), max_size=40),
    )
    def test_client_numbers_run_1_to_n_each_page_once(self, parts: list[str], cuts: list[int]) -> None:
        """However the answerer cites and its tokens split: the numbers the client sees first appear in the
        order 1, 2, …, n without gaps, each number is one page and each page one number, and the final
        resolution of the streamed text gives exactly those citations, one per page."""
        text = "".join(parts)
        pieces, i = [], 0
        for c in cuts:
            pieces.append(text[i : i + c])
            i += c
        pieces.append(text[i:])
        shown, numbering = numbered(pieces)
        seen = [int(m.group(1)) for run in MARKER_RUN.finditer(shown) for m in MARKER.finditer(run.group())]
        firsts = list(dict.fromkeys(seen))
        assert firsts == list(range(1, len(firsts) + 1))
        pages = numbering.pages()
        assert [p.n for p in pages] == firsts
        assert len({p.source for p in pages}) == len(pages)
        _, citations, invalid = resolve_citations(shown, pages)
        assert [c.n for c in citations] == firsts and invalid == []
        assert {s.chunk_id for p in pages for s in numbering.sections(p.n)} == {
            b.chunk_id for b in PAGED if b.n in numbering.cited
        }
