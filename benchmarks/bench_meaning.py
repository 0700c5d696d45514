"""What the corpus' own dense threshold costs (issue 33, round 5): start-up and the offline turn, side by side.

:mod:`ragloop.retrievers.meaning` measures a threshold when the chat is built (each heading one document holds is
embedded and compared with every chunk of the other documents), and with it the offline answerer scores the
sentences of the two blocks nearest the question by meaning on every turn. Two chats over the same MiniLM index:

- ``before``: the judges built from the corpus without a scale (``Corpus.of(chunks)``, no ``meaning``) — the
  judges of main before the change, since without a scale they take every decision as they did;
- ``after``: ``ChatRAG.from_index(index)``, the scale measured.

Questions: every question of a ``bench_answers.py`` set (``--set``: the sample's by default, or ``pydoc`` on
Debian's python3-doc), asked round-robin (before, after, before, …) for ``--rounds`` rounds after three untimed
warm-up questions, so load hits both alike; the load average is printed beside each figure. It reports each
chat's build time, the turns' p50 / p95 / mean — the first round apart (``first``: every question asked for the
first time) from the later ones (``repeat``: the answerer keeps the sentence vectors it embedded) — and the share
of replies that differ. It asserts nothing; it writes
``benchmarks/results/bench_meaning-<set>.json``.

Usage: ``python benchmarks/bench_meaning.py [--set sample|pydoc|…] [--rounds 3] [--out PATH] [--limit N]``;
``--scale-only`` prints the threshold a set's index measures and stops (small sets, one index per knowledge
base, are not supported: they have fewer headings than a scale needs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import _answers
import anyio
import bench_answers
import structlog

from ragloop.chat import ChatRAG
from ragloop.retrievers.scope import Corpus
from ragloop.turn import Turn

RESULTS = Path(__file__).parent / "results"


def _chats(index: Any) -> tuple[dict[str, ChatRAG], dict[str, float]]:
    """The two chats and how long each took to build (the judges are built with the turn)."""
    built: dict[str, float] = {}
    started = time.perf_counter()
    turn = Turn.from_retriever(
        index.retriever("hybrid"), Corpus.of(index.chunks), embedder=index.embedder, index_version=lambda: "v"
    )
    before = ChatRAG(turn)
    built["before"] = time.perf_counter() - started
    started = time.perf_counter()
    after = ChatRAG.from_index(index)
    built["after"] = time.perf_counter() - started
    return {"before": before, "after": after}, built


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: Asked once by each chat before anything is timed (the answerer's bulk model loads on its first turn).
WARM_UP = ("How do I get started?", "What does it cost?", "Who can see my data?")


def _times(ts: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(1000 * statistics.median(ts), 1),
        "p95_ms": round(1000 * _pct(ts, 0.95), 1),
        "mean_ms": round(1000 * statistics.mean(ts), 1),
        "turns": len(ts),
    }


async def _run(chats: dict[str, ChatRAG], questions: list[str], rounds: int) -> dict[str, Any]:
    """Round 1 asks each question for the first time (``first``); later rounds ask them again (``repeat``: the
    answerer keeps the sentence vectors it embedded, so a page asked about before costs less)."""
    for q in WARM_UP:
        for chat in chats.values():
            await chat.ask(q)
    times: dict[str, dict[str, list[float]]] = {name: {"first": [], "repeat": []} for name in chats}
    replies: dict[str, dict[str, str]] = {name: {} for name in chats}
    for r in range(rounds):
        for q in questions:
            for name, chat in chats.items():
                started = time.perf_counter()
                reply = await chat.ask(q)
                times[name]["first" if r == 0 else "repeat"].append(time.perf_counter() - started)
                replies[name][q] = reply.text
    for chat in chats.values():
        await chat.aclose()
    differ = sum(replies["before"][q] != replies["after"][q] for q in questions) / len(questions)
    out: dict[str, Any] = {
        name: {kind: _times(ts) for kind, ts in by_kind.items() if ts} for name, by_kind in times.items()
    }
    return out | {"replies_that_differ": round(differ, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(bench_answers.SETS), default="sample")
    parser.add_argument("--scale-only", action="store_true", help="print the set's measured threshold and stop")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N questions only (smoke runs)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.set in bench_answers.SMALL_SETS:
        parser.error(f"--set {args.set}: one index per small knowledge base, each with too few headings for a scale")
    path, corpus = bench_answers.SETS[args.set]
    index = bench_answers.open_index(args.set, corpus, "minilm", Path("/tmp/ragloop-bench-quality"))
    if args.scale_only:
        scales = index.meaning_scales()
        print(f"{args.set}: {len(index.chunks)} chunks; {scales(None) if scales is not None else None}")
        return
    questions = [q["question"] for q in _answers.load_set(path)][: args.limit]
    load_before = os.getloadavg()
    chats, built = _chats(index)
    scale = index.meaning_scales()
    measured = scale(None) if scale is not None else None
    turns = anyio.run(_run, chats, questions, args.rounds)
    report = {
        "set": args.set,
        "chunks": len(index.chunks),
        "questions": len(questions),
        "rounds": args.rounds,
        "threshold": None if measured is None else measured.threshold,
        "pseudo_questions": None if measured is None else measured.questions,
        "build_s": {k: round(v, 3) for k, v in built.items()},
        "turns": turns,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "commit": _answers.commit(),
    }
    out = args.out or RESULTS / f"bench_meaning-{args.set}.json"
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(
        f"{args.set}: {len(index.chunks)} chunks, {len(questions)} questions x {args.rounds} rounds; threshold "
        f"{report['threshold']} from {report['pseudo_questions']} headings"
    )
    print(f"  load {load_before} -> {report['load_after']}")
    print(f"  build      before {built['before']:.2f} s   after {built['after']:.2f} s")
    for name in ("before", "after"):
        for kind, t in turns[name].items():
            ms = f"p50 {t['p50_ms']} ms  p95 {t['p95_ms']} ms  mean {t['mean_ms']} ms"
            print(f"  turn {name:<6} {kind:<6} {ms} ({t['turns']} turns)")
    print(f"  replies that differ: {turns['replies_that_differ']:.1%}")


if __name__ == "__main__":
    main()
