"""Outage detection: which progress events report failed document searches, and when a turn's failures are one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragloop.events import Progress
from ragloop.serve._outage import busy_reason, searches, store_busy, store_unavailable


class TestSearches:
    def test_the_retrieve_event_counts_failed_and_answered_queries(self) -> None:
        """retrieve's 'retrieved' event: failed queries and the others of its hit counts."""
        event = Progress(
            node="retrieve", kind="retrieved", message="", data={"hits": {"a": 0, "b": 3}, "failed": ["a"]}
        )
        assert searches(event) == (1, 1, 0)

    def test_the_retrieve_event_counts_failures_that_waited_out(self) -> None:
        """Its 'busy' list: failed queries that ran out of time waiting (never more than the failed ones)."""
        data = {"hits": {"a": 0, "b": 0, "c": 0}, "failed": ["a", "b", "c"], "busy": ["a", "b"]}
        assert searches(Progress(node="retrieve", kind="retrieved", message="", data=data)) == (3, 0, 2)
        data = {"hits": {"a": 0}, "failed": ["a"], "busy": ["a", "x", "y"]}  # a malformed list cannot overcount
        assert searches(Progress(node="retrieve", kind="retrieved", message="", data=data)) == (1, 0, 1)

    def test_plan_waves_count_only_the_document_source(self) -> None:
        """A plan wave's fates: failed and ok/empty documents sub-queries; other sources do not count."""
        fates = [
            {"source": "documents", "status": "failed", "reason": "StoreUnavailable: unreachable"},
            {"source": "documents", "status": "failed", "reason": "timed out after 5.0s"},
            {"source": "documents", "status": "failed", "reason": "StoreBusy: no free connection"},
            {"source": "documents", "status": "empty"},
            {"source": "sql", "status": "failed", "reason": "timed out after 5.0s"},
            {"source": "documents", "status": "skipped"},
        ]
        assert searches(Progress(node="plan", kind="wave", message="", data={"fates": fates})) == (3, 1, 2)

    @pytest.mark.parametrize(
        "event",
        [
            Progress(node="retrieve", kind="search", message="searching…", data={"queries": ["a"]}),
            Progress(node="grade", kind="graded", message="", data={"failed": ["a"]}),
            Progress(node="plan", kind="queries", message="2 search(es)"),
        ],
    )
    def test_other_events_count_nothing(self, event: Progress) -> None:
        """Searching, grading and plan summaries report no search outcome."""
        assert searches(event) == (0, 0, 0)


class TestStoreUnavailable:
    @pytest.mark.parametrize(
        ("outcome", "failed", "answered", "down"),
        [
            ("none", 2, 0, True),
            ("none", 0, 0, False),  # no search ran (nothing to say about the store)
            ("none", 1, 1, False),  # a partial outage: something answered, the nothing found is real
            ("partial", 3, 0, False),  # a live source or SQL answered
            ("context", 1, 0, False),
            ("direct", 0, 0, False),
        ],
    )
    def test_only_a_turn_that_found_nothing_because_every_search_failed(
        self, outcome: str, failed: int, answered: int, down: bool
    ) -> None:
        """Outcome none, at least one search, all of them failed: that and only that is an outage."""
        assert store_unavailable(outcome, failed, answered) is down


class TestStoreBusy:
    @pytest.mark.parametrize(
        ("failed", "answered", "busy", "expected"),
        [
            (2, 0, 2, True),  # every search waited out: busy
            (2, 0, 1, False),  # one found the store down (or failed otherwise): unavailable, as before
            (2, 0, 0, False),
            (1, 1, 1, False),  # something answered: the turn answers
            (0, 0, 0, False),
        ],
    )
    def test_busy_only_when_every_failed_search_waited_out(
        self, failed: int, answered: int, busy: int, expected: bool
    ) -> None:
        """A busy store is a turn that found nothing because each of its failed searches ran out of time."""
        assert store_busy("none", failed, answered, busy) is expected

    @given(
        st.sampled_from(["none", "partial", "context", "direct"]),
        st.integers(0, 5),
        st.integers(0, 5),
        st.integers(0, 5),
    )
    def test_busy_is_a_kind_of_failed_turn_and_never_both_verdicts_differ(
        self, outcome: str, failed: int, answered: int, busy: int
    ) -> None:
        """store_busy implies store_unavailable's condition (the serve checks busy first): a turn is refused as
        busy or unavailable only when every search failed, and the busy verdict needs no more busy than failed."""
        if store_busy(outcome, failed, answered, busy):
            assert store_unavailable(outcome, failed, answered)
            assert busy >= failed > 0

    @pytest.mark.parametrize(
        ("reason", "expected"),
        [
            ("StoreBusy: no free connection to the Postgres store within 4.9s", True),
            ("timed out after 5.0s", True),
            ("StoreUnavailable: the Postgres store is unreachable", False),
            ("RetrievalError: Postgres connection failed twice", False),
            ("", False),
        ],
    )
    def test_a_plan_reason_is_busy_when_it_waited_out(self, reason: str, expected: bool) -> None:
        """The plan node's fate reasons: a busy store or a timeout, not a store that is down."""
        assert busy_reason(reason) is expected


class TestRefusal:
    def test_busy_is_503_store_busy_with_retry_after_and_down_is_store_unavailable(self) -> None:
        """The refusal the serve raises: store_busy carries Retry-After (at least 1 s), store_unavailable none."""
        from ragloop.serve._outage import refusal

        busy = refusal("none", 2, 0, 2, 0)
        assert busy is not None and busy.status == 503 and busy.code == "store_busy"
        assert busy.headers == {"retry-after": "1"} and "busy" in busy.message
        down = refusal("none", 2, 0, 1, 5)
        assert down is not None and down.code == "store_unavailable" and not down.headers
        assert refusal("none", 1, 1, 1, 5) is None and refusal("context", 2, 0, 2, 5) is None
