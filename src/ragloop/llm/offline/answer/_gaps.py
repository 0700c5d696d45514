"""What a reply says the knowledge base does not cover: the "not covered" reply and the gaps it may name.

A gap a reply names is made of the user's own words, a few of them: never a plan step, a reason, a rewritten
query or a whole sub-question the turn wrote itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["MAX_GAP_WORDS", "NOT_COVERED", "join_quoted", "not_covered", "user_gaps"]

#: How a reply with nothing to quote begins: it says the knowledge base does not cover the question.
NOT_COVERED = "The knowledge base doesn't cover this, so I won't guess."
_TRY = "Try rephrasing, or add a detail such as a product name, a feature or an error message."


#: A gap longer than this many words (a whole question) is not named in a "not covered" reply.
MAX_GAP_WORDS = 4


_GAP_WORD = re.compile(r"[\w'’-]+")


def user_gaps(missing: Sequence[str], question: str | None = None) -> list[str]:
    """The gaps a reply may name: short ones (at most :data:`MAX_GAP_WORDS` words) made only of the user's own
    words. A gap written by the turn itself — a plan step ("tickets found by sql1"), a reason ("depends on
    'sql1', which was refused"), a rewritten or whole sub-question — is never shown to the user; without
    ``question`` only the length rule applies."""
    asked = {w.casefold() for w in _GAP_WORD.findall(question)} if question is not None else None
    out = []
    for m in missing:
        gap = " ".join(m.split())
        words = _GAP_WORD.findall(gap)
        if not words or len(gap.split()) > MAX_GAP_WORDS or any(c in gap for c in "()'\"{}[]:"):
            continue
        if asked is not None and any(w.casefold() not in asked for w in words):
            continue
        if gap not in out:
            out.append(gap)
    return out


def not_covered(missing: Sequence[str] = (), question: str | None = None) -> str:
    """The reply for a question the knowledge base does not cover, naming the few words it says nothing about
    ("Trello"); a longer gap (the whole question) or one the user did not write is not shown (:func:`user_gaps`)."""
    gaps = user_gaps(missing, question)
    if not gaps:
        return f"{NOT_COVERED} {_TRY}"
    return f"The knowledge base doesn't cover this: it says nothing about {join_quoted(gaps)}, so I won't guess. {_TRY}"


def join_quoted(items: Sequence[str]) -> str:
    """The items in curly quotes, joined as a sentence says them ("“a”, “b” or “c”")."""
    quoted = [f"“{i}”" for i in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
