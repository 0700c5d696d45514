"""ragloop.errors: the record's error texts are ``Type: short message``, one line, bounded; the drawn tree is whole."""

from __future__ import annotations

import re

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


class TestTree:
    def test_every_error_is_in_the_drawn_tree(self) -> None:
        """The module docstring draws every exception class ``ragloop.errors`` exports, each under its parent."""
        import ragloop.errors as errors

        lines = (errors.__doc__ or "").splitlines()
        classes = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
        for cls in classes:
            (row,) = [i for i, line in enumerate(lines) if re.search(rf"[─ ]{cls.__name__}\b", line)]
            parent = cls.__mro__[1]
            if parent is not Exception:
                indent = lines[row].index(cls.__name__)
                above = [ln for ln in lines[:row] if re.search(rf"[─ ]{parent.__name__}\b", ln)]
                assert above and above[-1].index(parent.__name__) < indent, cls.__name__

    def test_tools_dropped_is_one_class_in_both_places(self) -> None:
        """``ToolsDropped`` lives in ``ragloop.errors`` and ``ragloop.llm.openai`` re-exports the same class."""
        from ragloop.errors import JudgeOutputError, ToolsDropped
        from ragloop.llm.openai import ToolsDropped as FromOpenAI

        assert FromOpenAI is ToolsDropped and issubclass(ToolsDropped, JudgeOutputError)
