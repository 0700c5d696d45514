"""Every public name has a docstring, and the API reference's role rewriting is right.

Public means: the names of ``ragloop.__all__``, ``ragloop.extend``, ``ragloop.testing``, ``ragloop.serve`` and the
turn log's modules (``ragloop.turnlog``, ``ragloop.gaps``, ``ragloop.kbcheck``, ``ragloop.freshness``), and the public
methods and properties their classes define. ``mkdocs build --strict`` (``.ci/run``) then fails on
a reference that does not resolve; this test fails on a public name the reference would show without words.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

FACES = (
    "ragloop",
    "ragloop.extend",
    "ragloop.testing",
    "ragloop.serve",
    "ragloop.turnlog",
    "ragloop.gaps",
    "ragloop.kbcheck",
    "ragloop.freshness",
)


def _doc(obj: Any) -> str:
    return (obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)) or ""


def undocumented(module_name: str) -> list[str]:
    """``module.name`` (and ``module.Class.member``) for each public name without a docstring."""
    module = importlib.import_module(module_name)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue  # a constant: documented by the #: comment above it
        if not _doc(obj).strip():
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_"):
                    continue
                inner = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if (inspect.isfunction(inner) or isinstance(value, property)) and not (inner.__doc__ or "").strip():
                    missing.append(f"{module_name}.{name}.{member}")
    return missing


class TestPublicNames:
    @pytest.mark.parametrize("module_name", FACES)
    def test_every_public_name_has_a_docstring(self, module_name: str) -> None:
        """A class, function, method or property of the public faces without a docstring is named here."""
        assert not undocumented(module_name), f"add docstrings (Google style): {undocumented(module_name)}"

    def test_the_check_finds_a_missing_docstring(self) -> None:
        """The check itself: an undocumented function and an undocumented method are both reported."""
        import types

        fake = types.ModuleType("fake_face")

        class Thing:
            """Documented."""

            def act(self) -> None:
                pass

        def bare() -> None:
            pass

        fake.__dict__.update(Thing=Thing, bare=bare, __all__=["Thing", "bare"])
        sys.modules["fake_face"] = fake
        try:
            assert undocumented("fake_face") == ["fake_face.Thing.act", "fake_face.bare"]
        finally:
            del sys.modules["fake_face"]


def _rewrite() -> Any:
    """``scripts/griffe_roles.py``'s ``rewrite`` (the script is not part of the package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        return importlib.import_module("griffe_roles").rewrite
    finally:
        sys.path.pop(0)


class TestRoleRewriting:
    def test_roles_become_checked_links(self) -> None:
        """A role to one of ours becomes an autorefs link (what the strict build checks); ~ shows the last name."""
        text = "See :class:`~ragloop.turn.Turn` and :meth:`ask`."
        assert _rewrite()(text) == "See [`Turn`][ragloop.turn.Turn] and [`ask`][ask]."

    def test_other_projects_fields_and_private_names_stay_code(self) -> None:
        """typing.Protocol, an attrs field and a private helper have no page to link to: plain code."""
        text = ":class:`typing.Protocol`, :attr:`glossary`, :func:`ragloop._redact.redact`"
        assert _rewrite()(text) == "`typing.Protocol`, `glossary`, `ragloop._redact.redact`"
