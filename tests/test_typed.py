"""Typed for its users: ragloop ships py.typed, so mypy --strict checks a user's file against ragloop's own types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ragloop"

USER_FILE = """
from ragloop.extend import Candidates, FusionRanker, Hit
from ragloop.turn import Turn


class Reversed:
    async def rank(self, candidates: Candidates) -> list[Hit]:
        return list(reversed(await FusionRanker().rank(candidates)))


def wire(turn: Turn) -> Turn:
    return turn.ranker(Reversed())
"""


def test_the_marker_is_in_the_package() -> None:
    """py.typed sits in the package folder (the wheel ships every file there: scripts/check_wheel.sh checks)."""
    assert (SRC / "py.typed").is_file()


@pytest.mark.slow
def test_a_users_file_passes_mypy_strict(tmp_path: Path) -> None:
    """A user's ranker, written against ragloop.extend, passes mypy --strict from outside the checkout (no
    import-untyped), and a wrong type in it is caught (so the check is real)."""
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(USER_FILE)
    bad.write_text(USER_FILE.replace("return turn.ranker(Reversed())", "return turn.ranker(Reversed()).build()"))
    # One mypy run over both files (each run analyses ragloop and its dependencies afresh, so two cost twice).
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache")]
    run = subprocess.run([*cmd, "good.py", "bad.py"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert "import-untyped" not in run.stdout, run.stdout
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert run.returncode == 1 and len(errors) == 1, run.stdout + run.stderr
    assert errors[0].startswith("bad.py:"), errors
    assert 'Incompatible return value type (got "BuiltTurn", expected "Turn")' in errors[0]
