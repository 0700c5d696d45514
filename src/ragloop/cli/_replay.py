"""The ``ragloop replay`` command: a docs change measured on real questions (registered by :mod:`ragloop.cli`).

``ragloop replay --turn-log sqlite:turns.db --index new-index/`` re-asks the distinct questions of the logged turns
of the period (``--since 30d`` by default; the latest ``--limit`` turns, 10,000 by default), each with the filters
it was logged with, against the given index or store, and prints per question whether it is ``fixed``, ``broken``,
``changed`` or ``same`` compared with its logged turn (:mod:`ragloop.replay`). Offline unless ``--model``.
``--json`` prints one JSON object, ``--markdown`` a pull-request comment, ``--junit FILE`` writes JUnit XML;
progress goes to stderr. ``--mark-gaps`` records in the turn log which questions are now answered, so that
``ragloop gaps`` marks the gaps this knowledge base fixed (run it on what you ship, not on a pull request's KB).
Exit 1 when anything is ``broken``, 2 on a bad option or an unreadable log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ragloop.errors import ConfigError, RagloopError
from ragloop.text.safety import terminal_safe

__all__ = ["add_replay", "cmd_replay"]


def add_replay(sub: Any) -> None:
    """Register ``ragloop replay``."""
    p = sub.add_parser(
        "replay",
        help="re-ask logged questions against a knowledge base: what a docs change fixed or broke",
        description="Re-ask the questions of a turn log against an index or store and compare each reply with "
        "its logged turn (fixed, broken, changed, same). Exit 1 when anything broke.",
    )
    p.add_argument("--turn-log", required=True, metavar="URL", help="the turn log: sqlite:PATH or postgresql://…")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--index", metavar="DIR", help="the knowledge base to measure: an index directory")
    where.add_argument("--store", metavar="URL", help="the knowledge base to measure: a PostgreSQL store")
    p.add_argument("--collection", default="ragloop", help="collection in the store")
    p.add_argument("--since", default="30d", help="start of the period: DAYS, a span (7d, 24h) or a date (default 30)")
    p.add_argument("--limit", type=int, default=10_000, metavar="N", help="replay the latest N turns (10,000)")
    p.add_argument("--model", action="store_true", help="use the configured model (OPENAI_* and RAGLOOP_MODEL)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as one JSON object")
    out.add_argument("--markdown", action="store_true", help="print a summary for a pull-request comment")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (a broken question is a failure)")
    p.add_argument("--deadline", type=float, metavar="S", help="time limit per question, in seconds")
    p.add_argument(
        "--mark-gaps",
        action="store_true",
        help="remember in the turn log which questions this knowledge base answers: `ragloop gaps` then shows "
        "the gaps it fixed (fixed) or broke again (reopened). Use it on the knowledge base you ship",
    )
    p.set_defaults(func=cmd_replay, cache_dir=None)


def _since(text: str, now: float) -> float:
    from ragloop.cli._gaps import parse_since

    raw = text.strip()
    return parse_since(f"{raw}d" if raw.replace(".", "", 1).isdigit() else raw, now)


def _store_pages(url: str, collection: str) -> frozenset[str]:
    import anyio

    from ragloop.retrievers.postgres import PostgresStore

    async def read() -> frozenset[str]:
        async with PostgresStore(url, None, collection=collection, create=False) as store:
            pages: set[str] = set()
            for scope in await store.scopes():
                pages.update(await store.document_hashes(scope))
            return frozenset(pages)

    return anyio.run(read)


def _chat(args: argparse.Namespace) -> tuple[Any, Any, frozenset[str]]:
    from ragloop.cli._check import _chat as chat_for

    if args.index:
        from ragloop.retrievers.index import KnowledgeIndex

        index = KnowledgeIndex.load(args.index)
        pages = frozenset(c.source for c in index.chunks)
        args = argparse.Namespace(**{**vars(args), "index": index})
        rag, client = chat_for(args)
        return rag, client, pages
    pages = _store_pages(args.store, args.collection)
    rag, client = chat_for(args)
    return rag, client, pages


def _progress() -> Any:
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 2.0:
            last[0] = now
            print(f"ragloop replay: {done}/{total} questions", file=sys.stderr)

    return show


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay the log; 0 when nothing broke, 1 when something did."""
    import anyio

    from ragloop.replay import as_dict, junit_xml, markdown, replay_turns
    from ragloop.turnlog import TurnLog

    if args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    if args.junit and not Path(args.junit).resolve().parent.is_dir():
        raise ConfigError(f"--junit {args.junit}: its folder does not exist; create it first")
    now = time.time()
    since = _since(args.since, now)
    log = TurnLog.open(args.turn_log)
    try:
        turns = log.turns(since, now + 1.0, latest=args.limit)
    finally:
        log.close()
    rag, client, pages = _chat(args)

    async def run() -> Any:
        try:
            return await replay_turns(
                rag, turns, pages=pages, limit=args.limit, deadline_s=args.deadline, progress=_progress()
            )
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()

    report = anyio.run(run)
    if args.mark_gaps:
        _mark(args.turn_log, report)
    if args.junit:
        try:
            Path(args.junit).write_text(junit_xml(report), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the JUnit XML to {args.junit}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(as_dict(report), ensure_ascii=False))
    elif args.markdown:
        print(markdown(report), end="")
    else:
        _table(report)
    return 1 if report.broken else 0


def _mark(url: str, report: Any) -> None:
    from ragloop.turnlog import TurnLog

    at = time.time()
    marks = [
        (turn_id, at, i.after.outcome == "context" and bool(i.after.pages))
        for i in report.items
        for turn_id in i.turn_ids
    ]
    log = TurnLog.open(url)
    try:
        log.backend.record_replays(marks)
    except RagloopError:
        raise
    except Exception as exc:  # the driver's own error (a read-only file, a dropped connection): one line
        raise ConfigError(f"cannot mark the replay in {log.backend.where}: {exc}") from exc
    finally:
        log.close()
    print(f"ragloop replay: marked {len(marks)} turns in {url.split('@')[-1]} for `ragloop gaps`", file=sys.stderr)


def _table(report: Any) -> None:
    from ragloop.replay import VERDICTS

    counts = ", ".join(f"{report.count(v)} {v}" for v in VERDICTS)
    print(f"replayed {len(report.items)} questions from {report.turns} turns in {report.seconds:.1f}s: {counts}")
    for reason, n in report.skipped:
        print(terminal_safe(f"  {n} turns not replayed: {reason}"))
    for i in report.items:
        if i.verdict == "same":
            continue
        print(terminal_safe(f"{i.verdict.upper():8} {i.question}  ({len(i.turn_ids)} turns)"))
        before = f"{i.before.outcome} {', '.join(i.before.pages) or '-'}"
        after = f"{i.after.outcome} {', '.join(i.after.pages) or '-'}"
        print(terminal_safe(f"         {before} -> {after}  ({i.reason})"))
