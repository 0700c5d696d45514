"""Tests for definitions (an HTML ``<dt>`` and its ``<dd>``: an API reference's signature and its description)
through the HTML loader (``_html``) and the chunker (``_chunk``): the term stays with the start of its
description, and a chunk that starts inside a description says the term first."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.retrievers.embed import minilm_tokenizer
from ragloop.retrievers.ingest import index_text, ingest_path, render
from ragloop.retrievers.ingest._blocks import Block
from ragloop.retrievers.ingest._chunk import Piece, chunk_blocks
from ragloop.retrievers.ingest._html import html_blocks
from ragloop.state import Chunk

TOKENS = minilm_tokenizer()
assert TOKENS is not None  # the [embed] extra is part of [test]
PYDOC = Path("/usr/share/doc/python3/html/library")

SIG = "hashlib.sha256(data=b'')"
#: A Sphinx (python3-doc) function entry: the signature in spans, a permalink, a description with code.
SPHINX = (
    '<div role="main"><h1>hashlib</h1><p>Secure hashes.</p>'
    '<dl class="py function"><dt class="sig sig-object py" id="hashlib.sha256">'
    '<span class="sig-prename descclassname"><span class="pre">hashlib.</span></span>'
    '<span class="sig-name descname"><span class="pre">sha256</span></span><span class="sig-paren">(</span>'
    '<em class="sig-param"><span class="n">data</span><span class="o">=</span><span class="default_value">'
    "b''</span></em><span class=\"sig-paren\">)</span>"
    '<a class="headerlink" href="#hashlib.sha256" title="Link to this definition">\u00b6</a></dt>'
    "<dd><p>Return a SHA-256 hash object.</p><pre>h = sha256()</pre></dd></dl>"
    "<p>After the list.</p></div>"
)
INTRO = "The module offers many hash functions with one interface. Each object has update and digest methods."
DESC = (
    "Return a new SHA-256 hash object, updated with data if it is given.",
    "The object is safe to share between threads once it is made, but not to update from two at once.",
    "Call digest to get the bytes or hexdigest to get a string of hex digits.",
)


def tokens(text: str) -> int:
    assert TOKENS is not None
    return len(TOKENS.token_spans([text])[0]) + TOKENS.special_tokens


def definition(term: str, *paragraphs: str) -> list[Block]:
    return [Block("text", term, is_term=True), *(Block("text", p, term=term) for p in paragraphs)]


def pieces(blocks: list[Block], max_tokens: int, title: str = "hashlib", max_chars: int | None = None) -> list[Piece]:
    assert TOKENS is not None
    return chunk_blocks(blocks, TOKENS, max_tokens=max_tokens, title=title, max_chars=max_chars)


def fits(piece: Piece, max_tokens: int, title: str) -> bool:
    chunk = Chunk(id="x", text=piece.text, source="s", title=title, title_path=piece.title_path)
    return tokens(index_text(chunk)) <= max_tokens


class TestHtmlDefinitions:
    def test_a_sphinx_entry_marks_its_term_and_its_description(self) -> None:
        """The ``<dt>`` is one text block marked as a term (permalink dropped); every block of the ``<dd>``
        carries it; what follows the list carries nothing; the rendered text is what it was."""
        _, blocks = html_blocks(SPHINX)
        assert blocks == [
            Block("heading", "hashlib", level=1),
            Block("text", "Secure hashes."),
            Block("text", SIG, is_term=True),
            Block("text", "Return a SHA-256 hash object.", term=SIG),
            Block("code", "h = sha256()", term=SIG),
            Block("text", "After the list."),
        ]
        assert render(blocks) == f"# hashlib\n\nSecure hashes.\n\n{SIG}\n\nReturn a SHA-256 hash object.\n\n" + (
            "```\nh = sha256()\n```\n\nAfter the list."
        )

    def test_two_terms_share_one_description(self) -> None:
        """Two ``<dt>`` before one ``<dd>`` (an overloaded signature) are both its term, one a line; the next
        entry starts afresh."""
        page = (
            "<main><dl><dt>int(x=0)</dt><dt>int(x, base=10)</dt><dd><p>An integer.</p></dd>"
            "<dt>bool(x)</dt><dd>A truth value.</dd></dl></main>"
        )
        _, blocks = html_blocks(page)
        assert blocks == [
            Block("text", "int(x=0)", is_term=True),
            Block("text", "int(x, base=10)", is_term=True),
            Block("text", "An integer.", term="int(x=0)\nint(x, base=10)"),
            Block("text", "bool(x)", is_term=True),
            Block("text", "A truth value.", term="bool(x)"),
        ]

    def test_a_nested_method_has_its_own_term_and_the_class_gets_its_own_back(self) -> None:
        """A method's ``<dl>`` inside a class's ``<dd>``: the method's description carries the method; the class's
        text after it carries the class again; the method's own term carries the class it is in."""
        page = (
            "<main><dl class='py class'><dt>class csv.Sniffer</dt><dd><p>Deduces a format.</p>"
            "<dl class='py method'><dt>sniff(sample)</dt><dd><p>Returns a Dialect.</p></dd></dl>"
            "<p>An example follows.</p></dd></dl></main>"
        )
        _, blocks = html_blocks(page)
        assert blocks == [
            Block("text", "class csv.Sniffer", is_term=True),
            Block("text", "Deduces a format.", term="class csv.Sniffer"),
            Block("text", "sniff(sample)", term="class csv.Sniffer", is_term=True),
            Block("text", "Returns a Dialect.", term="sniff(sample)"),
            Block("text", "An example follows.", term="class csv.Sniffer"),
        ]

    def test_html5_groups_in_divs_and_lists_in_descriptions(self) -> None:
        """``<div>`` groups inside a ``<dl>`` (HTML5) are read as their terms and descriptions; a list in a
        description carries the term too."""
        page = "<main><dl><div><dt>TTL</dt><dd>Time to live.<ul><li>in seconds</li></ul></dd></div></dl></main>"
        _, blocks = html_blocks(page)
        assert blocks == [
            Block("text", "TTL", is_term=True),
            Block("text", "Time to live.", term="TTL"),
            Block("text", "- in seconds", term="TTL"),
        ]


