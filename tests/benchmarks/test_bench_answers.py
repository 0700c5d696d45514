"""The answer benchmark's yardstick: its question sets are sound, its split is fixed, its scoring means what it says.

Nothing here runs the turn on a whole set; the smoke run asks three questions with the hash embedder.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "benchmarks"
DATA = ROOT / ".." / "shared" / "data"
sys.path.insert(0, str(BENCH))

import _answers  # noqa: E402 — the benchmarks folder is not a package
import bench_answers  # noqa: E402

SAMPLE = _answers.DATA / "sample_kb_questions.jsonl"
FASTAPI = _answers.DATA / "fastapi_docs_questions.jsonl"


class TestQuestionSets:
    def test_sample_facts_are_in_their_pages(self) -> None:
        """Every fact group of an answerable sample question occurs in a page it lists, and the set is large
        enough for the issue (20 answerable, 15 outside the knowledge base)."""
        pages = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "src/ragloop/data/sample_kb").glob("*.md")}
        questions = _answers.load_set(SAMPLE)
        assert _answers.unsupported_facts(questions, pages) == []
        assert sum(q["kind"] != "out_of_kb" for q in questions) >= 20
        assert sum(q["kind"] == "out_of_kb" for q in questions) >= 15

    def test_issue_33_sets_are_sound(self) -> None:
        """The #33 sets: every fact of sample_kb_questions_v2 is in a sample page it lists, and every fact of
        small_kb_questions is in a page of its own small knowledge base (each of 3-20 pages)."""
        pages = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "src/ragloop/data/sample_kb").glob("*.md")}
        assert (
            _answers.unsupported_facts(_answers.load_set(_answers.DATA / "sample_kb_questions_v2.jsonl"), pages) == []
        )
        small = _answers.load_set(_answers.DATA / "small_kb_questions.jsonl")
        for kb in sorted({q["kb"] for q in small}):
            folder = _answers.DATA / "small_kbs" / kb
            kb_pages = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.md")}
            assert 3 <= len(kb_pages) <= 20
            assert _answers.unsupported_facts([q for q in small if q["kb"] == kb], kb_pages) == []

    @pytest.mark.parametrize(
        "name", ["small-heldout", "small-heldout2", "small-heldout3", "small-heldout4", "small-heldout5"]
    )
    def test_heldout_small_kbs_are_sound(self, name: str) -> None:
        """The held-out small knowledge bases: 3 of them, each of 3-20 pages; every fact of an answerable
        question is in a page of its own knowledge base, and each holds questions outside it too."""
        path, corpus = bench_answers.SETS[name]
        assert path is not None and corpus is not None
        small = _answers.load_set(path)
        kbs = sorted({q["kb"] for q in small})
        assert len(kbs) >= 3
        assert sorted(p.name for p in corpus.iterdir() if p.is_dir()) == kbs
        for kb in kbs:
            folder = corpus / kb
            kb_pages = {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.md")}
            assert 3 <= len(kb_pages) <= 20
            mine = [q for q in small if q["kb"] == kb]
            assert _answers.unsupported_facts(mine, kb_pages) == []
            assert any(q["kind"] == "out_of_kb" for q in mine)
        ids = [q["id"] for q in small]
        assert len(ids) == len(set(ids))

    @pytest.mark.parametrize("name", ["sample3", "sample4", "sample5"])
    def test_heldout_sample_sets_are_sound(self, name: str) -> None:
        """A held-out set over the sample knowledge base: every fact group of an answerable question (a comparison
        has one per side) is in a sample page it lists, it holds 20 answerable and 10 outside questions, and it
        repeats no question of the other sample sets."""
        path, corpus = bench_answers.SETS[name]
        assert path is not None and corpus is None
        pages = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "src/ragloop/data/sample_kb").glob("*.md")}
        questions = _answers.load_set(path)
        assert _answers.unsupported_facts(questions, pages) == []
        assert sum(q["kind"] != "out_of_kb" for q in questions) >= 20
        assert sum(q["kind"] == "out_of_kb" for q in questions) >= 10
        assert all(len(q["facts"]) >= 2 for q in questions if q["kind"] == "comparison")
        earlier = {
            _answers.normalise(q["question"])
            for old in (
                "sample_kb_questions.jsonl",
                "sample_kb_questions_v2.jsonl",
                "sample_kb_questions_v3.jsonl",
                "sample_kb_questions_v4.jsonl",
            )
            if _answers.DATA / old != path
            for q in _answers.load_set(_answers.DATA / old)
        }
        assert not [q["id"] for q in questions if _answers.normalise(q["question"]) in earlier]

    @pytest.mark.skipif(not bench_answers.PYDOC.is_dir(), reason="Debian's python3-doc is not installed")
    @pytest.mark.parametrize("name", ["pydoc", "pydoc2", "pydoc3", "pydoc4", "pydoc5", "pydoc6", "pydoc7"])
    def test_pydoc_facts_are_in_their_pages(self, name: str) -> None:
        """Every fact of a python3-doc set is in the text ingest extracts from a page it lists (of the set's
        pages), so the set measures the answerer, not the HTML loader; the sets share no page."""
        from ragloop.retrievers.ingest import ingest_path

        page_sets = [set(pages) for pages in bench_answers.PYDOC_SETS.values()]
        assert sum(len(p) for p in page_sets) == len(set().union(*page_sets))
        chunks = ingest_path(bench_answers.PYDOC, include=bench_answers.PYDOC_SETS[name]).chunks
        pages: dict[str, str] = {}
        for c in chunks:
            pages[c.doc_id] = pages.get(c.doc_id, "") + "\n\n" + c.text
        path, _ = bench_answers.SETS[name]
        assert path is not None
        questions = _answers.load_set(path)
        assert _answers.unsupported_facts(questions, pages) == []
        assert sum(q["kind"] != "out_of_kb" for q in questions) >= 10

    @pytest.mark.skipif(not (DATA / "fastapi-docs").is_dir(), reason="shared fastapi-docs data not present")
    def test_fastapi_facts_are_in_their_pages(self) -> None:
        """Every fact group of an answerable FastAPI question occurs in a page of the shared corpus it lists."""
        pages = {}
        with gzip.open(DATA / "fastapi-docs" / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
            for line in fh:
                doc = json.loads(line)
                pages[doc["_id"]] = doc["text"]
        questions = _answers.load_set(FASTAPI)
        assert _answers.unsupported_facts(questions, pages) == []
        assert sum(q["kind"] == "out_of_kb" for q in questions) >= 15

    def test_a_fact_no_page_holds_is_reported(self) -> None:
        """The soundness check fails a fact its pages do not hold and a page that does not exist."""
        questions = [
            {"id": "x", "kind": "answerable", "question": "q", "facts": [["42 days"]], "sources": ["a.md", "b.md"]}
        ]
        problems = _answers.unsupported_facts(questions, {"a.md": "kept for 41 days"})
        assert problems == [
            "x: source 'b.md' is not a page of the corpus",
            "x: no listed page holds any of ['42 days']",
        ]

    def test_ids_are_unique(self) -> None:
        """No id repeats within a set (the split and the results file key on it)."""
        for path in (SAMPLE, FASTAPI, *(p for p, _ in bench_answers.SETS.values() if p is not None)):
            ids = [q["id"] for q in _answers.load_set(path)]
            assert len(ids) == len(set(ids))


class TestSplit:
    def test_halves_are_fixed_disjoint_and_hold_every_kind(self) -> None:
        """The seeded split is the same every time, the halves cover the set without overlap, and each half holds
        every kind of question."""
        questions = _answers.load_set(SAMPLE)
        a, b = _answers.split_set(questions), _answers.split_set(list(reversed(questions)))
        assert a == b
        assert not set(a["tuning"]) & set(a["validation"])
        assert sorted(a["tuning"] + a["validation"]) == a["all"]
        kinds = {q["id"]: q["kind"] for q in questions}
        for half in ("tuning", "validation"):
            assert {kinds[i] for i in a[half]} == {"answerable", "comparison", "out_of_kb"}

    def test_a_new_question_does_not_reshuffle_other_kinds(self) -> None:
        """Adding a question outside the knowledge base leaves the answerable questions in their halves."""
        questions = _answers.load_set(SAMPLE)
        more = [*questions, {"id": "o99", "kind": "out_of_kb", "question": "Is there a Windows app?"}]
        before, after = _answers.split_set(questions), _answers.split_set(more)
        answerable = {q["id"] for q in questions if q["kind"] == "answerable"}
        assert set(before["validation"]) & answerable == set(after["validation"]) & answerable


class TestFirstUnit:
    def test_first_sentence_with_its_marker(self) -> None:
        """Prose: the first sentence and the citation right after it."""
        reply = "Failed deliveries are retried 8 times [1]. After 72 hours the endpoint is disabled [2]."
        assert _answers.first_unit(reply) == "Failed deliveries are retried 8 times [1]."

    def test_marker_after_the_stop(self) -> None:
        """The offline answerer's form, ``sentence. [n] Next``, ends after the marker."""
        assert _answers.first_unit("It is 60 minutes. [1] Then it expires. [1]") == "It is 60 minutes. [1]"

    def test_table_header_and_first_row(self) -> None:
        """A leading table counts as its header and first data row, not the whole table."""
        reply = "| Plan | Price |\n|---|---|\n| Team | $9 |\n| Business | $19 |\n\n[1]"
        assert _answers.first_unit(reply) == "| Plan | Price |\n| Team | $9 |"

    def test_code_block_whole(self) -> None:
        """A leading fenced code block counts whole."""
        reply = "```python\ndef f():\n    return 1\n```\n\n[1] More text."
        assert _answers.first_unit(reply) == "```python\ndef f():\n    return 1\n```"

    def test_a_colon_goes_on_into_the_block_it_introduces(self) -> None:
        """A first sentence ending in a colon includes the code block right under it."""
        reply = "Pin it with:\n\n```txt\nfastapi==0.112.0\n```\n\n[1] More."
        assert _answers.first_unit(reply) == "Pin it with:\n\n```txt\nfastapi==0.112.0\n```"

    def test_version_numbers_do_not_end_a_sentence(self) -> None:
        """A dot inside ``v3.2.0`` or ``e.g.x`` is not a sentence end."""
        assert (
            _answers.first_unit("Passkeys came in v3.2.0 with OIDC. Later more.")
            == "Passkeys came in v3.2.0 with OIDC."
        )

    @given(st.text(max_size=200))
    def test_is_a_prefix_of_the_reply(self, reply: str) -> None:
        """The first unit is always a piece of the reply as written (never invented text)."""
        unit = _answers.first_unit(reply)
        assert unit in reply.strip() or all(line in reply for line in unit.splitlines() if line)


