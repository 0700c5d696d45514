"""Sphinx's reStructuredText (ragloop.retrievers.ingest._sphinx): roles and directives as readable text, and
``_sources/*.rst.txt`` read as RST citing the built page."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.retrievers.ingest import Document, explain_file, ingest_path, read_document, render
from ragloop.retrievers.ingest._loaders import rst_blocks
from ragloop.retrievers.ingest._sphinx import built_page, is_sphinx_source, role_text
from ragloop.retrievers.metadata import with_metadata

PYTHON_DOC = Path("/usr/share/doc/python3/html")

PAGE = """\
argparse --- Parser
===================

.. module:: argparse

.. versionadded:: 3.2

See :ref:`the tutorial <argparse-tutorial>` and :class:`~argparse.ArgumentParser`; call
:meth:`ArgumentParser.parse_args` or :func:`!print`.

.. class:: ArgumentParser(prog=None, \\
                          usage=None)

   Create a new :class:`ArgumentParser` object.

   .. versionchanged:: 3.11
      Calling :meth:`add_argument_group` is deprecated.

   .. code-block:: python

      def main():
          if ready:
              run()

.. note::

   Abbreviations are allowed.

.. toctree::

   howto/argparse

.. index:: single: parser
"""


class TestRoles:
    @pytest.mark.parametrize(
        ("name", "text", "shown"),
        [
            ("ref", "the tutorial <argparse-tutorial>", "the tutorial"),
            ("class", "~argparse.ArgumentParser", "ArgumentParser"),
            ("class", "argparse.ArgumentParser", "argparse.ArgumentParser"),
            ("meth", "parse_args", "parse_args()"),
            ("meth", "parse_args()", "parse_args()"),
            ("func", "!print", "print()"),
            ("py:func", "~os.path.join", "join()"),
            ("envvar", "PYTHONPATH", "PYTHONPATH"),
        ],
    )
    def test_a_role_shows_what_sphinx_shows(self, name: str, text: str, shown: str) -> None:
        """Titles of ``title <target>``, the last part after ``~``, ``()`` after a function or method."""
        assert role_text(name, text) == shown

    @given(st.text(st.characters(codec="utf-8", exclude_characters="<>~!`"), min_size=1, max_size=30))
    def test_plain_text_is_shown_as_is(self, text: str) -> None:
        """A role's text without target syntax comes out unchanged (stripped)."""
        assert role_text("term", text) == text.strip()


class TestDirectives:
    def test_a_sphinx_page_reads_as_text_with_its_structure(self) -> None:
        """Roles rendered, an object description kept as signature + description, version notes labelled,
        a code block with its indentation, a note kept; toctree, index and module leave nothing."""
        title, blocks = rst_blocks(PAGE)
        assert title == "argparse --- Parser"
        assert render(blocks) == (
            "# argparse --- Parser\n\n"
            "New in version 3.2\n\n"
            "See the tutorial and ArgumentParser; call ArgumentParser.parse_args() or print().\n\n"
            "class ArgumentParser(prog=None, usage=None)\n\n"
            "Create a new ArgumentParser object.\n\n"
            "Changed in version 3.11: Calling add_argument_group() is deprecated.\n\n"
            "```python\ndef main():\n    if ready:\n        run()\n```\n\n"
            "Abbreviations are allowed."
        )

    def test_the_fallbacks_do_not_outlive_the_read(self) -> None:
        """After a read, docutils knows no Sphinx role again (nothing global is left changed)."""
        from docutils.parsers.rst import roles

        rst_blocks(PAGE)
        found, _ = roles.role("meth", None, 0, _Reporter())
        assert found is None


class _Reporter:
    def info(self, *args: object, **kwargs: object) -> None:
        return None

    def error(self, *args: object, **kwargs: object) -> object:
        return None


class TestSphinxSources:
    @pytest.mark.parametrize(
        ("relative", "page"),
        [
            ("_sources/library/argparse.rst.txt", "library/argparse.html"),
            ("en/_sources/index.rst.txt", "en/index.html"),
        ],
    )
    def test_a_source_copy_cites_its_built_page(self, relative: str, page: str) -> None:
        """``_sources/…/x.rst.txt`` is a Sphinx source; its built page is the same path without ``_sources``."""
        assert is_sphinx_source(relative) and built_page(relative) == page

    @pytest.mark.parametrize("relative", ["notes.rst.txt", "_sources", "docs/_sources.txt", "_sources/a.txt"])
    def test_other_text_files_are_not_sources(self, relative: str) -> None:
        """Only a ``.rst.txt`` file under a ``_sources`` folder is read as a Sphinx source."""
        assert not is_sphinx_source(relative)

    def test_a_source_copy_is_read_as_rst_and_links_the_built_page(self, tmp_path: Path) -> None:
        """The file is read as RST (headings, no raw roles), its citation source and URL name the built page
        with the section's anchor; its id stays the file's own path."""
        (tmp_path / "_sources" / "library").mkdir(parents=True)
        (tmp_path / "_sources" / "library" / "argparse.rst.txt").write_text(PAGE)
        doc = read_document(tmp_path / "_sources" / "library" / "argparse.rst.txt", tmp_path)
        assert isinstance(doc, Document) and doc.fmt == "rst"
        assert doc.source == "library/argparse.html" and doc.id == "_sources/library/argparse.rst.txt"
        chunks = ingest_path(tmp_path, workers=1).chunks
        linked = with_metadata(chunks, tmp_path, url_base="https://docs.python.org/3")
        assert {c.source for c in linked} == {"library/argparse.html"}
        assert linked[0].url == "https://docs.python.org/3/library/argparse.html#argparse-parser"
        assert not any(":class:" in c.text or ":meth:" in c.text for c in linked)

    def test_explain_reads_a_source_copy_as_its_site_would(self, tmp_path: Path) -> None:
        """`--explain` on a source copy reads it as RST (as a build of the whole site does), not as plain text."""
        (tmp_path / "_sources").mkdir()
        (tmp_path / "_sources" / "page.rst.txt").write_text(PAGE)
        found = explain_file(tmp_path / "_sources" / "page.rst.txt")
        assert found.fmt == "rst" and found.cleaned.startswith("# argparse --- Parser")
        assert found.chunks and {c.source for c, _ in found.chunks} == {"page.html"}

    @pytest.mark.skipif(not (PYTHON_DOC / "_sources").exists(), reason="python3-doc is not installed")
    def test_pythons_argparse_source_has_no_raw_roles(self) -> None:
        """Debian's python3-doc: argparse's source copy reads with its headings and none of its raw roles."""
        doc = read_document(PYTHON_DOC / "_sources" / "library" / "argparse.rst.txt", PYTHON_DOC)
        assert isinstance(doc, Document)
        text = render(doc.blocks)
        assert sum(text.count(f":{r}:`") for r in ("class", "meth", "func", "ref", "attr")) == 0
        assert "class ArgumentParser(prog=None, usage=None, description=None," in text
        assert "## ArgumentParser objects" in text
