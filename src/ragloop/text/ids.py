"""Exact identifiers in text: tickets, error codes, versions. Pure functions.

The grader uses :func:`ids_conflict` (a chunk about ticket #1233 never answers a question about #1234); the
live node uses :func:`id_matches` to reject a record whose id differs from the one requested. Kinds are few
and precise on purpose: a false identifier would make the grader throw away good context.

Normal forms:

- ``ticket``: ``#`` and the digits — ``#1234``, "ticket 1234", "issue #1234", "bug no. 1234" → ``#1234``.
- ``error``: ``E`` codes as written upper-cased (``E1234``), ``ERR_…``/``ERROR_…`` constants upper-cased, and
  "error 404" / "error code 1234" / "status 503" → ``E404`` style.
- ``version``: ``v2.3.1``, ``2.3.1`` (three or more parts) and "version 2.3" / "release 2.3" → ``2.3.1`` /
  ``2.3`` (no ``v``; decimals like ``0.05`` alone are not versions). A bare dotted quad of numbers up to 255
  (``10.1.2.3``, ``10.0.0.0/8``) is an IPv4 address, not a version: a question's example address is a value,
  not the name of a page, and taking it for a version made every page that shows another address
  (``192.168.0.1``) conflict with it. Spelled as a version ("v1.2.3.4", "version 1.2.3.4") it still is one.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

__all__ = ["IdKind", "extract_ids", "id_matches", "ids_conflict", "missing_ids", "normalise_id"]

#: The kinds of identifier recognised.
IdKind = Literal["ticket", "error", "version"]
KINDS: tuple[IdKind, ...] = ("ticket", "error", "version")

_TICKET = re.compile(
    r"(?<![\w&/])#(\d{1,12})\b"
    r"|\b(?:ticket|issue|incident|bug)s?\s*(?:no\.?|number|id)?\s*[:#]?\s*(\d{1,12})\b",
    re.IGNORECASE,
)
_ERROR = re.compile(
    r"\b(E\d{3,6})\b"
    r"|\b((?-i:(?:ERR|ERROR)_[A-Z0-9_]*[A-Z0-9]))\b"
    r"|\b(?:error|err|status)(?:\s+code)?\s*[:#]?\s*(\d{3,6})\b",
    re.IGNORECASE,
)
_VERSION = re.compile(
    r"(?<![\w.])v(\d+(?:\.\d+){1,3})(?![\w]|\.\d)"
    r"|(?<![\w.])(\d+\.\d+\.\d+(?:\.\d+)?)(?![\w]|\.\d)"
    r"|\b(?:version|release|ver\.?)\s+v?(\d+(?:\.\d+){0,3})(?![\w]|\.\d)",
    re.IGNORECASE,
)


def _ipv4(dotted: str) -> bool:
    """Four parts, each at most 255: an IPv4 address (a version of four parts has a part past 255, or says so)."""
    parts = dotted.split(".")
    return len(parts) == 4 and all(len(p) <= 3 and int(p) <= 255 for p in parts)


def _first_group(m: re.Match[str]) -> tuple[int, str]:
    for i, g in enumerate(m.groups()):
        if g is not None:
            return i, g
    raise AssertionError("pattern matched with no group")  # pragma: no cover - every branch has a group


def extract_ids(text: str) -> dict[IdKind, frozenset[str]]:
    """The identifiers ``text`` names, by kind, in normal form; kinds with none are absent.

    >>> extract_ids("Ticket #1234 fails with E0042 since v2.3.1")
    {'ticket': frozenset({'#1234'}), 'error': frozenset({'E0042'}), 'version': frozenset({'2.3.1'})}
    """
    return dict(_extract(text))


# A turn asks this of the same passages again and again (each grading, each rerank, every turn that finds them):
# the three scans are memoised per text. The cache holds frozen values only (each call gets a new dict), bounded.
@functools.lru_cache(maxsize=2048)
def _extract(text: str) -> tuple[tuple[IdKind, frozenset[str]], ...]:
    found: dict[IdKind, set[str]] = {}
    for m in _TICKET.finditer(text):
        found.setdefault("ticket", set()).add("#" + _first_group(m)[1])
    for m in _ERROR.finditer(text):
        branch, value = _first_group(m)
        if branch == 0:
            if m.group(0)[0] != "E":  # "e1234" in prose is rarely a code; only the capital form
                continue
            found.setdefault("error", set()).add(value.upper())
        elif branch == 1:
            found.setdefault("error", set()).add(value.upper())
        else:
            found.setdefault("error", set()).add("E" + value)
    for m in _VERSION.finditer(text):
        branch, value = _first_group(m)
        if branch == 1 and _ipv4(value):
            continue
        found.setdefault("version", set()).add(value)
    return tuple((kind, frozenset(found[kind])) for kind in KINDS if kind in found)


def normalise_id(value: str | int) -> str:
    """The normal form of one identifier as a live source or a caller might spell it.

    ``"#1234"``, ``"1234"``, ``1234``, ``"ticket 1234"`` → ``"#1234"``; ``"e1234"`` → ``"E1234"``;
    ``"v2.3.1"`` → ``"2.3.1"``. Anything else is stripped and upper-cased.
    """
    text = str(value).strip()
    if text.isdigit():
        return "#" + text
    ids = extract_ids(text)
    if len(ids) == 1:
        (values,) = ids.values()
        if len(values) == 1:
            return next(iter(values))
    lowered = text.lower()
    if re.fullmatch(r"e\d{3,6}", lowered):
        return lowered.upper()
    if re.fullmatch(r"v\d+(?:\.\d+)+", lowered):
        return lowered[1:]
    return text.upper()


def id_matches(requested: str | int, found: str | int) -> bool:
    """True only when both spell the same identifier (exact equality of normal forms)."""
    return normalise_id(requested) == normalise_id(found)


def ids_conflict(query: str, text: str) -> bool:
    """True when the query names an exact id of some kind and ``text`` names only *other* ids of that kind.

    A text naming the requested id (with or without others) or no id of that kind is not a conflict; the
    grader judges it on its terms. So a chunk about ticket #1233 never satisfies a question about #1234.
    """
    wanted = extract_ids(query)
    if not wanted:
        return False
    named = extract_ids(text)
    return any(kind in named and not (ids & named[kind]) for kind, ids in wanted.items())


def missing_ids(query: str, text: str) -> list[str]:
    """The exact ids ``query`` asks about (any kind) that ``text`` does not name, sorted.

    ``missing_ids("status of #1234", "Ticket #1234 is open")`` is empty; against a generic page about
    tickets it is ``["#1234"]``.
    """
    named = extract_ids(text)
    return sorted(i for kind, ids in extract_ids(query).items() for i in ids - named.get(kind, frozenset()))
