"""The ``ragloop check`` command: the knowledge-base regression gate for CI (registered by :mod:`ragloop.cli`).

``ragloop check cases.jsonl --index kb-index/`` asks every case's question (offline by default: no model, the
same answer every run; ``--model`` uses the model ``ragloop ask`` would), prints PASS or FAIL per case with why,
then the pass rate with its 95 % Wilson score interval. It exits 1 when any case fails, or, with ``--min-pass``, when
the pass rate is below it; 2 on a bad cases file (one line naming the line and the field) or a ``--junit`` path
that cannot be written. ``--junit FILE`` writes JUnit XML for CI systems (well-formed whatever the text holds),
``--json`` prints one JSON object instead of the table. The file may start with a UTF-8 byte-order mark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ragloop.errors import ConfigError
from ragloop.text.safety import terminal_safe

__all__ = ["add_check", "cmd_check", "parse_min_pass"]


def add_check(sub: Any) -> None:
    """Register ``ragloop check``."""
    p = sub.add_parser(
        "check",
        help="knowledge-base regression gate: questions whose answers must keep working",
        description="Ask every case of a JSONL cases file and check its answer (cited pages, phrases, outcome). "
        "Offline unless --model. Exit 1 on a failing case or a pass rate below --min-pass.",
    )
    p.add_argument("cases", help='JSONL file: one case per line ({"question", "expect_sources", …})')
    where = p.add_mutually_exclusive_group()
    where.add_argument("--index", metavar="DIR", help="index directory (default: the bundled sample knowledge base)")
    where.add_argument("--store", metavar="URL", help="a PostgreSQL knowledge store (postgresql://…)")
    p.add_argument("--collection", default="ragloop", help="collection in the store")
    p.add_argument("--model", action="store_true", help="use the configured model (OPENAI_* and RAGLOOP_MODEL)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    p.add_argument("--json", action="store_true", help="print one JSON object: cases and summary")
    p.add_argument("--min-pass", type=parse_min_pass, metavar="X", help="least pass rate (0.9 or 90%%) to exit 0")
    p.add_argument("--deadline", type=float, metavar="S", help="time limit per case, in seconds")
    p.add_argument("--cache-dir", metavar="DIR", help="where the sample index is cached (~/.cache/ragloop)")
    p.set_defaults(func=cmd_check)


def parse_min_pass(text: str) -> float:
    """A pass rate for argparse: ``0.9`` or ``90%``."""
    raw = text.strip()
    try:
        value = float(raw.removesuffix("%")) / (100 if raw.endswith("%") else 1)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a rate from 0 to 1 (or 0% to 100%), got {text!r}")
    return value


def _chat(args: argparse.Namespace) -> tuple[Any, Any]:
    from ragloop.chat import ChatRAG

    client, fast, answer = None, None, None
    if args.model:
        from ragloop.cli._chat import _llm

        client, fast, answer = _llm()
        if client is None:
            raise ConfigError("--model needs OPENAI_BASE_URL or OPENAI_API_KEY, and RAGLOOP_MODEL, in the environment")
    kwargs: dict[str, Any] = {"fast_model": fast, "answer_model": answer}
    if args.store:
        return ChatRAG.from_store(args.store, client, collection=args.collection, **kwargs), client
    if args.index:
        return ChatRAG.from_index(args.index, client, **kwargs), client
    return ChatRAG.sample(client, cache_dir=args.cache_dir, live_sources=(), **kwargs), client


def _writable(path: Path) -> None:
    """Refuse a ``--junit`` path that cannot be written before any case runs."""
    if path.is_dir():
        raise ConfigError(f"--junit {path} is a directory: pass a file name, e.g. {path / 'ragloop-check.xml'}")
    if not path.parent.is_dir():
        raise ConfigError(f"--junit {path}: the folder {path.parent} does not exist; create it first")


def cmd_check(args: argparse.Namespace) -> int:
    """Run the cases; 0 when the gate passes, 1 when it fails."""
    import anyio

    from ragloop.kbcheck import junit_xml, load_cases, run_cases, summarize

    notes: list[str] = []
    cases = load_cases(args.cases, notes=notes)  # a bad file fails before the index loads
    for note in notes:
        print(terminal_safe(f"ragloop check: {note}"), file=sys.stderr)
    if args.junit:
        _writable(Path(args.junit))
    rag, client = _chat(args)

    async def run() -> Any:
        try:
            return await run_cases(rag, cases, deadline_s=args.deadline)
        finally:
            await rag.aclose()
            if client is not None:
                await client.close()

    results = anyio.run(run)
    summary = summarize(results)
    if args.junit:
        try:
            Path(args.junit).write_text(junit_xml(results), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the JUnit XML to {args.junit}: {exc.strerror or exc}") from None
    failed = summary.passed < summary.total
    gate_failed = summary.rate < args.min_pass if args.min_pass is not None else failed
    if args.json:
        print(
            json.dumps(
                {
                    "cases": [
                        {
                            "line": r.case.line,
                            "id": r.case.id,
                            "question": r.case.question,
                            "passed": r.passed,
                            "reasons": list(r.reasons),
                            "outcome": r.outcome,
                            "cited": list(r.cited),
                            "seconds": round(r.seconds, 4),
                        }
                        for r in results
                    ],
                    "summary": {
                        "total": summary.total,
                        "passed": summary.passed,
                        "rate": summary.rate,
                        "ci95": [summary.low, summary.high],
                        "min_pass": args.min_pass,
                        "ok": not gate_failed,
                    },
                },
                ensure_ascii=False,
            )
        )
        return 1 if gate_failed else 0
    for r in results:
        mark = "PASS" if r.passed else "FAIL"
        print(terminal_safe(f"{mark}  {r.case.name}  ({r.outcome}, {r.seconds:.2f}s)"))
        for reason in r.reasons:
            print(terminal_safe(f"      {reason}"))
    print(
        f"passed {summary.passed}/{summary.total} ({summary.rate:.1%}; 95% Wilson interval "
        f"{summary.low:.1%} to {summary.high:.1%})"
        + (f"; --min-pass {args.min_pass:.1%}" if args.min_pass is not None else "")
    )
    if args.junit:
        print(f"JUnit XML written to {args.junit}", file=sys.stderr)
    return 1 if gate_failed else 0
