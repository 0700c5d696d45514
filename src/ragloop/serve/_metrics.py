"""Prometheus metrics of one app, in a registry of its own (never the process-global one).

Two apps in one process (or one app created twice by a test) therefore never clash over metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["Metrics"]

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The app's counters and histograms, and their text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "ragloop_http_requests", "HTTP requests by endpoint and status code.", ["endpoint", "status"], registry=r
        )
        self.turns = Counter("ragloop_turns", "Finished chat turns by outcome.", ["outcome"], registry=r)
        self.turns_cancelled = Counter(
            "ragloop_turns_cancelled", "Turns cancelled because the client went away.", registry=r
        )
        self.turns_failed = Counter("ragloop_turns_failed", "Turns that ended in a server error.", registry=r)
        self.rejected = Counter(
            "ragloop_requests_rejected", "Requests refused before a turn started, by reason.", ["reason"], registry=r
        )
        self.fail_open = Counter(
            "ragloop_grades_fail_open", "Relevance grades that failed open (kept the hit).", registry=r
        )
        self.judge_calls = Counter(
            "ragloop_judge_calls",
            "Judge calls by judge, and whether a model or the offline judge answered.",
            ["judge", "backend"],
            registry=r,
        )
        self.judge_errors = Counter(
            "ragloop_judge_errors",
            "Judge calls that failed (the turn fell back to the offline judge or failed open).",
            ["judge"],
            registry=r,
        )
        self.session_errors = Counter(
            "ragloop_session_errors", "Session store reads or writes that failed.", registry=r
        )
        self.feedback = Counter("ragloop_feedback", "Feedback requests by result.", ["result"], registry=r)
        self.in_flight = Gauge("ragloop_turns_in_flight", "Turns running now.", registry=r)
        self.turn_seconds = Histogram("ragloop_turn_seconds", "Wall time of a turn.", buckets=_SECONDS, registry=r)
        self.first_token_seconds = Histogram(
            "ragloop_first_token_seconds",
            "Time from the request to the first answer token.",
            buckets=_SECONDS,
            registry=r,
        )
        self.node_seconds = Histogram(
            "ragloop_node_seconds", "Time per node run.", ["node"], buckets=_SECONDS, registry=r
        )

    def watch_turn_log(self, turn_log: Callable[[], Any]) -> None:
        """Expose the health of ``turn_log()`` (a :class:`~ragloop.turnlog.TurnLog`, or ``None``), read at scrape."""
        self.registry.register(_TurnLogCollector(turn_log))

    def watch_handoffs(
        self, counts: Callable[[], Mapping[str, int]], rows: Callable[[], Mapping[str, int]] | None = None
    ) -> None:
        """Expose the hand-off webhook's deliveries by result (``delivered``, ``failed``, ``dropped``, ``parked``,
        ``resent``, ``dead``: what this process did) and, with ``rows``, the outbox's rows by state as last read
        from the database (``ragloop_handoff_outbox_rows{state}``: every replica's and the CLI's)."""
        self.registry.register(_HandoffCollector(counts, rows))

    def watch_quotas(
        self,
        events: Callable[[], Iterable[tuple[tuple[str, str], int]]],
        limits: Callable[[], Mapping[str, float]],
    ) -> None:
        """Expose quota events (``ragloop_quota_events_total{limit, action}``: ``refused``, ``evicted``,
        ``expired``) and the configured limits (``ragloop_quota_limit{limit}``), both read at scrape."""
        self.registry.register(_QuotaCollector(events, limits))

    def observe_record(self, outcome: str, record: dict[str, Any]) -> None:
        """Count a finished turn from its reply's outcome and its decision record (read defensively)."""
        self.turns.labels(outcome=outcome).inc()
        fail_open = record.get("fail_open")
        if isinstance(fail_open, int) and fail_open > 0:
            self.fail_open.inc(fail_open)
        seconds = record.get("seconds")
        if isinstance(seconds, int | float):
            self.turn_seconds.observe(seconds)
        for call in record.get("calls") or ():
            if not isinstance(call, dict):
                continue
            judge = str(call.get("judge", "unknown"))
            backend = "offline" if call.get("model") == "offline" else "model"
            self.judge_calls.labels(judge=judge, backend=backend).inc()
            if call.get("error"):
                self.judge_errors.labels(judge=judge).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _TurnLogCollector:
    """The turn log's counters, read when ``/metrics`` is scraped (a log of its own keeps them)."""

    def __init__(self, turn_log: Callable[[], Any]) -> None:
        self.turn_log = turn_log

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        log = self.turn_log()
        if log is None:
            return
        stats = log.stats()
        for name, help_text, value in (
            ("ragloop_turn_log_rows_written", "Turn log rows written.", stats.written),
            ("ragloop_turn_log_rows_dropped", "Turn log rows dropped because its queue was full.", stats.dropped),
            (
                "ragloop_turn_log_rows_trimmed",
                "Turn log rows deleted to keep a key within --turn-log-per-key (its own oldest).",
                stats.trimmed,
            ),
            (
                "ragloop_turn_log_write_errors",
                "Turn log rows lost to failed writes (database unreachable …).",
                stats.errors,
            ),
        ):
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily("ragloop_turn_log_queued", "Turn log rows waiting to be written.", value=stats.queued)


class _HandoffCollector:
    """The hand-off webhook's delivery counts, read when ``/metrics`` is scraped."""

    def __init__(
        self, counts: Callable[[], Mapping[str, int]], rows: Callable[[], Mapping[str, int]] | None = None
    ) -> None:
        self.counts = counts
        self.rows = rows

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "ragloop_handoff_webhook", "Hand-off packets by delivery result.", labels=["result"]
        )
        for result, n in sorted(self.counts().items()):
            family.add_metric([result], n)
        yield family
        rows = self.rows() if self.rows is not None else {}
        if rows:
            table = GaugeMetricFamily(
                "ragloop_handoff_outbox_rows",
                "Parked hand-off deliveries in the turn log's outbox by state, as last read from the database.",
                labels=["state"],
            )
            for state, n in sorted(rows.items()):
                table.add_metric([state], n)
            yield table


class _QuotaCollector:
    """Quota events and limits, read when ``/metrics`` is scraped."""

    def __init__(
        self, events: Callable[[], Iterable[tuple[tuple[str, str], int]]], limits: Callable[[], Mapping[str, float]]
    ) -> None:
        self.events = events
        self.limits = limits

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "ragloop_quota_events",
            "Per-principal quota events by limit and action (refused, evicted: a principal's own oldest, expired).",
            labels=["limit", "action"],
        )
        for (limit, action), count in self.events():
            events.add_metric([limit, action], count)
        yield events
        limits = GaugeMetricFamily("ragloop_quota_limit", "Configured quota limits.", labels=["limit"])
        for name, value in sorted(self.limits().items()):
            limits.add_metric([name], value)
        yield limits
