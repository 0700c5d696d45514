"""Outage detection: which progress events report failed document searches, and when a turn's failures are one."""

from __future__ import annotations

import pytest

from ragloop.events import Progress
from ragloop.serve._outage import searches, store_unavailable


class TestSearches:
    def test_the_retrieve_event_counts_failed_and_answered_queries(self) -> None:
        """retrieve's 'retrieved' event: failed queries and the others of its hit counts."""
        event = Progress(
            node="retrieve", kind="retrieved", message="", data={"hits": {"a": 0, "b": 3}, "failed": ["a"]}
        )
        assert searches(event) == (1, 1)

    def test_plan_waves_count_only_the_document_source(self) -> None:
        """A plan wave's fates: failed and ok/empty documents sub-queries; other sources do not count."""
        fates = [
            {"source": "documents", "status": "failed"},
            {"source": "documents", "status": "empty"},
            {"source": "sql", "status": "failed"},
            {"source": "documents", "status": "skipped"},
        ]
        assert searches(Progress(node="plan", kind="wave", message="", data={"fates": fates})) == (1, 1)

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
        assert searches(event) == (0, 0)


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
