"""Tests for ragloop.cli (index, search, eval)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragloop.cli import main
from tests.strategies import tiny_beir


def _docs(root: Path) -> Path:
    root.mkdir()
    (root / "reset.md").write_text("# Account\n\n## Reset password\n\nOpen settings and click reset password.\n")
    (root / "ship.txt").write_text("Shipping to Europe takes five to seven business days.\n")
    (root / "logo.png").write_bytes(b"\x89PNG")
    return root


class TestCLI:
    def test_version(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`ragloop --version` prints the package's version, the one pyproject.toml and the installed metadata say."""
        import importlib.metadata
        import tomllib

        import ragloop

        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code == 0
        pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"]
        assert capsys.readouterr().out == f"ragloop {pyproject}\n"
        assert ragloop.__version__ == pyproject == importlib.metadata.version("ragloop")

    def test_index_then_search(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`index` prints a summary; `search --json` returns the matching chunk with provenance."""
        out = tmp_path / "kb"
        assert main(["index", str(_docs(tmp_path / "docs")), "--out", str(out), "--embedder", "hash"]) == 0
        summary = capsys.readouterr().out
        assert "indexed 2 files" in summary and "hash-512" in summary
        assert main(["search", str(out), "reset my password", "--json", "-k", "1"]) == 0
        (line,) = capsys.readouterr().out.splitlines()
        hit = json.loads(line)
        assert hit["title_path"][-1] == "Reset password" and set(hit["ranks"]) <= {"bm25", "dense"}

    def test_eval_json(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`eval --json` prints one JSON object with the metric keys."""
        assert main(["eval", "--beir", str(tiny_beir(tmp_path)), "--mode", "bm25", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["ndcg@10"] == 1.0 and got["queries"] == 3

    def test_eval_table(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Without --json, eval prints a table row per metric."""
        assert main(["eval", "--beir", str(tiny_beir(tmp_path)), "--mode", "bm25"]) == 0
        text = capsys.readouterr().out
        assert "ndcg@10" in text and "latency_ms_p95" in text

    def test_errors_are_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A ragloop error exits 2 with one line on stderr and no traceback."""
        assert main(["search", str(tmp_path / "missing"), "q"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "ragloop index" in err and "Traceback" not in err

    @pytest.mark.parametrize(
        "store",
        [
            "postgresql://u:hunter2@127.0.0.1:1/db",
            "postgresql://u:hunter2@[::1",  # libpq quotes a URL it cannot parse in its own message
            "postgresql://u:hun/ter@2@127.0.0.1:1/db",  # an unescaped / and @ in the password
            "postgresql://u@127.0.0.1:1/db?password=hunter2",
            "host=127.0.0.1 port=1 user=u password=hunter2 dbname=db",
        ],
    )
    @pytest.mark.parametrize("command", ["search", "ask"])
    def test_a_dead_store_is_one_line_without_the_password(
        self, store: str, command: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--store pointing at no server: exit 2, one line on stderr, no traceback, the password nowhere."""
        pytest.importorskip("psycopg")
        assert main([command, "--store", store, "how do I reset my password?"]) == 2
        captured = capsys.readouterr()
        err = captured.err
        assert err.count("\n") == 1 and "cannot connect" in err and "Traceback" not in err, err
        assert "hunter2" not in err + captured.out and "hun/ter" not in err

    @pytest.mark.parametrize(
        ("argv", "needle"),
        [
            (["--port", "99999"], "from 0 to 65535, got '99999'"),
            (["--port", "-1"], "from 0 to 65535"),
            (["--port", "http"], "from 0 to 65535"),
            (["--log-level", "bogus"], "invalid choice: 'bogus'"),
        ],
    )
    def test_serve_refuses_a_bad_port_or_log_level_up_front(
        self, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Both reached uvicorn and died with a traceback (OverflowError, KeyError) after loading the index."""
        with pytest.raises(SystemExit) as exited:
            main(["serve", *argv])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err

    @pytest.mark.parametrize(
        ("keys", "needle"),
        [
            (" , ", "is set but holds no key"),
            ("good,ключ", "key 2 must be printable ASCII"),
            ("a b", "key 1 must be printable ASCII without spaces"),
        ],
    )
    def test_serve_refuses_api_keys_that_would_leave_it_open_or_unusable(
        self, keys: str, needle: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """RAGLOOP_API_KEYS=',' served with no authentication; a non-ASCII key could never match a header."""
        monkeypatch.setenv("RAGLOOP_API_KEYS", keys)
        assert main(["serve", "--index", "/nonexistent", "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert needle in err and "ключ" not in err and err.count("\n") == 1


HEAVY = ("numpy", "scipy", "bm25s", "faiss", "onnxruntime", "openvino", "pypdf", "docx", "docutils", "openai")


def _subcommands() -> list[str]:
    from ragloop.cli._main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


def _nested(name: str) -> list[list[str]]:
    """``[name]`` and, for a command with subcommands of its own (``gaps list``…), each of those."""
    from ragloop.cli._main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    found = [[name]]
    for action in sub.choices[name]._actions:  # type: ignore[index]
        if action.choices and action.__class__.__name__ == "_SubParsersAction":
            found += [[name, child] for child in sorted(action.choices)]
    return found


class TestHelp:
    @pytest.mark.parametrize("command", [c for name in _subcommands() for c in _nested(name)], ids=" ".join)
    def test_every_subcommand_help_prints_and_exits_0(
        self, command: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`ragloop COMMAND --help` prints its usage and exits 0 (a `%` in a help string made `index --help`
        a traceback)."""
        with pytest.raises(SystemExit) as done:
            main([*command, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: ragloop " + " ".join(command))

    def test_the_removed_share_in_help_is_the_real_cap(self) -> None:
        """The share `index --help` quotes for --prune is the cap the update enforces."""
        from ragloop.cli._store import REMOVED_SHARE_SHOWN
        from ragloop.retrievers.update import MAX_REMOVED_SHARE

        assert REMOVED_SHARE_SHOWN == MAX_REMOVED_SHARE

    @pytest.mark.parametrize("argv", [["--version"], ["--help"], ["index", "--help"], ["chat", "--help"]], ids=str)
    def test_version_and_help_import_nothing_heavy(self, argv: list[str]) -> None:
        """`ragloop --version`, `--help` and a subcommand's `--help` import none of the retrieval stack or the
        loaders (numpy, scipy, bm25s, faiss, onnxruntime, openvino, pypdf, docx, docutils, openai)."""
        import subprocess
        import sys

        code = (
            "import sys\n"
            "from ragloop.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit:\n"
            "    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), file=sys.stderr)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


class TestServePage:
    def test_serve_refuses_a_colour_that_is_not_one(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``ragloop serve --colour 'red; x'`` stops before the index loads, saying what a colour looks like."""
        assert main(["serve", "--index", "/nonexistent", "--port", "0", "--colour", "red; x"]) == 2
        err = capsys.readouterr().err
        assert "page_colour must be #rgb, #rrggbb or a CSS colour name" in err and "Traceback" not in err
