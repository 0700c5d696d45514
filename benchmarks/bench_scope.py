"""What scoping corpus knowledge per tenant costs a turn (issue 30): offline turns, before and after, side by side.

The corpus is the bundled sample knowledge base copied once per tenant (``--tenants``, each copy's chunks with
``tenant=tN`` metadata), one hash-embedded index. Every turn is asked as one tenant (``filters={"tenant": …}``)
with the offline judges, so the judges' and the searches' own CPU time is the whole turn (no model waits hide
it). Two chats over the same index:

- ``before``: what main did — one set of judges built from every chunk's text (``Judges.offline(texts)``) and
  a BM25 retriever that masks the whole index's scores (no ``text_of``): every tenant scores with every
  tenant's statistics;
- ``after``: ``ChatRAG.from_index(index)`` — the judges and BM25 statistics of each tenant's own chunks, built
  on its first turn (``cold``) and kept (``warm``).

It reports the chats' start-up time, each tenant's first turn (``cold``: the scope's build included) and the
median of the warm turns, asked round-robin (before, after, before, …) so machine load hits both alike; the
load average is printed beside every figure. The two chats' judges see different statistics, so a turn may take
another path in each (a rewrite more or less): the mean number of steps and the share of turns whose path is
the same are reported beside the times. It asserts nothing; it writes ``benchmarks/results/bench_scope.json``.

Usage: ``python benchmarks/bench_scope.py [--tenants 8] [--rounds 3] [--out PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import anyio
import attrs

from ragloop.chat import ChatRAG
from ragloop.retrievers.bm25 import BM25Retriever
from ragloop.retrievers.dense import DenseRetriever
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.hybrid import HybridRetriever
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from ragloop.sample import sample_kb_path, sample_questions_path
from ragloop.state import Chunk

RESULTS = Path(__file__).parent / "results"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tenant_index(tenants: int) -> KnowledgeIndex:
    """The sample knowledge base once per tenant, ``tenant=tN`` on every copy's chunks."""
    base = ingest_path(sample_kb_path()).chunks
    chunks: list[Chunk] = []
    for n in range(tenants):
        for c in base:
            chunks.append(attrs.evolve(c, id=f"{c.id}-t{n}", metadata={**c.meta(), "tenant": f"t{n}"}))
    return KnowledgeIndex.build(chunks, HashEmbedder())


def before_chat(index: KnowledgeIndex) -> ChatRAG:
    """Main's behaviour: judges over every chunk's text, BM25 scores masked from the whole index."""
    by_id = {c.id: c for c in index.chunks}
    retriever = HybridRetriever(
        BM25Retriever(index.bm25, by_id),
        DenseRetriever(index.dense, index.embedder, by_id),
        weights=index.weights,
        rrf_k=index.rrf_k,
    )
    return ChatRAG.from_retriever(
        retriever, [c.text for c in index.chunks], embedder=index.embedder, index_version=lambda: index.version
    )


async def _turn(rag: ChatRAG, question: str, tenant: str, paths: list[tuple[str, ...]] | None = None) -> float:
    t0 = time.perf_counter()
    reply = await rag.ask(question, filters={"tenant": tenant})
    took = time.perf_counter() - t0
    if paths is not None:
        paths.append(reply.record.path)
    return took


async def run(tenants: int, rounds: int) -> dict[str, Any]:
    questions = [
        json.loads(line)["question"]
        for line in sample_questions_path().read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line)["kind"] != "greeting"
    ][:6]
    t0 = time.perf_counter()
    index = tenant_index(tenants)
    built_s = time.perf_counter() - t0
    before_chat(index), ChatRAG.from_index(index)  # untimed: first-use costs (imports, stemmer) hit neither
    t0 = time.perf_counter()
    before = before_chat(index)
    before_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    after = ChatRAG.from_index(index)
    after_start = time.perf_counter() - t0
    start_load = _load()
    names = [f"t{n}" for n in range(tenants)]
    cold: dict[str, list[float]] = {"before": [], "after": []}
    for tenant in names:  # each tenant's first turn: the scope's build happens here for "after"
        cold["before"].append(await _turn(before, questions[0], tenant))
        cold["after"].append(await _turn(after, questions[0], tenant))
    cold_load = _load()
    warm: dict[str, list[float]] = {"before": [], "after": []}
    paths: dict[str, list[tuple[str, ...]]] = {"before": [], "after": []}
    for _ in range(rounds):
        for tenant in names:
            for q in questions:
                warm["before"].append(await _turn(before, q, tenant, paths["before"]))
                warm["after"].append(await _turn(after, q, tenant, paths["after"]))
    same = sum(a == b for a, b in zip(paths["before"], paths["after"], strict=True)) / len(paths["after"])
    warm_load = _load()
    ms = {
        k: {"cold": [round(1000 * s, 2) for s in cold[k]], "warm_median": 1000 * statistics.median(warm[k])}
        for k in warm
    }
    decider: Any = after.turn.graph.nodes["decide"]
    return {
        "command": f"python benchmarks/bench_scope.py --tenants {tenants} --rounds {rounds}",
        "python": platform.python_version(),
        "chunks": len(index.chunks),
        "tenants": tenants,
        "warm_turns_each": len(warm["before"]),
        "index_build_s": round(built_s, 3),
        "startup_s": {"before": round(before_start, 3), "after": round(after_start, 3), "load": start_load},
        "cold_turn_ms": {
            "before_median": round(statistics.median(cold["before"]) * 1000, 2),
            "after_median": round(statistics.median(cold["after"]) * 1000, 2),
            "before": ms["before"]["cold"],
            "after": ms["after"]["cold"],
            "load": cold_load,
        },
        "warm_turn_ms": {
            "before_median": round(ms["before"]["warm_median"], 3),
            "after_median": round(ms["after"]["warm_median"], 3),
            "after_over_before": round(ms["after"]["warm_median"] / ms["before"]["warm_median"], 3),
            "mean_steps": {k: round(statistics.mean(len(p) for p in v), 2) for k, v in paths.items()},
            "same_path_share": round(same, 3),
            "load": warm_load,
        },
        "scope_builds": decider.decider.knowledge.builds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_scope.json")
    args = parser.parse_args()
    report = anyio.run(run, args.tenants, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
