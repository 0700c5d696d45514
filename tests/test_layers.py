"""The import layers of src/ragloop: every arrow points down the table below, and no modules import each other.

The walk reads every import with ``ast`` — module level, inside functions, under ``TYPE_CHECKING`` — plus the
module names of lazy-import tables (``{"ChatRAG": "ragloop.chat"}``, ``importlib.import_module("…")``), since
those are imports too. A new top-level module or package must be placed in :data:`LAYERS` before it can land.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Top-level modules and packages of ``ragloop``, lowest layer first. A module may import its own layer and the
#: layers below it (``ragloop`` itself is the package's ``__init__``: the public facade, on top).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "events", "_log", "_redact"),  # what runs and what it raises and streams; logging, redaction
    ("runner", "mermaid"),  # the graph runner: knows nothing of RAG
    ("text",),  # leaf text analysis
    ("usage", "caches"),  # judge-call metering; the cache protocol and its in-memory default
    ("state", "plan"),  # the turn state and the frozen values that flow through a turn (a plan is one)
    ("policy", "prompt_budget", "freshness"),  # the pure routing function; prompt token budgets; stale pages
    ("retrievers", "sample"),  # stores, embedders, live sources, ingestion; the bundled sample index
    ("llm",),  # judge Protocols, OpenAI-compatible and offline judges
    ("nodes",),  # one module per node
    ("turn",),  # settings, default nodes, graph, decision record
    ("turnlog", "gaps"),  # the log of finished turns; the content-gap report over it
    # ChatRAG, Reply; OpenTelemetry spans of finished turns; the KB regression gate; replaying logged questions
    ("chat", "otel", "kbcheck", "replay"),
    # the app, the CLI, the test kit, the extension contract, the facade
    ("serve", "cli", "testing", "extend", "ragloop"),
)

#: Arrows allowed against the order, each with the reason and who removes it: ``(importer, imported) -> note``.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


@attrs.frozen
class Arrow:
    """One import: ``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: str
    line: int

    def where(self) -> str:
        """``src/ragloop/x.py:12``."""
        return f"{self.path}:{self.line}"


