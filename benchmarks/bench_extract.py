"""Choosing the loaders by measurement: HTML main-content extractors and PDF text extractors on real files.

**HTML**: ragloop's extractor (selectolax/Lexbor with generator-aware main-content selection,
``ragloop.retrievers.ingest._html``), trafilatura (``extract(..., output_format="markdown")``) and
readability-lxml (``Document(...).summary()``, its text) on Sphinx pages of Debian's ``python3-doc`` and on the
hand-made MkDocs Material and Docusaurus fixture pages of ``tests/retrievers/fixtures/docs``. Per extractor:
milliseconds per page (median), and fidelity against the page's own main element:

- ``text_recall``: share of the main element's words (permalinks left out) found in the output;
- ``nav_leak``: share of pages whose output holds navigation text (the Sphinx sidebar's "Previous topic", "Show
  Source"…, the fixtures' cookie banner, "Edit this page", previous/next links);
- ``code_exact``: share of ``<pre>`` blocks whose every line, indentation included, is a line of the output;
- ``entities_once``: share of pages with an escaped ``&lt;`` in code whose decoded text (``<stdin>``…) survives;
- ``tables``: share of pages with a ``<table>`` whose output has markdown rows (``| a | b |``).

**PDF**: pypdf against pdfminer.six on the PDFs found under ``/usr/share/doc`` (and any ``--pdf`` given):
seconds per file (median of ``--repeats``), words out, and the Jaccard overlap of the two word sets.

The libraries compared with are not ragloop dependencies: ``pip install -r benchmarks/requirements-extract.txt``.
Nothing is asserted; a table is printed and JSON written to ``benchmarks/results/bench_extract.json``.

Usage: ``nice python benchmarks/bench_extract.py [--html-dir /usr/share/doc/python3/html] [--pages 60]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "retrievers" / "fixtures" / "docs"
RESULTS = ROOT / "benchmarks" / "results"
NAV = (
    "Previous topic",
    "Next topic",
    "This Page",
    "Show Source",
    "Report a Bug",
    "Quick search",
    "We use cookies",
    "Edit this page",
    "Previous Tutorial",
    "Made with Material",
    "On this page",
    "Built with Docusaurus",
)
_WORD = re.compile(r"\w+")


def _ragloop(html: str) -> str:
    from ragloop.retrievers.ingest import render
    from ragloop.retrievers.ingest._html import html_blocks

    return render(html_blocks(html)[1])


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, output_format="markdown", include_tables=True, include_comments=False) or ""


def _readability(html: str) -> str:
    import lxml.html
    from readability import Document

    summary = Document(html).summary(html_partial=True)
    return str(lxml.html.fromstring(summary).text_content()) if summary.strip() else ""


EXTRACTORS: dict[str, Callable[[str], str]] = {
    "ragloop (selectolax)": _ragloop,
    "trafilatura": _trafilatura,
    "readability-lxml": _readability,
}


def _truth(html: str) -> dict[str, Any]:
    """What the page's main element holds: its words, its <pre> blocks, whether it has tables and escapes."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html)
    main = next((n for s in ("[role=main]", "article", "main", "body") if (n := tree.css_first(s)) is not None), None)
    if main is None:
        return {"words": set(), "pres": [], "table": False, "escaped": []}
    for link in main.css("a.headerlink, a.hash-link, nav, footer, .md-source-file, .theme-doc-toc-mobile"):
        link.decompose()
    for br in main.css("pre br"):  # a <br> inside <pre> is a line break (Docusaurus ends every code line with one)
        br.replace_with("\n")
    pres = [p.text(deep=True) for p in main.css("pre")]
    escaped = sorted({m for p in pres for m in re.findall(r"<[a-z]+>", p)})
    return {
        "words": set(_WORD.findall(main.text(deep=True).lower())),
        "pres": pres,
        "table": main.css_first("table") is not None,
        "escaped": escaped,
    }


def _score(out: str, truth: dict[str, Any]) -> dict[str, float | None]:
    words = set(_WORD.findall(out.lower()))
    lines = {line.rstrip() for line in out.split("\n")}
    pres = [p for p in truth["pres"] if p.strip()]
    exact = [all(line.rstrip() in lines for line in p.split("\n") if line.strip()) for p in pres]
    return {
        "text_recall": len(words & truth["words"]) / len(truth["words"]) if truth["words"] else None,
        "nav_leak": float(any(n in out for n in NAV)),
        "code_exact": sum(exact) / len(exact) if exact else None,
        "entities_once": float(all(e in out for e in truth["escaped"])) if truth["escaped"] else None,
        "tables": float(bool(re.search(r"^\|.*\|\s*$", out, re.M))) if truth["table"] else None,
    }


