"""Checks on what a model wrote before ragloop acts on it: search queries, direct replies, small talk.

A weak model, or a server that drops the tools from the prompt, writes things that must not become a search
query or a reply: tool-call syntax (``<tool_call>``, ``{"name": "search", …}``), chat-template tokens
(``<|im_end|>``), control characters, 140 characters of digits and slashes. Each check returns the reason a
text is unusable, or ``None``; the reason ends up in the turn's record. :func:`model_json` and
:func:`flat_objects` read the JSON a model wrote, whatever it wrote.

Everything here is pure.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

__all__ = ["MAX_QUERY_CHARS", "flat_objects", "is_small_talk", "model_json", "query_problem", "reply_problem"]

#: Longest search query accepted from a model (characters).
MAX_QUERY_CHARS = 200

# Tags (<tool_call>, </tools>, <|im_end|>), JSON objects naming tool fields, code fences, bracket markers.
_MARKUP = re.compile(
    r"<\s*/?\s*\|?[A-Za-z_][\w:|-]*\s*\|?\s*/?>"
    r"|<\|[^>]*\|>"
    r"|\{\s*\"(?:name|arguments|function|tool_calls?|action|queries|query)\"\s*:"
    r"|```"
    r"|\[/?(?:TOOL_CALLS|TOOL_RESULTS|INST|ARGS)\]",
    re.IGNORECASE,
)
_WORD = re.compile(r"[^\W_]")
_SEGMENTS = re.compile(r"[.!?,;:\n]+")


def _unprintable(text: str) -> bool:
    return any(
        ch == "\ufffd" or (unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs", "Cn") and ch not in "\n\t")
        for ch in text
    )


def query_problem(query: str, *, max_chars: int = MAX_QUERY_CHARS) -> str | None:
    """Why ``query`` cannot be searched (empty, too long, unprintable, markup, no words, mostly symbols), or None."""
    text = " ".join(query.split())
    wordy = sum(ch.isalnum() or ch.isspace() for ch in text)
    checks = (
        (not text, "empty query"),
        (len(text) > max_chars, f"query is {len(text)} characters; the limit is {max_chars}"),
        (_unprintable(query), "query holds control or unprintable characters"),
        (bool(_MARKUP.search(text)), "query holds markup or tool-call syntax"),
        (not _WORD.search(text), "query has no words"),
        (wordy < 0.7 * len(text), "query is mostly punctuation or symbols"),
    )
    return next((why for failed, why in checks if failed), None)


def reply_problem(reply: str, *, max_chars: int = 4000) -> str | None:
    """Why ``reply`` cannot be shown as a direct reply (empty, too long, unprintable, markup, no words), or None."""
    text = reply.strip()
    checks = (
        (not text, "empty reply"),
        (len(text) > max_chars, f"reply is {len(text)} characters; the limit for a direct reply is {max_chars}"),
        (_unprintable(reply), "reply holds control or unprintable characters"),
        (bool(_MARKUP.search(text)), "reply holds markup or tool-call syntax"),
        (not _WORD.search(text), "reply has no words"),
    )
    return next((why for failed, why in checks if failed), None)


def is_small_talk(question: str) -> bool:
    """True when every part of ``question`` is small talk (greetings, thanks, goodbyes, "who are you" …)."""
    from ragloop.llm.offline.decide import small_talk_kind

    parts = [p for p in _SEGMENTS.split(question) if p.strip()]
    return bool(parts) and all(small_talk_kind(p) is not None for p in parts)


#: A JSON object with no object inside it (what survives of a reply cut mid-way or wrapped in chatter).
_FLAT_OBJECT = re.compile(r"\{[^{}]*\}")


def model_json(text: str) -> Any:
    """``json.loads(text)`` for what a model wrote. Anything the decoder cannot take raises ``ValueError``: bad
    syntax, and nesting deep enough to exhaust its recursion (``[[[[…``: a ``RecursionError`` otherwise)."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply to read") from exc


def flat_objects(text: str) -> list[Any]:
    """Every complete JSON object in ``text`` that holds no object itself and parses, in order."""
    found = []
    for match in _FLAT_OBJECT.finditer(text):
        try:
            found.append(model_json(match.group()))
        except ValueError:
            continue
    return found
