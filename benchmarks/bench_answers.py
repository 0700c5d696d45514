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
- ``sample2``: ``benchmarks/data/sample_kb_questions_v2.jsonl`` over the sample knowledge base: the failure
  shapes of issue #33 (a fact in a table cell, a multi-part question, a short question whose page shares its
  head noun, a concept named otherwise), written before #33's tuning.
- ``small``: ``benchmarks/data/small_kb_questions.jsonl`` over three small knowledge bases worded unlike the
  sample (``benchmarks/data/small_kbs/``: a shop of 4 pages, a yoga studio of 5, a backup tool of 6), each its
  own index; paraphrased questions a customer would type, written before #33's tuning.
- ``small-heldout``: ``benchmarks/data/small_kb_heldout_questions.jsonl`` over three more small knowledge bases
  (``benchmarks/data/small_kbs_heldout/``: a gym's membership rules, a library's lending policy, a SaaS's
  billing FAQ; 4-5 one-paragraph pages each). **Held out whole**: written and committed before the second round
  of #33 tuning, never tuned on; look at it with ``--half all`` once, at the end.
- ``pydoc``: ``benchmarks/data/python_docs_questions.jsonl`` over ten pages of Debian's python3-doc
  (:data:`PYDOC_PAGES` of ``/usr/share/doc/python3/html/library``): API questions written before any answer on
  these pages was seen, the API's name as the fact. Held out whole like ``small-heldout``.
- ``small-heldout2`` and ``pydoc2``: fresh held-out sets of #33's third round, written and committed before any
  run on them: ``benchmarks/data/small_kb_heldout2_questions.jsonl`` over ``benchmarks/data/small_kbs_heldout2/``
  (a dental clinic, a municipal waste service, a bike rental; 4 one-paragraph pages each), and
  ``benchmarks/data/python_docs2_questions.jsonl`` over ten other python3-doc pages (:data:`PYDOC2_PAGES`).
  Looked at once, with ``--half all``, at the end of the round.
- ``pydoc3``: the fresh held-out set of #33's fourth round (an API's name kept with its description),
  ``benchmarks/data/python_docs3_questions.jsonl`` over ten more python3-doc pages (:data:`PYDOC3_PAGES`),
  written and committed before any code change and any run on it; looked at once, at the end of the round.
- ``pydoc4``, ``small-heldout3`` and ``sample3``: the fresh held-out sets of #33's fifth round (round 5), written
  and committed before any change of round 5 and any run on them: ``pydoc4`` is
  ``benchmarks/data/python_docs4_questions.jsonl`` over ten more python3-doc pages (:data:`PYDOC4_PAGES`);
  ``small-heldout3`` is ``benchmarks/data/small_kb_heldout3_questions.jsonl`` over
  ``benchmarks/data/small_kbs_heldout3/`` (a veterinary clinic, a coworking space, a ferry company; 4-5
  one-paragraph pages each); ``sample3`` is ``benchmarks/data/sample_kb_questions_v3.jsonl`` over the sample
  knowledge base (facts not asked by ``sample`` or ``sample2``). Looked at once, with ``--half all``, at the end of
  the round.
- ``pydoc5``: #33 round 6's held-out set, written and committed before any change of round 6 and any run on it:
  ``benchmarks/data/python_docs5_questions.jsonl`` over ten more python3-doc pages (:data:`PYDOC5_PAGES`).
  Looked at once, with ``--half all``, at the end of the round.
- ``pydoc6``, ``small-heldout4`` and ``sample4``: #33 round 7's held-out sets, written and committed by a helper
  before any change of round 7 and any run on them: ``pydoc6`` is ``benchmarks/data/python_docs6_questions.jsonl``
  over ten more python3-doc pages (:data:`PYDOC6_PAGES`); ``small-heldout4`` is
  ``benchmarks/data/small_kb_heldout4_questions.jsonl`` over ``benchmarks/data/small_kbs_heldout4/`` (a language
  school, a self-storage company, a campsite; 4-5 one-paragraph pages each); ``sample4`` is
  ``benchmarks/data/sample_kb_questions_v4.jsonl`` over the sample knowledge base (facts not asked by ``sample``,
  ``sample2`` or ``sample3``). Looked at once, with ``--half all``, at the end of the round.
