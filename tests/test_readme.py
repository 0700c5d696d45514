"""The README's main-job command keeps working (run as a subprocess, offline)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The two set-up commands of the README's first code block."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_has_two_commands_and_ci_runs_the_test_one() -> None:
    """The first screen has exactly two commands; .ci/run ends by running the second one, after the style gate."""
    commands = readme_commands()
    assert len(commands) == 2
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert lines[-1] == commands[1]
    gate = ("ruff check", "ruff format --check", "mypy --strict src", "tests/test_layers.py")
    assert all(any(step in line for line in lines[:-1] if not line.startswith("#")) for step in gate)


def test_main_job_command_answers_offline(sample_cache: Path) -> None:
    """The README's `ragloop ask …` answers from the sample KB with no API key and no network."""
    ask = readme_commands()[0].split("&& ")[-1]
    argv = shlex.split(ask)
    assert argv[0].endswith("ragloop") and argv[1] == "ask"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RAGLOOP_"))}
    env["HF_HUB_OFFLINE"] = "1"
    cmd = [sys.executable, "-m", "ragloop.cli", *argv[1:], "--cache-dir", str(sample_cache), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "running offline" in done.stderr
    out = json.loads(done.stdout)
    assert out["outcome"] in ("context", "partial") and out["citations"]
    assert {"sso-saml.md"} & {c["source"] for c in out["citations"]}
    assert out["record"]["llm_calls"] == 0
    # The reply leads with the main clause (where SAML is set up) from the SAML page, as the README shows it.
    shown = re.search(r"```text\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert shown is not None
    first = shown.group(1).split(" [1] ", 1)[0]
    assert out["text"].startswith(first + " [1]"), out["text"]
    assert out["citations"][0]["source"] == "sso-saml.md"


def test_cli_error_is_one_line(tmp_path: Path) -> None:
    """A bad index directory is one clear line on stderr and exit status 2, not a traceback."""
    cmd = [
        sys.executable,
        "-m",
        "ragloop.cli",
        "ask",
        "hello there, how do I export?",
        "--index",
        str(tmp_path / "nope"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error:" in done.stderr


def test_layout_names_only_paths_that_exist() -> None:
    """Every src/ragloop path the README's Layout section names is in the tree (no module that is gone)."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout") :]
    named = re.findall(r"src/ragloop/[\w/]+(?:\.py)?", layout)
    assert named, "README.md's Layout section names no src/ragloop paths"
    assert [p for p in named if not (root / p).exists()] == []
    mentioned = re.findall(r"\b([a-z_]+\.py)\b", layout)  # other modules named in passing (plan.py, cli*.py)
    tree = {p.name for p in (root / "src" / "ragloop").rglob("*.py")}
    assert [m for m in mentioned if m not in tree] == []
