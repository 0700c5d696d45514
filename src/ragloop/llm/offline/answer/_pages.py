"""What kind of page a block comes from, for the answer's choice: a changelog ("Release notes", "What's New in
Python 3.12", "CHANGELOG.md") mentions every API in passing ("`token_urlsafe` now accepts …") and its one-line
entries share a question's words as closely as the reference page that explains them, so on a question that
asks how something works it outranks the page that answers. Its units weigh ``CHANGELOG_WEIGHT`` unless the
question asks about a change itself ("Which release added passkeys?", "What changed in 3.2?", "since which
version …")."""

from __future__ import annotations

import re

from ragloop.state import ContextBlock

__all__ = ["CHANGELOG_WEIGHT", "asks_about_changes", "is_changelog", "page_weight"]

#: The weight of a changelog's units for a question that does not ask about a change (see the module docstring).
CHANGELOG_WEIGHT = 0.6
_CHANGELOG = re.compile(
    r"release[\s_-]*notes?|change[\s_-]*log|what['’]?s[\s_-]*new|\bnews\b|\bchanges\s+in\b|\bhistory\s+of\s+changes",
    re.IGNORECASE,
)
_ASKS_CHANGE = re.compile(
    r"\b(?:versions?|releases?|released|changed?|changes|changelog|new\s+in|added|removed|deprecated|since|"
    r"upgrad\w*|migrat\w*|latest|ship(?:ped|s)?|introduced|v?\d+\.\d+(?:\.\d+)?)\b",
    re.IGNORECASE,
)


def is_changelog(block: ContextBlock) -> bool:
    """Whether ``block``'s page is a changelog, by its title or its address or source path (no anchor)."""
    where = " ".join(p.split("#", 1)[0] for p in (block.url, block.source) if p)
    return bool(_CHANGELOG.search(block.title) or _CHANGELOG.search(where))


def asks_about_changes(question: str) -> bool:
    """Whether ``question`` asks about a change or a version (see the module docstring)."""
    return _ASKS_CHANGE.search(question) is not None


def page_weight(block: ContextBlock, question: str) -> float:
    """The weight of ``block``'s units for ``question``: ``CHANGELOG_WEIGHT`` for a changelog's when the
    question does not ask about a change, else 1."""
    return CHANGELOG_WEIGHT if is_changelog(block) and not asks_about_changes(question) else 1.0
