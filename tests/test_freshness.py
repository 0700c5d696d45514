"""Freshness: cited pages past their valid_until, or older than the configured age, and the note a reply carries."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.freshness import Freshness, parse_date, stale_note, stale_sources
from ragloop.state import Chunk, Citation

TODAY = dt.date(2025, 6, 1)


def _chunk(cid: str, source: str, **meta: str) -> Chunk:
    return Chunk(id=cid, text="text", source=source, title=source.removesuffix(".md"), metadata=meta)


def _cite(n: int, chunk: Chunk) -> Citation:
    return Citation(n, chunk.source, chunk.title, chunk.id)


class TestParseDate:
    def test_date_and_datetime_prefix(self) -> None:
        """An ISO date, or a datetime that starts with one, gives its calendar date."""
        assert parse_date("2024-05-01") == dt.date(2024, 5, 1)
        assert parse_date("2024-05-01T10:00:00Z") == dt.date(2024, 5, 1)
        assert parse_date(" 2024-5-1 12:00") == dt.date(2024, 5, 1)

    @pytest.mark.parametrize("value", ["", None, "soon", "2024-13-01", "2024-02-30", "01/05/2024", "2024-05-01x"])
    def test_unparseable_is_none(self, value: str | None) -> None:
        """A value that is not a real ISO date is None, never an error."""
        assert parse_date(value) is None

    @given(st.dates(min_value=dt.date(1000, 1, 1)))
    def test_round_trip(self, day: dt.date) -> None:
        """Every date's ISO form parses back to it."""
        assert parse_date(day.isoformat()) == day


class TestStaleSources:
    def test_expired_page_is_named_with_owner(self) -> None:
        """A cited page past its valid_until is stale, with its owner and dates."""
        old = _chunk("c1", "pricing.md", valid_until="2025-05-31", owner="billing-team", updated="2024-01-01")
        [s] = stale_sources([_cite(1, old)], {"c1": old}, Freshness(today=TODAY))
        assert (s.n, s.source, s.reason, s.owner) == (1, "pricing.md", "expired", "billing-team")
        assert (s.valid_until, s.updated) == ("2025-05-31", "2024-01-01")

    def test_valid_until_today_is_not_stale(self) -> None:
        """The valid_until day itself still holds."""
        page = _chunk("c1", "pricing.md", valid_until="2025-06-01")
        assert stale_sources([_cite(1, page)], {"c1": page}, Freshness(today=TODAY)) == ()

    def test_age_counts_only_when_configured(self) -> None:
        """An old updated date is stale only with max_age_days set, and only past it."""
        page = _chunk("c1", "sso.md", updated="2024-06-01")
        cited, chunks = [_cite(2, page)], {"c1": page}
        assert stale_sources(cited, chunks, Freshness(today=TODAY)) == ()
        assert stale_sources(cited, chunks, Freshness(max_age_days=365, today=TODAY)) == ()
        [s] = stale_sources(cited, chunks, Freshness(max_age_days=364, today=TODAY))
        assert (s.reason, s.updated, s.owner) == ("old", "2024-06-01", None)

    def test_one_entry_per_source_and_unknown_chunks_skipped(self) -> None:
        """Two cited chunks of one stale page give one entry (the first number); a citation without its chunk
        and a page with a date that does not parse are skipped."""
        a = _chunk("a", "old.md", valid_until="2020-01-01")
        b = _chunk("b", "old.md", valid_until="2020-01-01")
        junk = _chunk("j", "junk.md", valid_until="someday")
        cited = [_cite(1, junk), _cite(2, a), _cite(3, b), Citation(4, "gone.md", "Gone", "zz")]
        found = stale_sources(cited, {"a": a, "b": b, "j": junk}, Freshness(today=TODAY))
        assert [(s.n, s.source) for s in found] == [(2, "old.md")]

    def test_negative_age_refused(self) -> None:
        """A negative or non-finite max_age_days is a configuration error that names the setting."""
        with pytest.raises(ValueError, match="max_age_days"):
            Freshness(max_age_days=-1)
        with pytest.raises(ValueError, match="max_age_days"):
            Freshness(max_age_days=float("nan"))

    @given(st.dates(), st.dates())
    def test_expired_exactly_when_past(self, until: dt.date, today: dt.date) -> None:
        """A page is expired exactly when today is after its valid_until."""
        page = _chunk("c", "p.md", valid_until=until.isoformat())
        found = stale_sources([_cite(1, page)], {"c": page}, Freshness(today=today))
        assert bool(found) == (today > until)


class TestStaleNote:
    def test_no_stale_no_note(self) -> None:
        """Nothing stale, nothing said."""
        assert stale_note(()) == ""

    def test_note_names_pages_dates_and_owners(self) -> None:
        """The note cites each stale page by its number and says why and who owns it."""
        a = _chunk("a", "pricing.md", valid_until="2020-01-01", owner="billing")
        b = _chunk("b", "sso.md", updated="2019-01-01")
        stale = stale_sources([_cite(1, a), _cite(3, b)], {"a": a, "b": b}, Freshness(max_age_days=30, today=TODAY))
        note = stale_note(stale)
        assert "[1] pricing (valid until 2020-01-01; owner: billing)" in note
        assert "[3] sso (last updated 2019-01-01)" in note
        assert note.startswith("\n\n(Note: this answer cites pages that may be out of date")
