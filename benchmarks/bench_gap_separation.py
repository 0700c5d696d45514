"""How far an encoder's cosine alone separates the planted gap topics of ``bench_gap_topics.py`` (issue 34).

For each planted topic: its *weakest link* (the lowest, over its paraphrases, of a paraphrase's best cosine with
another paraphrase of the topic) and its *nearest crossing* (the highest cosine between one of its paraphrases and
another topic's). A topic whose weakest link is below its nearest crossing cannot be grouped whole by any
threshold on these cosines without first joining another topic's question; one within ``--margin`` above it
hardly can. Over all pairs of planted questions it also reports the AUC: the chance that two paraphrases of one
topic are closer than two questions of different topics. Questions are embedded exactly as ``ragloop gaps
--index`` embeds them (the index's MiniLM).

With ``--mpnet DIR`` the same is measured beside MiniLM with all-mpnet-base-v2 (12 layers, 110 M parameters,
five times MiniLM-L6's; run in numpy by ``_mpnet.py``, whose docstring says where the weights come from): does a
larger general-purpose encoder separate the topics that MiniLM cannot?

It asserts nothing; it prints a table per set and encoder and writes ``benchmarks/results/bench_gap_separation.json``
and ``.txt`` (``bench_gap_separation-mpnet`` with ``--mpnet``).

The default runs every planted set, an unseen one (``heldout-7``) included: name ``--sets`` to keep it unseen.

Usage: ``python benchmarks/bench_gap_separation.py [--sets heldout-1,heldout-2,…] [--margin 0.05] [--mpnet DIR]``
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable, Sequence
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


def pair_auc(planted: dict[str, list[str]], vectors: np.ndarray) -> tuple[list[float], list[float]]:
    """The cosines of every pair of ``planted`` questions: same-topic pairs, then pairs across topics."""
    labels = [topic for topic, qs in planted.items() for _ in qs]
    sims = vectors @ vectors.T
    same: list[float] = []
    cross: list[float] = []
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            (same if labels[i] == labels[j] else cross).append(float(sims[i, j]))
    return same, cross


def auc(same: Sequence[float], cross: Sequence[float]) -> float:
    """The chance that a score of ``same`` (a same-topic pair's cosine) is above one of ``cross`` (a pair across
    topics), ties counting half."""
    a, b = np.asarray(same)[:, None], np.asarray(cross)[None, :]
    return float((a > b).mean() + 0.5 * (a == b).mean())


def _measure(label: str, embed: Callable[[list[str]], np.ndarray], sets: list[str], margin: float) -> tuple[
    dict[str, Any], list[str]
]:  # fmt: skip
    report: dict[str, Any] = {}
    lines = [f"{label} cosines of planted questions; margin = weakest link - nearest crossing"]
    below = close = total = 0
    same: list[float] = []
    cross: list[float] = []
    for name in sets:
        planted = SETS[name][0]
        vectors = np.asarray(embed([q for qs in planted.values() for q in qs]), dtype=np.float32)
        rows = separation(planted, vectors)
        report[name] = rows
        lines.append(f"{name}:")
        for r in rows:
            lines.append(
                f"  {r['topic']:<14} weakest link {r['weakest_link']:.3f}  nearest crossing "
                f"{r['nearest_crossing']:.3f}  margin {r['margin']:+.3f}"
            )
        below += sum(r["margin"] < 0 for r in rows)
        close += sum(0 <= r["margin"] < margin for r in rows)
        total += len(rows)
        s, c = pair_auc(planted, vectors)
        same += s
        cross += c
    pairs = auc(same, cross)
    report["summary"] = {"topics": total, "below_zero": below, f"within_{margin}": close, "pair_auc": round(pairs, 4),
                         "same_topic_mean": round(float(np.mean(same)), 4),
                         "cross_topic_mean": round(float(np.mean(cross)), 4)}  # fmt: skip
    lines.append(
        f"{total} topics: {below} with the weakest link below the nearest crossing, {close} more within "
        f"{margin} above it; same-topic pairs closer than pairs across topics (AUC) {pairs:.3f}, mean cosine "
        f"{np.mean(same):.3f} same topic, {np.mean(cross):.3f} across"
    )
    return report, lines


def main(argv: list[str] | None = None) -> int:
    """Run it and write the results."""
    from ragloop.retrievers.embed import MiniLMEmbedder

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(sorted(SETS)), help="comma-separated planted sets (default all)")
    parser.add_argument("--margin", type=float, default=0.05, help="a 'hardly separable' topic's margin (0.05)")
    parser.add_argument(
        "--mpnet", type=Path, default=None,
        help="an all-mpnet-base-v2 sentence-transformers folder (see benchmarks/_mpnet.py): measure it beside MiniLM",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="the results file (default results/"
                        "bench_gap_separation.json, or bench_gap_separation-mpnet.json with --mpnet)")  # fmt: skip
    args = parser.parse_args(argv)
    out = args.out or RESULTS / ("bench_gap_separation-mpnet.json" if args.mpnet else "bench_gap_separation.json")
    sets = args.sets.split(",")
    embedder = MiniLMEmbedder()
    report, lines = _measure(f"MiniLM ({embedder.name})", embedder.embed_sync, sets, args.margin)
    report["command"] = " ".join(["python", "benchmarks/bench_gap_separation.py", *sys.argv[1:]])
    if args.mpnet is not None:
        from _mpnet import MPNetEncoder

        encoder = MPNetEncoder(args.mpnet)
        report["mpnet"], more = _measure(f"MPNet ({encoder.name}, numpy)", encoder.embed, sets, args.margin)
        lines += more
    write_results(out, report, lines)
    return 0


def write_results(out: Path, report: dict[str, Any], lines: list[str]) -> None:
    """Print ``lines`` (and the Python version) and write them to ``out`` with ``.txt``, ``report`` to ``out``."""
    text = "\n".join([*lines, f"Python {platform.python_version()}"]) + "\n"
    print(text, end="")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".txt").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