class TestScore:
    def test_fact_match_ignores_markup_and_markers(self) -> None:
        """Facts match across markdown, arrows and citation markers, as whole words only."""
        assert _answers.has_fact("Open **Settings → Billing → Legal** [2].", "Settings → Billing → Legal")
        assert _answers.has_fact("It costs $11 [1] per seat.", "$11")
        assert not _answers.has_fact("It costs $110 per seat.", "$11")

    def test_comparison_needs_every_side(self) -> None:
        """A comparison's answer@any needs a fact of every group; answer@1 only the first group, first."""
        q = {"id": "c", "kind": "comparison", "question": "A vs B", "facts": [["300"], ["1,000"]], "sources": []}
        one_side = _answers.score(q, "Team allows 300 requests [1]. Nothing else.", "context", ["a.md"])
        assert one_side["answer_at_1"] and not one_side["answer_any"]
        both = _answers.score(q, "Team allows 300 [1]. Business allows 1,000 [2].", "context", ["a.md"])
        assert both["answer_any"]

    def test_wrong_context_is_a_confident_reply_without_the_fact(self) -> None:
        """wrong-context: an answerable question answered ``context`` whose reply lacks an expected fact; the
        same reply labelled ``partial`` is not (it said it may not answer all of it)."""
        q = {"id": "w", "kind": "answerable", "question": "q", "facts": [["token_urlsafe"]], "sources": []}
        assert _answers.score(q, "Use secrets.token_hex [1].", "context", ["a.md"])["wrong_context"]
        assert not _answers.score(q, "Use secrets.token_hex [1].", "partial", ["a.md"])["wrong_context"]
        assert not _answers.score(q, "Use token_urlsafe [1].", "context", ["a.md"])["wrong_context"]

    def test_honest_none_needs_no_citation(self) -> None:
        """Outside the knowledge base, ``none`` with a citation is not honest."""
        q = {"id": "o", "kind": "out_of_kb", "question": "Kubernetes?"}
        assert _answers.score(q, "Not covered.", "none", [])["honest_none"]
        assert not _answers.score(q, "Not covered.", "none", ["a.md"])["honest_none"]
        assert not _answers.score(q, "Here is something.", "partial", ["a.md"])["honest_none"]

    def test_summary_counts_false_none_on_answerable_only(self) -> None:
        """false-none is the share of answerable questions answered ``none``; honest-none that of the others."""
        a = {"id": "a", "kind": "answerable", "question": "q", "facts": [["x"]], "sources": ["p.md"]}
        o = {"id": "o", "kind": "out_of_kb", "question": "q"}
        rows = [
            _answers.score(a, "no", "none", []),
            _answers.score(dict(a, id="b"), "x [1].", "context", ["p.md"]),
            _answers.score(o, "no", "none", []),
        ]
        figures = _answers.summarise(rows)
        assert figures["false_none"] == 0.5 and figures["honest_none"] == 1.0 and figures["answer_at_1"] == 0.5


