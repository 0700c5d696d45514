"""Definitions on a real documentation site: does every chunk of an API's description name the API?

Ingests a folder of HTML pages (by default Debian's python3-doc, ``/usr/share/doc/python3/html``, all of it) with
``ragloop.ingest_path`` (MiniLM's tokenizer, 256-token chunks) twice, in child processes: with this tree's
``src/`` and with ``--before SRC`` (an exported ``src/`` of another commit: ``git archive main src | tar -x -C
/tmp/main``). Both sides are judged by the same reference, this tree's HTML loader, which marks each ``<dt>``
(the term: ``hashlib.sha256(data=b'')``) and the blocks of its ``<dd>``. Printed per side, with the load
average beside it:

- ``chunks`` and ``tokens`` (MiniLM tokens of all indexed chunk texts, titles included): the index's size;
  ``max_chunk_tokens``, the largest chunk's (the limit is 256);
- ``described``: chunks that hold the start of some description block (its first 60 characters, when no other
  block of the page starts with them);
- ``nameless``: of those, chunks in which the API's name (the term up to its parameters, ``hashlib.sha256``)
  appears nowhere: a chunk the answerer cannot name its API from;
- ``split_terms``: terms whose chunk does not also hold the start of their description's first block.

With ``--retrieval SET …`` (sets of ``bench_answers``' python3-doc sets: ``pydoc``, ``pydoc2``; never a held-out
set before its one look) it also builds each set's index (MiniLM) on each side and prints, over the set's
answerable questions, ``hit@5`` (a top-5 hybrid hit is a chunk of a listed page that holds the fact: the API's
name) and ``mrr@10`` (of the first such hit).

Usage::

    python benchmarks/bench_definitions.py --before /tmp/main/src --retrieval pydoc pydoc2 \
        --out benchmarks/results/definitions-pydoc.json

It writes the figures as JSON (``--out``) and prints a table. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
PYDOC_HTML = Path("/usr/share/doc/python3/html")
_PROBE = 60


def _name(term: str) -> str:
    """The API's name in a term: its first line up to the parameters, without a kind word (``class``)."""
    line = term.split("\n")[0].split("(")[0].split("[")[0].strip()
    return line.split()[-1] if line.split() else ""


def reference(folder: Path) -> dict[str, list[tuple[str, str, bool]]]:
    """Per page (its path under ``folder``): ``(term, probe, first)`` for each description block: the term, the
    first characters of the block's text (only a block whose first characters no other block of the page starts
    with: "A short usage example:" opens many), whether it is its description's first block."""
    from ragloop.retrievers.ingest._html import html_blocks

    out: dict[str, list[tuple[str, str, bool]]] = {}
    for path in sorted(folder.rglob("*.html")):
        _, blocks = html_blocks(path.read_text(encoding="utf-8", errors="replace"))
        seen = Counter(" ".join(b.text[:_PROBE].split()) for b in blocks)
        rows = []
        for prev, block in zip([None, *blocks], blocks, strict=False):
            probe = " ".join(block.text[:_PROBE].split())
            if block.term and not block.is_term and len(probe) >= 20 and seen[probe] == 1:
                rows.append((block.term, probe, prev is not None and prev.is_term))
        out[str(path.relative_to(folder))] = rows
    return out


def side(folder: Path) -> list[tuple[str, str, int]]:
    """``(doc id, text, tokens)`` of every chunk ``ingest_path`` cuts from ``folder`` (run in the child): its
    indexed text's MiniLM tokens, title and heading path and special tokens included (what the limit bounds)."""
    from ragloop.retrievers.embed import minilm_tokenizer
    from ragloop.retrievers.ingest import index_text, ingest_path

    tok = minilm_tokenizer()
    assert tok is not None
    chunks = ingest_path(folder, tokenizer=tok, include=("*.html",)).chunks
    counts = tok.token_spans([index_text(c) for c in chunks])
    return [(c.doc_id, c.text, len(n) + tok.special_tokens) for c, n in zip(chunks, counts, strict=True)]


