"""benchmarks/bench_followups.py: its data, its one seeded split, its scoring, and a smoke run on two conversations.

No figure is asserted: the script measures the answer and on-topic rates; these tests check that it can.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_followups as bench  # noqa: E402 - the benchmark is a script folder, not a package

KB = ROOT / "src" / "ragloop" / "data" / "sample_kb"


class TestData:
    def test_every_expected_fact_is_in_one_of_its_sources(self) -> None:
        """Each answerable follow-up's expected fact (any of them) is written in one of its expected sources, and
        every named source exists: the set asks for what the knowledge base says."""
        rows = bench.load()
        assert len(rows) >= 30 and len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert len(r["turns"]) == 2 and all(t.strip() for t in r["turns"])
            for source in [*r.get("sources", ()), *r["topic_sources"]]:
                assert (KB / source).is_file(), (r["id"], source)
            if r["kind"] == "answerable":
                pages = [bench.normalise((KB / s).read_text()) for s in r["sources"]]
                assert any(bench.normalise(f) in p for f in r["facts"] for p in pages), r["id"]
            else:
                assert r["kind"] == "not_in_kb" and "facts" not in r

    def test_split_is_seeded_disjoint_and_per_kind(self) -> None:
        """The halves are the same on every call, share nothing, cover everything and split each kind in two."""
        rows = bench.load()
        halves = bench.split(rows)
        assert halves == bench.split(list(reversed(rows)))
        tuning, validation = ({r["id"] for r in h} for h in (halves["tuning"], halves["validation"]))
        assert not tuning & validation and tuning | validation == {r["id"] for r in rows}
        for kind in ("answerable", "not_in_kb"):
            n = [sum(r["kind"] == kind for r in halves[h]) for h in ("tuning", "validation")]
            assert abs(n[0] - n[1]) <= 1


CONV = {"kind": "answerable", "facts": ["365 days"], "sources": ["api-keys.md"], "topic_sources": ["error-codes.md"]}


class TestScore:
    def test_answered_needs_the_fact_and_the_source(self) -> None:
        """The fact in the reply (markdown emphasis ignored) and the expected source cited."""
        assert bench.score(CONV, "A key lives at most **365 days** [1].", "context", ["api-keys.md"])["answered"]
        assert not bench.score(CONV, "A key lives at most 365 days [1].", "context", ["webhooks.md"])["answered"]
        assert not bench.score(CONV, "Keys expire [1].", "context", ["api-keys.md"])["answered"]

    def test_on_topic_or_not_found(self) -> None:
        """Every citation on the conversation's topic, or nothing cited and outcome none; anything else is not ok."""
        assert bench.score(CONV, "x", "context", ["api-keys.md", "error-codes.md"])["ok"]
        assert bench.score(CONV, "I couldn't find anything", "none", [])["ok"]
        off = bench.score(CONV, "x", "context", ["api-keys.md", "sso-saml.md"])
        assert not off["on_topic"] and not off["ok"] and off["lead_on_topic"]


def test_smoke_run_on_two_conversations(tmp_path: Path) -> None:
    """Two conversations with the hash embedder: one report per conversation with the rewrite and the verdicts,
    totals, and the table; a run on a copy of the data is not logged as a validation look."""
    data = tmp_path / "two.jsonl"
    rows = [r for r in bench.load() if r["id"] in ("f02", "n01")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.json"
    looks = bench.LOOKS.read_text() if bench.LOOKS.exists() else None
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_followups.py"), "--half", "all", "--embedder", "hash",
         "--cache-dir", str(tmp_path / "cache"), "--data", str(data), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [c["id"] for c in report["conversations"]] == ["f02", "n01"]
    for c in report["conversations"]:
        assert {"queries", "reason", "outcome", "sources", "reply", "on_topic", "lead_on_topic", "ok"} <= set(c)
    assert "answered" in report["conversations"][0] and "answered" not in report["conversations"][1]
    assert report["totals"]["conversations"] == 2 and report["totals"]["answerable"] == 1
    assert re.search(r"answered \(of 1 answerable\): ", out.with_suffix(".txt").read_text())
    assert (bench.LOOKS.read_text() if bench.LOOKS.exists() else None) == looks
