"""The offline turn is deterministic: the same questions over the same index give the same decision records,
whatever the interpreter's hash seed (set iteration order changes with ``PYTHONHASHSEED``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json, sys
from pathlib import Path
import anyio
from ragloop.chat import ChatRAG
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import ingest_path
from ragloop.sample import sample_kb_path, sample_questions_path

questions = [json.loads(line)["question"] for line in sample_questions_path().read_text().splitlines() if line]
questions += [
    "Is the Business plan or the Team plan cheaper?",
    "Are SSO and SCIM both available on the Team plan?",
]
index = KnowledgeIndex.build(ingest_path(sample_kb_path()).chunks, HashEmbedder())

async def main() -> None:
    rag = ChatRAG.from_index(index)
    out = []
    for q in questions:
        reply = await rag.ask(q)
        record = reply.record
        out.append({
            "question": q,
            "queries": [[r.text, r.status, r.hits] for r in record.queries],
            "grades": [[g.query, g.chunk_id, g.label, g.reason] for g in record.grades],
            "rewrites": [[r.to, r.accepted] for r in record.rewrites],
            "hops": [[h.query, h.accepted] for h in record.hops],
            "blocks": [b.chunk_id for b in reply.blocks],
            "outcome": reply.outcome,
            "missing": list(reply.missing),
            "answer": reply.text,
        })
    await rag.aclose()
    sys.stdout.write(json.dumps(out))

anyio.run(main)
"""


def _run(seed: str, tmp: Path) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "HOME": str(tmp)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records: list[dict[str, object]] = json.loads(done.stdout)
    return records


def test_two_processes_with_different_hash_seeds_agree(tmp_path: Path) -> None:
    """Queries, grades, rewrites, hops, blocks, outcome and answer match across PYTHONHASHSEED=1 and 2."""
    first = _run("1", tmp_path)
    second = _run("2", tmp_path)
    assert len(first) == len(second) > 10
    for a, b in zip(first, second, strict=True):
        assert a == b, a["question"]
