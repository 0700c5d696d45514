"""The guides' examples run as they are written: docs/extending.md's ranker, joined retriever and live source."""

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


#: docs/extending.md's examples, each a whole test file.
EXAMPLES = ("ranker", "retriever", "live")


class TestExtending:
    @pytest.mark.parametrize("name", EXAMPLES)
    def test_example_is_at_most_25_lines(self, name: str) -> None:
        """Each example (a whole test file: the piece, the pytest marker and backend fixture, its test) fits in 25
        lines."""
        lines = example(DOCS / "extending.md", name).splitlines()
        assert len(lines) <= 25, f"docs/extending.md's {name} example has {len(lines)} lines"

    @pytest.mark.parametrize("name", EXAMPLES)
    def test_example_runs_and_its_test_passes(
        self, name: str, sample_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The block runs on the sample (its default cache pointed at the session's), and its tests pass."""
        home = tmp_path / "home"
        (home / ".cache").mkdir(parents=True)
        (home / ".cache" / "ragloop").symlink_to(sample_cache)
        monkeypatch.setenv("HOME", str(home))
        namespace: dict[str, Any] = {"__name__": f"docs_extending_{name}"}
        exec(compile(example(DOCS / "extending.md", name), "docs/extending.md", "exec"), namespace)
        tests = [fn for key, fn in namespace.items() if key.startswith("test_")]
        assert tests, f"the {name} example defines no test"
        assert getattr(namespace.get("pytestmark"), "name", None) == "anyio", "the example shows the anyio marker"
        for test in tests:
            anyio.run(test)
