"""What a turn starts from: the user's question, history, page and filters, checked and cleaned.

Nothing is truncated silently: an over-long question or history message is an :class:`~ragloop.errors.InputError`
that says the limit; pasted terminal escapes go, control characters become spaces, lone surrogates U+FFFD.
:func:`turn_state` is what ``ChatRAG.ask`` and ``ChatRAG.stream`` start every turn from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ragloop.errors import ConfigError, InputError
from ragloop.retrievers.filters import FiltersArg, normalize_filters
from ragloop.state import Caller, Message, PageContext, TurnState
from ragloop.text.safety import MAX_URL_CHARS

__all__ = [
    "KEPT_HISTORY_CHARS",
    "MAX_HISTORY_CHARS",
    "MAX_HISTORY_MESSAGES",
    "MAX_QUESTION_CHARS",
    "MAX_URL_CHARS",
    "turn_state",
    "validate_question",
]

#: Longest question accepted by default (characters).
MAX_QUESTION_CHARS = 8_000

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


#: Unicode's control characters (category ``Cc``: U+0000-U+001F and U+007F-U+009F) but newline and tab.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _clean_text(text: str) -> str:
    # Terminal escape sequences are pasted noise, not words: drop them whole. Lone surrogates cannot be
    # encoded or sent anywhere: each becomes U+FFFD. Other control characters become spaces. (Two regex passes,
    # not a per-character category lookup: every question and history message of every turn goes through here.)
    text = _ANSI.sub("", text)
    return _SURROGATE.sub("\ufffd", _CONTROL.sub(" ", text))


def validate_question(question: object, *, max_chars: int = MAX_QUESTION_CHARS) -> str:
    """The question, cleaned; :class:`InputError` if it is not usable.

    Nothing is truncated: an over-long question is an error that says the limit.
    """
    if not isinstance(question, str):
        raise InputError(f"question must be a string, got {type(question).__name__}")
    if len(question) > max_chars:
        raise InputError(
            f"question is {len(question):,} characters; the limit is {max_chars:,}. "
            "Shorten it, or pass a larger max_question_chars to ChatRAG."
        )
    cleaned = " ".join(_clean_text(question).split())
    if not cleaned:
        raise InputError("question is empty; pass the user's message, e.g. rag.ask('How do I reset 2FA?')")
    return cleaned


#: Most earlier messages accepted as history, and the longest one (characters), by default.
MAX_HISTORY_MESSAGES = 50
#: Longest history message accepted by default (characters).
MAX_HISTORY_CHARS = 32_000
#: What a turn keeps of each history message: its last this-many characters (judging a megabyte of history
#: would hold the event loop; the latest words are what a follow-up refers to).
KEPT_HISTORY_CHARS = 8_000


def _history(
    history: object, *, max_messages: int = MAX_HISTORY_MESSAGES, max_chars: int = MAX_HISTORY_CHARS
) -> tuple[Message, ...]:
    """Validated history: roles ``user``/``assistant`` only, string content, within the count and size caps.

    ``Message`` objects are checked like dicts (a ``Message("system", …)`` is refused, not passed on). Each
    message keeps its last :data:`KEPT_HISTORY_CHARS` characters.
    """
    if history is None:
        return ()
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise InputError(
            f"history must be a list of messages like {{'role': 'user', 'content': '…'}}, got {type(history).__name__}"
        )
    if len(history) > max_messages:
        raise InputError(
            f"history has {len(history):,} messages; the limit is {max_messages:,} (max_history_messages). "
            "Send only the latest messages."
        )
    out = []
    for i, item in enumerate(history):
        role: object
        content: object
        if isinstance(item, Message):
            role, content = item.role, item.content
        elif isinstance(item, Mapping):
            role, content = item.get("role"), item.get("content")
        else:
            role = content = None
        if role not in ("user", "assistant") or not isinstance(content, str):
            shown = f"role {role!r}" if isinstance(role, str) else f"{item!r:.80}"
            raise InputError(
                f"history[{i}] must be a Message or a dict with role 'user'/'assistant' and string content, got {shown}"
            )
        if len(content) > max_chars:
            raise InputError(
                f"history[{i}] is {len(content):,} characters; the limit is {max_chars:,} (max_history_chars). "
                "Shorten or drop it."
            )
        kept = content[-KEPT_HISTORY_CHARS:]  # cut before cleaning: the cost stays bounded whatever the cap
        out.append(Message("user" if role == "user" else "assistant", _clean_text(kept)))
    return tuple(out)


def _filters(filters: object) -> dict[str, tuple[str, ...]]:
    try:
        return normalize_filters(filters)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise InputError(str(exc)) from exc


def _page(url: object, title: object) -> PageContext:
    for name, value in (("page_url", url), ("page_title", title)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{name} must be a string or None, got {type(value).__name__}")
        if isinstance(value, str) and len(value) > MAX_URL_CHARS:
            raise InputError(f"{name} is {len(value):,} characters; the limit is {MAX_URL_CHARS:,}")
    return PageContext(
        url=_clean_text(url).strip() or None if isinstance(url, str) else None,
        title=_clean_text(title).strip() or None if isinstance(title, str) else None,
    )


def turn_state(  # noqa: PLR0913 — configuration by keyword arguments (STYLE habit 7)
    question: object,
    *,
    history: object = None,
    page_url: object = None,
    page_title: object = None,
    filters: FiltersArg | None = None,
    caller: Caller | None = None,
    max_question_chars: int = MAX_QUESTION_CHARS,
    max_history_messages: int = MAX_HISTORY_MESSAGES,
    max_history_chars: int = MAX_HISTORY_CHARS,
) -> TurnState:
    """The validated state a turn starts from (raises :class:`~ragloop.errors.InputError` on unusable input)."""
    if caller is not None and not isinstance(caller, Caller):
        raise InputError(f"caller must be a ragloop.state.Caller or None, got {type(caller).__name__}")
    return TurnState(
        question=validate_question(question, max_chars=max_question_chars),
        history=_history(history, max_messages=max_history_messages, max_chars=max_history_chars),
        page=_page(page_url, page_title),
        filters=_filters(filters),
        caller=caller,
    )
