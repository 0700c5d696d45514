"""Redaction of credentials and upstream servers' own words, for records and logs (lowest layer: no imports).

:func:`redact` replaces the user info of URLs (``https://user:pw@host`` → ``https://***@host``), ``Bearer``/
``Basic`` tokens, ``api_key=``/``token=``/``password=``-style values, well-known key shapes (``sk-…``,
``ghp_…``, ``xoxb-…``, ``AKIA…``, JWTs) and every :func:`upstream` quotation. :func:`bounded` cuts a long
text for a log line. Both are pure, linear in the text, and never raise.
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "bounded", "hide_credentials", "hide_password", "redact", "upstream"]

#: What a redacted secret reads as.
REDACTED = "***"

_UPSTREAM_OPEN, _UPSTREAM_CLOSE = "\u2039upstream: ", "\u203a"
_UPSTREAM = re.compile(re.escape(_UPSTREAM_OPEN) + "[^\u203a]*" + re.escape(_UPSTREAM_CLOSE) + "?")


def upstream(message: str) -> str:
    """``message`` (an upstream server's own words) quoted so that :func:`redact` removes it from records."""
    return _UPSTREAM_OPEN + message.replace(_UPSTREAM_CLOSE, "'") + _UPSTREAM_CLOSE


_SECRETS = (
    # user info in a URL: scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://)[^\s/@:]{0,256}(?::[^\s/@]{0,256})?@"), r"\1" + REDACTED + "@"),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1\2" + REDACTED),
    (
        re.compile(
            r"(?i)\b((?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|client[_-]?secret|"
            r"password|passwd|pwd|key)\s{0,3}[=:]\s{0,3}[\"']?)[^\s\"'&,;)}\]]{1,512}"
        ),
        r"\1" + REDACTED,
    ),
    (
        re.compile(
            r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}"
            r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
        ),
        REDACTED,
    ),
)


def redact(text: str) -> str:
    """``text`` with credentials replaced by ``***`` and quoted upstream messages withheld."""
    text = _UPSTREAM.sub("server message withheld", text)
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def bounded(text: str, max_chars: int = 2_000) -> str:
    """``text``, or its first ``max_chars`` characters and a note of how many more there were."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… ({len(text) - max_chars:,} more characters)"


def hide_password(text: str) -> str:
    """``text`` without the passwords of URLs (even unescaped ``/`` or ``@`` in one), ``password=`` settings
    (keyword conninfo, ``?password=``) or other credentials :func:`redact` knows."""
    return redact(re.sub(r"(?i)(postgres(?:ql)?://[^:@/\s]*):\S*@", r"\1:***@", text))


def hide_credentials(message: str, url: str) -> str:
    """A driver's error about ``url`` on one line, the password gone (libpq quotes a URL it cannot parse whole)."""
    return " ".join(hide_password(message).replace(url, hide_password(url)).split())
