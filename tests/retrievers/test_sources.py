"""Tests for ragloop.retrievers.sources: the document and live-lookup plan sources."""

from __future__ import annotations

import pytest

from ragloop.errors import SourceError
from ragloop.retrievers.live import LiveRecord, SQLiteTicketSource
from ragloop.retrievers.sources import CallerScoped, DocumentSource, LiveLookupSource, Source
from ragloop.state import Caller
from ragloop.testing import FakeLiveSource, FakeRetriever, make_hit

pytestmark = pytest.mark.anyio


class TestDocumentSource:
    def test_is_a_source(self) -> None:
        """DocumentSource satisfies the Source protocol."""
        assert isinstance(DocumentSource(FakeRetriever()), Source)

    async def test_hits_and_rows(self) -> None:
        """Hits come back as the retriever ranked them, each with a row of id, title and source."""
        hits = [make_hit(f"passage {i}", title=f"T{i}", source=f"d{i}.md") for i in range(3)]
        result = await DocumentSource(FakeRetriever({"q": hits}), k=2).run("q", {})
        assert [h.text for h in result.hits] == ["passage 0", "passage 1"]
        assert [r["source"] for r in result.rows] == ["d0.md", "d1.md"]

    async def test_mentions_filter_overfetches(self) -> None:
        """A mentions filter keeps hits naming a value, from k * overfetch candidates."""
        hits = [make_hit(f"passage {i} about nothing") for i in range(7)] + [make_hit("the Team plan costs $9")]
        retriever = FakeRetriever({"price": hits})
        result = await DocumentSource(retriever, k=2, overfetch=4).run("price", {"mentions": ("team",)})
        assert [h.text for h in result.hits] == ["the Team plan costs $9"]

    async def test_source_filter(self) -> None:
        """A source filter keeps hits whose source path contains a value."""
        hits = [make_hit("a", source="billing.md"), make_hit("b", source="sso.md")]
        result = await DocumentSource(FakeRetriever({"q": hits})).run("q", {"source": ("sso",)})
        assert [h.text for h in result.hits] == ["b"]

    async def test_unknown_filter(self) -> None:
        """An unknown filter is an error naming the filters it knows."""
        with pytest.raises(SourceError, match="unknown filter"):
            await DocumentSource(FakeRetriever()).run("q", {"tenant": ("x",)})


class TestLiveLookupSource:
    async def test_ids_filter_drives_the_lookup(self) -> None:
        """Ids from the filter (e.g. found by SQL) are looked up; the record is a hit and a row."""
        tickets = SQLiteTicketSource(require_caller=False)
        result = await LiveLookupSource(tickets).run("tickets found by sql1", {"ids": ("1161",)})
        assert [h.id for h in result.hits] == ["tickets:1161"]
        assert result.rows[0]["id"] == "1161" and result.rows[0]["priority"] == "urgent"

    async def test_signal_when_no_filter(self) -> None:
        """Without an ids filter the source's own signal reads the id from the query."""
        result = await LiveLookupSource(SQLiteTicketSource(require_caller=False)).run("what about #1234", {})
        assert [h.id for h in result.hits] == ["tickets:1234"]

    async def test_mismatched_records_are_dropped(self) -> None:
        """A record whose id differs from the requested one is not returned."""
        records = {"2": LiveRecord("tickets", "2", "Ticket #2", "two")}
        live = FakeLiveSource(records=records, wrong={"1": "2"})
        result = await LiveLookupSource(live).run("x", {"ids": ("1",)})
        assert result.hits == ()

    async def test_no_ids(self) -> None:
        """No ids at all is an error that says how to give them."""
        with pytest.raises(SourceError, match="no ids to look up"):
            await LiveLookupSource(SQLiteTicketSource(require_caller=False)).run("nothing here", {})

    async def test_failure_is_a_source_error(self) -> None:
        """A failing live source becomes a SourceError naming the ids."""
        live = FakeLiveSource(fail_times=1)
        with pytest.raises(SourceError, match=r"lookup of \['7'\] failed"):
            await LiveLookupSource(live).run("x", {"ids": ("7",)})

    async def test_for_caller_hands_the_caller_to_every_lookup(self) -> None:
        """for_caller(caller) is the source on behalf of that caller; for_caller(None) on behalf of nobody."""
        live = FakeLiveSource()
        source = LiveLookupSource(live, caller=Caller(tenant="old"))
        assert isinstance(source, CallerScoped)
        await source.for_caller(Caller(tenant="acme")).run("x", {"ids": ("1234",)})
        await source.for_caller(None).run("x", {"ids": ("1234",)})
        assert live.callers == [Caller(tenant="acme"), None]
