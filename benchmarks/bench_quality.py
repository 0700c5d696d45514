"""Quality: single-shot retrieval against the offline agentic turn, on a BEIR-layout folder.

Both arms search the same :class:`~ragloop.retrievers.index.KnowledgeIndex` of the folder's corpus (hybrid
mode: bm25s + dense, RRF-fused), built once with ``--embedder`` (MiniLM by default) and cached under
``--cache`` (``/tmp/ragloop-bench-quality``).

**Tuning discipline.** The judged questions are split once into a *tuning* half and a *validation* half (called
*reporting* before issue 22): the sorted query ids shuffled with ``random.Random(13)`` (``SPLIT_SEED``), first
half tuning. Thresholds are chosen with ``--half tuning`` (the default); figures are quoted from ``--half
validation``, which needs ``--note "the finished change"`` and appends its figures to
``results/validation-log.md`` (one look per finished change). ``--half all`` runs both.

- **single_shot**: the question as one query, ``search(question, k=30)``; documents ranked by their best
  chunk's score (the ``ragloop eval`` convention), top 10 scored. Its answer is the offline answerer's over
  its top ``max_blocks`` chunks, outcome ``context``.
- **agentic**: ``ChatRAG.from_index(index)`` — the default turn with the offline judges (decide's splitting,
  grading, rewriting, the hop, the verify step; no model, no network) — asked the question. Every ``search``
  the turn makes is recorded. Its documents are ranked by the turn's final ranking
  (the default ranker, :class:`ragloop.retrievers.ranking.FusionRanker`, recomputed here from the recorded
  searches and the record's grades): every search's list fused by rank, grades as a factor, the question's own
  top 5 protected.

Metrics: :func:`ragloop.retrievers.evaluate.evaluate_run`'s recall@2, recall@5, recall@10 and nDCG@10 (BEIR /
trec_eval definitions), retrieval calls and wall seconds per question (the agentic figure includes the offline
judges), and per arm at answer level: ``answer_recall`` (a normalised gold answer, ``metadata.answers``,
appears in the reply as whole words; ``None`` without gold answers), ``supported_rate`` (cited sentences with
at least 80 % of their key terms in the blocks they cite), ``context_precision`` (of the replies with
outcome ``context``, the share that hold the gold answer), and, as ``bench_answers.py`` scores them
(:mod:`_answers`), ``answer_at_1`` (a gold answer in the reply's first sentence), ``false_none`` (replies with
outcome ``none``: every question here has an answer in the corpus) and ``reply_chars_median``. The full
report — also ``kept_only`` recall (the answer's blocks alone) and a diagnosis (how often decide split the
question, a rewrite or a hop ran, where the judged documents were lost) — goes to
``benchmarks/results/quality-<folder>-<half>.json``.

Usage::

    python benchmarks/bench_quality.py --beir ../shared/data/hotpotqa-dev200 --split dev --half tuning
    python benchmarks/bench_quality.py --beir ../shared/data/scifact-train --split train --half tuning --json

With ``--json`` it prints one object ``{"single_shot": {...}, "agentic": {...}}``, each keyed ``recall@2``,
``recall@5``, ``recall@10``, ``ndcg@10``, ``retrieval_calls_per_question``, ``seconds_per_question``,
``answer_recall``, ``answer_at_1``, ``false_none``, ``reply_chars_median``, ``supported_rate``,
``context_precision``. It never asserts anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _answers
import anyio
import structlog

from ragloop.retrievers.evaluate import evaluate_run, load_qrels, load_queries, rank_docs
from ragloop.retrievers.fusion import FusionSettings
from ragloop.retrievers.rerank import RerankSettings

RESULTS = Path(__file__).parent / "results"
KEYS = ("recall@2", "recall@5", "recall@10", "ndcg@10", "retrieval_calls_per_question", "seconds_per_question")
ANSWER_KEYS = (
    "answer_recall",
    "answer_at_1",
    "false_none",
    "reply_chars_median",
    "supported_rate",
    "context_precision",
)
#: The feature rerank switched off (``--no-rerank``).
NO_RERANK = RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0)
#: The seed of the tuning/reporting split (stated in benchmarks/README.md; never change it after reporting).
SPLIT_SEED = 13
_CITED = re.compile(r"\[(\d+)\]")
#: Whether the agentic arm's ranking is reranked (``--no-rerank`` measures the fused order alone).
RERANK = True
#: ``--lead``: the fusion settings of the agentic arm's default ranker (``FusionSettings.lead``).
FUSION = FusionSettings()
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


def split_halves(qids: Sequence[str], seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """The judged questions split into a tuning half and a reporting half (seeded shuffle of the sorted ids)."""
    order = sorted(qids)
    random.Random(seed).shuffle(order)
    mid = len(order) // 2
    return {"tuning": sorted(order[:mid]), "reporting": sorted(order[mid:]), "all": sorted(order)}


def load_answers(folder: Path) -> dict[str, list[str]]:
    """Gold answer strings per query id (``metadata.answers``; HotpotQA has them, SciFact does not)."""
    out: dict[str, list[str]] = {}
    with (folder / "queries.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                d = json.loads(line)
                answers = (d.get("metadata") or {}).get("answers") or []
                if answers:
                    out[str(d["_id"])] = [str(a) for a in answers]
    return out


def normalise(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = re.sub(r"[^\w\s]", " ", text.casefold())
    return " ".join(_ARTICLES.sub(" ", text).split())


def has_answer(reply: str, answers: Sequence[str]) -> bool:
    """Whether a normalised gold answer appears, as whole words, in the normalised reply."""
    body = f" {normalise(reply)} "
    return any(normalise(a) and f" {normalise(a)} " in body for a in answers)


def sentence_support(reply: str, blocks: Sequence[Any]) -> tuple[int, int]:
    """(supported, cited) sentences of a reply: a sentence carrying ``[n]`` is supported when at least 80 % of
    its key terms occur in the blocks it cites. Independent of the turn's own verify step (plain key-term
    overlap, no embeddings)."""
    from ragloop.text.terms import key_terms, stem, tokenize

    by_n = {b.n: {stem(t) for t in tokenize(b.text)} for b in blocks}
    supported = cited = 0
    for sentence in re.split(r"(?<=\])\s+|\n+", reply):
        ns = [int(n) for n in _CITED.findall(sentence)]
        if not ns:
            continue
        cited += 1
        stems = set().union(*(by_n.get(n, set()) for n in ns))
        terms = {t.stem for t in key_terms(_CITED.sub("", sentence))}
        if terms and len(terms & stems) / len(terms) >= 0.8:
            supported += 1
    return supported, cited


def answer_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """answer_recall, supported_rate and context_precision of one arm (``None`` without gold answers)."""
    judged = [r for r in rows if r["answers"]]
    cited = sum(r["cited"] for r in rows)
    context = [r for r in judged if r["outcome"] == "context"]
    return {
        "answer_recall": sum(r["has_answer"] for r in judged) / len(judged) if judged else None,
        "answer_at_1": sum(r["answer_at_1"] for r in judged) / len(judged) if judged else None,
        "false_none": sum(r["outcome"] == "none" for r in rows) / len(rows) if rows else None,
        "reply_chars_median": statistics.median(r["reply_chars"] for r in rows) if rows else None,
        "supported_rate": sum(r["supported"] for r in rows) / cited if cited else None,
        "context_precision": sum(r["has_answer"] for r in context) / len(context) if context else None,
    }


def answer_row(reply_text: str, outcome: str, blocks: Sequence[Any], answers: Sequence[str]) -> dict[str, Any]:
    supported, cited = sentence_support(reply_text, blocks)
    return {
        "answers": list(answers),
        "has_answer": has_answer(reply_text, answers) if answers else None,
        "answer_at_1": any(_answers.has_fact(_answers.first_unit(reply_text), a) for a in answers) if answers else None,
        "reply_chars": len(reply_text),
        "outcome": outcome,
        "supported": supported,
        "cited": cited,
    }


#: The ranked list the turn's ranker returned for the last question (what it cited from).
RANKED: list[list[Any]] = []


class RankRecorder:
    """A ranker wrapper that keeps the list the wrapped ranker returned (the agentic arm's ranking)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def rank(self, candidates: Any) -> list[Any]:
        ranked = list(await self.inner.rank(candidates))
        RANKED[:] = [ranked]
        return ranked

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


class Recording:
    """A retriever wrapper that keeps every search's query and hits (for the agentic arm's ranking)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, list[Any]]] = []

    async def search(self, query: str, k: int = 10) -> Sequence[Any]:
        hits = list(await self.inner.search(query, k))
        self.calls.append((query, hits))
        return hits


def open_index(folder: Path, embedder_name: str, cache: Path) -> Any:
    """The folder's index, built once and cached under ``cache``."""
    from ragloop.errors import IndexError_
    from ragloop.retrievers.embed import HashEmbedder, MiniLMEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path

    embedder = MiniLMEmbedder() if embedder_name == "minilm" else HashEmbedder()
    target = cache / f"{folder.resolve().name}-{embedder.name}"
    if (target / "manifest.json").is_file():
        try:
            return KnowledgeIndex.load(target, embedder)
        except IndexError_:
            pass
    t = time.perf_counter()
    index = KnowledgeIndex.build(ingest_path(folder).chunks, embedder)
    index.save(target)
    print(f"built index of {len(index.chunks)} chunks in {time.perf_counter() - t:.0f}s → {target}", file=sys.stderr)
    return index


def doc_of(index: Any, chunk_id: str) -> str:
    chunk = index.chunk(chunk_id)
    return (chunk.doc_id or chunk.id) if chunk is not None else chunk_id


def best_by_doc(index: Any, hits: Sequence[Any]) -> dict[str, float]:
    docs: dict[str, float] = {}
    for hit in hits:
        doc = hit.chunk.doc_id or hit.id
        if hit.score > docs.get(doc, -math.inf):
            docs[doc] = hit.score
    return docs


def as_run(order: Sequence[str]) -> dict[str, float]:
    """A ranked list as a run whose scores reproduce the order."""
    return {doc: float(len(order) - i) for i, doc in enumerate(order)}


async def single_shot(
    index: Any, rag: Any, queries: dict[str, str], qids: list[str], answers: dict[str, list[str]]
) -> tuple[dict[str, Any], float, list[dict[str, Any]]]:
    """One hybrid search per question (k=30), documents by best chunk; answered by the offline answerer over
    its top ``max_blocks`` chunks with outcome ``context`` (one search has no way to say it found nothing)."""
    from ragloop.state import ContextBlock

    retriever = index.retriever("hybrid")
    answer_node: Any = rag.nodes["answer"]
    await retriever.search(queries[qids[0]], 30)  # warm-up
    run: dict[str, dict[str, float]] = {}
    found: dict[str, list[Any]] = {}
    t = time.perf_counter()
    for qid in qids:
        found[qid] = list(await retriever.search(queries[qid], 30))
        run[qid] = as_run(rank_docs(best_by_doc(index, found[qid]))[:10])
    seconds = (time.perf_counter() - t) / len(qids)
    rows = []
    for qid in qids:
        q = queries[qid]
        blocks = [
            ContextBlock(n, h.chunk.text, h.chunk.source, h.chunk.title, h.id, q, h.chunk.url)
            for n, h in enumerate(found[qid][: answer_node.max_blocks], start=1)
        ]
        text = answer_node.answerer.compose(q, blocks, "context")
        rows.append(answer_row(text, "context", blocks, answers.get(qid, [])))
    return run, seconds, rows


async def agentic(
    index: Any,
    rag: Any,
    queries: dict[str, str],
    qids: list[str],
    qrels: dict[str, dict[str, int]],
    answers: dict[str, list[str]],
) -> tuple[dict[str, Any], dict[str, Any], float, float, list[dict[str, Any]], list[dict[str, Any]]]:
    node: Any = rag.nodes["retrieve"]
    recording = Recording(node.retriever)
    node.retriever = recording
    await rag.ask(queries[qids[0]])  # warm-up
    run: dict[str, dict[str, float]] = {}
    kept: dict[str, dict[str, float]] = {}
    calls: list[int] = []
    seconds: list[float] = []
    rows: list[dict[str, Any]] = []
    answer_rows: list[dict[str, Any]] = []
    for qid in qids:
        recording.calls.clear()
        RANKED.clear()
        t = time.perf_counter()
        reply = await rag.ask(queries[qid])
        seconds.append(time.perf_counter() - t)
        calls.append(len(recording.calls))
        block_docs = list(dict.fromkeys(doc_of(index, b.chunk_id) for b in reply.blocks))
        ranking = RANKED.pop() if RANKED else turn_ranking(queries[qid], reply.record, recording.calls)
        run[qid] = as_run(list(dict.fromkeys(doc_of(index, h.id) for h in ranking))[:10])
        kept[qid] = as_run(block_docs[:10])
        rows.append(diagnose(index, qid, qrels[qid], reply, recording.calls, block_docs))
        answer_rows.append(answer_row(reply.text, reply.outcome, reply.blocks, answers.get(qid, [])))
        rows[-1]["has_answer"] = answer_rows[-1]["has_answer"]
    return run, kept, sum(calls) / len(calls), statistics.mean(seconds), rows, answer_rows


def turn_ranking(question: str, record: Any, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
    """The turn's final ranking, as its default ranker computes it (:class:`ragloop.retrievers.ranking.FusionRanker`
    over the recorded searches and the record's grades): every search's list fused by rank, the grades as a
    signal, the question's own list protected, the head reranked (unless ``--no-rerank``: the fused order alone,
    to measure the reranker)."""
    from ragloop.retrievers.fusion import anchor_query
    from ragloop.retrievers.ranking import Candidates, FusionRanker

    searches = {query: list(hits) for query, hits in calls}
    grades: dict[str, list[Any]] = {}
    for g in record.grades:
        grades.setdefault(g.chunk_id, []).append(g.label)
    decided = record.decision.queries
    anchor = anchor_query(question, decided, searches)
    parts = [q for q in decided if q != anchor] if len(decided) > 1 else []
    hops = {h.query for h in record.hops if h.accepted and h.query}
    return (FusionRanker(FUSION) if RERANK else FusionRanker(FUSION, NO_RERANK)).order(
        Candidates(question, searches, grades, anchor, parts, hops)
    )


def diagnose(
    index: Any, qid: str, rels: dict[str, int], reply: Any, calls: list[tuple[str, list[Any]]], block_docs: list[str]
) -> dict[str, Any]:
    """Where each judged document went in one turn."""
    record = reply.record
    gold = {d for d, r in rels.items() if r > 0}
    first = record.decision.queries
    hop_queries = {h.query for h in record.hops if h.accepted and h.query}
    found_by: dict[str, set[str]] = {}
    for query, hits in calls:
        for hit in hits:
            found_by.setdefault(hit.chunk.doc_id or hit.id, set()).add(query)
    labels: dict[str, str] = {}
    order = {"relevant": 0, "partial": 1, "irrelevant": 2}
    for g in record.grades:
        doc = doc_of(index, g.chunk_id)
        if doc not in labels or order[g.label] < order[labels[doc]]:
            labels[doc] = g.label
    fates = {}
    for doc in gold:
        if doc in block_docs:
            fates[doc] = "in_blocks"
        elif doc not in found_by:
            fates[doc] = "not_retrieved"
        elif doc in labels:
            fates[doc] = f"graded_{labels[doc]}_not_kept" if labels[doc] != "irrelevant" else "graded_irrelevant"
        else:
            fates[doc] = "retrieved_not_graded"
    return {
        "qid": qid,
        "decide_queries": len(first),
        "queries": [q for q, _ in calls],
        "rewrites": len([r for r in record.rewrites if r.accepted]),
        "hops": len([h for h in record.hops if h.accepted]),
        "fast_path": record.fast_path,
        "outcome": reply.outcome,
        "gold_fates": fates,
        "gold_found_only_by_rewrite": sum(1 for d in gold if d in found_by and not (found_by[d] & set(first))),
        # the hop's paragraph found but not cited: a judged document the hop's search returned, not in the blocks
        "hop_found_not_cited": sorted(
            d for d in gold if found_by.get(d, set()) & hop_queries and d not in block_docs and d in fates
        ),
        "hop_found_fates": {d: fates[d] for d in gold if found_by.get(d, set()) & hop_queries},
    }


def summarise_diagnosis(rows: list[dict[str, Any]]) -> dict[str, Any]:
    fates = Counter(f for r in rows for f in r["gold_fates"].values())
    total = sum(fates.values()) or 1
    return {
        "questions": len(rows),
        "split_into_2plus_queries": sum(r["decide_queries"] > 1 for r in rows) / len(rows),
        "mean_decide_queries": statistics.mean(r["decide_queries"] for r in rows),
        "with_accepted_rewrite": sum(r["rewrites"] > 0 for r in rows) / len(rows),
        "with_hop": sum(r["hops"] > 0 for r in rows) / len(rows),
        "fast_path": sum(r["fast_path"] for r in rows) / len(rows),
        "outcomes": dict(Counter(r["outcome"] for r in rows)),
        "gold_fate_share": {k: v / total for k, v in fates.most_common()},
        "gold_found_only_by_rewrite": sum(r["gold_found_only_by_rewrite"] for r in rows),
        "gold_docs": total,
        "hop_found_gold": sum(len(r["hop_found_fates"]) for r in rows),
        "hop_found_not_cited": {r["qid"]: r["hop_found_not_cited"] for r in rows if r["hop_found_not_cited"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", required=True, type=Path, help="BEIR folder: corpus.jsonl[.gz], queries, qrels/")
    parser.add_argument("--split", default=None, help="qrels split (default: the only one, else test)")
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ragloop-bench-quality"))
    parser.add_argument(
        "--half",
        choices=("tuning", "validation", "reporting", "all"),
        default="tuning",
        help=f"which half of the judged questions (seeded split, seed {SPLIT_SEED}); tune only on 'tuning'; "
        "'reporting' is the old name of 'validation'",
    )
    parser.add_argument("--note", default="", help="the finished change a validation look confirms (required then)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of the half only (quick runs)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/quality-NAME-HALF.json)")
    parser.add_argument("--json", action="store_true", help="print {single_shot, agentic} as one JSON object")
    parser.add_argument("--no-rerank", action="store_true", help="rank the agentic arm by the fused order alone")
    parser.add_argument("--lead", type=int, default=None, help="FusionSettings.lead of the agentic arm's ranker")
    parser.add_argument(
        "--reranker",
        default=None,
        help="the agentic arm's ranker is this cross-encoder (URL or ONNX folder; 'scripted': ragloop.testing's "
        "server, whose /rerank scores by query-word overlap: a test of the wiring, not of a model)",
    )
    args = parser.parse_args()
    global RERANK, FUSION
    RERANK = not args.no_rerank
    FUSION = FusionSettings(lead=args.lead) if args.lead is not None else FusionSettings()
    if args.half == "reporting":
        args.half = "validation"
    if args.half != "tuning" and not args.note.strip():
        parser.error("--half validation/all looks at validation questions: say which finished change with --note")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    qrels = {q: r for q, r in load_qrels(args.beir, args.split).items() if any(v > 0 for v in r.values())}
    queries = load_queries(args.beir)
    answers = load_answers(args.beir)
    halves = split_halves([q for q in qrels if q in queries])
    qids = halves["reporting" if args.half == "validation" else args.half][: args.limit]
    qrels = {q: qrels[q] for q in qids}
    index = open_index(args.beir, args.embedder, args.cache)

    async def both() -> Any:
        from ragloop.chat import ChatRAG
        from ragloop.turn import TurnSettings

        server = None
        ranker: Any = None
        if args.reranker:  # the cross-encoder's wiring: the scripted server's /rerank scores by query-word overlap
            from ragloop.retrievers.cross_encoder import cross_encoder
            from ragloop.testing import ScriptedOpenAIServer

            server = ScriptedOpenAIServer().start() if args.reranker == "scripted" else None
            ranker = RankRecorder(cross_encoder(server.base_url if server else args.reranker))
        else:  # the default ranker, recorded: the agentic arm is scored on the very list its answer cited from
            from ragloop.retrievers.ranking import FusionRanker

            ranker = RankRecorder(FusionRanker(FUSION) if RERANK else FusionRanker(FUSION, NO_RERANK))
        rag = ChatRAG.from_index(index, settings=TurnSettings(fusion=FUSION), ranker=ranker)
        if not RERANK:
            rag.nodes["answer"].default_ranking = FusionRanker(FUSION, NO_RERANK)  # type: ignore[attr-defined]
        try:
            ss = await single_shot(index, rag, queries, qids, answers)
            ag = await agentic(index, rag, queries, qids, qrels, answers)
        finally:
            await rag.aclose()
            if server is not None:
                server.close()
        return ss, ag

    started = time.perf_counter()
    (ss_run, ss_seconds, ss_answers), (ag_run, kept_run, ag_calls, ag_seconds, rows, ag_answers) = anyio.run(both)
    wall = time.perf_counter() - started
    report: dict[str, Any] = {}
    for name, run, calls, secs, arows in (
        ("single_shot", ss_run, 1.0, ss_seconds, ss_answers),
        ("agentic", ag_run, ag_calls, ag_seconds, ag_answers),
    ):
        m = evaluate_run(run, qrels)
        report[name] = {
            "recall@2": m["recall@2"],
            "recall@5": m["recall@5"],
            "recall@10": m["recall@10"],
            "ndcg@10": m["ndcg@10"],
            "retrieval_calls_per_question": calls,
            "seconds_per_question": secs,
            **answer_metrics(arows),
        }
    kept = evaluate_run(kept_run, qrels)
    full = {
        **report,
        "agentic_kept_only": {k: kept[k] for k in ("recall@2", "recall@5", "recall@10", "ndcg@10")},
        "diagnosis": summarise_diagnosis(rows),
        "dataset": str(args.beir.name),
        "split": args.split,
        "half": args.half,
        "split_seed": SPLIT_SEED,
        "commit": _answers.commit(),
        "load_average": _answers.load_average(),
        "questions": len(qids),
        "limit": args.limit,
        "wall_seconds": wall,
        "embedder": index.embedder.name,
        "chunks": len(index.chunks),
        "machine": f"{platform.machine()} {platform.system()}, shared CPUs",
        "per_question": rows,
    }
    out = args.out or RESULTS / f"quality-{args.beir.resolve().name}-{args.half}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(full, indent=1) + "\n")
    if args.half != "tuning":  # every look is logged, a partial one (--limit) too
        limit = f" (first {args.limit})" if args.limit is not None else ""
        shown = {f"{arm} {k}": report[arm][k] for arm in report for k in ("recall@2", "recall@5", "answer_recall")}
        shown["agentic context_precision"] = report["agentic"]["context_precision"]
        shown["agentic answer_at_1"] = report["agentic"]["answer_at_1"]
        _answers.log_validation("bench_quality.py", f"{args.beir.name}/{args.half}{limit}", args.note, shown, out)
    if args.json:
        print(json.dumps(report))
        return
    print(
        f"{args.beir.name}, {args.half} half (seed {SPLIT_SEED}; {len(qids)} questions, {len(index.chunks)} chunks, "
        f"{index.embedder.name}, hybrid; {wall:.0f}s; load {full['load_average']})"
    )
    cols = (*KEYS, *ANSWER_KEYS)
    print(f"{'':<14}" + "".join(f"{k.replace('_per_question', '/q'):>18}" for k in cols))
    for name in ("single_shot", "agentic"):
        cells = [report[name][k] for k in cols]
        print(f"{name:<14}" + "".join(f"{'-':>18}" if v is None else f"{v:>18.3f}" for v in cells))
    print(f"{'kept only':<14}" + "".join(f"{full['agentic_kept_only'][k]:>18.3f}" for k in KEYS[:4]))
    print("diagnosis:", json.dumps(full["diagnosis"], indent=1))


if __name__ == "__main__":
    main()
