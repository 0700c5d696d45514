"""--turn-log on `ragloop ask` (the same options reach `chat` and `serve`): a row per turn, private mode, one-line
errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.turnlog import TurnLog


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A small hash-embedded index."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "keys.md").write_text("# API keys\n\nTo rotate an API key, create a new key and revoke the old one.\n")
    assert main(["index", str(docs), "--out", str(tmp_path / "index"), "--embedder", "hash"]) == 0
    return tmp_path / "index"


class TestAskTurnLog:
    def test_ask_logs_its_turn(self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`ask --json --turn-log` prints the turn_id, and the log holds that turn when the command returns."""
        capsys.readouterr()
        url = f"sqlite:{tmp_path / 'turns.db'}"
        assert main(["ask", "--index", str(index), "--turn-log", url, "--json", "How do I rotate an API key?"]) == 0
        reply = json.loads(capsys.readouterr().out)
        [turn] = TurnLog.open(url).turns()
        assert turn.row.turn_id == reply["turn_id"] and turn.row.question == "How do I rotate an API key?"

    def test_private_log_keeps_no_question(
        self, index: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--turn-log-no-questions keeps the terms and an embedding, not the text."""
        url = f"sqlite:{tmp_path / 'turns.db'}"
        argv = ["ask", "--index", str(index), "--turn-log", url, "--turn-log-no-questions", "--json"]
        assert main([*argv, "How do I rotate an API key?"]) == 0
        [turn] = TurnLog.open(url).turns()
        assert turn.row.question is None and "rotate" in turn.row.terms
        assert turn.embedder == "hash-512" and turn.embedding is not None and len(turn.embedding) == 512

    @pytest.mark.parametrize("url", ["mysql://u:pw@h/db", "sqlite:/no/such/folder/turns.db"])
    def test_bad_turn_log_is_one_line(self, index: Path, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A turn log URL of no known kind, or in a folder that does not exist, is one line and exit 2."""
        capsys.readouterr()
        assert main(["ask", "--index", str(index), "--turn-log", url, "q"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "turn log" in err and "pw@" not in err

    def test_retention_must_be_positive(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--turn-log-retention 0 is refused before anything loads."""
        with pytest.raises(SystemExit):
            main(["ask", "--turn-log", "sqlite:t.db", "--turn-log-retention", "0", "q"])
        assert "positive number of days" in capsys.readouterr().err


class TestChatTurnLog:
    def test_piped_chat_logs_every_turn(self, index: Path, tmp_path: Path) -> None:
        """`chat --turn-log` (the options ask and chat share in cli_chat/): each question of a piped chat is one
        row, written by the time the chat exits."""
        url = f"sqlite:{tmp_path / 'turns.db'}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
        env.update(XDG_STATE_HOME=str(tmp_path / "state"), HF_HUB_OFFLINE="1")
        cmd = [sys.executable, "-m", "ragloop.cli", "chat", "--index", str(index), "--no-live", "--quiet"]
        stdin = "How do I rotate an API key?\nand the old one?\n"
        done = subprocess.run(
            [*cmd, "--turn-log", url], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        turns = TurnLog.open(url).turns()
        assert [t.row.question for t in turns] == ["How do I rotate an API key?", "and the old one?"]


class TestServeTurnLog:
    def test_serve_hands_its_turn_log_options_to_the_chat(self, tmp_path: Path) -> None:
        """`serve --turn-log …` reaches the chat it builds (through the options `ask` shares with it)."""
        from ragloop.cli import build_parser
        from ragloop.cli._serve import _chat_args

        url = f"sqlite:{tmp_path / 'turns.db'}"
        args = build_parser().parse_args(["serve", "--turn-log", url, "--turn-log-retention", "30"])
        merged = _chat_args(args)
        assert (merged.turn_log, merged.turn_log_retention, merged.turn_log_no_questions) == (url, 30.0, False)

    def test_turn_log_per_key_reaches_the_log(self, tmp_path: Path) -> None:
        """``--turn-log-per-key N`` is the log's per-key cap (default 100,000); 0 is refused before anything
        loads."""
        from ragloop.cli import build_parser
        from ragloop.cli._turnlog import open_turn_log

        url = f"sqlite:{tmp_path / 'turns.db'}"
        for extra, cap in (([], 100_000), (["--turn-log-per-key", "7"], 7)):
            log = open_turn_log(build_parser().parse_args(["serve", "--turn-log", url, *extra]))
            assert log is not None and log.max_turns_per_principal == cap
            log.close()
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--turn-log", url, "--turn-log-per-key", "0"])
