"""A loaded index's first offline turn: with the heading vectors its save kept, and without them.

The offline judges weigh a passage's meaning against the corpus's own dense threshold
(:mod:`ragloop.retrievers.meaning`), measured on the index's page titles and section headings, each embedded by
MiniLM. An index saved by this ragloop keeps those vectors (``headings.npz``); one saved before them embeds the
headings when its chat is built (196 for the bundled sample knowledge base, four per call). This measures what a process
that has just started pays: the sample knowledge base's index is built and saved once, and a copy of it without
``headings.npz`` (the file and its manifest entry removed: an index from an older ragloop) is made; each run is a
fresh Python process that loads one of the two, builds ``ChatRAG.from_index`` (offline judges) and asks one
question, timing the load, the chat's construction (where the corpus's scale is measured) and the first turn (where
MiniLM's query-sized session is compiled when the scale did not compile it), and the last two together. The two
kinds alternate (kept, older, kept, …) so machine load hits both alike; the load average is printed beside the
medians. It asserts nothing; it writes ``benchmarks/results/bench_first_turn.json`` and ``.txt``.

Usage: ``python benchmarks/bench_first_turn.py [--runs 7] [--out PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gap_separation import write_results

RESULTS = Path(__file__).resolve().parent / "results"
QUESTION = "How do I set up SAML single sign-on, and which plan do I need?"

#: One run: load the index, build the chat, ask; print the times (seconds) as JSON.
_RUN = """
import json, sys, time
import anyio
t0 = time.perf_counter()
from ragloop import ChatRAG
from ragloop.retrievers.index import KnowledgeIndex
index = KnowledgeIndex.load(sys.argv[1])
t1 = time.perf_counter()
async def main():
    rag = ChatRAG.from_index(index)
    t2 = time.perf_counter()
    reply = await rag.ask(sys.argv[2])
    t3 = time.perf_counter()
    await rag.aclose()
    return t2, t3, reply.outcome, reply.text[:60]
t2, t3, outcome, lead = anyio.run(main)
print(json.dumps({"load_s": t1 - t0, "chat_s": t2 - t1, "first_turn_s": t3 - t2, "outcome": outcome, "lead": lead}))
"""


def _without_headings(saved: Path, copy: Path) -> Path:
    shutil.copytree(saved, copy)
    (copy / "headings.npz").unlink()
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"]["headings.npz"]
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy


def main(argv: list[str] | None = None) -> int:
    """Run it and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each kind")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_first_turn.json")
    args = parser.parse_args(argv)
    from ragloop.retrievers.embed import MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path
    from ragloop.sample import sample_kb_path

    with tempfile.TemporaryDirectory() as tmp:
        kept = KnowledgeIndex.build(ingest_path(sample_kb_path()).chunks, MiniLMEmbedder()).save(Path(tmp) / "kept")
        older = _without_headings(kept, Path(tmp) / "older")
        with np.load(kept / "headings.npz") as data:
            headings = len(data["texts"])
        runs: dict[str, list[dict[str, Any]]] = {"kept": [], "older": []}
        for _ in range(args.runs):
            for kind, path in (("kept", kept), ("older", older)):
                done = subprocess.run(
                    [sys.executable, "-c", _RUN, str(path), QUESTION], capture_output=True, text=True, check=True
                )
                runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/bench_first_turn.py", *sys.argv[1:]]),
        "question": QUESTION,
        "headings_kept": headings,
        "load_average_after": load,
        "runs": runs,
    }
    lines = [
        f"the sample knowledge base's saved index, a fresh process per run, {args.runs} runs of each kind "
        f"(median seconds; {headings} heading vectors kept; load average after: {load})",
        f"{'index':<34}{'load':>8}{'ChatRAG':>10}{'first turn':>12}{'both':>8}  outcome, lead",
    ]
    for kind, label in (("kept", "heading vectors kept (this save)"), ("older", "without them (an older save)")):
        rows = runs[kind]
        for r in rows:
            r["both_s"] = r["chat_s"] + r["first_turn_s"]
        med = {k: statistics.median(r[k] for r in rows) for k in ("load_s", "chat_s", "first_turn_s", "both_s")}
        report[kind] = {k: round(v, 4) for k, v in med.items()}
        lines.append(
            f"{label:<34}{med['load_s']:>8.3f}{med['chat_s']:>10.3f}{med['first_turn_s']:>12.3f}{med['both_s']:>8.3f}  "
            f"{rows[0]['outcome']}, {rows[0]['lead']!r}"
        )
    same = {json.dumps([r["outcome"], r["lead"]]) for rs in runs.values() for r in rs}
    report["same_reply"] = len(same) == 1
    lines.append(f"every run gave the same outcome and lead: {len(same) == 1}")
    write_results(args.out, report, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
