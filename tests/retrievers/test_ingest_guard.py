"""One file in a worker (ragloop.retrievers.ingest._guard) and the loaders' caps: text per file, ZIP members,
PDF streams, table spans, and the skip line for each way a file can fail."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.retrievers.ingest import Budget, ingest_path, skip_kind
from ragloop.retrievers.ingest._blocks import LoaderError
from ragloop.retrievers.ingest._guard import FileTask, failure_reason, parse_file
from ragloop.retrievers.ingest._isolate import Failure
from ragloop.retrievers.ingest._loaders import check_zip, docx_blocks, pdf_blocks
from ragloop.retrievers.ingest._types import Document, Skip
from tests.reliability import _hostile_docs


class TestParseFile:
    def test_a_document_comes_back_with_final_blocks_and_no_raw_text(self, tmp_path: Path) -> None:
        """A markdown file is cleaned in the worker: its blocks are final and its raw text is not sent back."""
        (tmp_path / "a.md").write_text("# Title\n\nBody text here.\n")
        doc = parse_file(FileTask(str(tmp_path / "a.md"), str(tmp_path)))
        assert isinstance(doc, Document)
        assert doc.text == "" and [b.text for b in doc.blocks] == ["Title", "Body text here."]

    def test_text_over_the_cap_is_skipped_with_its_size(self, tmp_path: Path) -> None:
        """A file giving more characters than the cap is one skip saying how many, of kind 'too large'."""
        (tmp_path / "big.txt").write_text("word " * 1000)
        skip = parse_file(FileTask(str(tmp_path / "big.txt"), str(tmp_path), max_text_chars=100))
        assert isinstance(skip, Skip)
        assert "5,000 characters of text (over 100 per file)" in skip.reason
        assert skip_kind(skip.reason) == "too large"

    def test_an_empty_file_is_skipped_as_empty(self, tmp_path: Path) -> None:
        """Only markup: the empty-after-cleaning skip, decided in the worker."""
        (tmp_path / "e.html").write_text("<script>x()</script>")
        skip = parse_file(FileTask(str(tmp_path / "e.html"), str(tmp_path)))
        assert isinstance(skip, Skip) and skip_kind(skip.reason) == "empty after cleaning"


class TestFailureReason:
    @pytest.mark.parametrize(
        ("failure", "words", "kind"),
        [
            (Failure("timeout", "30 s"), "took more than 30 s to read", "too slow"),
            (Failure("memory", "MemoryError"), "needed more than 512 MB of memory", "too much memory"),
            (Failure("crash", "SIGABRT"), "the PDF loader crashed (SIGABRT)", "loader crashed"),
            (Failure("error", "ValueError: too large binary"), "the PDF loader failed (ValueError", "loader failed"),
        ],
    )
    def test_each_failure_is_one_line_naming_the_cause_and_the_fix(
        self, failure: Failure, words: str, kind: str
    ) -> None:
        """The skip names what happened, the budget it hit, and what to do; its kind is the failure's, whatever
        words the loader's own message holds."""
        skip = failure_reason("docs/manual.pdf", failure, Budget(seconds=30, memory_bytes=512 << 20))
        assert words in skip.reason and skip_kind(skip.reason) == kind
        assert "\n" not in skip.reason


class TestZipCaps:
    def test_a_zip_bomb_is_refused_from_its_directory(self, tmp_path: Path) -> None:
        """A part declaring 300 MB unpacked is refused before anything is unpacked."""
        data = _hostile_docs.bomb_docx(tmp_path).read_bytes()
        with pytest.raises(LoaderError, match=r"too large when unpacked: its part 'word/document.xml'"):
            check_zip(data)

    def test_a_lying_directory_cannot_unpack_more_than_it_declares(self) -> None:
        """A member whose directory entry declares fewer bytes than it holds is cut at the declared size (the
        read fails), so the declared sizes check bounds what unpacking produces."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("word/document.xml", b"a" * 1_000_000)
        raw = bytearray(out.getvalue())
        central = raw.rfind(b"PK\x01\x02")
        raw[central + 24 : central + 28] = (1000).to_bytes(4, "little")  # uncompressed size in the directory
        archive = zipfile.ZipFile(io.BytesIO(bytes(raw)))
        with pytest.raises(zipfile.BadZipFile), archive.open("word/document.xml") as member:
            member.read()

    @given(st.integers(0, 1 << 12), st.integers(0, 1 << 12))
    def test_the_caps_are_exact(self, size: int, cap: int) -> None:
        """A part is refused exactly when its declared size is over the cap."""
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("part.xml", b"x" * size)
        if size > cap:
            with pytest.raises(LoaderError):
                check_zip(out.getvalue(), max_member=cap)
        else:
            check_zip(out.getvalue(), max_member=cap)


class TestLoaderShapes:
    def test_inconsistent_merged_cells_are_a_loader_error(self, tmp_path: Path) -> None:
        """python-docx's 'no tr above topmost tr' becomes a LoaderError (a skip), not an exception that ends a
        run read in this process."""
        data = _hostile_docs.merged_cells_docx(tmp_path).read_bytes()
        with pytest.raises(LoaderError, match="no tr above topmost tr"):
            docx_blocks(data)

    def test_a_two_million_column_span_is_refused_at_once(self, tmp_path: Path) -> None:
        """A cell spanning 2,000,000 columns is refused by the span cap, not read for minutes."""
        data = _hostile_docs.gridspan_docx(tmp_path).read_bytes()
        with pytest.raises(LoaderError, match="spans 2,000,000 columns"):
            docx_blocks(data)

    def test_a_huge_compressed_pdf_stream_stops_at_the_stream_cap(self, tmp_path: Path) -> None:
        """A 70 MB string in one compressed stream is refused at the 32 MB stream cap."""
        data = _hostile_docs.huge_stream_pdf(tmp_path).read_bytes()
        with pytest.raises(LoaderError, match="too large when decoded"):
            pdf_blocks(data)

    def test_good_files_still_read(self, tmp_path: Path) -> None:
        """The generated good DOCX and PDF give their words (the caps leave ordinary files alone)."""
        _, docx = docx_blocks(_hostile_docs.good_docx(tmp_path, "Webhooks retry.").read_bytes())
        title, pdf = pdf_blocks(_hostile_docs.good_pdf(tmp_path, "Invoices are sent monthly.").read_bytes())
        assert any("Webhooks retry." in b.text for b in docx)
        assert title == "Good PDF" and any("Invoices are sent monthly." in b.text for b in pdf)


class TestInProcess:
    def test_workers_zero_reads_in_this_process_and_still_skips_a_loader_error(self, tmp_path: Path) -> None:
        """``workers=0`` reads without worker processes; a file whose loader raises is still one skip."""
        _hostile_docs.merged_cells_docx(tmp_path)
        (tmp_path / "a.md").write_text("# A\n\nAlpha.\n")
        result = ingest_path(tmp_path, workers=0)
        assert result.files == 1
        assert [(Path(p).name, skip_kind(r)) for p, r in result.skipped] == [("merged-cells.docx", "unreadable")]
