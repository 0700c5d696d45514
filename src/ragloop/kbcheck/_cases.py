"""The cases file of ``ragloop check``: one JSON object per line, checked field by field.

::

    {"question": "How many times does Lumen retry a failed webhook delivery?",
     "expect_sources": ["webhooks.md"], "expect_phrases": ["8 times"], "expect_outcome": "context"}

Fields: ``question`` (required); ``history`` (earlier ``{"role", "content"}`` messages) and ``filters``
(``{"key": "value" or ["v1", "v2"]}``); the expectations ``expect_sources`` (any of these pages must be cited),
``expect_phrases`` (all must appear in the answer, case-insensitive) and ``expect_outcome`` (``context``,
``partial``, ``none`` or ``direct``), at least one of them; and, for people, ``id`` and ``note``. A line that breaks
a rule is one error naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from ragloop.errors import ConfigError
from ragloop.text.safety import terminal_safe

__all__ = ["MAX_DEPTH", "OUTCOMES", "Case", "CasesError", "load_cases", "parse_cases"]

#: The outcomes a case may expect (a reply's ``outcome``).
OUTCOMES = ("context", "partial", "none", "direct")
#: Deepest nesting of a case line (a case needs 3: the case, history, a message).
MAX_DEPTH = 32
_KNOWN = ("question", "history", "filters", "expect_sources", "expect_phrases", "expect_outcome", "id", "note")


class CasesError(ConfigError):
    """A cases file that cannot be used; the message names the line and the field."""


@frozen
class Case:
    """One regression case.

    Attributes:
        line: Its line in the cases file (1-based).
        question: The question asked.
        history: Earlier messages, ``(role, content)``.
        filters: Metadata filters for the turn.
        expect_sources: Any one of these pages must be cited (empty: no requirement).
        expect_phrases: Every one must appear in the answer, case-insensitive.
        expect_outcome: The outcome the turn must have (``None``: any).
        id: Its name, if given.
        note: A note for people.
    """

    line: int
    question: str
    history: tuple[tuple[str, str], ...] = ()
    filters: Mapping[str, tuple[str, ...]] = field(factory=dict)
    expect_sources: tuple[str, ...] = ()
    expect_phrases: tuple[str, ...] = ()
    expect_outcome: str | None = None
    id: str | None = None
    note: str | None = None

    @property
    def name(self) -> str:
        """Its id, or the line and the start of the question."""
        return self.id or f"line {self.line}: {self.question[:60]}"


def _strings(value: Any, where: str, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise CasesError(f"{where}: field '{name}' must be a list of non-empty strings, got {json.dumps(value)[:60]}")
    return tuple(v.strip() for v in value)


def _history(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        raise CasesError(f'{where}: field \'history\' must be a list of {{"role", "content"}} objects')
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)):
            raise CasesError(
                f'{where}: field \'history[{i}]\' must be {{"role": "user" or "assistant", "content": "…"}}'
            )
        out.append((str(m["role"]), str(m["content"])))
    return tuple(out)


def _filters(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise CasesError(f'{where}: field \'filters\' must be an object like {{"tenant": "acme"}}')
    out: dict[str, tuple[str, ...]] = {}
    for key, v in value.items():
        if isinstance(v, str):
            out[key] = (v,)
        elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            out[key] = tuple(v)
        else:
            raise CasesError(f"{where}: field 'filters.{key}' must be a string or a list of strings")
    return out


def _case(obj: Any, line: int, where: str) -> Case:
    if not isinstance(obj, dict):
        raise CasesError(f"{where}: a case must be a JSON object with at least a 'question', got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_KNOWN))
    if unknown:
        raise CasesError(f"{where}: unknown field '{unknown[0]}'; known fields: {', '.join(_KNOWN)}")
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise CasesError(f"{where}: field 'question' is required: the question as a non-empty string")
    outcome = obj.get("expect_outcome")
    if outcome is not None and outcome not in OUTCOMES:
        raise CasesError(f"{where}: field 'expect_outcome' must be one of {', '.join(OUTCOMES)}, got {outcome!r:.40}")
    sources = _strings(obj.get("expect_sources", []), where, "expect_sources")
    phrases = _strings(obj.get("expect_phrases", []), where, "expect_phrases")
    if not (sources or phrases or outcome):
        raise CasesError(
            f"{where}: field 'expect_sources', 'expect_phrases' or 'expect_outcome': give at least one, "
            "or the case can never fail"
        )
    for name in ("id", "note"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise CasesError(f"{where}: field '{name}' must be a string")
    return Case(
        line=line,
        question=question.strip(),
        history=_history(obj["history"], where) if obj.get("history") is not None else (),
        filters=_filters(obj["filters"], where) if obj.get("filters") is not None else {},
        expect_sources=sources,
        expect_phrases=phrases,
        expect_outcome=outcome,
        id=obj.get("id"),
        note=obj.get("note"),
    )


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: Any) -> tuple[Any, int]:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD, and how many there were.

    JSON may carry ``"\\ud800"`` escapes that pair with nothing; Python keeps them as lone surrogates, which no
    encoder writes (UTF-8 output, a terminal, XML), so they are replaced once, here, and counted.
    """
    if isinstance(value, str):
        return _SURROGATE.subn("\ufffd", value)
    if isinstance(value, list):
        items = [_clean(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    if isinstance(value, dict):
        out, total = {}, 0
        for key, v in value.items():
            (k, nk), (c, nv) = _clean(key), _clean(v)
            out[k] = c
            total += nk + nv
        return out, total
    return value, 0


def parse_cases(lines: Iterable[str], where: str = "cases", *, notes: list[str] | None = None) -> list[Case]:
    """The cases of ``lines`` (blank lines skipped); :class:`CasesError` at the first bad one.

    A line may nest only :data:`MAX_DEPTH` deep. Lone surrogates are replaced by U+FFFD; each line where that
    happened adds a sentence to ``notes`` when it is given.
    """
    out = []
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        at = f"{where} line {n}"
        if n == 1:
            text = text.removeprefix("\ufeff")
        depth = _depth(text)
        if depth > MAX_DEPTH:
            raise CasesError(f"{at}: nested {depth} levels deep; a case nests at most {MAX_DEPTH} (flatten it)")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CasesError(f"{at}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:  # e.g. an integer of more digits than Python converts
            raise CasesError(f"{at}: not usable JSON ({str(exc)[:80]})") from None
        obj, replaced = _clean(obj)
        if replaced and notes is not None:
            notes.append(f"{at}: {replaced} lone surrogate(s) replaced by U+FFFD")
        try:
            out.append(_case(obj, n, at))
        except CasesError as exc:  # the message quotes the file's own text: keep it one printable line
            raise CasesError(" ".join(terminal_safe(str(exc)).split())) from None
    if not out:
        raise CasesError(f'{where} holds no cases: write one JSON object per line, e.g. {{"question": …}}')
    return out


def _depth(text: str) -> int:
    """How deep ``text``'s brackets nest outside strings (linear; run before the recursive parser sees it)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load_cases(path: str | os.PathLike[str], *, notes: list[str] | None = None) -> list[Case]:
    """The cases of a JSONL file (UTF-8, a byte-order mark allowed); any file that cannot be used is one
    :class:`CasesError` naming it. ``notes`` gathers what was repaired (see :func:`parse_cases`)."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise CasesError(f"no cases file at {file}") from None
    except IsADirectoryError:
        raise CasesError(f"{file} is a directory: pass the cases file (JSONL) itself") from None
    except OSError as exc:
        raise CasesError(f"cannot read the cases file {file}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CasesError(
            f"{file} is not UTF-8 text (byte {exc.start} cannot be decoded): save it as UTF-8 JSONL"
        ) from None
    # Lines end at \n only: str.splitlines would also split at U+2028, \x1c … that a JSON string may hold raw.
    return parse_cases([line.removesuffix("\r") for line in text.split("\n")], str(file), notes=notes)
