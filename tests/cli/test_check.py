"""`ragloop check` on the command line: --min-pass, --json, a bad cases file in one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.cli.check import parse_min_pass


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A small hash-embedded index."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "keys.md").write_text("# API keys\n\nTo rotate an API key, create a new key and revoke the old one.\n")
    assert main(["index", str(docs), "--out", str(tmp_path / "index"), "--embedder", "hash"]) == 0
    return tmp_path / "index"


def _cases(tmp_path: Path, *cases: dict[str, object]) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    return path


PASSING = {"question": "How do I rotate an API key?", "expect_sources": ["keys.md"], "expect_phrases": ["revoke"]}
FAILING = {"question": "How do I rotate an API key?", "expect_phrases": ["zapier"]}


class TestMinPass:
    @pytest.mark.parametrize(("text", "value"), [("0.9", 0.9), ("90%", 0.9), ("1", 1.0), ("0%", 0.0)])
    def test_rates(self, text: str, value: float) -> None:
        """A fraction or a percentage."""
        assert parse_min_pass(text) == pytest.approx(value)

    @pytest.mark.parametrize("text", ["90", "-0.1", "most", "150%"])
    def test_bad_rates(self, text: str) -> None:
        """Anything outside 0 to 1 is refused with the range."""
        with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 1"):
            parse_min_pass(text)


class TestCheckCommand:
    def test_exit_status_follows_the_gate(
        self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Any failure exits 1; with --min-pass the rate decides; --json says the same."""
        cases = _cases(tmp_path, PASSING, FAILING)
        capsys.readouterr()
        assert main(["check", str(cases), "--index", str(index)]) == 1
        assert "passed 1/2 (50.0%" in capsys.readouterr().out
        assert main(["check", str(cases), "--index", str(index), "--min-pass", "50%"]) == 0
        capsys.readouterr()
        assert main(["check", str(cases), "--index", str(index), "--min-pass", "0.75", "--json"]) == 1
        out = json.loads(capsys.readouterr().out)
        assert out["summary"]["passed"] == 1 and out["summary"]["ok"] is False
        assert out["cases"][1]["reasons"] == ["the answer does not say 'zapier'"]

    def test_bad_cases_file_is_one_line(self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A malformed case is exit 2 with one line naming the line and the field, before any turn runs."""
        cases = _cases(tmp_path, PASSING, {"question": "q", "expect_phrases": "revoke"})
        capsys.readouterr()
        assert main(["check", str(cases), "--index", str(index)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cases.jsonl line 2: field 'expect_phrases'" in err

    def test_model_without_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--model without a configured model says which variables to set."""
        for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "RAGLOOP_MODEL"):
            monkeypatch.delenv(name, raising=False)
        assert main(["check", str(_cases(tmp_path, PASSING)), "--model"]) == 2
        assert "RAGLOOP_MODEL" in capsys.readouterr().err
