"""_redact: credentials and upstream messages never reach a record or a log line."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ragloop._redact import bounded, hide_credentials, hide_password, redact, upstream


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


class TestDatabaseCredentials:
    @pytest.mark.parametrize(
        ("text", "secret"),
        [
            ("postgresql://app:s3cr/t@db:5432/kb", "s3cr/t"),
            ("postgres://app:p@ss@db/kb", "p@ss"),
            ("host=db user=app password=hunter22 dbname=kb", "hunter22"),
            ("postgresql://app@db/kb?password=topsecret", "topsecret"),
        ],
    )
    def test_a_password_in_any_spelling_is_hidden(self, text: str, secret: str) -> None:
        """URL passwords with / or @ in them, keyword conninfo and ?password= all lose the password."""
        assert secret not in hide_password(text)

    def test_a_driver_error_is_one_line_without_the_url_password(self) -> None:
        """libpq quotes a URL it cannot parse whole, over lines; the message keeps its words, not the password."""
        url = "postgresql://app:pa:ss@db/kb"
        message = f'invalid connection option\n  in "{url}"\n'
        hidden = hide_credentials(message, url)
        assert "pa:ss" not in hidden and "\n" not in hidden and hidden.startswith("invalid connection option")

    @given(st.text(alphabet=st.characters(categories=("L", "N", "P", "S")), min_size=6, max_size=40))
    def test_no_password_survives(self, password: str) -> None:
        """Property: whatever its characters, a URL's password is in neither the URL nor a message quoting it."""
        url = f"postgresql://app:{password}@db.example:5432/kb"
        assume(password not in "connection to postgresql://app:***@db.example:5432/kb failed: timeout")
        assert password not in hide_credentials(f"connection to {url} failed: timeout", url)
