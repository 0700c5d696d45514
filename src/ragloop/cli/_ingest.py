"""The ingestion half of ``ragloop index``: which files, how chunks are cut, which embedder, what is reported.

``--include``/``--exclude`` globs, ``--max-tokens``/``--max-chars``, ``--embedder openai:MODEL`` with
``--embedder-base-url``, ``--explain FILE`` (what one file becomes), the per-file budgets (``--workers``,
``--file-timeout``, ``--file-memory``), progress with an ETA (redrawn on a terminal, plain lines elsewhere,
nothing with ``--quiet``), and the summary of every file left out, by reason, in text and ``--json``.
Kept apart from :mod:`ragloop.cli._main` and :mod:`ragloop.cli._store` (both call it; it imports neither).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, TYPE_CHECKING, Any

from ragloop.cli._common import Progress, close_embedder, make_embedder
from ragloop.errors import ConfigError, RagloopError

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder
    from ragloop.retrievers.ingest import IngestResult

__all__ = [
    "add_ingest_options",
    "build_index",
    "cmd_explain",
    "ingest_for_index",
    "print_skips",
    "summary_dict",
]


#: What ``ragloop index`` leaves out unless ``--include-drafts``: the drafts folders of hand-off answers.
DRAFTS = ("**/_drafts/**",)


def add_ingest_options(p: argparse.ArgumentParser) -> None:
    """The ingestion options of ``ragloop index``."""
    p.add_argument(
        "--embedder",
        default="auto",
        metavar="auto|minilm|hash|openai:MODEL",
        help="minilm (the [embed] extra), hash (lexical, no model), openai:MODEL (an embeddings API: "
        "$OPENAI_API_KEY, --embedder-base-url); auto picks minilm when installed",
    )
    p.add_argument(
        "--embedder-base-url", metavar="URL", help="base URL of the embeddings API (default $OPENAI_BASE_URL)"
    )
    p.add_argument(
        "--max-tokens", type=int, default=None, help="largest chunk in the embedder's tokens (default: its limit, 256)"
    )
    p.add_argument("--max-chars", type=int, default=None, help="largest chunk in characters as well (default: none)")
    p.add_argument(
        "--include", action="append", default=[], metavar="GLOB", help="read only files matching GLOB; repeatable"
    )
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave out files matching GLOB")
    p.add_argument(
        "--include-drafts",
        action="store_true",
        help="also index _drafts/ folders (answers to hand-offs that `ragloop serve --handoff-drafts` wrote)",
    )
    p.add_argument("--explain", metavar="FILE", help="show what FILE becomes (cleaned text and chunks); writes nothing")
    p.add_argument(
        "--workers", type=_count, default=None, metavar="N", help="processes reading files (default: one per core)"
    )
    p.add_argument(
        "--file-timeout",
        type=_positive,
        default=30.0,
        metavar="SECONDS",
        help="seconds one file may take to read, plus 10 s per MB of the file; a slower one is skipped (default 30)",
    )
    p.add_argument(
        "--file-memory",
        type=_positive,
        default=512.0,
        metavar="MB",
        help="most memory (MB of address space) reading one file may use; over it, the file is skipped (default 512)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return value


def _budget(args: argparse.Namespace) -> Any:
    from ragloop.retrievers.ingest import Budget
    from ragloop.retrievers.ingest._guard import FILE_BUDGET

    return Budget(
        seconds=getattr(args, "file_timeout", 30.0),
        memory_bytes=int(getattr(args, "file_memory", 512.0) * (1 << 20)),
        seconds_per_mb=FILE_BUDGET.seconds_per_mb,
    )


def build_index(chunks: Any, embedder: Embedder, progress: Any, *, scope: Any = None) -> Any:
    """``KnowledgeIndex.build``; an API embedder's requests and its client's closing run in one event loop."""
    from ragloop.retrievers.index import KnowledgeIndex

    if getattr(embedder, "embed_sync", None) is not None:
        return KnowledgeIndex.build(chunks, embedder, progress=progress, scope=scope)
    import anyio

    async def run() -> KnowledgeIndex:
        try:
            return await KnowledgeIndex.abuild(chunks, embedder, progress=progress, scope=scope)
        finally:
            await close_embedder(embedder)

    return anyio.run(run)


def _limits(args: argparse.Namespace, embedder: Embedder | None) -> tuple[int, Any]:
    """``(max_tokens, tokenizer)``: the embedder's own tokenizer and limit when it has them."""
    from ragloop.retrievers.ingest import default_tokenizer

    tokenizer = getattr(embedder, "tokenizer", None) or default_tokenizer()
    limit = getattr(embedder, "max_length", None) or 256
    max_tokens = getattr(args, "max_tokens", None) or limit
    if max_tokens > limit:
        raise ConfigError(f"--max-tokens {max_tokens} is over the embedder's limit of {limit}; it would be truncated")
    return max_tokens, tokenizer


