"""Tiny binary documents made at test time: a two-page PDF with an outline (a minimal PDF writer) and a DOCX
(python-docx), so no binary fixture is committed."""

from __future__ import annotations

import io
from pathlib import Path


def write_pdf(path: Path, pages: list[str], *, title: str = "", outline: list[tuple[str, int]] = ()) -> Path:  # type: ignore[assignment]
    """A PDF with one line of Helvetica text per page, an optional /Title and outline entries ``(title, page)``."""
    objects: list[bytes] = []

    def add(body: str | bytes) -> int:
        objects.append(body.encode("latin-1") if isinstance(body, str) else body)
        return len(objects)

    catalog = add("")  # filled in below
    pages_obj = add("")
    font = add("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    page_ids = []
    for text in pages:
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode("latin-1")
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        page_ids.append(
            add(
                f"<< /Type /Page /Parent {pages_obj} 0 R /MediaBox [0 0 612 792] "
                f"/Resources << /Font << /F1 {font} 0 R >> >> /Contents {content} 0 R >>"
            )
        )
    kids = " ".join(f"{p} 0 R" for p in page_ids)
    objects[pages_obj - 1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(page_ids)} >>".encode()
    extra = ""
    if outline:
        root = add("")
        items = []
        for name, page in outline:
            items.append(add(f"<< /Title ({name}) /Parent {root} 0 R /Dest [{page_ids[page - 1]} 0 R /Fit] >>"))
        for i, item in enumerate(items):
            links = (f" /Prev {items[i - 1]} 0 R" if i else "") + (
                f" /Next {items[i + 1]} 0 R" if i + 1 < len(items) else ""
            )
            objects[item - 1] = objects[item - 1][:-2] + links.encode() + b" >>"
        objects[root - 1] = (
            f"<< /Type /Outlines /First {items[0]} 0 R /Last {items[-1]} 0 R /Count {len(items)} >>".encode()
        )
        extra = f" /Outlines {root} 0 R"
    objects[catalog - 1] = f"<< /Type /Catalog /Pages {pages_obj} 0 R{extra} >>".encode()
    info = add(f"<< /Title ({title}) >>") if title else 0
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % n + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for off in offsets:
        out.write(b"%010d 00000 n \n" % off)
    trailer = f"<< /Size {len(objects) + 1} /Root {catalog} 0 R" + (f" /Info {info} 0 R" if info else "") + " >>"
    out.write(f"trailer\n{trailer}\nstartxref\n{xref}\n%%EOF\n".encode())
    path.write_bytes(out.getvalue())
    return path


def write_docx(path: Path) -> Path:
    """A Word document with a title, a heading, prose, a bullet, a code line and a table."""
    import docx

    document = docx.Document()
    document.core_properties.title = "Release Notes"
    document.add_heading("Release Notes", level=0)
    document.add_heading("Fixes", level=1)
    document.add_paragraph("Crash on start fixed & logged.")
    document.add_paragraph("Faster search", style="List Bullet")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate((("Version", "Date"), ("2.1", "2024-05-01"))):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.save(str(path))
    return path
