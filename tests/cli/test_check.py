"""`ragloop check` on the command line: --min-pass, --json, a bad cases file in one line, hostile text, gaps drafts."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.cli._check import parse_min_pass


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


class TestHostileInput:
    def test_deep_json_is_one_line(self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A line nested 100,000 deep is exit 2 and one line, not a RecursionError traceback."""
        path = tmp_path / "deep.jsonl"
        path.write_text('{"question": "q", "expect_outcome": "none", "note": ' + "[" * 100_000 + "]" * 100_000 + "}")
        capsys.readouterr()
        assert main(["check", str(path), "--index", str(index)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "deep.jsonl line 1: nested 100001 levels deep" in err

    def test_bom_and_crlf_accepted(self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A cases file saved with a byte-order mark and Windows line ends runs."""
        path = tmp_path / "bom.jsonl"
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(PASSING).encode() + b"\r\n")
        assert main(["check", str(path), "--index", str(index)]) == 0
        assert "passed 1/1" in capsys.readouterr().out

    def test_junit_well_formed_for_any_text(
        self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Lone surrogates and control characters in a case give a parseable, non-empty JUnit file, said on stderr
        and in the XML; the table and --json print too."""
        path = tmp_path / "odd.jsonl"
        path.write_text(
            '{"question": "rotate \\ud800 an API key\\u0001?", "expect_phrases": ["zapier\\udc00"]}\n'
            '{"question": "How do I rotate an API key?", "id": "ok\\u0007", "expect_sources": ["keys.md"]}\n',
            encoding="utf-8",
        )
        junit = tmp_path / "out.xml"
        capsys.readouterr()
        assert main(["check", str(path), "--index", str(index), "--junit", str(junit)]) == 1
        out, err = capsys.readouterr()
        assert "odd.jsonl line 1: 2 lone surrogate(s) replaced by U+FFFD" in err and "FAIL" in out
        root = ET.parse(junit).getroot()
        suite = root.find("testsuite")
        assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
        names = [c.get("name") for c in suite.iter("testcase")]
        assert names[1] == "ok\\u0007" and "\ufffd" in (names[0] or "")
        assert int(suite.find("properties/property").get("value") or 0) >= 3  # type: ignore[union-attr]
        assert main(["check", str(path), "--index", str(index), "--json"]) == 1
        assert json.loads(capsys.readouterr().out)["cases"][0]["question"].startswith("rotate \ufffd")

    def test_unwritable_junit_fails_before_any_case(
        self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--junit into a missing folder or onto a directory is exit 2 in one line, before a turn runs."""
        cases = str(_cases(tmp_path, PASSING))
        for target, says in ((tmp_path / "no" / "x.xml", "does not exist"), (tmp_path, "is a directory")):
            capsys.readouterr()
            assert main(["check", cases, "--index", str(index), "--junit", str(target)]) == 2
            out, err = capsys.readouterr()
            assert out == "" and err.count("\n") == 1 and says in err


class TestGapsDrafts:
    def test_export_cases_feed_check_unchanged(
        self, week: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`ragloop gaps --export-cases` writes a file `ragloop check` runs as it is: every draft fails (the gap is
        still open), none is refused."""
        drafts = tmp_path / "drafts.jsonl"
        argv = ["gaps", "--turn-log", f"sqlite:{week['log']}", "--since", "2025-05-05", "--until", "2025-05-12"]
        assert main([*argv, "--export-cases", str(drafts), "--top", "3"]) == 0
        written = drafts.read_text(encoding="utf-8").count("\n")
        assert written >= 3
        capsys.readouterr()
        assert main(["check", str(drafts), "--index", str(week["index"]), "--json"]) == 1
        report = json.loads(capsys.readouterr().out)
        assert report["summary"]["total"] == written and report["summary"]["passed"] < written


from tests.gaps.conftest import week  # noqa: E402  (the planted week, shared with tests/gaps)

__all__ = ["week"]