def module_names(src: Path) -> dict[str, Path]:
    """Dotted module name → file, for every module under ``src/ragloop``."""
    out: dict[str, Path] = {}
    for path in sorted((src / "ragloop").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``ragloop.x.Y`` → ``ragloop.x``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every dotted name ``tree`` imports (submodules from ``from x import y`` too), with its line."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # a submodule (``from ragloop import text``) or a name in ``base``
                yield f"{base}.{alias.name}", node.lineno
        elif isinstance(node, ast.Dict):  # lazy-import tables: {"Name": "ragloop.module"}
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield value.value, value.lineno
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.value, node.lineno


def arrows(src: Path) -> list[Arrow]:
    """Every import between two modules of ``src/ragloop``, in file and line order."""
    modules = module_names(src)
    out: set[Arrow] = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        shown = path.relative_to(src.parent).as_posix()
        for name, line in _imported_names(tree, module, path.name == "__init__.py"):
            target = _resolve(name, modules) if name.startswith("ragloop") else None
            if target is not None and target != module:
                out.add(Arrow(module, target, shown, line))
    return sorted(out, key=lambda a: (a.path, a.line, a.target))


def layer_of(module: str) -> str:
    """The top-level name a module belongs to: ``ragloop.llm.offline.grade`` → ``llm``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ragloop"


def rank(layers: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    """Top-level name → layer index."""
    return {name: i for i, names in enumerate(layers) for name in names}


def unplaced(modules: dict[str, Path], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Top-level modules missing from ``layers``."""
    ranks = rank(layers)
    return sorted({layer_of(m) for m in modules} - ranks.keys())


def upward(found: list[Arrow], layers: tuple[tuple[str, ...], ...], known: dict[tuple[str, str], str]) -> list[str]:
    """One line per arrow that points up the layer order."""
    ranks = rank(layers)
    out = []
    for a in found:
        low, high = layer_of(a.source), layer_of(a.target)
        if low in ranks and high in ranks and ranks[low] < ranks[high] and (a.source, a.target) not in known:
            out.append(f"{a.where()}: {a.source} -> {a.target} points up ({low!r} is below {high!r})")
    return out


def cycles(found: list[Arrow], known: dict[tuple[str, str], str]) -> list[str]:
    """One line per group of modules that import each other (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {}
    for a in found:
        if (a.source, a.target) not in known:
            graph.setdefault(a.source, set()).add(a.target)
            graph.setdefault(a.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for group in groups:
        inside = [f"{a.where()}: {a.source} -> {a.target}" for a in found if a.source in group and a.target in group]
        out.append(f"cycle between {', '.join(group)}:\n    " + "\n    ".join(inside))
    return out


class TestRagloop:
    """The real package."""

    def test_every_top_level_module_is_placed(self) -> None:
        """A new module or package must be given a layer in LAYERS before it lands."""
        missing = unplaced(module_names(SRC), LAYERS)
        assert not missing, f"place these top-level modules in LAYERS (tests/test_layers.py): {missing}"

    def test_imports_point_down(self) -> None:
        """No module imports one of a higher layer (TYPE_CHECKING and function-level imports count)."""
        bad = upward(arrows(SRC), LAYERS, KNOWN_EXCEPTIONS)
        assert not bad, "imports against the layer order:\n" + "\n".join(bad)

    def test_no_import_cycles(self) -> None:
        """No two modules import each other, directly or through others."""
        bad = cycles(arrows(SRC), KNOWN_EXCEPTIONS)
        assert not bad, "\n".join(bad)

    def test_known_exceptions_still_exist(self) -> None:
        """An exception that no longer occurs is removed from KNOWN_EXCEPTIONS."""
        present = {(a.source, a.target) for a in arrows(SRC)}
        assert set(KNOWN_EXCEPTIONS) <= present, f"remove from KNOWN_EXCEPTIONS: {set(KNOWN_EXCEPTIONS) - present}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        path = src / "ragloop" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return src


LOW_HIGH = (("low",), ("high",))


class TestChecker:
    """The checks themselves, on made-up packages."""

    def test_upward_arrow_named_with_file_and_line(self, tmp_path: Path) -> None:
        """An import of a higher layer inside a function is reported with its file, line and arrow."""
        src = _package(tmp_path, {"__init__.py": "", "high.py": "", "low.py": "def f():\n    import ragloop.high\n"})
        assert upward(arrows(src), LOW_HIGH, {}) == [
            "src/ragloop/low.py:2: ragloop.low -> ragloop.high points up ('low' is below 'high')"
        ]

    def test_type_checking_import_counts(self, tmp_path: Path) -> None:
        """An import under TYPE_CHECKING is an arrow like any other."""
        src = _package(
            tmp_path,
            {
                "__init__.py": "",
                "high/__init__.py": "",
                "high/mod.py": "X = 1\n",
                "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ragloop.high.mod import X\n",
            },
        )
        assert [(a.source, a.target, a.line) for a in arrows(src)] == [("ragloop.low", "ragloop.high.mod", 3)]
        assert len(upward(arrows(src), LOW_HIGH, {})) == 1

    def test_lazy_table_counts(self, tmp_path: Path) -> None:
        """A lazy-import table entry is an arrow."""
        src = _package(tmp_path, {"__init__.py": "", "high.py": "", "low.py": '_LAZY = {"Y": "ragloop.high"}\n'})
        assert len(upward(arrows(src), LOW_HIGH, {})) == 1

    def test_downward_arrow_passes(self, tmp_path: Path) -> None:
        """Importing a lower layer is fine."""
        src = _package(tmp_path, {"__init__.py": "", "low.py": "", "high.py": "from ragloop import low\n"})
        assert upward(arrows(src), LOW_HIGH, {}) == []
        assert cycles(arrows(src), {}) == []

    def test_known_exception_is_skipped(self, tmp_path: Path) -> None:
        """A listed exception is not reported."""
        src = _package(tmp_path, {"__init__.py": "", "high.py": "", "low.py": "import ragloop.high\n"})
        assert upward(arrows(src), LOW_HIGH, {("ragloop.low", "ragloop.high"): "why"}) == []

    def test_cycle_in_one_layer(self, tmp_path: Path) -> None:
        """Two modules of one layer importing each other are a cycle, with both arrows named."""
        src = _package(
            tmp_path,
            {
                "__init__.py": "",
                "a/__init__.py": "",
                "a/x.py": "from ragloop.a import y\n",
                "a/y.py": "import ragloop.a.x\n",
            },
        )
        [report] = cycles(arrows(src), {})
        assert "ragloop.a.x, ragloop.a.y" in report
        assert "src/ragloop/a/x.py:1: ragloop.a.x -> ragloop.a.y" in report
        assert "src/ragloop/a/y.py:1: ragloop.a.y -> ragloop.a.x" in report

    def test_unplaced_module_listed(self, tmp_path: Path) -> None:
        """A top-level module missing from the table is listed."""
        src = _package(tmp_path, {"__init__.py": "", "low.py": "", "newthing/__init__.py": ""})
        assert unplaced(module_names(src), (("low", "ragloop"),)) == ["newthing"]


@pytest.mark.parametrize("name", [n for layer in LAYERS for n in layer])
def test_layer_names_are_unique(name: str) -> None:
    """Each name sits in one layer."""
    assert sum(name in layer for layer in LAYERS) == 1
