"""The API reference and the public modules stay in step, and attrs classes show their constructors there.

The reference (``docs/api/*.md``, built by mkdocstrings from the source through griffe, never imported) renders a
documented module's ``__all__`` names that have a docstring, and every other public name the module itself defines
and documents. So each documented module must export exactly what it documents: every ``__all__`` name has words
(or the reference silently leaves it out), and nothing documented is missing from ``__all__`` (or the reference
shows a name the module does not export). ``scripts/griffe_attrs.py`` writes the ``__init__`` of attrs classes,
so ``Chunk``, ``Hit`` and ``LiveRecord`` show their constructor and defaults.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

import griffe
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^::: (\S+)((?:\n {4}.*)*)", re.MULTILINE)


def _attrs_extension() -> Any:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("griffe_attrs")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def documented_modules() -> dict[str, bool]:
    """Every module a ``:::`` directive of ``docs/api`` documents → whether its members are shown."""
    found: dict[str, bool] = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            found[match.group(1)] = "members: false" not in match.group(2)
    return found


def reference_extensions() -> griffe.Extensions:
    """The griffe extensions ``mkdocs.yml`` gives the reference (``#:`` comments, roles, attrs constructors)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    (mkdocstrings,) = [p["mkdocstrings"] for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    names = mkdocstrings["handlers"]["python"]["options"]["extensions"]
    return griffe.load_extensions(*(str(ROOT / n) if n.endswith(".py") else n for n in names))


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    module = griffe.load("ragloop", search_paths=[str(ROOT / "src")], extensions=reference_extensions())
    assert isinstance(module, griffe.Module)
    return module


def _module(package: griffe.Module, name: str) -> griffe.Module:
    obj = package if name == package.path else package[name.removeprefix(f"{package.path}.")]
    assert isinstance(obj, griffe.Module), name
    return obj


def _exports(module: griffe.Module) -> list[str] | None:
    if module.exports is None:
        return None
    return [e if isinstance(e, str) else e.name for e in module.exports]


def _has_docstring(obj: griffe.Object | griffe.Alias) -> bool:
    try:
        return bool(obj.docstring and obj.docstring.value.strip())
    except griffe.AliasResolutionError:
        return False


def out_of_step(package: griffe.Module, name: str) -> list[str]:
    """What the reference of module ``name`` would get wrong: exported names it leaves out, documented names
    the module does not export (an empty list: in step)."""
    module = _module(package, name)
    exports = _exports(module)
    own = {n: m for n, m in module.members.items() if not n.startswith("_") and not m.is_alias and not m.is_module}
    if exports is None:
        return [f"{name} documents {sorted(own)} but has no __all__"] if own else []
    problems = [
        f"{name}.{e} is in __all__ but not defined or imported there" for e in exports if e not in module.members
    ]
    problems += [
        f"{name}.{e} is in __all__ but has no docstring, so the reference leaves it out"
        for e in exports
        if e in module.members and not module.members[e].is_module and not _has_docstring(module.members[e])
    ]
    problems += [
        f"{name}.{n} is documented but not in __all__ (export it or make it private)"
        for n, member in own.items()
        if n not in exports and _has_docstring(member)
    ]
    return problems


def public_modules(src: Path) -> set[str]:
    """Every module under ``src/ragloop`` with no leading underscore in any part of its dotted name."""
    names = set()
    for path in sorted((src / "ragloop").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(part.startswith("_") for part in parts):
            names.add(".".join(parts))
    return names


class TestReferenceInStep:
    def test_every_public_module_is_in_the_reference(self) -> None:
        """A module a user can import by a public name has a ``:::`` directive in ``docs/api`` (document it, or
        rename it with a leading underscore)."""
        missing = public_modules(ROOT / "src") - set(documented_modules())
        assert missing == set(), f"document these in docs/api/*.md or make them private (_name): {sorted(missing)}"

    def test_every_referenced_module_is_public(self) -> None:
        """The reference documents no private module and no module that does not exist."""
        extra = set(documented_modules()) - public_modules(ROOT / "src")
        assert extra == set(), f"docs/api/*.md documents modules that are private or gone: {sorted(extra)}"

    def test_public_modules_skips_private_parts(self, tmp_path: Path) -> None:
        """A private module, a module in a private package and ``__main__`` are not public; a package is."""
        for rel in (
            "ragloop/__init__.py",
            "ragloop/a.py",
            "ragloop/_b.py",
            "ragloop/_p/c.py",
            "ragloop/q/__init__.py",
            "ragloop/q/__main__.py",
        ):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text("")
        assert public_modules(tmp_path) == {"ragloop", "ragloop.a", "ragloop.q"}

    @pytest.mark.parametrize("name", [n for n, shown in documented_modules().items() if shown])
    def test_a_documented_module_exports_exactly_what_it_documents(self, package: griffe.Module, name: str) -> None:
        """Every ``__all__`` name has a docstring (the reference shows it) and every documented name is exported."""
        assert out_of_step(package, name) == []

    def test_the_check_finds_a_module_out_of_step(self, tmp_path: Path) -> None:
        """An export without words and a documented name outside ``__all__`` are both reported."""
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text(
            '"""A package."""\n__all__ = ["Bare", "gone"]\nBare = int\n\n'
            'def extra() -> None:\n    """Documented, not exported."""\n'
        )
        pkg = griffe.load("pkg", search_paths=[str(tmp_path)])
        assert isinstance(pkg, griffe.Module)
        problems = out_of_step(pkg, "pkg")
        assert any("pkg.gone is in __all__ but not defined" in p for p in problems)
        assert any("Bare is in __all__ but has no docstring" in p for p in problems)
        assert any("extra is documented but not in __all__" in p for p in problems)

    def test_the_facade_page_names_every_export(self) -> None:
        """``ragloop``'s page shows no members; its text links every name of ``ragloop.__all__``."""
        import ragloop

        page = (ROOT / "docs" / "api" / "ragloop.md").read_text(encoding="utf-8")
        errors = {n for n in ragloop.__all__ if getattr(getattr(ragloop, n), "__module__", "") == "ragloop.errors"}
        unlinked = [n for n in ragloop.__all__ if n not in errors and f"[`{n}`]" not in page]
        assert unlinked == [] and ("ragloop.errors" in page or not errors)


class TestAttrsConstructors:
    @pytest.mark.parametrize(
        ("path", "signature"),
        [
            ("state.Chunk", "id: str, text: str, source: str = ''"),
            ("state.Hit", "chunk: Chunk, score: float, confidence: float = 0.0, ranks: Mapping[str, int] = dict()"),
            ("retrievers.live.LiveRecord", "source: str, id: str, title: str, text: str, url: str | None = None"),
            ("caches.Caches", "grades: Cache[Any] | None = MemoryCache(max_items=8192)"),
        ],
    )
    def test_public_values_show_their_constructor(self, package: griffe.Module, path: str, signature: str) -> None:
        """The reference's signature of each public value lists its fields with their defaults."""
        assert signature in _signature(package[path])

    def test_attrs_rules(self, tmp_path: Path) -> None:
        """Bases first, ``init=False`` left out, factories called, a private field passed by its public name,
        ``kw_only`` last, ``ClassVar`` and properties skipped, a hand-written ``__init__`` kept."""
        (tmp_path / "vals.py").write_text(
            "from typing import ClassVar\n"
            "from attrs import Factory, define, field, frozen\n\n"
            "@frozen\nclass Base:\n    a: int\n    b: str = 'x'\n\n"
            "@define(kw_only=False)\nclass Child(Base):\n"
            "    LIMIT: ClassVar[int] = 3\n"
            "    c: list[int] = field(factory=list)\n"
            "    _d: int = field(default=2)\n"
            "    e: int = field(init=False, default=0)\n"
            "    f: dict[str, int] = field(default=Factory(dict))\n"
            "    g: int = field(default=1, kw_only=True)\n"
            "    h: int = field(default=5, alias='height')\n\n"
            "    @property\n    def p(self) -> int:\n        return 1\n\n"
            "@define\nclass Own:\n    x: int\n    def __init__(self, y: str) -> None:\n        self.x = len(y)\n"
        )
        module = griffe.load(
            "vals", search_paths=[str(tmp_path)], extensions=griffe.load_extensions(_attrs_extension().AttrsInit)
        )
        assert _signature(module["Child"]) == (
            "a: int, b: str = 'x', c: list[int] = list(), d: int = 2, f: dict[str, int] = dict(), height: int = 5, "
            "*, g: int = 1"
        )
        assert _signature(module["Own"]) == "y: str"


def _signature(cls: griffe.Object | griffe.Alias) -> str:
    """``cls.__init__``'s parameters after ``self`` as written in the reference (``*`` before keyword-only)."""
    init = cls.members["__init__"]
    assert init.is_function
    out, star = [], False
    for p in list(init.parameters)[1:]:
        if p.kind is griffe.ParameterKind.keyword_only and not star:
            out.append("*")
            star = True
        out.append(f"{p.name}: {p.annotation}" + ("" if p.default is None else f" = {p.default}"))
    return ", ".join(out)
