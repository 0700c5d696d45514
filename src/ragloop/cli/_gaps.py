"""The ``ragloop gaps`` command: the content-gap report of a turn log (registered by :mod:`ragloop.cli`).

``ragloop gaps --turn-log sqlite:turns.db --since 7d`` prints the topics users hit that the knowledge base does
not answer, most users first; ``--json`` prints the whole report as one JSON object, ``--html FILE`` writes it as
one static page with its charts, ``--export-cases FILE`` writes the top topics' questions as draft
``ragloop check`` cases. With ``--index DIR`` questions are also embedded with that index's embedder, with
``--store URL [--collection C]`` with that PostgreSQL collection's (a deployment without a local index). Each topic
is a gap with a stable id and a status (``open``, ``fixed`` once ``ragloop replay --mark-gaps`` answers its
questions, ``reopened``), kept in the turn log's database from run to run. With ``--model`` the configured model
also sorts the questions into topics once per report (:mod:`ragloop.gaps._topics`), a hint the grouping weighs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from ragloop.errors import ConfigError
from ragloop.text.safety import terminal_safe

__all__ = ["add_gaps", "cmd_gaps", "parse_since", "parse_until"]

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*$")
_UNIT_S = {"m": 60, "h": 3_600, "d": 86_400, "w": 604_800}


def add_gaps(sub: Any) -> None:
    """Register ``ragloop gaps``."""
    p = sub.add_parser(
        "gaps",
        help="what the knowledge base is missing: topics of unanswered questions from a turn log",
        description="Group the turns that ended without a full answer (or were rated down) into topics, with "
        "their causes and the nearest pages.",
    )
    p.add_argument("--turn-log", required=True, metavar="URL", help="the turn log: sqlite:PATH or postgresql://…")
    p.add_argument("--since", default="7d", help="start of the period: 7d, 24h, 2w, or a date (default 7d)")
    p.add_argument("--until", default=None, help="end of the period: a date or datetime, UTC (default now)")
    kb = p.add_mutually_exclusive_group()
    kb.add_argument("--index", metavar="DIR", help="embed questions with this index's embedder (default: terms only)")
    kb.add_argument("--store", metavar="URL", help="... or with this PostgreSQL store's embedder (postgresql://…)")
    p.add_argument("--collection", default="ragloop", help="the collection in --store (default ragloop)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--html", metavar="FILE", help="write the report as one static HTML page")
    p.add_argument("--export-cases", metavar="FILE", help="write the topics' questions as draft check cases (JSONL)")
    p.add_argument("--top", type=int, default=20, metavar="N", help="most topics listed (default 20)")
    p.add_argument("--min-turns", type=int, default=2, metavar="N", help="smallest topic listed (default 2)")
    p.add_argument("--threshold", type=float, default=None, help="average cosine at which questions group")
    p.add_argument(
        "--model",
        action="store_true",
        help="also let the configured model (OPENAI_BASE_URL / OPENAI_API_KEY and RAGLOOP_MODEL) sort the questions "
        "into topics, once per report: a hint the grouping weighs (without it nothing is sent anywhere)",
    )
    p.set_defaults(func=cmd_gaps)


def _when(text: str, what: str) -> float:
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"{what} must be a span like 7d, 24h, 2w or a date like 2025-05-01, got {text!r:.40}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def parse_since(text: str, now: float) -> float:
    """The start of the period: ``now`` minus a span (``30m``, ``24h``, ``7d``, ``2w``), or a date or datetime."""
    span = _SPAN.match(text)
    if span is not None:
        return now - float(span.group(1)) * _UNIT_S[span.group(2)]
    return _when(text, "--since")


def parse_until(text: str | None, now: float) -> float:
    """The end of the period: a date or datetime (UTC), or ``now``."""
    return now if text is None else _when(text, "--until")


def _store_embedder(url: str, collection: str) -> Any:
    """The embedder a PostgreSQL collection was built with (read from the collection, as searches do)."""
    import anyio

    from ragloop._redact import hide_credentials
    from ragloop.retrievers.postgres import PostgresStore

    async def read() -> Any:
        async with PostgresStore(url, None, collection=collection, create=False, pool_size=1) as store:
            return store.embedder

    try:
        return anyio.run(read)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 — the driver's own error: one line and exit 2, never a traceback
        why = hide_credentials(f"{type(exc).__name__}: {exc}", url)
        raise ConfigError(f"--store: cannot read the collection {collection!r}'s embedder: {why}") from None


def _embedding(index: str | None, store: str | None = None, collection: str = "ragloop") -> tuple[Any, str | None]:
    if store is not None:
        embedder = _store_embedder(store, collection)
    elif index is not None:
        from ragloop.retrievers.index import KnowledgeIndex

        embedder = KnowledgeIndex.load(index).embedder
    else:
        return None, None
    if embedder.name.startswith("hash-"):  # lexical: it grouped worse joined to the terms (bench_gaps.py)
        print(f"ragloop gaps: {embedder.name} is lexical; grouping on terms alone", file=sys.stderr)
        return None, None
    sync = getattr(embedder, "embed_sync", None)
    if callable(sync):
        return sync, embedder.name
    import anyio

    return (lambda texts: anyio.run(embedder.embed, texts)), embedder.name


def _model_sort() -> Any:
    """The configured model as a blocking ``sort`` for :func:`~ragloop.gaps.build_report`; it says on stderr what
    the model did (or why its hint was not used)."""
    import anyio

    from ragloop.cli._chat import _llm
    from ragloop.gaps import sort_topics

    client, model, _ = _llm()  # checks the environment and that the endpoint answers, before any work
    if client is None or model is None:
        raise ConfigError("--model needs OPENAI_BASE_URL or OPENAI_API_KEY, and RAGLOOP_MODEL, in the environment")

    def sort(questions: Any) -> Any:
        async def run() -> Any:
            async with client:  # one call, in the report's event loop; a client never used holds no connection
                return await sort_topics(client, model, questions)

        topics = anyio.run(run)
        print(terminal_safe(f"ragloop gaps: {topics.note}"), file=sys.stderr)
        return topics

    return sort


def _lifecycle(log: Any, report: Any, turns: Any) -> Any:
    """The report with each topic's id and status (from what earlier runs and replays left in the log), saved for
    the next run. A log that cannot be read or written so (a read-only file or replica) still gets its report:
    without ids and statuses when the state cannot be read, with them but unsaved when it cannot be written."""
    from ragloop.gaps import apply_lifecycle

    where = log.backend.where
    try:
        book = log.backend.gap_book()
    except Exception as exc:  # noqa: BLE001 — the driver's own error: the report goes on without the state
        print(
            terminal_safe(f"ragloop gaps: gap ids and statuses left out: cannot read them in {where}: {exc}"),
            file=sys.stderr,
        )
        return report
    report, records, members = apply_lifecycle(report, book, {t.row.turn_id: t.row.at for t in turns})
    try:
        log.backend.save_gaps(records, members)
    except Exception as exc:  # noqa: BLE001 — as above: this run's ids are shown, the next run cannot know them
        print(terminal_safe(f"ragloop gaps: the gaps' state was not saved in {where}: {exc}"), file=sys.stderr)
    return report


def cmd_gaps(args: argparse.Namespace) -> int:
    """Build the report, then print or write it."""
    from ragloop.gaps import CAUSE_NAMES, build_report, draft_cases, report_html
    from ragloop.turnlog import TurnLog

    if args.top < 1 or args.min_turns < 1:
        raise ConfigError("--top and --min-turns must be at least 1")
    now = time.time()
    since, until = parse_since(args.since, now), parse_until(args.until, now)
    if since >= until:
        raise ConfigError(f"the period is empty: --since {args.since} is not before --until {args.until or 'now'}")
    if args.store is None and args.collection != "ragloop":
        raise ConfigError("--collection names a collection of --store: give --store URL too")
    embed, name = _embedding(args.index, args.store, args.collection)
    sort = _model_sort() if args.model else None
    log = TurnLog.open(args.turn_log)
    try:
        turns = log.turns(since, until, brief_answered=True)
        report = build_report(
            turns,
            since=since,
            until=until,
            embed=embed,
            embedder=name,
            threshold=args.threshold,
            min_turns=args.min_turns,
            max_topics=args.top,
            sort=sort,
        )
        report = _lifecycle(log, report, turns)
    finally:
        log.close()
    if args.html:
        Path(args.html).write_text(report_html(report), encoding="utf-8")
    if args.export_cases:
        cases = draft_cases(report)
        with Path(args.export_cases).open("w", encoding="utf-8") as fh:
            for case in cases:
                fh.write(json.dumps(case, ensure_ascii=False) + "\n")
        print(f"ragloop gaps: wrote {len(cases)} draft cases to {args.export_cases}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False))
        return 0
    print(
        terminal_safe(
            f"Content gaps {report.since} to {report.until}: {report.turns} turns from {report.users} users, "
            f"{report.gap_turns} without a full answer or rated down, in {len(report.topics)} topics"
        )
    )
    for t in report.topics:
        print(
            terminal_safe(
                f"{t.rank:>3}. {t.label}  ·  {t.users} users, {t.turns} turns, {t.trend}  ·  {CAUSE_NAMES[t.cause]}"
            )
        )
        rated = f", {t.down} down, {t.up} up" if t.down or t.up else ""
        weeks = " ".join(str(n) for _, n in t.weekly)
        if t.gap_id:
            print(
                terminal_safe(
                    f"     {t.gap_id} {t.status.upper()} since {t.status_since}; first seen {t.first_seen}, "
                    f"last {t.last_seen}; per week {weeks}{rated}"
                )
            )
        print(terminal_safe(f"     {t.detail}"))
        for example in t.examples[:2]:
            print(terminal_safe(f"     e.g. {example}"))
    if report.stale:
        print("Stale pages cited:")
        for s in report.stale:
            why = f"valid until {s.valid_until}" if s.reason == "expired" else f"updated {s.updated}"
            owner = s.owner or "no owner"
            print(terminal_safe(f"  {s.source} ({owner}, {why}): cited in {s.citations} turns, {s.users} users"))
    if args.html:
        print(f"report written to {args.html}", file=sys.stderr)
    return 0