class TestBenchAnswersScript:
    def test_smoke_run_writes_rows_and_refuses_an_unnoted_validation_look(self, tmp_path: Path) -> None:
        """bench_answers scores a few sample questions (hash embedder) into a results file, and refuses a
        validation run without --note (so every look is a logged one)."""
        out = tmp_path / "a.json"
        done = subprocess.run(
            [sys.executable, str(BENCH / "bench_answers.py"), "--set", "sample", "--embedder", "hash",
             "--limit", "3", "--cache", str(tmp_path), "--out", str(out), "--json"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        assert {"answer_at_1", "answer_any", "false_none", "honest_none", "reply_chars_median"} <= set(figures)
        saved = json.loads(out.read_text())
        assert saved["half"] == "tuning" and len(saved["per_question"]) == 3
        refused = subprocess.run(
            [sys.executable, str(BENCH / "bench_answers.py"), "--set", "sample", "--half", "validation"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert refused.returncode == 2 and "--note" in refused.stderr

    def test_small_set_before_and_after_in_one_run(self, tmp_path: Path) -> None:
        """``--set small --before SRC`` answers a few small-KB questions with this tree and with ``SRC`` (here the
        same src/) in one run; the report holds both, and a folder without ragloop/ is refused with the fix."""
        out = tmp_path / "s.json"
        done = subprocess.run(
            [sys.executable, str(BENCH / "bench_answers.py"), "--set", "small", "--embedder", "hash",
             "--limit", "3", "--out", str(out), "--before", str(ROOT / "src")],
            capture_output=True, text=True, timeout=240, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        saved = json.loads(out.read_text())
        assert len(saved["per_question"]) == 3 and saved["before"]["figures"] == saved["figures"]
        assert "before" in done.stdout and "after" in done.stdout
        bad = subprocess.run(
            [sys.executable, str(BENCH / "bench_answers.py"), "--set", "small", "--before", str(tmp_path)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert bad.returncode != 0 and "git archive main src" in bad.stderr