class TestChunkDefinitions:
    def test_the_term_moves_to_the_chunk_of_its_description(self) -> None:
        """When the term would end one chunk and its description start the next, the cut goes before the term
        (the old chunker left ``hashlib.sha256(data=b'')`` alone at the end of the intro's chunk)."""
        blocks = [Block("heading", "Hashing", level=1), Block("text", INTRO), *definition(SIG, DESC[0])]
        got = pieces(blocks, 50)
        assert [p.text for p in got] == [f"# Hashing\n\n{INTRO}", f"{SIG}\n\n{DESC[0]}"]
        assert all(fits(p, 50, "hashlib") for p in got)

    def test_a_long_description_says_the_term_in_front_of_each_later_chunk(self) -> None:
        """Every chunk that starts inside the description opens with the term (not part of any block's pieces:
        the blocks come back whole from the pieces' parts)."""
        blocks = [Block("heading", "Hashing", level=1), Block("text", INTRO), *definition(SIG, *DESC)]
        got = pieces(blocks, 64)
        assert [p.text for p in got] == [
            f"# Hashing\n\n{INTRO}\n\n{SIG}\n\n{DESC[0]}",
            f"{SIG}\n\n{DESC[1]}\n\n{DESC[2]}",
        ]
        assert [part for p in got for part in p.parts] == ["Hashing", INTRO, SIG, *DESC]
        assert all(fits(p, 64, "hashlib") for p in got)

    def test_a_term_too_long_for_its_room_is_cut_to_the_api_name(self) -> None:
        """In a small chunk the repeated term keeps a quarter of the room at most: cut before its parameters,
        it still names the API, and no chunk exceeds the limit."""
        blocks = [Block("heading", "Hashing", level=1), Block("text", INTRO), *definition(SIG, *DESC)]
        got = pieces(blocks, 48)
        assert [p.text for p in got] == [
            f"# Hashing\n\n{INTRO}",
            f"{SIG}\n\n{DESC[0]}",
            f"hashlib.sha256\n\n{DESC[1]}",
            f"hashlib.sha256\n\n{DESC[2]}",
        ]
        assert all(fits(p, 48, "hashlib") for p in got)

    def test_a_long_first_paragraph_is_cut_to_leave_the_term_room(self) -> None:
        """A description paragraph longer than a chunk is cut at sentences so that the term and its first piece
        share a chunk, and the later pieces each say the term first."""
        paragraph = " ".join(DESC)
        got = pieces(definition(SIG, paragraph), 48, title="")
        assert [p.text for p in got] == [
            f"{SIG}\n\n{DESC[0]}",
            f"hashlib.sha256\n\n{DESC[1]}",
            f"hashlib.sha256\n\n{DESC[2]}",
        ]
        assert all(fits(p, 48, "") for p in got)

    def test_text_outside_definitions_is_cut_as_before(self) -> None:
        """Blocks that are no definition's are packed exactly as before: no term, no repetition."""
        plain = [Block("heading", "Hashing", level=1), Block("text", INTRO), *(Block("text", d) for d in DESC)]
        assert [p.text for p in pieces(plain, 48)] == [f"# Hashing\n\n{INTRO}\n\n{DESC[0]}", DESC[1], DESC[2]]

    def test_an_enormous_term_is_cut_and_its_repetition_stays_a_quarter_of_the_chunk(self) -> None:
        """A hostile ``<dt>`` of 3,000 words: every chunk within the limit, nothing lost, and each chunk of the
        description says only the term's first words (a quarter of the room at most)."""
        term = "f(" + ", ".join(f"arg{i}" for i in range(3000)) + ")"
        blocks = definition(term, *DESC)
        got = pieces(blocks, 64, title="")
        assert all(fits(p, 64, "") for p in got)
        _owners(got, blocks)  # nothing lost, nothing repeated
        described = [p for p in got if p.parts[0] in DESC]
        assert described and all(p.text.startswith("f(arg0,") for p in described)
        assert all(tokens(p.text.split("\n\n")[0]) - 2 <= (64 - 2) // 4 for p in described)

    @pytest.mark.skipif(not (PYDOC / "csv.html").is_file(), reason="Debian's python3-doc is not installed")
    def test_python_docs_csv_dictwriter_chunks_name_their_class(self) -> None:
        """On the real csv page every chunk that holds DictWriter's description text names ``csv.DictWriter``."""
        chunks = ingest_path(PYDOC, include=("csv.html",)).chunks
        mine = [c for c in chunks if "unlike the `DictReader` class" in c.text or "maps dictionaries onto" in c.text]
        assert mine and all(c.text.startswith("class csv.DictWriter(") for c in mine)


_NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10)
_TERMS = st.one_of(
    st.tuples(_NAME, _NAME).map(lambda t: f"{t[0]}.{t[1]}()"),
    st.lists(_NAME, min_size=1, max_size=12).map(lambda ws: f"{ws[0]}({', '.join(ws[1:])})"),
)
_SENTENCES = st.lists(st.lists(_NAME, min_size=1, max_size=14).map(" ".join), min_size=1, max_size=6).map(
    lambda ss: ". ".join(ss) + "."
)
_ENTRIES = st.lists(
    st.one_of(
        _SENTENCES.map(lambda s: [Block("text", s)]),
        st.tuples(_TERMS, st.lists(_SENTENCES, min_size=1, max_size=4)).map(lambda t: definition(t[0], *t[1])),
    ),
    min_size=1,
    max_size=8,
).map(lambda entries: [block for entry in entries for block in entry])


