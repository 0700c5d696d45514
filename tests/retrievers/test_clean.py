"""Tests for cleaning: the markdown/text cleaner, HTML main content, the loaders (PDF, DOCX, RST) and decoding.

The fixture pages in ``fixtures/docs/`` are small hand-written pages modelled on the markup Sphinx (the Python
docs theme), MkDocs Material and Docusaurus really produce; the PDF and DOCX are made at test time
(``tests/retrievers/_docs.py``), so no binary is committed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ragloop.errors import InputError
from ragloop.retrievers.ingest import (
    clean_text,
    explain_file,
    ingest_path,
    render,
    split_front_matter,
)
from ragloop.retrievers.ingest._decode import Undecodable, decode_text
from ragloop.retrievers.ingest._html import html_blocks
from ragloop.retrievers.ingest._loaders import LoaderError, pdf_blocks, rst_blocks
from tests.retrievers._docs import write_docx, write_pdf
from tests.strategies import markup_text, words

FIXTURES = Path(__file__).parent / "fixtures" / "docs"
PYTHON_DOC = Path("/usr/share/doc/python3/html/library")


def cleaned(name: str) -> str:
    found = explain_file(FIXTURES / name)
    assert not found.skip, found.skip
    return found.cleaned


class TestHtmlMainContent:
    def test_sphinx_page_is_its_main_content_exactly(self) -> None:
        """A Sphinx page keeps only div.body: entities decoded once, code verbatim, # lines in code not headings,
        the table as markdown rows; the sidebar, related bar, footer and ¶ permalinks are gone."""
        assert cleaned("sphinx.html") == (
            "# 8. Errors and Exceptions\n\n"
            "Until now error messages haven’t been more than mentioned & shown.\n\n"
            "## 8.1. Syntax Errors\n\n"
            "The parser repeats the offending line:\n\n"
            "```python3\n"
            ">>> while True print('Hello world')\n"
            '  File "<stdin>", line 1\n'
            "    while True print('Hello world')\n"
            "# a comment line, not a heading\n"
            "SyntaxError: invalid syntax\n"
            "```\n\n"
            "| Exception | Meaning |\n"
            "| --- | --- |\n"
            "| ValueError | bad value \\| wrong |\n"
            "| KeyError | missing key |"
        )

    def test_mkdocs_page_drops_header_sidebars_footer_and_cookie_consent(self) -> None:
        """MkDocs Material: the article only; the consent banner, navigation, table of contents, "edit" button,
        source-file aside and previous/next footer never reach the text."""
        text = cleaned("mkdocs.html")
        assert text.startswith("# First Steps\n\nThe simplest FastAPI file could look like this:\n\n```\nfrom fastapi")
        assert '    return {"message": "Hello World"}\n```' in text
        assert "## Step 1: import FastAPI\n\n`FastAPI` is a Python class" in text and "your API & more." in text
        for junk in ("cookies", "Table of contents", "Edit", "Previous Tutorial", "Last update", "Made with", "¶"):
            assert junk not in text

    def test_docusaurus_page_keeps_its_header_h1_and_code_lines(self) -> None:
        """Docusaurus: the h1 inside the article's header stays, <br>-separated code lines stay lines with their
        indentation, and breadcrumbs, 'On this page', hash links, 'Edit this page', pagination and the cookie
        banner are gone."""
        assert cleaned("docusaurus.html") == (
            "# Installation\n\n"
            "Install the package with `npm`:\n\n"
            "```bash\nnpm install my-site\n  --save   # keep it\n```\n\n"
            "## Requirements\n\n"
            "Node.js version 18.0 or above <= 20."
        )

    def test_anchors_come_from_heading_ids_permalinks_or_sections(self) -> None:
        """Heading anchors: the section's id (Sphinx), the heading's id (MkDocs, Docusaurus)."""
        for name, want in (
            ("sphinx.html", ["errors-and-exceptions", "syntax-errors"]),
            ("mkdocs.html", ["first-steps", "step-1-import-fastapi"]),
            ("docusaurus.html", ["", "requirements"]),
        ):
            _, blocks = html_blocks((FIXTURES / name).read_text())
            assert [b.anchor for b in blocks if b.kind == "heading"] == want

    def test_link_lists_are_navigation(self) -> None:
        """A list that is all links (a toctree, an index page) is dropped; prose with a link is kept."""
        links = "".join(f'<li><a href="p{i}.html">Page {i}</a></li>' for i in range(8))
        page = f'<main><p>See <a href="x.html">the guide</a> first.</p><ul>{links}</ul></main>'
        assert render(html_blocks(page)[1]) == "See the guide first."

    def test_escaped_markup_in_prose_stays_text(self) -> None:
        """&lt;tag&gt; in prose is the text <tag>, and &amp;lt; is the text &lt; (decoded exactly once)."""
        page = "<body><p>Use &lt;key&gt; and write &amp;lt; for &lt;.</p></body>"
        assert render(html_blocks(page)[1]) == "Use <key> and write &lt; for <."

    def test_hidden_elements_are_dropped(self) -> None:
        """hidden, aria-hidden and display:none elements vanish with their content."""
        page = (
            '<article><p>shown</p><p hidden>a</p><div aria-hidden="true">b</div>'
            '<span style="display: none">c</span></article>'
        )
        assert render(html_blocks(page)[1]) == "shown"


class TestBoilerplateByStructure:
    def test_a_section_about_cookies_is_content(self) -> None:
        """Sphinx's ids and classes that hold the word 'cookie' or 'consent' (http.cookiejar's sections) keep their
        text: boilerplate is never recognised by a word in an id or class."""
        page = (
            '<div class="body" role="main"><section id="http-cookiejar-cookie-handling">'
            "<h1>http.cookiejar — Cookie handling</h1><p>The module defines classes for cookies.</p>"
            '<section id="cookiejar-and-filecookiejar-objects"><h2>CookieJar objects</h2>'
            '<dl class="py class"><dt id="http.cookiejar.CookieJar">class CookieJar</dt>'
            "<dd><p>Stores HTTP cookies.</p></dd></dl>"
            '<div class="consent-notes"><p>Consent is the user\'s.</p></div></section></section></div>'
        )
        assert render(html_blocks(page)[1]) == (
            "# http.cookiejar — Cookie handling\n\nThe module defines classes for cookies.\n\n"
            "## CookieJar objects\n\nclass CookieJar\n\nStores HTTP cookies.\n\nConsent is the user's."
        )

    @pytest.mark.parametrize(
        "banner",
        [
            '<div style="position: fixed; bottom: 0">We use trackers. <button>Accept</button></div>',
            '<div class="bar-x1">We use trackers. <button>Accept</button><button>Reject</button></div>',
            '<div role="dialog"><p>Subscribe to our newsletter.</p><a role="button" href="/s">Subscribe</a></div>',
            '<section aria-modal="true"><p>Choose a region.</p><input type="submit" value="OK"></section>',
        ],
        ids=["inline-fixed", "styled-fixed", "dialog-role", "aria-modal"],
    )
    def test_an_overlay_with_buttons_is_a_banner(self, banner: str) -> None:
        """An overlay (fixed or sticky position, inline or from the page's style; a dialog role; aria-modal)
        holding buttons and little text is dropped, whatever its words."""
        page = (
            "<html><head><style>.bar-x1 { position: fixed; bottom: 0 } p { color: red }</style></head>"
            f"<body><main><h1>Webhooks</h1><p>Webhooks retry five times.</p>{banner}</main></body></html>"
        )
        assert render(html_blocks(page)[1]) == "# Webhooks\n\nWebhooks retry five times."

    def test_a_fixed_note_without_buttons_and_a_long_overlay_are_content(self) -> None:
        """A sticky note with no button, and a dialog holding a page's worth of text, are not banners."""
        long = "The whole policy text. " * 80
        page = (
            '<main><div style="position: sticky; top: 0"><p>Version 2.1 of the API.</p></div>'
            f'<div role="dialog"><p>{long}</p><button>Close</button></div></main>'
        )
        text = render(html_blocks(page)[1])
        assert text.startswith("Version 2.1 of the API.\n\nThe whole policy text.") and text.count("policy") == 80

    def test_texinfo_navigation_lines_and_permalink_marks_are_dropped(self) -> None:
        """Texinfo's 'Next: … Previous: … Up: …' line and '¶' links go; a sentence with a 'next' link stays."""
        page = (
            '<body><div class="nav-panel"><p>Next: <a href="Tar.html" accesskey="n" rel="next">Tar</a>, '
            'Previous: <a href="Intro.html" accesskey="p" rel="prev">Intro</a>, '
            'Up: <a href="index.html" accesskey="u" rel="up">Top</a> &nbsp; [<a href="index.html#SEC_Contents" '
            'rel="contents">Contents</a>]</p></div><hr>'
            '<h2 class="chapter" id="Usage">2 Usage<a class="copiable-link" href="#Usage"> \u00b6</a></h2>'
            '<p>Read the <a href="Tar.html" rel="next">next chapter</a> first.</p></body>'
        )
        assert render(html_blocks(page)[1]) == "## 2 Usage\n\nRead the next chapter first."

    def test_a_page_losing_most_of_its_text_is_reported_with_the_rule(self) -> None:
        """A page that cleaning empties or halves gets one note naming the share and the rule that took it."""
        links = "".join(f'<li><a href="p{i}.html">Reference page number {i}</a></li>' for i in range(20))
        notes: list[str] = []
        html_blocks(f"<main><p>Pages.</p><ul>{links}</ul></main>", notes)
        assert notes == [
            "cleaning removed 99% of the 416 characters of the page's main text, most by: lists and tables that "
            "are almost all links (410)"
        ]
        kept: list[str] = []
        html_blocks("<main><p>Plenty of real text here.</p><nav>Home</nav></main>", kept)
        assert kept == []

    def test_an_emptied_page_is_skipped_naming_the_rule(self, tmp_path: Path) -> None:
        """An index page that is all links is skipped as empty, and the reason says which rule emptied it."""
        links = "".join(f'<li><a href="p{i}.html">Page {i}</a></li>' for i in range(10))
        (tmp_path / "genindex.html").write_text(f"<main><ul>{links}</ul></main>")
        (tmp_path / "ok.md").write_text("# OK\n\nText.\n")
        skipped = dict(ingest_path(tmp_path).skipped)
        reason = skipped[next(iter(skipped))]
        assert reason.startswith("empty after cleaning")
        assert "cleaning removed all of the 50 characters" in reason and "almost all links" in reason

    @pytest.mark.skipif(not PYTHON_DOC.exists(), reason="python3-doc is not installed")
    def test_pythons_cookie_pages_are_indexed(self) -> None:
        """Debian's python3-doc: http.cookiejar and http.cookies keep their content (both were emptied by
        `[id*=cookie]`), and urllib.request keeps its HTTPCookieProcessor sections."""
        for name, term in (
            ("http.cookiejar.html", "FileCookieJar"),
            ("http.cookies.html", "SimpleCookie"),
            ("urllib.request.html", "HTTPCookieProcessor"),
        ):
            text = render(html_blocks((PYTHON_DOC / name).read_text())[1])
            assert len(text) > 5000 and term in text, name


class TestHostileHtml:
    def test_deeply_nested_page_is_refused_quickly(self, tmp_path: Path) -> None:
        """100,000 nested <div>s (the parser's time grows with the square of the depth) are a skip in well under a
        second, not minutes of parsing or a RecursionError."""
        (tmp_path / "deep.html").write_text("<body>" + "<div>" * 100_000 + "x" + "</div>" * 100_000 + "</body>")
        started = time.perf_counter()
        result = ingest_path(tmp_path)
        assert time.perf_counter() - started < 3.0
        assert "nested too deeply" in dict(result.skipped)[str(tmp_path / "deep.html")]

    def test_sloppy_html_with_unclosed_paragraphs_is_read(self) -> None:
        """Thousands of unclosed <p> and <li> (closed by HTML itself) are not deep nesting."""
        page = "<body><ul>" + "<li>item <p>para" * 3000 + "</ul></body>"
        assert render(html_blocks(page)[1]).count("para") == 3000


class TestLoaders:
    def test_pdf_pages_are_kept_in_blocks_and_chunks(self, tmp_path: Path) -> None:
        """A PDF's text keeps its page numbers; its outline gives headings; chunks link #page=N."""
        pdf = write_pdf(
            tmp_path / "manual.pdf",
            ["Page one says hello.", "Page two says goodbye."],
            title="Manual",
            outline=[("Intro", 1), ("End", 2)],
        )
        title, blocks = pdf_blocks(pdf.read_bytes())
        assert title == "Manual"
        assert [(b.kind, b.text, b.page) for b in blocks] == [
            ("heading", "Intro", 1),
            ("text", "Page one says hello.", 1),
            ("heading", "End", 2),
            ("text", "Page two says goodbye.", 2),
        ]
        chunks = explain_file(pdf).chunks
        assert [(c.text, c.meta()) for c, _ in chunks] == [
            ("# Intro\n\nPage one says hello.", {"anchor": "page=1", "page": "1"}),
            ("# End\n\nPage two says goodbye.", {"anchor": "page=2", "page": "2"}),
        ]

    def test_damaged_pdf_is_a_clear_skip(self, tmp_path: Path) -> None:
        """A file that is not a PDF inside says it is damaged, and is skipped, not fatal."""
        with pytest.raises(LoaderError, match="damaged PDF"):
            pdf_blocks(b"%PDF-1.4\nthis is not a pdf")
        (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4\ngarbage")
        assert "damaged PDF" in explain_file(tmp_path / "bad.pdf").skip

    def test_pypdf_warnings_go_to_the_report_not_stderr(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A PDF pypdf reads but warns about (a wrong startxref pointer) is indexed; pypdf's warnings are in the
        result's ``warnings`` under the file's name, nothing reaches stderr, and pypdf's logger is as it was."""
        import logging

        (tmp_path / "docs").mkdir()
        pdf = write_pdf(tmp_path / "docs" / "manual.pdf", ["First page text."])
        data = pdf.read_bytes()
        pdf.write_bytes(data[: data.rfind(b"startxref")] + b"startxref\n999\n%%EOF\n")
        pypdf_log = logging.getLogger("pypdf")
        before = (list(pypdf_log.handlers), pypdf_log.propagate, pypdf_log.level)
        result = ingest_path(tmp_path / "docs")
        assert result.files == 1 and "First page text." in result.chunks[0].text
        assert result.warnings and all(where == "manual.pdf" for where, _ in result.warnings)
        assert any("startxref" in message for _, message in result.warnings)
        assert capsys.readouterr().err == ""
        assert (list(pypdf_log.handlers), pypdf_log.propagate, pypdf_log.level) == before

    def test_docx_headings_lists_and_tables(self, tmp_path: Path) -> None:
        """DOCX: Title/Heading styles become headings, list styles items, tables markdown rows."""
        found = explain_file(write_docx(tmp_path / "notes.docx"))
        assert found.title == "Release Notes"
        assert found.cleaned == (
            "# Release Notes\n\n# Fixes\n\nCrash on start fixed & logged.\n\n- Faster search\n\n"
            "| Version | Date |\n| --- | --- |\n| 2.1 | 2024-05-01 |"
        )

    def test_rst_sections_code_lists_and_tables(self) -> None:
        """RST through docutils: section ids as anchors, code-block verbatim with its language, simple tables."""
        title, blocks = rst_blocks((FIXTURES / "guide.rst").read_text())
        assert title == "Install Guide"
        assert render(blocks) == (
            "# Install Guide\n\nRead this first.\n\n## Requirements\n\nYou need Python 3.11:\n\n"
            "```python\nimport sys\n# check the version\nassert sys.version_info >= (3, 11)\n```\n\n"
            "- one item\n\n- two items\n\n| Name | Meaning |\n| --- | --- |\n| a | first |\n| b | second |"
        )
        assert [b.anchor for b in blocks if b.kind == "heading"] == ["install-guide", "requirements"]

    def test_rst_include_directive_reads_no_file(self, tmp_path: Path) -> None:
        """``.. include::`` and ``.. raw::`` are refused: parsing an RST file never reads another file."""
        secret = tmp_path / "secret.txt"
        secret.write_text("TOP SECRET")
        _, blocks = rst_blocks(f"Title\n=====\n\n.. include:: {secret}\n\n.. raw:: html\n\n   <b>x</b>\n\nafter\n")
        assert "TOP SECRET" not in render(blocks) and "<b>" not in render(blocks)


class TestDecode:
    @pytest.mark.parametrize(
        ("name", "encoding", "text"),
        [
            ("latin1.txt", "cp1252", "Café crème: the menu of the café lists crème brûlée and naïve recipes"),
            ("utf16.txt", "utf-16", "UTF-16 text: Grüße aus Köln, with a BOM at the start."),
            ("shiftjis.md", "cp932", "これは日本語の文章です。"),
            ("nul.md", "utf-8", "A markdown file with one stray NUL byte in it."),
        ],
    )
    def test_odd_encodings_are_decoded_not_dropped(self, name: str, encoding: str, text: str) -> None:
        """latin-1, UTF-16 (BOM), Shift-JIS and a stray NUL byte: decoded and indexed, not skipped."""
        found = explain_file(FIXTURES / name)
        assert (found.skip, found.encoding) == ("", encoding)
        assert text in found.cleaned

    def test_random_bytes_are_binary(self) -> None:
        """Random bytes in a .txt are refused as binary, with a reason."""
        with pytest.raises(Undecodable, match="binary"):
            decode_text((FIXTURES / "junk.txt").read_bytes())

    def test_fixture_folder_accounts_for_every_file(self) -> None:
        """Indexing the fixture folder reads every document and skips each junk file with its kind."""
        from ragloop.retrievers.ingest import skip_kind

        result = ingest_path(FIXTURES)
        kinds = {Path(p).name: skip_kind(why) for p, why in result.skipped}
        assert kinds == {"junk.bin": "unsupported type", "junk.txt": "binary", "blank.md": "empty after cleaning"}
        assert result.files == len(list(FIXTURES.iterdir())) - 3
        assert {c.doc_id for c in result.chunks} >= {"sphinx.html", "mkdocs.html", "guide.rst", "shiftjis.md"}


class TestCleanText:
    def test_script_and_style_removed_with_their_content(self) -> None:
        """<script> and <style> elements vanish with everything inside them."""
        out = clean_text("Before <script>var x = 1;</script><style>p { color: red }</style> after", "html")
        assert out == "Before after"

    def test_html_comment_removed(self) -> None:
        """HTML comments are dropped."""
        assert clean_text("keep <!-- secret\nnote --> this", "markdown") == "keep this"

    def test_tags_stripped_text_kept_and_headings_become_lines(self) -> None:
        """Tags go, their text stays; <h2> becomes a markdown heading line; <p> breaks paragraphs."""
        out = clean_text("<h2>Setup</h2><p>Run <b>make</b>.</p><p>Done.</p>", "html")
        assert out == "## Setup\n\nRun make.\n\nDone."

    def test_placeholders_that_are_not_html_survive_in_markdown(self) -> None:
        """<key> and <node-id> in command docs are not HTML elements and are kept."""
        assert clean_text("Use GET <key> on <node-id>", "markdown") == "Use GET <key> on <node-id>"

    def test_base64_blob_dropped(self) -> None:
        """A long mixed-case base64 run is removed; a long lower-case hex digest is not."""
        blob = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
        digest = "a" * 30 + "0123456789abcdef" * 2
        assert clean_text(f"payload {blob} end", "text") == "payload end"
        assert clean_text(f"sha {digest}", "text") == f"sha {digest}"

    def test_data_uri_dropped(self) -> None:
        """data: URIs are removed, and so is an image that only carried one."""
        out = clean_text('Logo <img src="data:image/png;base64,QUJDRA=="> here data:text/plain,hi!', "markdown")
        assert out == "Logo here"

    def test_data_colon_in_prose_is_not_a_uri(self) -> None:
        """'data: something' in prose is not a data URI."""
        assert clean_text("send data: a JSON body", "markdown") == "send data: a JSON body"

    def test_hugo_shortcodes_keep_inner_text(self) -> None:
        """Hugo shortcode delimiters go, the human text they wrap stays."""
        out = clean_text('{{% alert title="Note" %}}Keys expire.{{% /alert %}} {{< highlight bash >}}', "markdown")
        assert out == "Keys expire."

    def test_jinja_and_mkdocs_directives_dropped(self) -> None:
        """{{ … }}, {% … %}, {# … #}, {* include *} and { #anchor } are removed."""
        text = "# Intro { #intro }\n\n{% if x %}Hello {{ user.name }}{# note #}{% endif %}\n\n{* ../src/a.py hl[1] *}"
        assert clean_text(text, "markdown") == "# Intro\n\nHello"

    def test_wordpress_shortcodes_resolved(self) -> None:
        """[name …]inner[/name] keeps inner; attribute-only and self-closing shortcodes are dropped."""
        text = '[note type="x"]Read this[/note] [gallery ids="1,2"] [embed url="u" /] done'
        assert clean_text(text, "markdown") == "Read this done"

    def test_admonition_markers_dropped_titles_kept(self) -> None:
        """mkdocs '/// note | Title' keeps its title; bare markers and tab labels go."""
        text = "/// note | Technical Details\n\nBody.\n\n///\n\n//// tab | Python 3.10+\n\nCode.\n\n////"
        assert clean_text(text, "markdown") == "Technical Details\n\nBody.\n\nCode."

    def test_logo_image_dropped_informative_alt_kept(self) -> None:
        """Short-alt or logo images vanish; informative alt text is kept as plain text."""
        text = "![logo](l.png) ![Swagger UI](s.png) ![A company logo for us](c.png) ![Latency by pipeline size](p.png)"
        assert clean_text(text, "markdown") == "Latency by pipeline size"

    def test_captioned_figure_kept(self) -> None:
        """An image with a caption keeps alt text and caption, however short the alt."""
        html_figure = '<figure><img src="c.png" alt="Cat"><figcaption>Figure 1: a <b>cat</b></figcaption></figure>'
        assert clean_text(html_figure, "html") == "Cat\nFigure 1: a cat"
        assert clean_text('![NUMA](n.gif "NUMA nodes versus latency")', "markdown") == "NUMA NUMA nodes versus latency"
        wp = '[caption id="a1"]<img src="x.png" alt="Map"> The city centre[/caption]'
        assert clean_text(wp, "markdown") == "Map\nThe city centre"

    def test_links_keep_text(self) -> None:
        """Markdown links keep their text (code and nested brackets included), not the URL."""
        text = "See [the `Depends` docs](https://x.y/deps) by [@bot[bot]](https://github.com/apps/bot)."
        assert clean_text(text, "markdown") == "See the `Depends` docs by @bot[bot]."

    def test_entities_decoded(self) -> None:
        """HTML entities are decoded."""
        assert clean_text("Tom &amp; Jerry &lt;3 &#233;t&eacute;", "html") == "Tom & Jerry <3 été"

    def test_whitespace_normalised_paragraphs_and_headings_kept(self) -> None:
        """Runs of spaces collapse, blank-line runs become one, heading lines and breaks survive."""
        text = "\ufeff  # Title  \r\n\r\n\r\n\r\nword\t\t word\u00a0end  \n\n\n\n## Next ##\nline"
        assert clean_text(text, "markdown") == "# Title\n\nword word end\n\n## Next\nline"

    def test_code_blocks_are_literal(self) -> None:
        """Fenced code keeps its tags, braces and indentation; inline code keeps its tags."""
        text = 'Use `<div>` here.\n\n```python\ndef f():\n    return "<b>{{ x }}</b>"\n```'
        assert clean_text(text, "markdown") == text

    def test_terminal_transcripts_lose_their_colour_markup(self) -> None:
        """HTML colouring inside a console fence is removed."""
        text = '```console\n<span style="color:red">INFO</span> started &lt;pid&gt;\n```'
        assert clean_text(text, "markdown") == "```console\nINFO started <pid>\n```"

    def test_unknown_format_rejected(self) -> None:
        """An unknown fmt raises ValueError naming the valid ones."""
        with pytest.raises(ValueError, match="markdown"):
            clean_text("x", "pdf")

    @given(markup_text, st.sampled_from(["markdown", "text", "html", "beir"]))
    @example("&amp;lt;b&amp;gt;x", "text")
    @example("<b>/// tip", "markdown")
    @example("{<b>{ x }</b>}", "html")
    @example("<b>```</b>\n<script>x</script>", "markdown")
    def test_idempotent(self, text: str, fmt: str) -> None:
        """Cleaning a cleaned text changes nothing."""
        once = clean_text(text, fmt)
        assert clean_text(once, fmt) == once

    @given(st.text(), st.sampled_from(["markdown", "text", "html", "beir"]))
    def test_arbitrary_text_never_raises_and_is_encodable(self, text: str, fmt: str) -> None:
        """Any string, lone surrogates and control characters included, cleans to encodable UTF-8."""
        out = clean_text(text, fmt)
        out.encode("utf-8")
        assert out == out.strip()
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out)

    @given(st.lists(words, min_size=1, max_size=20), st.sampled_from(["markdown", "text", "html", "beir"]))
    def test_plain_words_survive(self, ws: list[str], fmt: str) -> None:
        """Meaningful text without markup comes out with every word, in order."""
        assert clean_text(" ".join(ws), fmt).split() == ws


class TestFrontMatter:
    def test_title_taken_and_block_dropped(self) -> None:
        """A YAML block at the top is removed and its title returned unquoted."""
        title, body = split_front_matter('---\ntitle: "Redis ACL"\nweight: 3\ntags:\n  - a\n---\n# Body\n')
        assert (title, body) == ("Redis ACL", "# Body\n")

    def test_horizontal_rule_is_not_front_matter(self) -> None:
        """A document opening with a rule and prose is left whole."""
        text = "---\nThis is prose, not YAML.\n---\nMore."
        assert split_front_matter(text) == ("", text)


#: Patterns that made the old cleaning regexes quadratic (64 KB of ``[a](`` took 53 s).
PATHOLOGICAL = {
    "markdown link": "[a](",
    "markdown image": "![a](",
    "unclosed script": "<script>",
    "unclosed comment": "x<!--",
    "unclosed img": "<img ",
    "unclosed heading": "<h1>",
    "unclosed figure": "<figure>",
    "unclosed caption": "[caption]",
    "shortcode": "{{<",
    "jinja": "{%",
    "backticks": "``a`",
    "wordpress": "[a b]",
}


class TestCleaningStaysLinear:
    @pytest.mark.parametrize("pattern", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
    @pytest.mark.parametrize("fmt", ["markdown", "html"])
    def test_256_kb_of_a_pathological_pattern_cleans_quickly(self, pattern: str, fmt: str) -> None:
        """256 KB of each pattern cleans in well under 3 s (the old regexes took minutes)."""
        text = (pattern * (262_144 // len(pattern) + 1))[:262_144]
        started = time.perf_counter()
        clean_text(text, fmt)
        assert time.perf_counter() - started < 3.0

    def test_budget_is_enforced(self) -> None:
        """A document over its cleaning budget raises InputError, and ingestion skips it with the reason."""
        with pytest.raises(InputError, match="cleaning too slow"):
            clean_text("<p>text</p>" * 1000, "html", budget_s=0.0)

    def test_ingest_skips_a_document_over_budget(self, tmp_path: Path) -> None:
        """ingest_path reports the document it gave up cleaning."""
        (tmp_path / "slow.md").write_text("# Slow\n\nSome words here.\n")
        result = ingest_path(tmp_path, clean_budget_s=0.0)
        assert dict(result.skipped)["slow.md"].startswith("cleaning too slow")


class TestHiddenHtml:
    @pytest.mark.parametrize(
        "hidden",
        [
            '<div style="display:none">SECRET</div>',
            '<div style="color: red; display : none;">SECRET</div>',
            "<span style='visibility:hidden'>SECRET</span>",
            "<p hidden>SECRET</p>",
            '<p hidden="hidden">SECRET</p>',
            '<div aria-hidden="true">SECRET</div>',
            "<div hidden><div>SECRET</div>SECRET</div>",
            "<template>SECRET</template>",
            "<![CDATA[SECRET]]>",
            "<!-- SECRET -->",
            "<script>SECRET</script>",
            "<noscript>SECRET</noscript>",
        ],
    )
    @pytest.mark.parametrize("fmt", ["markdown", "html"])
    def test_hidden_content_is_dropped(self, hidden: str, fmt: str) -> None:
        """What a reader never sees is not indexed; the visible text around it is."""
        cleaned = clean_text(f"<p>Visible before.</p>\n\n{hidden}\n\n<p>Visible after.</p>", fmt)
        assert "SECRET" not in cleaned
        assert "Visible before." in cleaned and "Visible after." in cleaned

    @pytest.mark.parametrize("opener", ["<script>", "<style>", "<!--", "<![CDATA[", "<template>", "<div hidden>"])
    def test_unterminated_hiding_construct_hides_the_rest(self, opener: str) -> None:
        """An unterminated script, style, comment, CDATA, template or hidden element hides the rest."""
        cleaned = clean_text(f"<p>Visible.</p>\n{opener}\nSECRET instructions for the assistant", "html")
        assert cleaned == "Visible."

    def test_visible_attributes_that_mention_hidden_are_kept(self) -> None:
        """Only real hiding counts: a class or title mentioning 'hidden', aria-hidden=false stay visible."""
        text = '<p class="hidden-xs" title="hidden gem">Kept one.</p><p aria-hidden="false">Kept two.</p>'
        assert clean_text(text, "html") == "Kept one.\n\nKept two."

    def test_hidden_void_element_drops_only_itself(self) -> None:
        """A hidden input or image is dropped alone; the text after it stays."""
        assert clean_text('<p>A <input type="text" hidden> B</p>', "html") == "A B"

    def test_plain_text_keeps_what_follows_an_unterminated_opener(self) -> None:
        """A .txt file is not rendered: a stray '<script>' or '<!--' in it hides nothing."""
        text = "Use a <script> tag or an <!-- comment marker; this sentence stays."
        assert clean_text(text, "text") == "Use a tag or an <!-- comment marker; this sentence stays."