- ``pydoc7``, ``small-heldout5`` and ``sample5``: #33 round 8's held-out sets, written and committed before any change
  of round 8 and any run on them (by a helper): ``pydoc7`` is ``benchmarks/data/python_docs7_questions.jsonl`` over
  ten more python3-doc pages (:data:`PYDOC7_PAGES`); ``small-heldout5`` is
  ``benchmarks/data/small_kb_heldout5_questions.jsonl`` over ``benchmarks/data/small_kbs_heldout5/`` (a hostel, a
  driving school, a piano tuner; 4-5 one-paragraph pages each); ``sample5`` is
  ``benchmarks/data/sample_kb_questions_v5.jsonl`` over the sample knowledge base (facts not asked by ``sample``,
  ``sample2``, ``sample3`` or ``sample4``). Looked at once, with ``--half all``, at the end of the round.

**Before and after in one run.** ``--before SRC`` runs the same questions a second time with ``ragloop``
imported from ``SRC`` (an exported ``src/`` of another commit, e.g. ``git archive main src | tar -x -C
/tmp/main``), in a subprocess, right after this tree's run, and prints both columns with the load average
beside each; the report holds both.

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
import os
import sys
import time
from pathlib import Path
from typing import Any

import _answers
import anyio
import structlog

ROOT = Path(__file__).parents[1]
SHARED = ROOT / ".." / "shared" / "data"
#: Debian's python3-doc (``apt install python3-doc``): the real documentation site of the ``pydoc`` set.
PYDOC = Path("/usr/share/doc/python3/html/library")
#: The pages of ``PYDOC`` the ``pydoc`` set indexes (``ingest_path(include=...)``), chosen with its questions.
PYDOC_PAGES = (
    "secrets.html", "shutil.html", "json.html", "random.html", "textwrap.html",
    "tempfile.html", "csv.html", "zipfile.html", "glob.html", "fnmatch.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc2`` set indexes: none of :data:`PYDOC_PAGES`, chosen with its questions.
PYDOC2_PAGES = (
    "hashlib.html", "base64.html", "heapq.html", "bisect.html", "statistics.html",
    "difflib.html", "uuid.html", "itertools.html", "functools.html", "os.path.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc3`` set indexes: none of :data:`PYDOC_PAGES` or :data:`PYDOC2_PAGES`.
PYDOC3_PAGES = (
    "collections.html", "dataclasses.html", "enum.html", "pathlib.html", "string.html",
    "copy.html", "pprint.html", "contextlib.html", "operator.html", "calendar.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc4`` set indexes: none of the earlier sets' pages (#33 round 5's held-out set).
PYDOC4_PAGES = (
    "datetime.html", "re.html", "logging.html", "subprocess.html", "argparse.html",
    "math.html", "sqlite3.html", "urllib.parse.html", "shlex.html", "struct.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc5`` set indexes: none of the earlier sets' pages (#33 round 6's held-out set).
PYDOC5_PAGES = (
    "fractions.html", "decimal.html", "tarfile.html", "configparser.html", "zoneinfo.html",
    "ipaddress.html", "timeit.html", "concurrent.futures.html", "traceback.html", "mimetypes.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc6`` set indexes: none of the earlier sets' pages (#33 round 7's held-out set).
PYDOC6_PAGES = (
    "gzip.html", "pickle.html", "getpass.html", "hmac.html", "html.html",
    "queue.html", "atexit.html", "filecmp.html", "tomllib.html", "graphlib.html",
)  # fmt: skip
#: The pages of ``PYDOC`` the ``pydoc7`` set indexes: none of the earlier sets' pages (#33 round 8's held-out set).
PYDOC7_PAGES = (
    "zlib.html", "unicodedata.html", "weakref.html", "array.html", "sched.html",
    "shelve.html", "signal.html", "webbrowser.html", "platform.html", "locale.html",
)  # fmt: skip
PYDOC_SETS = {
    "pydoc": PYDOC_PAGES,
    "pydoc2": PYDOC2_PAGES,
    "pydoc3": PYDOC3_PAGES,
    "pydoc4": PYDOC4_PAGES,
    "pydoc5": PYDOC5_PAGES,
    "pydoc6": PYDOC6_PAGES,
    "pydoc7": PYDOC7_PAGES,
}
SETS = {
    "sample": (_answers.DATA / "sample_kb_questions.jsonl", None),
    "fastapi": (_answers.DATA / "fastapi_docs_questions.jsonl", SHARED / "fastapi-docs"),
    "hotpotqa": (None, SHARED / "hotpotqa-dev200"),
    "sample2": (_answers.DATA / "sample_kb_questions_v2.jsonl", None),
    "small": (_answers.DATA / "small_kb_questions.jsonl", _answers.DATA / "small_kbs"),
    "small-heldout": (_answers.DATA / "small_kb_heldout_questions.jsonl", _answers.DATA / "small_kbs_heldout"),
    "pydoc": (_answers.DATA / "python_docs_questions.jsonl", PYDOC),
    "small-heldout2": (_answers.DATA / "small_kb_heldout2_questions.jsonl", _answers.DATA / "small_kbs_heldout2"),
    "pydoc2": (_answers.DATA / "python_docs2_questions.jsonl", PYDOC),
    "pydoc3": (_answers.DATA / "python_docs3_questions.jsonl", PYDOC),
    "pydoc4": (_answers.DATA / "python_docs4_questions.jsonl", PYDOC),
    "small-heldout3": (_answers.DATA / "small_kb_heldout3_questions.jsonl", _answers.DATA / "small_kbs_heldout3"),
    "sample3": (_answers.DATA / "sample_kb_questions_v3.jsonl", None),
    "pydoc5": (_answers.DATA / "python_docs5_questions.jsonl", PYDOC),
    "pydoc6": (_answers.DATA / "python_docs6_questions.jsonl", PYDOC),
    "small-heldout4": (_answers.DATA / "small_kb_heldout4_questions.jsonl", _answers.DATA / "small_kbs_heldout4"),
    "sample4": (_answers.DATA / "sample_kb_questions_v4.jsonl", None),
    "pydoc7": (_answers.DATA / "python_docs7_questions.jsonl", PYDOC),
    "small-heldout5": (_answers.DATA / "small_kb_heldout5_questions.jsonl", _answers.DATA / "small_kbs_heldout5"),
    "sample5": (_answers.DATA / "sample_kb_questions_v5.jsonl", None),
}
SMALL_SETS = ("small", "small-heldout", "small-heldout2", "small-heldout3", "small-heldout4", "small-heldout5")
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
    if name in PYDOC_SETS:
        from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
        from ragloop.retrievers.index import KnowledgeIndex
        from ragloop.retrievers.ingest import ingest_path

        emb = MiniLMEmbedder() if embedder == "minilm" else HashEmbedder()
        return KnowledgeIndex.build(ingest_path(corpus, include=PYDOC_SETS[name]).chunks, emb)
    import bench_quality

    return bench_quality.open_index(corpus, embedder, cache)


def small_indexes(folder: Path, embedder: str) -> dict[str, Any]:
    """One in-memory index per small knowledge base (a sub-folder of ``folder``), keyed by its name."""
    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path

    emb = MiniLMEmbedder() if embedder == "minilm" else HashEmbedder()
    return {
        kb.name: KnowledgeIndex.build(ingest_path(kb).chunks, emb) for kb in sorted(folder.iterdir()) if kb.is_dir()
    }


async def run_small(indexes: dict[str, Any], questions: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """:func:`run_set` per small knowledge base (each question names its ``kb``), rows in question order."""
    rows: dict[str, dict[str, Any]] = {}
    seconds = 0.0
    for kb, index in indexes.items():
        mine = [q for q in questions if q.get("kb") == kb]
        if mine:
            got, per = await run_set(index, mine)
            rows.update({r["id"]: r for r in got})
            seconds += per * len(mine)
    return [rows[q["id"]] for q in questions if q["id"] in rows], seconds / max(len(questions), 1)


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
    parser.add_argument("--before", type=Path, default=None, help="also run with ragloop from this src/ folder")
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
    if args.set in SMALL_SETS:
        assert corpus is not None
        indexes = small_indexes(corpus, args.embedder)
        index = next(iter(indexes.values()))
        rows, seconds = anyio.run(run_small, indexes, chosen)
        chunks = sum(len(i.chunks) for i in indexes.values())
    else:
        index = open_index(args.set, corpus, args.embedder, args.cache)
        rows, seconds = anyio.run(run_set, index, chosen)
        chunks = len(index.chunks)
    load_after = _answers.load_average()
    figures = _answers.summarise(rows)
    before = run_before(args) if args.before is not None else None
    report = {
        "set": args.set,
        "half": args.half,
        "split_seed": _answers.SET_SEED if path is not None else 13,
        "questions": len(rows),
        "limit": args.limit,
        "embedder": index.embedder.name,
        "chunks": chunks,
        "commit": _answers.commit(),
        "load_average": load_after,
        "seconds_per_question": seconds,
        "figures": figures,
        "per_question": rows,
    }
    if before is not None:
        report["before"] = before
    out = args.out or _answers.RESULTS / f"answers-{args.set}-{args.half}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.half != "tuning" and not os.environ.get("RAGLOOP_BENCH_NO_LOG"):  # every look is logged (--limit too)
        shown = {k: figures[k] for k in HEADLINE if figures.get(k) is not None}
        if before is not None:
            old = before["figures"]
            shown = {k: f"{_answers._fmt(old.get(k))} -> {_answers._fmt(v)}" for k, v in shown.items()}
        limit = f" (first {args.limit})" if args.limit is not None else ""
        _answers.log_validation("bench_answers.py", f"{args.set}/{args.half}{limit}", args.note, shown, out)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{args.set}, {args.half} half ({len(rows)} questions, {chunks} chunks, {index.embedder.name}; "
        f"{seconds:.3f} s/q; load {load_after})"
    )
    old = before["figures"] if before is not None else None
    if before is not None:
        print(f"  {'':<24}{'before':>8}{'after':>8}   (before: {args.before}, load {before['load_average']})")
    for key in (*HEADLINE, "wrong_context", "cites_source", "comparison_answer_any", "reply_chars_mean"):
        value = figures.get(key)
        shown = "-" if value is None else f"{value:.3f}"
        if old is not None:
            was = old.get(key)
            print(f"  {key:<24}{'-' if was is None else f'{was:.3f}':>8}{shown:>8}")
        else:
            print(f"  {key:<24}{shown}")
    if old is not None:
        print(f"  outcomes before         {old['outcomes']}")
    print(f"  outcomes                {figures['outcomes']}")


def run_before(args: argparse.Namespace) -> dict[str, Any]:
    """The same questions answered with ``ragloop`` imported from ``args.before`` (a subprocess), its report."""
    import subprocess
    import tempfile

    src = args.before.resolve()
    if not (src / "ragloop" / "__init__.py").is_file():
        sys.exit(f"--before {src}: not a src/ folder holding ragloop/ (export one: git archive main src | tar -x)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "before.json"
        cmd = [sys.executable, __file__, "--set", args.set, "--half", args.half, "--embedder", args.embedder]
        cmd += ["--cache", str(args.cache), "--out", str(out), "--json"]
        cmd += ["--note", args.note or "before"] + (["--limit", str(args.limit)] if args.limit is not None else [])
        env = {**os.environ, "PYTHONPATH": str(src), "RAGLOOP_BENCH_NO_LOG": "1"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    report.pop("per_question_before", None)
    return report


if __name__ == "__main__":
    main()