def _owners(got: list[Piece], blocks: list[Block]) -> list[tuple[int, bool]]:
    """For each piece, the block its first part is of and whether that part starts the block (checking that the
    parts, in order, give back every block: nothing lost, nothing repeated)."""
    compact = ["".join(b.text.split()) for b in blocks]
    out: list[tuple[int, bool]] = []
    index = offset = 0
    for piece in got:
        for k, part in enumerate(piece.parts):
            bit = "".join(part.split())
            assert compact[index][offset : offset + len(bit)] == bit
            if k == 0:
                out.append((index, offset == 0))
            offset += len(bit)
            if offset == len(compact[index]):
                index, offset = index + 1, 0
    assert index == len(blocks)
    return out


class TestDefinitionProperties:
    @given(_ENTRIES, st.integers(40, 160))
    def test_every_piece_of_a_description_names_its_term_and_the_term_keeps_its_description(
        self, blocks: list[Block], max_tokens: int
    ) -> None:
        """Within the limit; nothing lost or repeated; a piece starting inside a description opens with its term
        (whole when it takes at most a quarter of the room, else its first part); and, whenever the term fits a
        quarter of the room, never a cut between a term and its description's first block."""
        got = pieces(blocks, max_tokens, title="t")
        assert all(fits(p, max_tokens, "t") for p in got)
        budget = max_tokens - 2 - (tokens("t") - 2)
        owners = _owners(got, blocks)
        for (index, starts), piece in zip(owners, got, strict=True):
            block = blocks[index]
            if block.term and not block.is_term:
                short = tokens(block.term) - 2 <= budget // 4
                if short:
                    assert piece.text.startswith(block.term + "\n\n")
                else:
                    assert piece.text.split("\n\n")[0] and block.term.startswith(piece.text.split("\n\n")[0])
                if starts and blocks[index - 1].is_term:
                    assert not short, "a term was cut from the start of its description"

    @given(_ENTRIES, st.integers(24, 160), st.integers(24, 600))
    def test_the_character_limit_holds_with_repeated_terms(
        self, blocks: list[Block], max_tokens: int, max_chars: int
    ) -> None:
        """With a character limit as well, no chunk text (repeated term included) is longer, none exceeds the
        token limit, and the blocks come back whole from the pieces' parts."""
        got = pieces(blocks, max_tokens, title="t", max_chars=max_chars)
        assert all(len(p.text) <= max_chars and fits(p, max_tokens, "t") for p in got)
        _owners(got, blocks)
