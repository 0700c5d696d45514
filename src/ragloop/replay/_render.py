"""A replay as JSON data, as a pull-request comment in Markdown, and as JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from ragloop.kbcheck import xml_text
from ragloop.replay._compare import VERDICTS, ReplayItem, ReplayReport

__all__ = ["as_dict", "junit_xml", "markdown"]

#: Questions listed per verdict in the Markdown summary (a comment must stay readable).
MARKDOWN_ROWS = 25


def _item(i: ReplayItem) -> dict[str, Any]:
    return {
        "question": i.question,
        "filters": {k: list(v) for k, v in i.filters},
        "verdict": i.verdict,
        "reason": i.reason,
        "turns": len(i.turn_ids),
        "turn_ids": list(i.turn_ids),
        "before": {"outcome": i.before.outcome, "pages": list(i.before.pages)},
        "after": {"outcome": i.after.outcome, "pages": list(i.after.pages)},
    }


def as_dict(report: ReplayReport) -> dict[str, Any]:
    """The report as one JSON-ready object: ``summary`` (counts per verdict, turns, skipped) and ``items``."""
    return {
        "summary": {
            **{v: report.count(v) for v in VERDICTS},
            "questions": len(report.items),
            "turns": report.turns,
            "skipped": dict(report.skipped),
            "ok": not report.broken,
        },
        "items": [_item(i) for i in report.items],
    }


def _cell(text: str) -> str:
    """Text safe in one Markdown table cell: one line, pipes and markup escaped."""
    flat = " ".join(xml_text(text)[0].split())
    for char in "\\|*_`[]<>#":
        flat = flat.replace(char, "\\" + char)
    return flat


def _pages(pages: tuple[str, ...]) -> str:
    return ", ".join(f"`{p.replace('`', '')}`" for p in pages) or "—"


def markdown(report: ReplayReport, *, title: str = "ragloop replay") -> str:
    """A summary fit for a pull-request comment: the counts, then the broken questions first, each with its question,
    outcome before and after, and pages (at most 25 per verdict, ``same`` ones only counted)."""
    status = "❌ something broke" if report.broken else "✅ nothing broke"
    counts = " · ".join(f"**{report.count(v)}** {v}" for v in VERDICTS)
    lines = [
        f"### {title}: {status}",
        "",
        f"{counts} — {len(report.items)} distinct questions from {report.turns} logged turns",
    ]
    for reason, n in report.skipped:
        lines.append(f"- {n} turns not replayed: {reason}")
    for which in VERDICTS[:-1]:
        rows = [i for i in report.items if i.verdict == which]
        if not rows:
            continue
        lines += ["", f"#### {which} ({len(rows)})", "", "| question | turns | before | after |", "|---|---|---|---|"]
        for i in rows[:MARKDOWN_ROWS]:
            before = f"{i.before.outcome}: {_pages(i.before.pages)}"
            after = f"{i.after.outcome}: {_pages(i.after.pages)}"
            lines.append(f"| {_cell(i.question)} | {len(i.turn_ids)} | {before} | {after} |")
        if len(rows) > MARKDOWN_ROWS:
            lines.append(f"\n… and {len(rows) - MARKDOWN_ROWS} more (`--json` lists them all)")
    return "\n".join(lines) + "\n"


def junit_xml(report: ReplayReport, *, suite: str = "ragloop replay") -> str:
    """One ``testcase`` per distinct question; a broken one has a ``failure`` with the before and after."""

    def safe(text: str) -> str:
        return xml_text(text)[0]

    broken = report.count("broken")
    root = ET.Element("testsuites", tests=str(len(report.items)), failures=str(broken))
    node = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(report.items)),
        failures=str(broken),
        errors="0",
        time=f"{report.seconds:.3f}",
    )
    for i in report.items:
        case = ET.SubElement(node, "testcase", classname=f"{suite}.{i.verdict}", name=safe(i.question[:200]))
        if i.verdict == "broken":
            failure = ET.SubElement(case, "failure", message=safe(i.reason), type="Broken")
            failure.text = safe(
                f"question: {i.question}\nbefore: {i.before.outcome} {', '.join(i.before.pages)}\n"
                f"after: {i.after.outcome} {', '.join(i.after.pages)}\nturns: {', '.join(i.turn_ids[:20])}"
            )
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
