"""Cleaning time against input size for each pathological pattern: does it grow linearly?

For every pattern that made the old cleaning regexes quadratic (issue 12: 64 KB of ``[a](`` took 53 s and 144 KB
of unclosed ``<script>`` 15 s), plus realistic markdown and HTML pages as a baseline, the script repeats the
pattern up to each size in ``--sizes`` (default 64 KB, 128 KB, 256 KB, 512 KB, 1 MB) and times
:func:`ragloop.retrievers.ingest.clean_text` on it (median of ``--repeats`` rounds; each round times every
size, so machine noise hits all sizes alike). Per pattern it reports the time at every size, µs per KB at the
largest size, the ratio of the largest to the smallest time (16 for linear growth from 64 KB to 1 MB, 256 for
quadratic) and the fitted exponent of time against size (1.0 is linear, 2.0 quadratic). It asserts nothing;
it prints a table and writes JSON to ``benchmarks/results/bench_clean.json``.

Usage: ``python benchmarks/bench_clean.py [--sizes 65536,131072,262144,524288,1048576] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

from ragloop.retrievers.ingest import clean_text

RESULTS = Path(__file__).parent / "results"

_PAGE_MD = (
    "## Webhooks\n\nRetries use [exponential backoff](https://example.com/retry) with `max_retries`.\n\n"
    "```python\nclient.retry(max_retries=5)\n```\n\n![Architecture diagram of the retry queue](img.png)\n\n"
)
_PAGE_HTML = (
    "<section><h2>Webhooks</h2><p>Retries use <a href='/retry'>exponential backoff</a>.</p>"
    "<script>track()</script><div style='display:none'>hidden</div><figure><img alt='Retry queue'>"
    "<figcaption>The retry queue</figcaption></figure></section>\n"
)

#: name → (repeated unit, format). The first two are realistic pages; the rest are the pathological patterns.
PATTERNS: dict[str, tuple[str, str]] = {
    "markdown page (baseline)": (_PAGE_MD, "markdown"),
    "html page (baseline)": (_PAGE_HTML, "html"),
    "markdown link  [a](": ("[a](", "markdown"),
    "markdown image  ![a](": ("![a](", "markdown"),
    "reference image  ![a": ("![a", "markdown"),
    "unclosed <script>": ("<script>", "html"),
    "unclosed <!--": ("x<!--", "markdown"),
    "unclosed CDATA": ("<![CDATA[", "html"),
    "unclosed <img": ("<img ", "html"),
    "unclosed <h1>": ("<h1>", "html"),
    "unclosed <figure>": ("<figure>", "html"),
    "unclosed hidden <div hidden>": ("<div hidden>", "html"),
    "<div> with display:none, closed": ("<div style='display:none'>x</div>", "html"),
    "declaration  <!x": ("<!x", "html"),
    "processing instruction  <?x": ("<?x", "html"),
    "wordpress [caption]": ("[caption]", "markdown"),
    "wordpress [a b]": ("[a b]", "markdown"),
    "hugo {{<": ("{{<", "markdown"),
    "jinja {%": ("{%", "markdown"),
    "jinja {{": ("{{", "markdown"),
    "jinja comment {#": ("{#", "markdown"),
    "backticks ``a`": ("``a`", "markdown"),
    "brackets [[[": ("[", "markdown"),
    "base64-like run": ("QUJDRGVm0123", "markdown"),
}


def text_of(unit: str, size: int) -> str:
    """``unit`` repeated to exactly ``size`` characters."""
    return (unit * (size // len(unit) + 1))[:size]


def time_clean(text: str, fmt: str, repeats: int) -> float:
    """Median seconds of ``clean_text(text, fmt)`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        clean_text(text, fmt)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def exponent(sizes: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(size): 1.0 for linear growth, 2.0 for quadratic."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(t, 1e-9)) for t in seconds]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    """Run the benchmark; print the table; write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,131072,262144,524288,1048576", help="characters, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run only patterns whose name contains this")
    parser.add_argument("--out", default=str(RESULTS / "bench_clean.json"))
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for name, (unit, fmt) in PATTERNS.items():
        if args.only and args.only not in name:
            continue
        texts = [text_of(unit, size) for size in sizes]
        runs: list[list[float]] = [[] for _ in sizes]
        for _ in range(args.repeats):  # rounds interleave the sizes, so machine noise hits every size alike
            for i, text in enumerate(texts):
                runs[i].append(time_clean(text, fmt, 1))
        seconds = [statistics.median(r) for r in runs]
        rows.append(
            {
                "pattern": name,
                "unit": unit if len(unit) < 20 else unit[:17] + "...",
                "format": fmt,
                "seconds": [round(s, 5) for s in seconds],
                "us_per_kb_at_largest": round(seconds[-1] / (sizes[-1] / 1024) * 1e6, 1),
                "ratio_largest_to_smallest": round(seconds[-1] / seconds[0], 2),
                "exponent": round(exponent(sizes, seconds), 2) if len(sizes) > 1 else None,
            }
        )
    report = {
        "benchmark": "bench_clean",
        "command": "python " + " ".join(["benchmarks/bench_clean.py", *sys.argv[1:]]),
        "sizes": sizes,
        "repeats": args.repeats,
        "size_ratio": sizes[-1] / sizes[0],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return 0
    heads = " ".join(f"{s // 1024:>7} KB" for s in sizes)
    print(f"{'pattern':<34} {'fmt':<8} {heads}  {'µs/KB':>7} {'ratio':>6} {'exp':>5}")
    for row in rows:
        cells = " ".join(f"{t * 1000:>8.1f}ms" for t in row["seconds"])
        print(
            f"{row['pattern']:<34} {row['format']:<8} {cells}  {row['us_per_kb_at_largest']:>7.1f} "
            f"{row['ratio_largest_to_smallest']:>6.1f} {row['exponent'] if row['exponent'] is not None else '':>5}"
        )
    print(f"size ratio {sizes[-1] / sizes[0]:g}: linear growth gives a time ratio near it and an exponent near 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