def ingest_for_index(args: argparse.Namespace, embedder: Embedder | None = None) -> IngestResult:
    """Ingest ``args.path`` as ``ragloop index`` asked (globs, token limits), with progress on a terminal.

    Raises:
        RagloopError: nothing indexable was found (every file skipped), naming the first reasons.
    """
    from ragloop.retrievers.ingest import ingest_path

    max_tokens, tokenizer = _limits(args, embedder)
    reading = Progress("reading", quiet=getattr(args, "quiet", False))
    try:
        result = ingest_path(
            args.path,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            max_chars=getattr(args, "max_chars", None),
            include=getattr(args, "include", ()),
            exclude=[*getattr(args, "exclude", ()), *(() if getattr(args, "include_drafts", False) else DRAFTS)],
            progress=reading,
            budget=_budget(args),
            workers=getattr(args, "workers", None),
        )
    finally:
        reading.close()
    if not result.chunks:
        reasons = "; ".join(f"{where}: {why}" for where, why in result.skipped[:3])
        raise RagloopError(
            f"nothing to index in {args.path}: all {len(result.skipped)} file(s) or document(s) were skipped "
            f"({reasons}); {getattr(args, 'out', None) or 'the index'} was left unchanged"
        )
    return result


def summary_dict(result: IngestResult) -> dict[str, Any]:
    """The ingestion part of ``--json``: files, chunks, and every skip with its kind and reason."""
    from ragloop.retrievers.ingest import skip_kind, skip_kinds

    return {
        "files": result.files,
        "chunks": len(result.chunks),
        "skipped": len(result.skipped),
        "skipped_by_kind": dict(skip_kinds(result.skipped)),
        "skips": [{"path": p, "kind": skip_kind(why), "reason": why} for p, why in result.skipped],
        "excluded": result.excluded,
        "hidden": result.hidden,
        "warnings": [{"path": p, "message": message} for p, message in result.warnings],
    }


def print_skips(result: IngestResult, *, shown: int = 20, out: IO[str] | None = None) -> None:
    """Every kind of skip with its count, then the first ``shown`` skips grouped by kind; then the loaders'
    warnings about files that were still read (pypdf on a damaged PDF)."""
    stream = out if out is not None else sys.stdout
    _print_skipped(result, shown, stream)
    if result.warnings:
        files = len({p for p, _ in result.warnings})
        print(f"warnings about {files} file(s) read anyway (some text may be missing):", file=stream)
        for where, message in result.warnings[:shown]:
            print(f"  {where}: {message}", file=stream)
        if len(result.warnings) > shown:
            print(f"  … and {len(result.warnings) - shown} more (--json lists them all)", file=stream)


def _print_skipped(result: IngestResult, shown: int, stream: IO[str]) -> None:
    from ragloop.retrievers.ingest import skip_kind, skip_kinds

    left_out = []
    if result.excluded:
        left_out.append(f"{result.excluded} excluded by --include/--exclude")
    if result.hidden:
        left_out.append(f"{result.hidden} hidden")
    if not result.skipped:
        print("skipped 0" + (f" ({', '.join(left_out)})" if left_out else ""), file=stream)
        return
    kinds = skip_kinds(result.skipped)
    print(f"skipped {len(result.skipped)}: " + ", ".join(f"{n} {kind}" for kind, n in kinds), file=stream)
    if left_out:
        print("not read: " + ", ".join(left_out), file=stream)
    printed = 0
    for kind, _ in kinds:
        for where, why in result.skipped:
            if printed >= shown:
                break
            if skip_kind(why) == kind:
                print(f"  [{kind}] {where}: {why}", file=stream)
                printed += 1
    if len(result.skipped) > printed:
        print(f"  … and {len(result.skipped) - printed} more (--json lists them all)", file=stream)


def cmd_explain(args: argparse.Namespace) -> int:
    """``ragloop index --explain FILE``: the cleaned text and chunks of one file, or why it is skipped."""
    from ragloop.retrievers.ingest import explain_file

    embedder = make_embedder(args.embedder, args.embedder_base_url) if args.embedder != "auto" else None
    max_tokens, tokenizer = _limits(args, embedder)
    found = explain_file(
        args.explain, max_tokens=max_tokens, tokenizer=tokenizer, max_chars=args.max_chars, budget=_budget(args)
    )
    if getattr(args, "json", False):
        record = {
            "path": found.path,
            "skip": found.skip or None,
            "title": found.title,
            "format": found.fmt,
            "encoding": found.encoding or None,
            "cleaned": found.cleaned,
            "chunks": [
                {"tokens": n, "title_path": list(c.title_path), "metadata": dict(c.metadata), "text": c.text}
                for c, n in found.chunks
            ],
        }
        print(json.dumps(record, ensure_ascii=False))
        return 0
    print(f"{found.path}: {found.fmt or '?'}" + (f", {found.encoding}" if found.encoding else ""))
    if found.skip:
        print(f"skipped: {found.skip}")
        return 0
    print(f"title: {found.title}")
    print("--- cleaned text ---")
    print(found.cleaned)
    print(f"--- {len(found.chunks)} chunks (limit {max_tokens} tokens) ---")
    for i, (chunk, tokens) in enumerate(found.chunks, start=1):
        where = " › ".join(chunk.title_path) or "(top)"
        anchor = chunk.meta().get("anchor", "")
        print(f"[{i}] {tokens} tokens · {where}" + (f" · #{anchor}" if anchor else ""))
        print(chunk.text)
        print()
    return 0
