"""``ragloop.testing`` is the one public test kit: every documented name imports, and ``__all__`` is complete."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import ragloop.testing

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "src" / "ragloop" / "testing"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# `from ragloop.testing import A, B` or `from ragloop.testing import (\n A,\n B,\n)`, in prose, code or docstrings.
IMPORT_LINE = re.compile(r"from ragloop\.testing import (\([^)]*\)|[^\n]+)")
LEADING_NAME = re.compile(r"\s*([A-Za-z_]\w*)")
# `ragloop.testing.Name` written out in prose.
DOTTED = re.compile(r"ragloop\.testing\.([A-Za-z_]\w*)")


def documented_names(text: str) -> set[str]:
    """The names that ``text`` imports from, or spells out under, ``ragloop.testing``."""
    names = {name for name in DOTTED.findall(text) if not name.startswith("_")}  # private modules: internal use
    for match in IMPORT_LINE.finditer(text):
        names |= {m.group(1) for part in match.group(1).strip("()").split(",") if (m := LEADING_NAME.match(part))}
    return names


def sources_that_document_the_kit() -> list[Path]:
    """README.md, docs/*.md, and every Python file under src/ and benchmarks/ (docstrings show imports)."""
    return [*DOCS, *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]


class TestDocumentedNames:
    def test_the_issue_example_imports(self) -> None:
        """`from ragloop.testing import FakeRetriever, ScriptedOpenAIServer` works."""
        from ragloop.testing import FakeRetriever, ScriptedOpenAIServer

        assert FakeRetriever.__module__.startswith("ragloop.testing")
        assert ScriptedOpenAIServer.__module__.startswith("ragloop.testing")

    def test_readme_and_docs_import_the_kit(self) -> None:
        """README.md and docs/testing.md show at least one import from the kit (else the check below is empty)."""
        assert documented_names((ROOT / "README.md").read_text(encoding="utf-8"))
        assert documented_names((ROOT / "docs" / "testing.md").read_text(encoding="utf-8"))

    @pytest.mark.parametrize("path", sources_that_document_the_kit(), ids=lambda p: str(p.relative_to(ROOT)))
    def test_every_documented_name_imports(self, path: Path) -> None:
        """Each name a document imports from (or spells under) ``ragloop.testing`` is exported there."""
        names = documented_names(path.read_text(encoding="utf-8"))
        missing = sorted(name for name in names if name not in ragloop.testing.__all__)
        assert not missing, f"{path.relative_to(ROOT)} names {missing}, not exported by ragloop.testing"
        for name in names:
            exec(f"from ragloop.testing import {name}", {})

    def test_fakes_named_in_prose_exist(self) -> None:
        """Every ``Fake…`` name written in README.md or docs/*.md is a fake the kit exports."""
        named = {m for path in DOCS for m in re.findall(r"`(Fake\w+)", path.read_text(encoding="utf-8"))}
        assert named, "the README names some fakes"
        assert named <= set(ragloop.testing.__all__)


class TestAll:
    def test_all_is_complete_and_sorted(self) -> None:
        """``__all__`` lists exactly the public names of the package, sorted (as httpx checks its own)."""
        public = [
            name
            for name, value in vars(ragloop.testing).items()
            if not name.startswith("_") and name != "annotations" and not inspect.ismodule(value)
        ]
        assert ragloop.testing.__all__ == sorted(public)

    def test_public_classes_and_functions_have_docstrings(self) -> None:
        """Every exported class and function says what it is."""
        undocumented = [
            name
            for name in ragloop.testing.__all__
            if (inspect.isclass(obj := getattr(ragloop.testing, name)) or inspect.isfunction(obj))
            and not inspect.getdoc(obj)
        ]
        assert not undocumented

    def test_old_module_is_gone(self) -> None:
        """The fakes live in the kit only: the old ``ragloop.fakes`` module no longer exists."""
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("ragloop.fakes")


class TestLayout:
    @pytest.mark.parametrize("path", sorted(KIT.glob("*.py")), ids=lambda p: p.name)
    def test_no_module_of_the_kit_is_a_god_module(self, path: Path) -> None:
        """Each module of the kit stays under 350 lines; only ``__init__`` is public."""
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 350
        assert path.name == "__init__.py" or path.name.startswith("_")

    def test_init_only_re_exports(self) -> None:
        """The package ``__init__`` defines nothing itself: every public name comes from a private module."""
        tree = ast.parse((KIT / "__init__.py").read_text(encoding="utf-8"))
        defined = [node for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
        assert not defined
        for name in ragloop.testing.__all__:
            obj = getattr(ragloop.testing, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__module__.startswith("ragloop.testing._"), f"{name} comes from {obj.__module__}"