def retrieval(names: list[str]) -> dict[str, dict[str, float]]:
    """``hit@5`` and ``mrr@10`` per set (see the module docstring; run in the child)."""
    import _answers
    import anyio
    import bench_answers

    out: dict[str, dict[str, float]] = {}
    for name in names:
        path, corpus = bench_answers.SETS[name]
        assert path is not None and corpus is not None
        index = bench_answers.open_index(name, corpus, "minilm", Path("/tmp"))
        asked = [q for q in _answers.load_set(path) if q["kind"] != "out_of_kb"]
        hits5 = rr = 0.0
        for q in asked:
            hits = anyio.run(index.search, q["question"], 10)
            good = [
                i
                for i, h in enumerate(hits)
                if (c := index.chunk(h.id)) is not None
                and c.doc_id in q["sources"]
                and any(_answers.has_fact(c.text, alt) for group in q["facts"] for alt in group)
            ]
            hits5 += bool(good and good[0] < 5)
            rr += 1 / (good[0] + 1) if good else 0.0
        out[name] = {
            "questions": len(asked),
            "hit@5": round(hits5 / len(asked), 3),
            "mrr@10": round(rr / len(asked), 3),
        }
    return out


def judge(chunks: list[tuple[str, str, int]], ref: dict[str, list[tuple[str, str, bool]]]) -> dict[str, Any]:
    """The figures of one side's chunks against the reference (see the module docstring)."""
    by_doc: dict[str, list[str]] = {}
    for doc, text, _ in chunks:
        by_doc.setdefault(doc, []).append(" ".join(text.split()))
    described = nameless = split = firsts = 0
    for doc, rows in ref.items():
        texts = by_doc.get(doc, [])
        for term, probe, first in rows:
            holders = [t for t in texts if probe in t]
            described += len(holders)
            name = _name(term)
            nameless += sum(1 for t in holders if name and name not in t)
            if first:
                firsts += 1
                line = " ".join(term.split("\n")[0].split())
                if not any(line in t for t in holders):
                    split += 1
    return {
        "chunks": len(chunks),
        "tokens": sum(n for _, _, n in chunks),
        "max_chunk_tokens": max((n for _, _, n in chunks), default=0),
        "described": described,
        "nameless": nameless,
        "terms": firsts,
        "split_terms": split,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=PYDOC_HTML)
    parser.add_argument("--before", type=Path, default=None, help="also cut with ragloop from this src/ folder")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--retrieval", nargs="*", default=[], choices=("pydoc", "pydoc2"), metavar="SET")
    parser.add_argument("--side", choices=("child", "retrieval"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "child":
        json.dump(side(args.folder), sys.stdout)
        return
    if args.side == "retrieval":
        json.dump(retrieval(args.retrieval), sys.stdout)
        return
    ref = reference(args.folder)
    report: dict[str, Any] = {"folder": str(args.folder), "pages": len(ref)}
    sides = [("after", ROOT / "src")] + ([("before", args.before)] if args.before else [])
    for label, src in sides:
        start = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(src)}
        run = subprocess.run(
            [sys.executable, __file__, "--folder", str(args.folder), "--side", "child"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        figures = judge([(d, t, n) for d, t, n in json.loads(run.stdout)], ref)
        figures["seconds"] = round(time.perf_counter() - start, 1)
        figures["load"] = [round(x, 2) for x in os.getloadavg()]
        if args.retrieval:
            run = subprocess.run(
                [sys.executable, __file__, "--side", "retrieval", "--retrieval", *args.retrieval],
                env={**env, "PYTHONPATH": f"{src}{os.pathsep}{ROOT / 'benchmarks'}"},
                capture_output=True,
                text=True,
                check=True,
            )
            for name, got in json.loads(run.stdout).items():
                figures.update({f"{name} {key}": value for key, value in got.items() if key != "questions"})
            figures["retrieval load"] = [round(x, 2) for x in os.getloadavg()]
        report[label] = figures
    keys = [key for key in report[sides[0][0]] if all(key in report[label] for label, _ in sides)]
    print(f"{'':>18}" + "".join(f"{label:>22}" for label, _ in sides))
    for key in keys:
        print(f"{key:>18}" + "".join(f"{report[label][key]!s:>22}" for label, _ in sides))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
