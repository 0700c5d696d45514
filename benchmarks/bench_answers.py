"""Answers a user can read: does the reply lead with the answer, and does it say "not covered" honestly?

Runs the default offline turn (``ChatRAG.from_index``: offline judges, no model) on a question set and scores
every reply (:mod:`_answers`): ``answer@1`` (the expected fact in the reply's first sentence, or the first row of
a leading table, or a leading code block), ``answer@any`` (every expected fact anywhere in the reply),
``false-none`` (an answerable question answered ``none``), ``honest-none`` (a question outside the knowledge
base answered ``none`` with nothing cited), reply length, and whether a cited block comes from an expected page.

Sets (``--set``):

- ``sample``: ``benchmarks/data/sample_kb_questions.jsonl`` over the bundled sample knowledge base: answerable
  questions written as users ask them (expected fact phrases and pages), comparisons, and questions outside the
  knowledge base. Written and committed before any tuning.
- ``fastapi``: ``benchmarks/data/fastapi_docs_questions.jsonl`` over ``../shared/data/fastapi-docs`` (the same
  kinds; committed before any tuning).
- ``hotpotqa``: ``../shared/data/hotpotqa-dev200`` (answerable only; the gold answers of ``metadata.answers``).

**Tuning discipline.** Each set is split once, in code, into a tuning half and a validation half
(:func:`_answers.split_set`, seed 22, per kind; HotpotQA keeps ``bench_quality``'s seed-13 split, whose second
half is the validation half). Tune with ``--half tuning``. ``--half validation`` needs ``--note "the change"``
and appends its figures to ``results/validation-log.md``: one look per finished change.

Usage::

    python benchmarks/bench_answers.py --set sample --half tuning
    python benchmarks/bench_answers.py --set fastapi --half validation --note "answer-first answerer"

It writes ``results/answers-<set>-<half>.json`` (figures and one row per question) and prints a table, or one
JSON object of the figures with ``--json``. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import _answers
import anyio
import structlog

ROOT = Path(__file__).parents[1]
SHARED = ROOT / ".." / "shared" / "data"
SETS = {
    "sample": (_answers.DATA / "sample_kb_questions.jsonl", None),
    "fastapi": (_answers.DATA / "fastapi_docs_questions.jsonl", SHARED / "fastapi-docs"),
    "hotpotqa": (None, SHARED / "hotpotqa-dev200"),
}
HEADLINE = ("answer_at_1", "answer_any", "false_none", "honest_none", "reply_chars_median")


def hotpot_questions(folder: Path) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """HotpotQA's judged questions as a set (gold answers as one group of alternatives) and its seed-13 split."""
    import bench_quality

    from ragloop.retrievers.evaluate import load_qrels, load_queries

    qrels = {q: r for q, r in load_qrels(folder, "dev").items() if any(v > 0 for v in r.values())}
    queries = load_queries(folder)
    answers = bench_quality.load_answers(folder)
    rows = [
        {
            "id": qid,
            "kind": "answerable",
            "question": queries[qid],
            "facts": [answers[qid]],
            "sources": sorted(d for d, v in qrels[qid].items() if v > 0),
        }
        for qid in sorted(qrels)
        if qid in queries and qid in answers
    ]
    halves = bench_quality.split_halves([r["id"] for r in rows])
    return rows, {"tuning": halves["tuning"], "validation": halves["reporting"], "all": halves["all"]}


def open_index(name: str, corpus: Path | None, embedder: str, cache: Path) -> Any:
    """The set's index: the bundled sample's (cached by ``sample_index``), or the corpus folder's."""
    if corpus is None:
        from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
        from ragloop.sample import sample_index

        return sample_index(cache, embedder=MiniLMEmbedder() if embedder == "minilm" else HashEmbedder())
    import bench_quality

    return bench_quality.open_index(corpus, embedder, cache)


async def run_set(index: Any, questions: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Ask every question of the default offline turn; one scored row each, and seconds per question."""
    from ragloop.chat import ChatRAG

    rag = ChatRAG.from_index(index)
    rows = []
    started = time.perf_counter()
    try:
        for q in questions:
            reply = await rag.ask(q["question"], page_url=q.get("page_url"))
            docs = []
            for c in reply.citations:
                chunk = index.chunk(c.chunk_id)
                docs.append((chunk.doc_id or chunk.source) if chunk is not None else c.source)
            row = _answers.score(q, reply.text, reply.outcome, list(dict.fromkeys(docs)))
            row["reply"] = reply.text
            row["missing"] = list(reply.missing)
            rows.append(row)
    finally:
        await rag.aclose()
    return rows, (time.perf_counter() - started) / max(len(questions), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="sample", help="which question set")
    parser.add_argument("--half", choices=("tuning", "validation", "all"), default="tuning")
    parser.add_argument("--note", default="", help="the finished change a validation look confirms (required then)")
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ragloop-bench-quality"))
    parser.add_argument("--limit", type=int, default=None, help="first N questions of the half only (quick runs)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/answers-SET-HALF.json)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if args.half != "tuning" and not args.note.strip():
        parser.error("--half validation/all looks at validation questions: say which finished change with --note")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    path, corpus = SETS[args.set]
    if path is None:
        assert corpus is not None
        questions, halves = hotpot_questions(corpus)
    else:
        questions = _answers.load_set(path)
        halves = _answers.split_set(questions)
    if corpus is not None and not corpus.is_dir():
        sys.exit(f"{corpus} not found: the shared data lives in ../shared/data beside the project")
    wanted = set(halves[args.half])
    chosen = [q for q in questions if q["id"] in wanted][: args.limit]
    index = open_index(args.set, corpus, args.embedder, args.cache)
    rows, seconds = anyio.run(run_set, index, chosen)
    figures = _answers.summarise(rows)
    report = {
        "set": args.set,
        "half": args.half,
        "split_seed": _answers.SET_SEED if path is not None else 13,
        "questions": len(rows),
        "limit": args.limit,
        "embedder": index.embedder.name,
        "chunks": len(index.chunks),
        "commit": _answers.commit(),
        "load_average": _answers.load_average(),
        "seconds_per_question": seconds,
        "figures": figures,
        "per_question": rows,
    }
    out = args.out or _answers.RESULTS / f"answers-{args.set}-{args.half}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.half != "tuning":  # every look is logged, a partial one (--limit) too
        shown = {k: figures[k] for k in HEADLINE if figures.get(k) is not None}
        limit = f" (first {args.limit})" if args.limit is not None else ""
        _answers.log_validation("bench_answers.py", f"{args.set}/{args.half}{limit}", args.note, shown, out)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{args.set}, {args.half} half ({len(rows)} questions, {len(index.chunks)} chunks, {index.embedder.name}; "
        f"{seconds:.3f} s/q; load {report['load_average']})"
    )
    for key in (*HEADLINE, "cites_source", "comparison_answer_any", "reply_chars_mean"):
        value = figures.get(key)
        print(f"  {key:<24}{'-' if value is None else f'{value:.3f}'}")
    print(f"  outcomes                {figures['outcomes']}")


if __name__ == "__main__":
    main()
