"""The content-gap report as one static HTML file: inline style, inline SVG charts, no script, nothing fetched."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from html import escape

from ragloop.gaps._report import GapReport, StalePage, Topic

__all__ = ["CAUSE_COLORS", "CAUSE_NAMES", "report_html"]

#: How each cause reads in the report, and its colour in the charts.
CAUSE_NAMES = {
    "contradicting": "contradicting sources",
    "no_passage": "no passage",
    "irrelevant": "found, graded irrelevant",
    "partial": "partly covered",
    "stale": "stale page",
    "rated_down": "rated down",
}
CAUSE_COLORS = {
    "contradicting": "#b3261e",
    "no_passage": "#6a1b9a",
    "irrelevant": "#d35400",
    "partial": "#b7950b",
    "stale": "#00695c",
    "rated_down": "#546e7a",
}
_LINES = ("#0b5fcc", "#b3261e", "#2e7d32", "#6a1b9a")

_STYLE = (
    """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1f24; background: #fff;
       margin: 0 auto; max-width: 64rem; padding: 1.25rem; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; } h2 { font-size: 1.1rem; margin: 1.75rem 0 .5rem; }
.muted { color: #5b6470; } .small { font-size: .85rem; }
.charts { display: grid; gap: 1rem; }
figure { margin: 0; border: 1px solid #d5dae0; border-radius: .5rem; padding: .75rem; }
figcaption { font-weight: 600; margin-bottom: .25rem; }
svg text { font: 12px system-ui, sans-serif; fill: #1b1f24; }
.legend { display: flex; flex-wrap: wrap; gap: .25rem 1rem; font-size: .8rem; margin-top: .25rem; }
.swatch { display: inline-block; width: .75rem; height: .75rem; border-radius: .15rem; margin-right: .3rem;
          vertical-align: -1px; }
.topic { border: 1px solid #d5dae0; border-radius: .5rem; padding: .75rem 1rem; margin: .75rem 0; }
.topic h3 { margin: 0; font-size: 1rem; } .topic p { margin: .35rem 0; }
.badge { display: inline-block; color: #fff; border-radius: 1rem; padding: 0 .6rem; font-size: .8rem; }
.stats { color: #5b6470; font-size: .85rem; }
.status { border: 1px solid currentColor; border-radius: 1rem; padding: 0 .5rem; font-size: .8rem; }
.s-open { color: #9a3412; } .s-fixed { color: #166534; } .s-reopened { color: #991b1b; }
ul { margin: .25rem 0; padding-left: 1.25rem; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .5rem; border-bottom: 1px solid #e3e7eb; vertical-align: top; }
"""
    + "".join(f".c-{c} {{ background: {color}; }}\n" for c, color in CAUSE_COLORS.items())
    + "".join(f".l-{k} {{ background: {color}; }}\n" for k, color in enumerate(_LINES))
)


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()
    return f"default-src 'none'; style-src 'sha256-{digest}'; img-src data:; base-uri 'none'; form-action 'none'"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _bars(topics: Sequence[Topic]) -> str:
    shown = topics[:12]
    if not shown:
        return '<p class="muted">No topics in this period.</p>'
    width, label_w, row_h, top = 760, 280, 26, 8
    most = max(t.users for t in shown) or 1
    span = width - label_w - 120
    height = top + row_h * len(shown) + 8
    parts = [
        f'<svg id="topics-chart" role="img" aria-label="Topics by users" viewBox="0 0 {width} {height}" '
        f'width="100%" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, t in enumerate(shown):
        y = top + i * row_h
        w = max(2.0, span * t.users / most)
        color = CAUSE_COLORS[t.cause]
        name = escape(f"{t.rank}. {_short(t.label, 38)}")
        tip = escape(f"{t.label}: {t.users} users, {t.turns} turns, {CAUSE_NAMES[t.cause]}")
        parts.append(
            f'<g class="bar"><title>{tip}</title>'
            f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">{name}</text>'
            f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" rx="3" fill="{color}"/>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 17}">{t.users} users · {t.turns} turns</text></g>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span><span class="swatch c-{c}"></span>{escape(CAUSE_NAMES[c])}</span>'
        for c in dict.fromkeys(t.cause for t in shown)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _trend(report: GapReport) -> str:
    days = report.days
    series = [("all gap turns", report.daily_gaps)] + [(f"{t.rank}. {t.label}", t.daily) for t in report.topics[:3]]
    width, height, left, right, top, bottom = 760, 230, 40, 28, 12, 34
    most = max([1, *(max(s, default=0) for _, s in series)])
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i: int) -> float:
        return left + (plot_w * i / (len(days) - 1) if len(days) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h * (1 - v / most)

    parts = [
        f'<svg id="trend-chart" role="img" aria-label="Gap turns per day" viewBox="0 0 {width} {height}" '
        f'width="100%" xmlns="http://www.w3.org/2000/svg">'
    ]
    for v in sorted({0, most // 2, most}):
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e3e7eb"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>'
        )
    step = max(1, len(days) // 8)
    for i in range(0, len(days), step):
        parts.append(f'<text x="{x(i):.1f}" y="{height - 12}" text-anchor="middle">{escape(days[i][5:])}</text>')
    for k, (name, values) in enumerate(series):
        color = _LINES[k % len(_LINES)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        dash = "" if k == 0 else ' stroke-dasharray="5 3"'
        parts.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="{2.5 if k == 0 else 1.75}"{dash} '
            f'points="{points}"><title>{escape(name)}</title></polyline>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span><span class="swatch l-{k % len(_LINES)}"></span>{escape(_short(n, 40))}</span>'
        for k, (n, _) in enumerate(series)
    )
    return "".join(parts) + f'<div class="legend">{legend}</div>'


def _topic(t: Topic) -> str:
    examples = "".join(f"<li>{escape(e)}</li>" for e in t.examples)
    pages = ", ".join(f"{escape(p.title)} <span class='muted'>({escape(p.source)})</span>" for p in t.pages) or "none"
    comments = "".join(f"<li>“{escape(c)}”</li>" for c in t.comments)
    rated = (f" · {t.down} thumbs down" if t.down else "") + (f" · {t.up} thumbs up" if t.up else "")
    status = (
        f'<span class="status s-{escape(t.status)}">{escape(t.status)}</span> <span class="muted small">'
        f"{escape(t.gap_id)}</span>"
        if t.gap_id
        else ""
    )
    seen = (
        f'<p class="small muted">first seen {escape(t.first_seen or "?")} · last seen {escape(t.last_seen or "?")}'
        f" · {escape(t.status)} since {escape(t.status_since or '?')} · per week: "
        + ", ".join(f"{escape(week)}: {n}" for week, n in t.weekly)
        + "</p>"
        if t.gap_id
        else ""
    )
    return (
        f'<section class="topic" id="topic-{t.rank}"><h3>{t.rank}. {escape(t.label)} '
        f'<span class="badge c-{t.cause}">{escape(CAUSE_NAMES[t.cause])}</span> {status}</h3>'
        f'<p class="stats">{t.users} users · {t.turns} turns · {escape(t.trend)}{rated}</p>{seen}'
        f"<p>{escape(t.detail)}</p>"
        f'<p class="small">Questions:</p><ul class="small">{examples}</ul>'
        f'<p class="small">Nearest pages: {pages}</p>'
        + (f'<p class="small">Comments:</p><ul class="small">{comments}</ul>' if comments else "")
        + "</section>"
    )


def _stale(report: GapReport) -> str:
    if not report.stale:
        return '<p class="muted">No stale page was cited in this period.</p>'

    def why(s: StalePage) -> str:
        return f"valid until {s.valid_until or '?'}" if s.reason == "expired" else f"updated {s.updated or '?'}"

    rows = "".join(
        f"<tr><td>{escape(s.title)}<br><span class='muted small'>{escape(s.source)}</span></td>"
        f"<td>{escape(s.owner or '—')}</td><td>{escape(why(s))}</td>"
        f"<td>{s.citations}</td><td>{s.users}</td></tr>"
        for s in report.stale
    )
    head = "<tr><th>Page</th><th>Owner</th><th>Why stale</th><th>Cited in</th><th>Users</th></tr>"
    return f'<table id="stale">{head}{rows}</table>'


def _when(iso: str) -> str:
    """``2025-05-05T00:00:00Z`` as ``2025-05-05 00:00 UTC``."""
    return iso.replace("T", " ").replace(":00Z", " UTC")


def report_html(report: GapReport) -> str:
    """The report as one self-contained HTML page (open it from disk; it loads nothing)."""
    summary = (
        f"{report.turns} turns from {report.users} users; {report.gap_turns} ended without a full answer or were "
        f"rated down, in {len(report.topics)} topics"
        + (f" (and {report.unclustered} in smaller ones)" if report.unclustered else "")
        + "."
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_csp()}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Content gaps · ragloop</title><style>{_STYLE}</style></head><body>"
        f"<h1>What the knowledge base is missing</h1>"
        f'<p class="muted">{escape(_when(report.since))} to {escape(_when(report.until))} · {escape(summary)}</p>'
        f'<div class="charts"><figure><figcaption>Topics by users</figcaption>{_bars(report.topics)}</figure>'
        f"<figure><figcaption>Gap turns per day</figcaption>{_trend(report)}</figure></div>"
        f"<h2>Topics</h2>{''.join(_topic(t) for t in report.topics) or '<p class=muted>None.</p>'}"
        f"<h2>Stale pages cited</h2>{_stale(report)}"
        f'<p class="muted small">Grouped by {escape(report.method)}.</p>'
        "</body></html>\n"
    )
