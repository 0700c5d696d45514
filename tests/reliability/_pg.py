"""Helpers of the store walls suites: tenant folders, snapshots of a collection's rows, counts per tenant."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

SAMPLE_KB = Path(__file__).parents[2] / "src" / "ragloop" / "data" / "sample_kb"


def tenant_folders(root: Path) -> tuple[Path, Path]:
    """Two tenants' folders: the sample knowledge base's first 17 files for acme, the other 17 for globex."""
    files = sorted(SAMPLE_KB.glob("*.md"))
    acme, globex = root / "acme", root / "globex"
    for folder, part in ((acme, files[:17]), (globex, files[17:])):
        folder.mkdir(parents=True)
        for f in part:
            shutil.copy(f, folder / f.name)
    return acme, globex


def snapshot(url: str, collection: str, where: str = "true") -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the collection's chunk, document and posting tables (as text), ordered; ``where`` filters
    the chunks (``metadata->>'tenant' = 'acme'``) and the postings and documents of those chunks."""
    import psycopg

    with psycopg.connect(url) as conn:
        chunks = conn.execute(
            f"select c::text, c.doc_id, c.chunk_id from {collection}_chunks c where {where} order by 1"
        ).fetchall()
        keys = sorted({(r[1], r[2]) for r in chunks})
        docs = sorted({r[1] for r in chunks})
        postings = conn.execute(
            f"select p::text from {collection}_postings p join unnest(%s::text[], %s::text[]) k(d, c) "
            "on p.doc_id = k.d and p.chunk_id = k.c order by 1",
            ([k[0] for k in keys], [k[1] for k in keys]),
        ).fetchall()
        doc_rows = conn.execute(
            f"select d::text from {collection}_docs d where d.doc_id = any(%s) order by 1", (docs,)
        ).fetchall()
    return {"chunks": [r[:1] for r in chunks], "postings": postings, "docs": doc_rows}


def tenant_counts(url: str, collection: str) -> dict[str | None, int]:
    """Stored documents per ``tenant`` metadata value."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"select metadata->>'tenant', count(distinct doc_id) from {collection}_chunks group by 1"
        ).fetchall()
    return {r[0]: int(r[1]) for r in rows}
