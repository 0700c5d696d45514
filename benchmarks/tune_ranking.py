"""Ranking variants on the tuning halves: how the turn's final ranking compares with its own first search.

Runs the offline agentic turn (``ChatRAG.from_index``) once per question of a BEIR folder's **tuning** half
(``bench_quality.py``'s seeded split; never the validation half), keeps what the turn's ranker was given
(:class:`~ragloop.retrievers.ranking.Candidates`: every search, every grade, the anchor) and which queries were
hops, then ranks those same candidates with each variant below and scores recall@2 / recall@5 of the documents
against single-shot's (the question's own search, documents by best chunk, as ``bench_quality.py`` scores it).

Variants: ``default`` (the shipped :class:`~ragloop.retrievers.ranking.FusionRanker`, ``lead=2`` by documents
with its evidence exceptions), ``before-lead-2`` (the default before that: the question's first chunk kept
first), ``lead-2-no-evidence`` and ``lead-2-parts-hops-only`` (the exceptions left out, or only the named-page one
left out), ``lead-0``
(the default before issue 32: fusion and feature rerank alone), ``fused`` (no feature rerank), ``anchor-<w>``
(the question's list weighted ``w``), ``lead-<n>`` (the question's own first ``n`` documents kept in the first
``n`` places), ``no-hops`` (the hop lists left out), feature ablations and fusion knobs; and the issue-32 candidates
for "never let fusion demote the single-shot head when the hops add nothing": ``no-hop-lead-<n>`` (``lead=n`` in a
turn that accepted no hop, else 1), ``settled-lead-<n>`` (``lead=n`` when no chunk outside the question's own
list was graded relevant) and ``no-hop-settled-lead-<n>`` (both). Prints one row per
variant and writes ``results/tune-ranking-<folder>.json``. It never asserts anything; thresholds are chosen from
its rows.

Usage::

    python benchmarks/tune_ranking.py --beir ../shared/data/hotpotqa-dev200 --split dev
    python benchmarks/tune_ranking.py --beir ../shared/data/scifact-train --split train
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import attrs
import structlog
from bench_quality import RESULTS, as_run, best_by_doc, doc_of, open_index, split_halves

from ragloop.retrievers.evaluate import evaluate_run, load_qrels, load_queries, rank_docs
from ragloop.retrievers.fusion import FusionSettings
from ragloop.retrievers.ranking import Candidates, FusionRanker, document_of, keep_lead, keep_lead_documents
from ragloop.retrievers.rerank import RerankSettings
from ragloop.state import Hit

Variant = Callable[[Candidates, frozenset[str]], list[Hit]]


class Capture:
    """A ranker that ranks as the default does and keeps the candidates it was given."""

    def __init__(self) -> None:
        self.seen: list[Candidates] = []

    async def rank(self, candidates: Candidates) -> list[Hit]:
        self.seen.append(candidates)
        return FusionRanker().order(candidates)


def without_hops(candidates: Candidates, hops: frozenset[str], ranker: FusionRanker) -> list[Hit]:
    """The ranker's order of the candidates without the hop lists (what the hops add to the ranking)."""
    searches = {q: hits for q, hits in candidates.searches.items() if q not in hops}
    return ranker.order(attrs.evolve(candidates, searches=searches))


def lead(candidates: Candidates, ranked: list[Hit], n: int, doc: Callable[[str], str]) -> list[Hit]:
    """``ranked`` with the anchor's first ``n`` documents' best hits moved into the first ``n`` places."""
    anchor = candidates.searches.get(candidates.anchor or "", ())
    firsts: list[Hit] = []
    docs: list[str] = []
    for hit in anchor:
        if doc(hit.id) not in docs:
            docs.append(doc(hit.id))
            firsts.append(hit)
        if len(docs) == n:
            break
    head_docs = list(dict.fromkeys(doc(h.id) for h in ranked))[:n]
    if set(docs) <= set(head_docs):
        return ranked
    keep = [h for h in ranked if doc(h.id) in head_docs[: n - len(set(docs) - set(head_docs))] or doc(h.id) in docs]
    order = {h.id: i for i, h in enumerate(ranked)}
    front = sorted({h.id: h for h in keep}.values(), key=lambda h: order.get(h.id, 1 << 30))
    taken = {h.id for h in front}
    return front + [h for h in ranked if h.id not in taken]


