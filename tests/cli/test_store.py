"""``ragloop index --meta``: the metadata every chunk of a run gets is checked before anything is read or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.cli._store import parse_meta
from ragloop.errors import ConfigError


def _docs(root: Path) -> Path:
    root.mkdir()
    (root / "reset.md").write_text("# Account\n\n## Reset password\n\nOpen settings and click reset password.\n")
    return root


class TestMeta:
    @pytest.mark.parametrize(
        ("pair", "says"),
        [
            ("path=shared.md", "ragloop sets 'path' for each document itself"),
            ("url=https://x.example", "reserved"),
            ("anchor=top", "reserved"),
            ("tenant=", "a value of 1 to 256 printable characters"),
            ("tenant=ac\x1bme", "no control characters"),
            ("tenant=ac\nme", "no control characters"),
            ("tenant=" + "a" * 257, "1 to 256"),
            ("ten ant=acme", "must start with a letter"),
            ("=acme", "is not KEY=VALUE"),
            ("tenant", "is not KEY=VALUE"),
        ],
    )
    def test_a_bad_pair_is_refused_before_any_file_is_read(
        self, pair: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A reserved key, an empty, over-long or control-character value, a malformed key: exit 2 naming the
        rule, and no index written."""
        out = tmp_path / "kb"
        with pytest.raises(SystemExit) as done:
            main(["index", str(_docs(tmp_path / "docs")), "--out", str(out), "--embedder", "hash", "--meta", pair])
        assert done.value.code == 2 and says in capsys.readouterr().err
        assert not out.exists()

    def test_a_key_given_twice_is_refused_and_nothing_is_written(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--meta tenant=acme --meta tenant=globex: one error line, exit 2, no index (not the last one winning)."""
        out = tmp_path / "kb"
        argv = ["index", str(_docs(tmp_path / "docs")), "--out", str(out), "--embedder", "hash"]
        assert main([*argv, "--meta", "tenant=acme", "--meta", "tenant=globex"]) == 2
        err = capsys.readouterr().err
        assert "--meta tenant is given twice" in err and not out.exists()

    def test_good_pairs_pass(self) -> None:
        """Names with digits, dots, dashes and underscores and values with spaces and non-ASCII letters pass."""
        assert parse_meta(["tenant=acme", "build.v-1=42", "_team=Zürich ops"], "--meta") == {
            "tenant": "acme",
            "build.v-1": "42",
            "_team": "Zürich ops",
        }
        with pytest.raises(ConfigError, match="given twice"):
            parse_meta(["a=1", "a=1"], "--meta")
