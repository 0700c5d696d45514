"""The guides' examples run as they are written: docs/extending.md's reranker and retriever, with their test."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def example(path: Path, name: str) -> str:
    """The ``python`` code block that follows ``<!-- example: name -->`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    found = re.search(rf"<!-- example: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert found, f"{path.name} has no code block marked <!-- example: {name} -->"
    return found.group(1)


class TestExtending:
    def test_example_is_at_most_25_lines(self) -> None:
        """The reranker, the retriever and their test fit in 25 lines, as the issue promised."""
        lines = example(DOCS / "extending.md", "extending").splitlines()
        assert len(lines) <= 25, f"docs/extending.md's example has {len(lines)} lines"

    def test_example_runs_and_its_test_passes(
        self, sample_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The block runs on the sample (its default cache pointed at the session's), and its test passes."""
        home = tmp_path / "home"
        (home / ".cache").mkdir(parents=True)
        (home / ".cache" / "ragloop").symlink_to(sample_cache)
        monkeypatch.setenv("HOME", str(home))
        namespace: dict[str, Any] = {"__name__": "docs_extending"}
        exec(compile(example(DOCS / "extending.md", "extending"), "docs/extending.md", "exec"), namespace)
        tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
        assert tests, "the example defines no test"
        for test in tests:
            anyio.run(test)
