"""Tests for benchmarks/bench_definitions.py: the reference marks and the figures it counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_definitions  # noqa: E402

PAGE = (
    "<main><h1>m</h1><dl><dt>class m.Thing(a, b)</dt><dd><p>Makes a thing out of a and b, in that order.</p>"
    "<p>A short usage example:</p></dd><dt>m.other()</dt><dd><p>Returns the other one, never the first.</p>"
    "<p>A short usage example:</p></dd></dl></main>"
)


class TestReference:
    def test_probes_are_description_starts_unique_in_their_page(self, tmp_path: Path) -> None:
        """Each description block gives its term and first characters, unless another block starts alike."""
        (tmp_path / "m.html").write_text(PAGE, encoding="utf-8")
        assert bench_definitions.reference(tmp_path) == {
            "m.html": [
                ("class m.Thing(a, b)", "Makes a thing out of a and b, in that order.", True),
                ("m.other()", "Returns the other one, never the first.", True),
            ]
        }

    def test_the_name_of_a_term(self) -> None:
        assert bench_definitions._name("class csv.DictReader(f, fieldnames=None)") == "csv.DictReader"
        assert bench_definitions._name("list.append(x)\nlist.extend(i)") == "list.append"
        assert bench_definitions._name("typing.List[int]") == "typing.List"


class TestJudge:
    def test_a_chunk_without_the_name_and_a_term_cut_from_its_description_are_counted(self) -> None:
        ref = {
            "m.html": [
                ("class m.Thing(a, b)", "Makes a thing out of a and b.", True),
                ("class m.Thing(a, b)", "Thing objects are immutable.", False),
            ]
        }
        chunks = [
            ("m.html", "class m.Thing(a, b)", 10),
            ("m.html", "Makes a thing out of a and b.", 12),
            ("m.html", "m.Thing\n\nThing objects are immutable.", 9),
        ]
        got = bench_definitions.judge(chunks, ref)
        assert got == {
            "chunks": 3,
            "tokens": 31,
            "max_chunk_tokens": 12,
            "described": 2,
            "nameless": 1,
            "terms": 1,
            "split_terms": 1,
        }


def test_the_script_prints_both_columns(tmp_path: Path) -> None:
    """A run on a one-page folder prints each figure for this tree's side."""
    (tmp_path / "m.html").write_text(PAGE, encoding="utf-8")
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_definitions.py"), "--folder", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "split_terms" in done.stdout and out.is_file()