def variants(doc: Callable[[str], str]) -> dict[str, Variant]:
    """Every variant by name."""
    off = RerankSettings(title_weight=0, proximity_weight=0, bridge_weight=0)
    base = FusionRanker()
    bare = FusionRanker(FusionSettings(lead=0))

    def anchor_of(c: Candidates) -> tuple[Hit, ...]:
        return c.searches.get(c.anchor or "", ())

    def heads(c: Candidates, queries: frozenset[str] | tuple[str, ...]) -> set[str]:
        return {document_of(hits[0]) for q, hits in c.searches.items() if hits and q in queries}

    out: dict[str, Variant] = {
        "default": lambda c, h: base.order(c),
        # Issue 32's last step, its parts one by one: the default before it (the question's first chunk first),
        # lead=2 by documents with no exception, and with only one kind of evidence allowed to take place two.
        "before-lead-2": lambda c, h: keep_lead(bare.order(c), [x.id for x in anchor_of(c)], 1),
        "lead-2-no-evidence": lambda c, h: keep_lead_documents(bare.order(c), anchor_of(c), 2),
        "lead-2-parts-hops-only": lambda c, h: keep_lead_documents(
            bare.order(c), anchor_of(c), 2, may_lead=lambda x: document_of(x) in heads(c, c.hops) | heads(c, c.parts)
        ),
        "lead-0": lambda c, h: FusionRanker(FusionSettings(lead=0)).order(c),
        "fused": lambda c, h: FusionRanker(features=off).order(c),
        "no-hops": lambda c, h: without_hops(c, h, base),
    }
    for w in (2.0, 3.0):
        out[f"anchor-{w:g}"] = lambda c, h, w=w: FusionRanker(FusionSettings(anchor_weight=w)).order(c)
    for n in (1, 2):
        out[f"lead-{n}"] = lambda c, h, n=n: lead(c, base.order(c), n, doc)
        out[f"lead-{n}-chunk"] = lambda c, h, n=n: FusionRanker(FusionSettings(lead=n)).order(c)
        out[f"fused-lead-{n}"] = lambda c, h, n=n: FusionRanker(FusionSettings(lead=n), off).order(c)
    for name, rs in (
        ("no-title", RerankSettings(title_weight=0)),
        ("no-proximity", RerankSettings(proximity_weight=0)),
        ("no-bridge", RerankSettings(bridge_weight=0)),
        ("depth-5", RerankSettings(depth=5)),
        ("protect-2", RerankSettings(protect_depth=2)),
    ):
        out[name] = lambda c, h, rs=rs: FusionRanker(features=rs).order(c)
        out[f"{name}-lead-1"] = lambda c, h, rs=rs: FusionRanker(FusionSettings(lead=1), rs).order(c)
    nob = RerankSettings(bridge_weight=0)
    out["bridge-if-hop"] = lambda c, h: (base if h else FusionRanker(features=nob)).order(c)
    out["bridge-if-hop-lead-1"] = lambda c, h: FusionRanker(
        FusionSettings(lead=1), RerankSettings() if h else nob
    ).order(c)
    for k in (5.0, 20.0, 60.0):
        out[f"k-{k:g}-lead-1"] = lambda c, h, k=k: FusionRanker(FusionSettings(k=k, lead=1)).order(c)
    for rb in (1.0, 1.6):
        out[f"relevant-{rb:g}-lead-1"] = lambda c, h, rb=rb: FusionRanker(
            FusionSettings(relevant_boost=rb, lead=1)
        ).order(c)
    for irr in (0.3, 1.0):
        out[f"irrelevant-{irr:g}-lead-1"] = lambda c, h, irr=irr: FusionRanker(
            FusionSettings(irrelevant_factor=irr, lead=1)
        ).order(c)
    out["bridge-if-split"] = lambda c, h: (base if len(c.searches) > 2 else FusionRanker(features=nob)).order(c)
    for n in (2, 3):
        out[f"settled-lead-{n}"] = lambda c, h, n=n: FusionRanker(FusionSettings(lead=n if settled(c) else 1)).order(c)
        out[f"no-hop-lead-{n}"] = lambda c, h, n=n: FusionRanker(FusionSettings(lead=1 if h else n)).order(c)
        out[f"no-hop-settled-lead-{n}"] = lambda c, h, n=n: FusionRanker(
            FusionSettings(lead=n if not h and settled(c) else 1)
        ).order(c)
    return out


