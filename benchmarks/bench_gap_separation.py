"""How far MiniLM's cosine alone separates the planted gap topics of ``bench_gap_topics.py`` (issue 34).

For each planted topic: its *weakest link* (the lowest, over its paraphrases, of a paraphrase's best cosine with
another paraphrase of the topic) and its *nearest crossing* (the highest cosine between one of its paraphrases and
another topic's). A topic whose weakest link is below its nearest crossing cannot be grouped whole by any
threshold on these cosines without first joining another topic's question; one within ``--margin`` above it
hardly can. Questions are embedded exactly as ``ragloop gaps --index`` embeds them (the index's MiniLM).

It asserts nothing; it prints a table per set and writes ``benchmarks/results/bench_gap_separation.json`` and
``.txt``.

Usage: ``python benchmarks/bench_gap_separation.py [--sets heldout-1,heldout-2,…] [--margin 0.05]``
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gap_topics import RESULTS, SETS


def separation(planted: dict[str, list[str]], vectors: np.ndarray) -> list[dict[str, Any]]:
    """Per topic of ``planted`` (its questions' unit ``vectors`` in the same order): weakest link, nearest
    crossing and their difference."""
    if any(len(qs) < 2 for qs in planted.values()):
        raise ValueError("every planted topic needs at least two paraphrases to have a weakest link")
    labels = [topic for topic, qs in planted.items() for _ in qs]
    sims = vectors @ vectors.T
    rows = []
    for topic in planted:
        mine = [i for i, t in enumerate(labels) if t == topic]
        others = [i for i, t in enumerate(labels) if t != topic]
        weakest = min(max(float(sims[i, j]) for j in mine if j != i) for i in mine)
        crossing = max(float(sims[i, j]) for i in mine for j in others)
        rows.append({"topic": topic, "weakest_link": round(weakest, 4), "nearest_crossing": round(crossing, 4),
                     "margin": round(weakest - crossing, 4)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run it and write the results."""
    from ragloop.retrievers.embed import MiniLMEmbedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(sorted(SETS)), help="comma-separated planted sets (default all)")
    parser.add_argument("--margin", type=float, default=0.05, help="a 'hardly separable' topic's margin (0.05)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_gap_separation.json")
    args = parser.parse_args(argv)
    embedder = MiniLMEmbedder()
    report: dict[str, Any] = {"command": " ".join(["python", "benchmarks/bench_gap_separation.py", *sys.argv[1:]])}
    lines = [f"MiniLM ({embedder.name}) cosines of planted questions; margin = weakest link - nearest crossing"]
    below = close = total = 0
    for name in args.sets.split(","):
        planted = SETS[name][0]
        questions = [q for qs in planted.values() for q in qs]
        rows = separation(planted, np.asarray(embedder.embed_sync(questions), dtype=np.float32))
        report[name] = rows
        lines.append(f"{name}:")
        for r in rows:
            lines.append(
                f"  {r['topic']:<14} weakest link {r['weakest_link']:.3f}  nearest crossing "
                f"{r['nearest_crossing']:.3f}  margin {r['margin']:+.3f}"
            )
        below += sum(r["margin"] < 0 for r in rows)
        close += sum(0 <= r["margin"] < args.margin for r in rows)
        total += len(rows)
    report["summary"] = {"topics": total, "below_zero": below, f"within_{args.margin}": close}
    lines.append(
        f"{total} topics: {below} with the weakest link below the nearest crossing, {close} more within "
        f"{args.margin} above it; Python {platform.python_version()}"
    )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    args.out.with_suffix(".txt").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