def html_report(pages: list[Path], repeats: int) -> dict[str, Any]:
    raw = [p.read_text(encoding="utf-8", errors="replace") for p in pages]
    truths = [_truth(h) for h in raw]
    report: dict[str, Any] = {"pages": [str(p) for p in pages]}
    for name, extract in EXTRACTORS.items():
        try:
            extract(raw[0])
        except ImportError as exc:
            report[name] = {"error": f"not installed: {exc}"}
            continue
        times: list[float] = []
        scores: list[dict[str, float | None]] = []
        for html, truth in zip(raw, truths, strict=True):
            rounds = []
            for _ in range(repeats):
                started = time.perf_counter()
                out = extract(html)
                rounds.append(time.perf_counter() - started)
            times.append(statistics.median(rounds))
            scores.append(_score(out, truth))
        summary: dict[str, Any] = {"ms_per_page": 1000 * statistics.median(times)}
        for key in ("text_recall", "nav_leak", "code_exact", "entities_once", "tables"):
            values = [s[key] for s in scores if s[key] is not None]
            summary[key] = statistics.mean(v for v in values if v is not None) if values else None
            summary[f"{key}_pages"] = len(values)
        report[name] = summary
    return report


def pdf_report(pdfs: list[Path], repeats: int) -> dict[str, Any]:
    report: dict[str, Any] = {"files": {}}
    for pdf in pdfs:
        data = pdf.read_bytes()
        row: dict[str, Any] = {}
        texts: dict[str, str] = {}
        for name, run in (("pypdf", _pypdf), ("pdfminer.six", _pdfminer)):
            try:
                rounds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    texts[name] = run(data)
                    rounds.append(time.perf_counter() - started)
            except ImportError as exc:
                row[name] = {"error": f"not installed: {exc}"}
                continue
            row[name] = {"seconds": statistics.median(rounds), "words": len(_WORD.findall(texts[name]))}
        if len(texts) == 2:
            a, b = (set(_WORD.findall(t.lower())) for t in texts.values())
            row["jaccard"] = len(a & b) / len(a | b) if a | b else 1.0
        report["files"][str(pdf)] = row
    return report


def _pypdf(data: bytes) -> str:
    import io

    import pypdf

    return "\n".join(page.extract_text() or "" for page in pypdf.PdfReader(io.BytesIO(data)).pages)


def _pdfminer(data: bytes) -> str:
    import io

    from pdfminer.high_level import extract_text

    return str(extract_text(io.BytesIO(data)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--html-dir", default="/usr/share/doc/python3/html")
    p.add_argument("--pages", type=int, default=60, help="Sphinx pages to take (sorted, every k-th for spread)")
    p.add_argument("--pdf", action="append", default=[], help="a PDF to add; repeatable")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "bench_extract.json"))
    args = p.parse_args()
    sphinx = sorted(
        q for q in Path(args.html_dir).rglob("*.html") if "genindex" not in q.name and "_sources" not in q.parts
    )
    step = max(1, len(sphinx) // max(1, args.pages))
    pages = [*sphinx[::step][: args.pages], FIXTURES / "mkdocs.html", FIXTURES / "docusaurus.html"]
    pdfs = sorted(Path("/usr/share/doc").rglob("*.pdf")) + [Path(x) for x in args.pdf]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report = {"load_before": load, "html": html_report(pages, args.repeats), "pdf": pdf_report(pdfs, args.repeats)}
    report["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"HTML: {len(pages)} pages ({len(pages) - 2} Sphinx from {args.html_dir}, MkDocs and Docusaurus fixtures)")
    cols = ("ms_per_page", "text_recall", "nav_leak", "code_exact", "entities_once", "tables")
    print(f"  {'extractor':<22}" + "".join(f"{c:>15}" for c in cols))
    for name in EXTRACTORS:
        row = report["html"][name]
        if "error" in row:
            print(f"  {name:<22}{row['error']}")
            continue
        print(f"  {name:<22}" + "".join(f"{row[c]:>15.3f}" if row[c] is not None else f"{'-':>15}" for c in cols))
    print("PDF:")
    for pdf, row in report["pdf"]["files"].items():
        parts = [f"{k}: {v['seconds']:.3f}s {v['words']} words" for k, v in row.items() if isinstance(v, dict)]
        print(
            f"  {Path(pdf).name}: " + "; ".join(parts) + (f"; jaccard {row['jaccard']:.3f}" if "jaccard" in row else "")
        )
    print(f"load average before/after: {report['load_before']} / {report['load_after']}")


if __name__ == "__main__":
    main()
