"""ragloop.errors: the record's error texts are ``Type: short message``, one line, bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ragloop.errors import InputError, error_text


class TestErrorText:
    def test_type_then_the_message_on_one_line(self) -> None:
        """Type: message; a multi-line message joined on one line."""
        assert error_text(InputError("bad\n  filter")) == "InputError: bad filter"

    def test_an_empty_message_says_what_happened(self) -> None:
        """TimeoutError() reads "TimeoutError: timed out", not "TimeoutError: "; others say there was none."""
        assert error_text(TimeoutError()) == "TimeoutError: timed out"
        assert error_text(RuntimeError()) == "RuntimeError: (no message)"

    def test_a_group_of_one_is_the_error_inside(self) -> None:
        """A task group around one failing call names that call's error."""
        group = ExceptionGroup("unhandled errors in a TaskGroup", [ExceptionGroup("x", [KeyError("k")])])
        assert error_text(group) == "KeyError: 'k'"

    @given(st.text(), st.integers(10, 500))
    def test_always_one_bounded_line(self, message: str, max_chars: int) -> None:
        """Whatever the message: one line, the type first, the message at most max_chars."""
        text = error_text(ValueError(message), max_chars)
        assert text.startswith("ValueError: ") and "\n" not in text and "\r" not in text
        assert len(text) - len("ValueError: ") <= max_chars
