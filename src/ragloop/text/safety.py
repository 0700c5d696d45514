"""Text that came from outside (documents, pages, users, models, servers), made safe to show, log or quote.

- :func:`terminal_safe` — no escape sequences, control or bidi characters: safe to print to a terminal.
- :func:`client_url` — a link safe to hand a client (``http(s)://`` or relative), or ``None``.
- :func:`instruction_problem` — why a sentence must not be quoted as an answer (it gives the assistant or the
  reader orders, links to another host, or carries a credential), or ``None``.
- :func:`glossary_problem` — why a mined glossary entry is not a short noun phrase, or ``None``.
- :func:`bounded_int` — an integer from a digit string, or ``None`` when it has too many digits.

Every function is pure and runs in linear time (no regex here backtracks on long input).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = [
    "MAX_URL_CHARS",
    "bounded_int",
    "client_url",
    "glossary_problem",
    "instruction_problem",
    "terminal_safe",
]

# ESC sequences: CSI (ESC [ … final), OSC/DCS/PM/APC/SOS strings (ESC ] … BEL or ST, bounded), and two-byte ones.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]{0,64}[ -/]{0,16}[@-~]?"
    r"|\x1b[\]P^_X][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?"
    r"|\x1b[ -~]?"
    r"|\x9b[0-?]{0,64}[ -/]{0,16}[@-~]?"
    r"|[\x90\x9d\x9e\x9f][^\x07\x1b\x9c]{0,4096}(?:\x07|\x9c|\x1b\\)?"
)
# C0 but \t and \n, DEL, C1; bidi embeddings/overrides/isolates and marks; line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


#: Longest link handed to a client, and longest page URL or title a turn accepts (characters).
MAX_URL_CHARS = 2_048

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f-\x9f\\]")


def client_url(url: str | None) -> str | None:
    """``url`` when it is safe to hand a client as a link: ``http(s)://host…`` or a relative path; else ``None``.

    Refused: any other scheme (``javascript:``, ``data:``, ``vbscript:``, ``file:``), protocol-relative ``//host``
    links, and URLs holding whitespace, control characters or backslashes (browsers drop tabs and newlines
    from a URL and read ``\\`` as ``/``, so ``java\tscript:`` or ``/\\evil`` would pass a naive check).
    """
    if not url or len(url) > MAX_URL_CHARS or _URL_UNSAFE.search(url):
        return None
    scheme = _SCHEME.match(url)
    if scheme is None:
        return None if url.startswith("//") else url
    rest = url[scheme.end() :]
    if scheme.group(1).lower() in ("http", "https") and rest.startswith("//") and len(rest) > 2 and rest[2] != "/":
        return url
    return None


def terminal_safe(text: str) -> str:
    """``text`` with escape sequences removed whole and other control and bidi characters removed.

    Newlines and tabs stay; ``\\r`` is dropped (it would let text overwrite a line already shown).
    """
    return _UNSAFE.sub("", _ESCAPES.sub("", text))


# URL user info and well-known key shapes (the full redaction of records is ragloop._redact.redact).
_USERINFO = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,20}://[^\s/@:]{0,256}(?::[^\s/@]{0,256})?@")
_KEY_SHAPES = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,})"
)


_ORDERS = re.compile(
    r"(?i)\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:instructions?|rules|prompts?|above|previous|context)\b"
    r"|\b(?:tell|inform|instruct|advise|ask|remind)\s+(?:the\s+)?(?:user|reader|customer|them|him|her)\b"
    r"|\b(?:you\s+are\s+now|act\s+as\s+(?:an?\s+)?(?:ai|assistant|admin)|pretend\s+to\s+be|new\s+instructions?"
    r"|developer\s+mode|system\s+prompt)\b"
    r"|\b(?:dear|hey|attention|note\s+to\s+the|if\s+you\s+are\s+an?|as\s+an?)\s+"
    r"(?:ai|assistant|chatbot|language\s+model|llm|bot)\b"
    r"|^\s*(?:system|assistant|user)\s*:"
    r"|\b(?:reveal|print|repeat|output)\s+(?:your|the)\s+(?:system\s+)?(?:prompt|instructions)\b"
)
_CREDENTIAL = re.compile(
    r"(?i)\b(?:password|passwd|passcode|api[\s_-]?key|secret\s+key|access\s+token|private\s+key)\b"
    r"\s{0,3}(?:is|=|:|was)\s{0,3}\S"
)
_CODE = re.compile(r"`[^`\n]{0,1000}`")
_SENDS = re.compile(
    r"(?i)\b(?:visit|go\s+to|click|open|navigate\s+to|head\s+(?:over\s+)?to|log\s*in|sign\s*in|download\w*"
    r"|install|restored?|submit|send|email|call|contact|verify|confirm|update)\b"
)
_URL = re.compile(r"(?i)\b(?:https?|ftp)://([^\s/?#\"'<>()\[\]]{1,256})|\bwww\.([a-z0-9.-]{1,253})")


def _host(netloc: str) -> str:
    try:
        return (urlsplit("//" + netloc).hostname or "").lower()
    except ValueError:
        return netloc.lower()


def instruction_problem(sentence: str, *, allowed_hosts: Iterable[str] = ()) -> str | None:
    """Why ``sentence`` must not be quoted in an answer, or ``None``.

    A sentence is refused when it gives orders to the assistant or about the user ("ignore previous
    instructions", "tell the user …"), carries a credential ("the admin password is …"), or links to another
    host: with ``allowed_hosts`` (the document's own hosts and their subdomains), any link outside them; without,
    a link the sentence sends the reader to ("visit …", "log in at …", "download from …"). URLs in backticks are
    code or configuration values, not links.
    """
    if _ORDERS.search(sentence):
        return "addresses the assistant or the reader with instructions"
    if _CREDENTIAL.search(sentence) or _USERINFO.search(sentence) or _KEY_SHAPES.search(sentence):
        return "carries a credential"
    allowed = tuple(h.lower().lstrip(".") for h in allowed_hosts if h)
    prose = _CODE.sub(" ", sentence)
    for m in _URL.finditer(prose):
        host = _host(m.group(1)) if m.group(1) is not None else (m.group(2) or "").lower()
        if any(host == a or host.endswith("." + a) for a in allowed):
            continue
        if allowed or _SENDS.search(prose):
            return f"links to another host ({host or 'unknown'})"
    return None


#: Longest abbreviation and expansion a glossary entry may have (characters), and most words in an expansion.
MAX_TERM_CHARS, MAX_EXPANSION_CHARS, MAX_EXPANSION_WORDS = 16, 80, 8
_TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9&+./-]{0,15}")
_PHRASE = re.compile(r"[^\W_][\w '&+./-]*", re.UNICODE)


def glossary_problem(term: str, expansion: str) -> str | None:
    """Why ``term: expansion`` is not a short abbreviation and noun phrase fit for a prompt, or ``None``."""
    if len(term) > MAX_TERM_CHARS or not _TERM.fullmatch(term):
        return f"abbreviation {term[:40]!r} is not 1-{MAX_TERM_CHARS} letters, digits or -./&+"
    words = expansion.split()
    if len(expansion) > MAX_EXPANSION_CHARS or not 1 <= len(words) <= MAX_EXPANSION_WORDS:
        return f"expansion is not 1-{MAX_EXPANSION_WORDS} words within {MAX_EXPANSION_CHARS} characters"
    if not _PHRASE.fullmatch(expansion):
        return "expansion holds characters other than letters, digits, spaces and -'&+./"
    if instruction_problem(expansion) is not None:
        return "expansion reads as an instruction, a link or a credential"
    return None


def bounded_int(digits: str, max_digits: int = 9) -> int | None:
    """``int(digits)`` for a string of at most ``max_digits`` ASCII digits, else ``None`` (never raises)."""
    digits = digits.strip()
    if not 0 < len(digits) <= max_digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
