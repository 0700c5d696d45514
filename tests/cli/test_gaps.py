"""`ragloop gaps` on the command line: the period, the table, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.cli.gaps import parse_since, parse_until
from ragloop.errors import ConfigError

NOW = 1_746_403_200.0  # 2025-05-05 00:00 UTC


class TestPeriod:
    @pytest.mark.parametrize(
        ("text", "ago"), [("7d", 7 * 86_400), ("24h", 86_400), ("30m", 1_800), ("2w", 14 * 86_400)]
    )
    def test_spans(self, text: str, ago: float) -> None:
        """A span counts back from now."""
        assert parse_since(text, NOW) == NOW - ago

    def test_dates_are_utc(self) -> None:
        """A date without a zone is UTC; a datetime with one keeps it."""
        assert parse_since("2025-05-04", NOW) == NOW - 86_400
        assert parse_until("2025-05-05T02:00:00+02:00", NOW) == NOW
        assert parse_until(None, NOW) == NOW

    def test_nonsense_names_the_option(self) -> None:
        """A value that is neither a span nor a date names the option and both forms."""
        with pytest.raises(ConfigError, match="--since must be a span like 7d"):
            parse_since("last week", NOW)


class TestCommand:
    def test_missing_log_is_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A turn log that does not exist is one line, exit 2, and no file is made."""
        assert main(["gaps", "--turn-log", f"sqlite:{tmp_path / 'none.db'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "does not exist" in err and not (tmp_path / "none.db").exists()

    def test_empty_period_is_one_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--since after --until is refused."""
        assert main(["gaps", "--turn-log", "sqlite:x.db", "--since", "2025-05-06", "--until", "2025-05-05"]) == 2
        assert "the period is empty" in capsys.readouterr().err

    def test_table(self, week: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """Without --json the report is a table: a line per topic with its cause, the detail, examples, stale pages."""
        argv = ["gaps", "--turn-log", f"sqlite:{week['log']}", "--since", "2025-05-05", "--until", "2025-05-12"]
        assert main([*argv, "--top", "5"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("Content gaps 2025-05-05T00:00:00Z to 2025-05-12T00:00:00Z: 300 turns")
        assert out.count(" users, ") == 5 + 1 and "no passage" in out and "e.g. " in out  # the header, five topics
        assert "plans-and-pricing.md (billing-team, valid until 2020-01-01)" in out


from tests.gaps.conftest import week  # noqa: E402  (the planted week, shared with tests/gaps)

__all__ = ["week"]