def settled(candidates: Candidates) -> bool:
    """True when no chunk outside the question's own list was graded relevant: the other searches (decide's
    parts, rewrites, hops) found nothing new the grader kept, so fusion has no evidence to reorder its head."""
    own = {h.id for h in candidates.searches.get(candidates.anchor or "", ())}
    return candidates.anchor is not None and not any(
        "relevant" in labels for cid, labels in candidates.grades.items() if cid not in own
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beir", required=True, type=Path)
    parser.add_argument("--split", default=None)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ragloop-bench-quality"))
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--reuse", action="store_true", help="rescore the turns the last run kept (/tmp)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    qrels = {q: r for q, r in load_qrels(args.beir, args.split).items() if any(v > 0 for v in r.values())}
    queries = load_queries(args.beir)
    qids = split_halves([q for q in qrels if q in queries])["tuning"][: args.limit]
    index = open_index(args.beir, "minilm", args.cache)

    def doc(cid: str) -> str:
        return doc_of(index, cid)

    async def run() -> list[tuple[str, Candidates, frozenset[str]]]:
        from ragloop.chat import ChatRAG

        capture = Capture()
        rag = ChatRAG.from_index(index, ranker=capture)
        out = []
        try:
            for qid in qids:
                capture.seen.clear()
                reply = await rag.ask(queries[qid])
                hops = frozenset(h.query for h in reply.record.hops if h.accepted and h.query)
                if capture.seen:
                    out.append((qid, capture.seen[-1], hops))
        finally:
            await rag.aclose()
        return out

    started = time.perf_counter()
    saved = Path(f"/tmp/tune-ranking-{args.beir.resolve().name}.pickle")  # the turns of one run, to rescore
    if args.reuse and saved.is_file():
        turns = pickle.loads(saved.read_bytes())
    else:
        turns = anyio.run(run)
        saved.write_bytes(pickle.dumps(turns))
    judged = {qid: qrels[qid] for qid, _, _ in turns}
    single = {}
    for qid, c, _ in turns:
        anchor = c.searches.get(c.anchor or "", ())
        single[qid] = as_run(rank_docs(best_by_doc(index, anchor))[:10])
    rows: dict[str, dict[str, float]] = {"single_shot": _scores(single, judged)}
    all_variants = variants(doc)
    for name, variant in all_variants.items():
        ranked = {qid: as_run(list(dict.fromkeys(doc(h.id) for h in variant(c, hops)))[:10]) for qid, c, hops in turns}
        rows[name] = _scores(ranked, judged)
    # Per question, where the default and the default before issue 32's lead=2 differ in judged documents in the
    # first two places: what the change did, question by question.
    changes = []
    for qid, c, hops in turns:
        judged_docs = {d for d, rel in judged[qid].items() if rel > 0}
        tops = {
            name: list(dict.fromkeys(doc(h.id) for h in all_variants[name](c, hops)))[:2]
            for name in ("before-lead-2", "default")
        }
        hits = {name: len(judged_docs & set(top)) for name, top in tops.items()}
        if hits["before-lead-2"] != hits["default"]:
            changes.append({"qid": qid, "question": c.question, "judged": sorted(judged_docs), "top2": tops})
    report = {
        "dataset": args.beir.name,
        "half": "tuning",
        "questions": len(turns),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
        "recall@2_changes_vs_before_lead_2": changes,
    }
    out = RESULTS / f"tune-ranking-{args.beir.resolve().name}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.beir.name} tuning half, {len(turns)} questions, load {report['load_average']}")
    for name, row in rows.items():
        print(f"{name:<12} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    gained = sum(
        len(set(ch["judged"]) & set(ch["top2"]["default"])) > len(set(ch["judged"]) & set(ch["top2"]["before-lead-2"]))
        for ch in changes
    )
    print(f"recall@2 against before-lead-2, per question: {gained} gained, {len(changes) - gained} lost")


def _scores(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    m = evaluate_run(run, qrels)
    return {k: m[k] for k in ("recall@2", "recall@5", "ndcg@10")}


if __name__ == "__main__":
    main()
