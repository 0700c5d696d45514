"""A griffe extension for the API reference: the docstrings' Sphinx roles become checked cross-references.

The docstrings write references the Sphinx way (``:class:`~ragloop.turn.Turn```, ``:meth:`ask```); mkdocstrings
reads Markdown. This extension rewrites each role into an autorefs link (``[`Turn`][ragloop.turn.Turn]``) when
griffe loads the object, so ``mkdocs build --strict`` fails on a reference to a name that does not exist.
Used by ``mkdocs.yml``; not part of the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([A-Za-z_][\w.]*)`")


def rewrite(text: str) -> str:
    """``text`` with every Sphinx role as a Markdown cross-reference (``~`` keeps only the last name shown).

    Three kinds stay plain code: another project's names (no inventory to check them against offline), fields
    (``:attr:``, documented in their class's Attributes section, which has no anchors) and private names.
    """

    def link(match: re.Match[str]) -> str:
        role, short, target = match.group(1), match.group(2) == "~", match.group(3)
        shown = target.rsplit(".", 1)[-1] if short else target
        if "." in target and not target.startswith("ragloop."):
            return f"`{shown}`"  # another project's name (typing.Protocol): no inventory to check it against
        if role == "attr" or "._" in target:
            return f"`{shown}`"  # a field of an Attributes section, or a private name: neither has a page
        return f"[`{shown}`][{target}]"

    return _ROLE.sub(link, text)


class SphinxRoles(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
