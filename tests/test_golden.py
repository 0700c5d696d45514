"""The offline decision records of the bundled sample questions are exactly those of the committed golden file.

Refactors that must not change behaviour (issue 23: the turn's assembly moved into ``ragloop.turn``) are checked
against it: every sample question and every planner question, asked offline over the sample knowledge base
(hash embedder, so the figures do not depend on an ONNX build), once on a chat without plan sources and once on
the chat ``ragloop ask`` builds (the sample CRM database as a plan source). The record is compared whole
(``TurnRecord.as_dict()``) together with the reply's text, citations and blocks, minus what varies from run to run:
run ids, timings and durations. Floats are rounded to 6 significant digits.

A change that is *meant* to change the offline turn regenerates the file, and its diff is part of the review::

    .venv/bin/python -m tests.test_golden      # rewrites tests/golden/sample_records.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import anyio

GOLDEN = Path(__file__).parent / "golden" / "sample_records.json"

#: Keys whose values vary from run to run (ids, clocks), dropped at any depth (``turn_id`` is the run id).
VARYING = frozenset({"run_id", "turn_id", "timings", "seconds", "duration", "started"})
#: A clock reading inside a text (``… 1 row(s), 0.003s)``), replaced by ``<t>s``.
_CLOCK = re.compile(r"\b\d+\.\d{3}s\b")


def normalise(value: Any) -> Any:
    """``value`` without the keys of :data:`VARYING`, floats rounded to 6 significant digits, clock readings in
    texts masked, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, str):
        return _CLOCK.sub("<t>s", value)
    return value


def _questions(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


async def _records() -> dict[str, list[dict[str, Any]]]:
    """Every sample and planner question's normalised reply, by chat configuration."""
    from ragloop.chat import ChatRAG
    from ragloop.retrievers.embed import HashEmbedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path
    from ragloop.retrievers.live import SQLiteTicketSource
    from ragloop.retrievers.sql import SQLiteSource
    from ragloop.sample import (
        SAMPLE_CRM_ALLOW,
        sample_crm_path,
        sample_kb_path,
        sample_plan_questions_path,
        sample_questions_path,
    )

    index = KnowledgeIndex.build(ingest_path(sample_kb_path()).chunks, HashEmbedder())
    sample, planned = _questions(sample_questions_path()), _questions(sample_plan_questions_path())
    out: dict[str, list[dict[str, Any]]] = {}
    for name, plan_sources, questions in (
        ("documents", (), sample),
        ("planned", (SQLiteSource(sample_crm_path(), SAMPLE_CRM_ALLOW),), sample + planned),
    ):
        rag = ChatRAG.from_index(index, live_sources=(SQLiteTicketSource(),), plan_sources=plan_sources)
        rows = []
        for q in questions:
            reply = await rag.ask(q["question"], page_url=q.get("page_url"))
            rows.append(
                normalise(
                    {
                        "id": q["id"],
                        "question": q["question"],
                        **reply.as_dict(),
                        "blocks": [[b.n, b.chunk_id, b.source] for b in reply.blocks],
                    }
                )
            )
        await rag.aclose()
        out[name] = rows
    return out


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want``: one ``path: got != want`` line per differing leaf."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            line
            for k in sorted(got.keys() | want.keys())
            for line in differences(got.get(k), want.get(k), f"{path}.{k}")
        ]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            line for i, (g, w) in enumerate(zip(got, want, strict=True)) for line in differences(g, w, f"{path}[{i}]")
        ]
    return [] if got == want else [f"{path}: {got!r:.300} != {want!r:.300}"]


def write_golden() -> None:
    """Record today's replies as the golden file: one line per question, so a diff names the questions changed."""
    records = anyio.run(_records)
    parts = []
    for name, rows in sorted(records.items()):
        lines = ",\n".join(json.dumps(row, ensure_ascii=False, sort_keys=True) for row in rows)
        parts.append(f"{json.dumps(name)}: [\n{lines}\n]")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text("{\n" + ",\n".join(parts) + "\n}\n", encoding="utf-8")


class TestGolden:
    def test_sample_records_unchanged(self) -> None:
        """Every sample question's decision record and reply equal the golden file's, question by question."""
        expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
        found = json.loads(json.dumps(anyio.run(_records), sort_keys=True))
        assert found.keys() == expected.keys()
        for name in expected:
            assert [r["id"] for r in found[name]] == [r["id"] for r in expected[name]]
            for got, want in zip(found[name], expected[name], strict=True):
                changed = "\n".join(differences(got, want))
                assert got == want, f"{name} {want['id']}: {want['question']!r} changed:\n{changed}"


class TestNormalise:
    def test_drops_varying_keys_at_any_depth(self) -> None:
        """Run ids, timings and durations go wherever they sit; everything else stays."""
        raw = {
            "run_id": "x",
            "calls": [{"judge": "grade", "seconds": 0.1}],
            "plan": {"waves": [{"n": 1, "seconds": 2}]},
        }
        assert normalise(raw) == {"calls": [{"judge": "grade"}], "plan": {"waves": [{"n": 1}]}}

    def test_rounds_floats(self) -> None:
        """Floats keep 6 significant digits, so a last-bit difference in a score does not count."""
        assert normalise({"best_score": 0.12345678901}) == {"best_score": 0.123457}

    def test_masks_clock_readings_in_texts(self) -> None:
        """A duration written into a text (a plan step's detail) is masked; other numbers are kept."""
        assert normalise("LIMIT 50 (1 row(s), 0.003s) costs $19.00") == "LIMIT 50 (1 row(s), <t>s) costs $19.00"


if __name__ == "__main__":
    write_golden()
    sys.stdout.write(f"wrote {GOLDEN}\n")
