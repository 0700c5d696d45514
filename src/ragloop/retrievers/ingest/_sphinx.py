"""Sphinx's reStructuredText read by plain docutils: its roles and directives rendered as readable text.

docutils alone knows none of Sphinx's roles (``:class:``, ``:meth:``, ``:ref:``…) or directives
(``versionadded``, ``code-block``, ``function``…): it would keep a role's raw source and drop a directive with
all its content (a function's whole description). While :func:`sphinx_markup` is active, docutils falls back,
for a name it does not know, to:

- a role that shows its text as Sphinx renders it: ``:ref:`the tutorial <tut>``` → ``the tutorial``,
  ``:class:`~argparse.ArgumentParser``` → ``ArgumentParser``, ``:meth:`parse_args``` → ``parse_args()``;
- a directive that keeps its content: object descriptions (``function``, ``class``, ``method``…) become their
  signature then their description, ``versionadded``/``versionchanged``/``deprecated``/``seealso`` a labelled
  paragraph, ``code-block``/``sourcecode``/``testcode``/``doctest`` a literal block (indentation kept), and
  ``toctree``, ``index``, ``highlight``, ``currentmodule``, ``include``-like directives nothing (no file is ever
  read).

Also :func:`built_page`: the page Sphinx built from a ``_sources/…/x.rst.txt`` file, which citations point at.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

__all__ = ["built_page", "is_sphinx_source", "role_text", "sphinx_markup"]

_LOCK = threading.Lock()
_CALL_ROLES = frozenset(("func", "meth", "c:func", "py:func", "py:meth", "cpp:func"))
_LABELS = {
    "versionadded": "New in version",
    "versionchanged": "Changed in version",
    "deprecated": "Deprecated since version",
    "deprecated-removed": "Deprecated since version",
    "seealso": "See also",
    "impl-detail": "CPython implementation detail",
    "versionremoved": "Removed in version",
}
_KEYWORDS = frozenset(("class", "exception", "method", "classmethod", "staticmethod", "attribute", "data"))
_CODE = frozenset(("code-block", "sourcecode", "testcode", "testoutput", "doctest", "productionlist", "parsed-literal"))
_NOTHING = frozenset(
    (
        "toctree",
        "index",
        "highlight",
        "currentmodule",
        "module",
        "sectionauthor",
        "moduleauthor",
        "codeauthor",
        "tabularcolumns",
        "literalinclude",
        "include",
        "raw",
        "testsetup",
        "testcleanup",
        "autosummary",
        "automodule",
        "autoclass",
        "autofunction",
        "default-role",
        "default-domain",
    )
)


def is_sphinx_source(relative: str) -> bool:
    """Whether a path relative to the ingested folder is a Sphinx source copy (``…/_sources/…/x.rst.txt``)."""
    parts = PurePosixPath(relative).parts
    return "_sources" in parts[:-1] and relative.lower().endswith(".rst.txt")


def built_page(relative: str) -> str:
    """The built page of a Sphinx source copy: ``_sources/library/argparse.rst.txt`` → ``library/argparse.html``
    (and ``en/_sources/x.rst.txt`` → ``en/x.html``)."""
    parts = list(PurePosixPath(relative).parts)
    at = len(parts) - 1 - parts[::-1].index("_sources")
    rest = parts[:at] + parts[at + 1 :]
    rest[-1] = rest[-1][: -len(".rst.txt")] + ".html"
    return "/".join(rest)


def role_text(name: str, text: str) -> str:
    """What Sphinx shows for a role: the title of ``title <target>``, the last part of ``~a.b.c``, ``()`` after a
    function or method, without a leading ``!``."""
    text = text.strip()
    if text.endswith(">") and " <" in text:
        return text[: text.rindex(" <")].strip()
    text = text.lstrip("!")
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    if name.lower() in _CALL_ROLES and not text.endswith(")"):
        text += "()"
    return text


@contextlib.contextmanager
def sphinx_markup() -> Iterator[None]:
    """While active, docutils reads unknown roles and directives as Sphinx's (see the module docstring)."""
    from docutils.parsers.rst import directives, roles

    with _LOCK:
        known_role, known_directive = roles.role, directives.directive

        def role(name: str, language: Any, lineno: int, reporter: Any) -> tuple[Any, list[Any]]:
            found, messages = known_role(name, language, lineno, reporter)
            return (found, messages) if found is not None else (_role(name), [])

        def directive(name: str, language: Any, document: Any) -> tuple[Any, list[Any]]:
            if name.lower() == "class":  # Sphinx's object description; docutils' "class" is Sphinx's "rst-class"
                return _directive(name), []
            found, messages = known_directive("class" if name.lower() == "rst-class" else name, language, document)
            return (found, messages) if found is not None else (_directive(name), [])

        roles.role, directives.directive = role, directive
        try:
            yield
        finally:
            roles.role, directives.directive = known_role, known_directive


def _role(name: str) -> Any:
    from docutils import nodes, utils

    def show(
        role: str, rawtext: str, text: str, lineno: int, inliner: Any, options: Any = None, content: Any = None
    ) -> tuple[list[Any], list[Any]]:
        return [nodes.literal(rawtext, role_text(name, utils.unescape(text)))], []

    return show


class _AnyOptions(dict[str, Any]):
    """An option spec that accepts every option (their values are not shown)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> Any:
        from docutils.parsers.rst import directives

        return directives.unchanged


def _directive(name: str) -> Any:
    from docutils import nodes
    from docutils.parsers.rst import Directive

    kind = name.split(":")[-1].lower()

    class Generic(Directive):  # type: ignore[misc]  # docutils ships no types
        has_content = True
        optional_arguments = 1
        final_argument_whitespace = True
        option_spec = _AnyOptions()

        def run(self) -> list[Any]:
            # a signature continued over lines ends each with a backslash
            argument = " ".join(self.arguments[0].replace("\\\n", " ").split()) if self.arguments else ""
            if kind in _NOTHING:
                return []
            if kind in _CODE:
                code = "\n".join(self.content) or (self.arguments[0] if self.arguments else "")
                block = nodes.literal_block(code, code)
                if argument and kind == "code-block":
                    block["classes"].append(argument)
                return [block]
            out: list[Any] = []
            if kind in _LABELS:
                # "versionchanged:: 3.11 Calling add_argument_group() …": the version, then inline text
                version, _, rest = ("", "", argument) if kind == "seealso" else argument.partition(" ")
                label = f"{_LABELS[kind]} {version}".strip()
                para = nodes.paragraph("", label + (":" if rest or self.content else "") + (" " if rest else ""))
                if rest:
                    inline, _ = self.state.inline_text(rest, self.lineno)
                    para.extend(inline)
                out.append(para)
            elif argument:  # an object's signature: "class argparse.ArgumentParser(prog=None, …)"
                prefix = f"{kind} " if kind in _KEYWORDS else ""
                out.append(nodes.paragraph("", prefix + argument))
            if self.content:
                box = nodes.container()
                self.state.nested_parse(self.content, self.content_offset, box)
                out.append(box)
            return out

    return Generic
