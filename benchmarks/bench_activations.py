"""Retrieval quality of MiniLM on int8 activations against float activations, side by side (issue 31).

For each BEIR folder, the corpus is indexed twice with ``MiniLMEmbedder(runtime="openvino")``: once with
``activations="float"`` and once with ``activations="int8"`` (the default: the calibrated ranges of
``src/ragloop/retrievers/assets/minilm-activations.json``). Both indexes are scored in ``dense`` and ``hybrid``
mode (``ragloop eval``'s metrics; queries always run on ONNX Runtime's float session). Printed and written per
folder: nDCG@10 and recall@10 of each side and mode, the build's CPU seconds (ingestion included), and the least and
mean cosine between the two sides' vectors of the same chunks. Nothing is asserted.

The quantized variant was chosen on ``hotpotqa-dev200`` (all four kinds of projection input on int8 against
keeping the feed-forward output on float: both within 0.5 points there, the first faster); SciFact is the check.

Run: ``nice .venv/bin/python benchmarks/bench_activations.py --beir ../shared/data/hotpotqa-dev200
--beir ../shared/data/scifact-train:train --out benchmarks/results/bench_activations.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(folder: Path, split: str | None) -> dict[str, Any]:
    from ragloop.retrievers.embed import MiniLMEmbedder
    from ragloop.retrievers.evaluate import _open_index, evaluate_beir

    report: dict[str, Any] = {"folder": folder.name, "split": split}
    vectors: dict[str, Any] = {}
    for activations in ("float", "int8"):
        embedder = MiniLMEmbedder(runtime="openvino", threads=2, activations=activations)
        load, cpu = _load(), time.process_time()
        index = _open_index(folder, embedder, None, None)
        side: dict[str, Any] = {
            "activations": embedder.activations,
            "build_cpu_s": round(time.process_time() - cpu, 1),
            "load_before": load,
            "chunks": len(index.chunks),
        }
        for mode in ("dense", "hybrid"):
            metrics = evaluate_beir(folder, split, mode, embedder, index=index)
            side[mode] = {k: round(metrics[k], 4) for k in ("ndcg@10", "recall@10")}
        ids = [c.id for c in index.chunks]
        vectors[activations] = np.asarray(index.dense.vectors(ids))
        report[activations] = side
    cos = np.sum(vectors["float"] * vectors["int8"], axis=1)
    report["least_cosine"], report["mean_cosine"] = round(float(cos.min()), 5), round(float(cos.mean()), 5)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", action="append", required=True, help="FOLDER or FOLDER:SPLIT")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_activations.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "commit": commit, "runs": []}
    for spec in args.beir:
        folder, _, split = spec.partition(":")
        report = measure(Path(folder), split or None)
        out["runs"].append(report)
        f, q = report["float"], report["int8"]
        print(
            f"{report['folder']}: nDCG@10 dense {f['dense']['ndcg@10']:.4f} -> {q['dense']['ndcg@10']:.4f}, "
            f"hybrid {f['hybrid']['ndcg@10']:.4f} -> {q['hybrid']['ndcg@10']:.4f}; build CPU "
            f"{f['build_cpu_s']} -> {q['build_cpu_s']} s; cosine least {report['least_cosine']}, "
            f"mean {report['mean_cosine']} (float -> int8 activations)",
            flush=True,
        )
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
