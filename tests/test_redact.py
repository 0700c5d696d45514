"""_redact: credentials and upstream messages never reach a record or a log line."""

from __future__ import annotations

import pytest

from ragloop._redact import bounded, redact, upstream


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("call to http://admin:s3cret@10.0.0.2/v1 failed", "s3cret"),
        ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop"),
        ("GET /v1?api_key=zzz123&x=1", "zzz123"),
        ("password=hunter2", "hunter2"),
        ("key sk-proj-abcdefghijklmnopqrstuv used", "sk-proj-abcdefghijklmnopqrstuv"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ],
)
def test_credentials_are_redacted(text: str, secret: str) -> None:
    """Each credential shape is replaced by ***."""
    assert secret not in redact(text) and "***" in redact(text)


def test_upstream_message_is_withheld() -> None:
    """A server's own words, quoted with upstream(), are withheld; the text around them stays."""
    text = f"HTTP 503: {upstream('db at 10.9.8.7 down')}; see the server's message"
    assert redact(text) == "HTTP 503: server message withheld; see the server's message"


def test_bounded_cuts_and_says_how_much() -> None:
    """A 1 MB value is cut to the limit with a note."""
    assert bounded("x" * 1_000_000, 10) == "xxxxxxxxxx… (999,990 more characters)" and bounded("ok") == "ok"
