"""Hostile documents, generated small on disk: what made one file end or stall a whole ``ragloop index`` run.

Each writer builds its file under a folder and returns the path. They are generated (a few hundred KB each on
disk) rather than committed, and each is the shape a field test met:

- a DOCX whose merged cells are inconsistent (python-docx raises ``no tr above topmost tr in w:tbl``);
- a DOCX with a 2,000,000-column ``gridSpan`` (python-docx builds a cell per grid column);
- a DOCX zip bomb (one part that unpacks to hundreds of MB);
- a PDF whose one compressed content stream holds a 70 MB string;
- a PDF with ten million text operators;
- 15 MB of words on one line.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path

__all__ = [
    "bomb_docx",
    "good_docx",
    "good_pdf",
    "gridspan_docx",
    "huge_stream_pdf",
    "merged_cells_docx",
    "one_line_words",
    "operators_pdf",
    "pdf_with_content",
]

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _docx_bytes(body: bytes) -> bytes:
    """A minimal DOCX (the parts python-docx needs) whose ``word/document.xml`` body is ``body``."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(
            "[Content_Types].xml",
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            '<Override PartName="/word/document.xml" ContentType="application/'
            'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
        )
        z.writestr(
            "_rels/.rels",
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
            '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
            'relationships/officeDocument" Target="word/document.xml"/></Relationships>',
        )
        z.writestr("word/document.xml", _document_xml(body))
    return out.getvalue()


def _document_xml(body: bytes) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?><w:document xmlns:w="{_W}"><w:body>'.encode()
        + body
        + b"</w:body></w:document>"
    )


def _para(text: str) -> bytes:
    return f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>".encode()


def _cell(text: str, props: str = "") -> bytes:
    return f"<w:tc>{f'<w:tcPr>{props}</w:tcPr>' if props else ''}{_para(text).decode()}</w:tc>".encode()


def good_docx(folder: Path, words: str) -> Path:
    """A readable DOCX holding ``words`` and a small table."""
    table = b"<w:tbl>" + b"<w:tr>" + _cell("region") + _cell("tier") + b"</w:tr></w:tbl>"
    path = folder / "good.docx"
    path.write_bytes(_docx_bytes(_para(words) + table))
    return path


def merged_cells_docx(folder: Path) -> Path:
    """A table whose first row continues a vertical merge from a row that does not exist."""
    row = b"<w:tr>" + _cell("a", '<w:vMerge w:val="continue"/>') + _cell("b") + b"</w:tr>"
    path = folder / "merged-cells.docx"
    path.write_bytes(_docx_bytes(_para("Before the table.") + b"<w:tbl>" + row * 3 + b"</w:tbl>"))
    return path


def gridspan_docx(folder: Path) -> Path:
    """A table cell spanning 2,000,000 grid columns, in 200 rows."""
    row = b"<w:tr>" + _cell("wide", '<w:gridSpan w:val="2000000"/>') + b"</w:tr>"
    path = folder / "gridspan.docx"
    path.write_bytes(_docx_bytes(_para("A wide table follows.") + b"<w:tbl>" + row * 200 + b"</w:tbl>"))
    return path


def bomb_docx(folder: Path, unpacked: int = 300 << 20) -> Path:
    """A DOCX whose ``word/document.xml`` unpacks to ``unpacked`` bytes of empty paragraphs (about 300 KB packed)."""
    path = folder / "bomb.docx"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        base = _docx_bytes(b"")
        with zipfile.ZipFile(io.BytesIO(base)) as src:
            for name in src.namelist():
                if name != "word/document.xml":
                    z.writestr(name, src.read(name))
        head = _document_xml(b"")[: -len(b"</w:body></w:document>")]
        with z.open("word/document.xml", "w", force_zip64=True) as member:
            member.write(head)
            piece = b"<w:p/>" * (1 << 16)
            written = len(head)
            while written < unpacked:
                member.write(piece)
                written += len(piece)
            member.write(b"</w:body></w:document>")
    return path


def pdf_with_content(contents: list[bytes], *, compress: bool = True, title: str = "") -> bytes:
    """A PDF with one page per content stream (Helvetica as ``/F1``), hand-built so a test controls every byte."""
    objects: list[bytes] = []
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(contents)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(contents)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, content in enumerate(contents):
        page = 4 + 2 * i
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {page + 1} 0 R >>".encode()
        )
        data = zlib.compress(content, 9) if compress else content
        flt = b" /Filter /FlateDecode" if compress else b""
        objects.append(b"<< /Length %d%s >>\nstream\n" % (len(data), flt) + data + b"\nendstream")
    info = len(objects) + 1
    objects.append(f"<< /Title ({title}) >>".encode())
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    trailer = b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
    out.write(trailer % (len(objects) + 1, info, xref))
    return out.getvalue()


def _text_ops(lines: list[str]) -> bytes:
    ops = [b"BT /F1 12 Tf 72 720 Td 14 TL"]
    ops += [b"(" + line.encode("latin-1") + b") Tj T*" for line in lines]
    return b"\n".join(ops) + b"\nET"


def good_pdf(folder: Path, words: str) -> Path:
    """A readable two-page PDF holding ``words`` on its first page."""
    path = folder / "good.pdf"
    path.write_bytes(pdf_with_content([_text_ops([words]), _text_ops(["Second page."])], title="Good PDF"))
    return path


def huge_stream_pdf(folder: Path, size: int = 70_000_000) -> Path:
    """One page whose compressed content stream holds a ``size``-byte string (about 70 KB on disk)."""
    path = folder / "huge-stream.pdf"
    path.write_bytes(pdf_with_content([b"BT /F1 12 Tf 72 720 Td (" + b"a" * size + b") Tj ET"]))
    return path


def operators_pdf(folder: Path, count: int = 10_000_000) -> Path:
    """One page with ``count`` text-showing operators in one compressed stream."""
    path = folder / "operators.pdf"
    path.write_bytes(pdf_with_content([b"BT /F1 1 Tf " + b"(a) Tj " * count + b"ET"]))
    return path


def one_line_words(folder: Path, size: int = 15 << 20) -> Path:
    """``size`` bytes of words on one line, no newline (under the 16 MB file cap)."""
    path = folder / "one-line.txt"
    words = b"alpha beta gamma delta epsilon zeta eta theta iota kappa "
    path.write_bytes((words * (size // len(words) + 1))[:size])
    return path
