"""The ``ragloop`` command: ``ask``, ``chat`` (in :mod:`ragloop.cli._chat`), ``index``, ``search``, ``eval``, and
``gaps`` and ``check`` (in :mod:`ragloop.cli._gaps` and :mod:`ragloop.cli._check`).

Each subcommand is a pair of functions, ``_add_<name>(sub)`` (its arguments) and ``_cmd_<name>(args)``
(what it does, returning the exit status), registered in :data:`_COMMANDS`. Heavy modules are imported
inside the command functions so that ``ragloop --help`` stays fast. A :class:`~ragloop.errors.RagloopError`
becomes one line on stderr and exit status 2; environment variables are read here and nowhere else.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ragloop.cli._chat import add_ask, add_chat
from ragloop.cli._check import add_check
from ragloop.cli._common import Progress, make_embedder
from ragloop.cli._doctor import add_doctor
from ragloop.cli._gaps import add_gaps
from ragloop.cli._handoff import add_handoff
from ragloop.cli._ingest import add_ingest_options, build_index, cmd_explain, ingest_for_index, print_skips
from ragloop.cli._mcp import add_mcp
from ragloop.cli._replay import add_replay
from ragloop.cli._serve import add_serve
from ragloop.cli._store import (
    add_filter_option,
    add_index_options,
    add_store_options,
    attach_metadata,
    check_rebuild,
    cmd_index_store,
    cmd_index_update,
    cmd_search_store,
    index_scope,
    parse_filters,
    print_hits,
    store_url,
)
from ragloop.errors import RagloopError

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder
    from ragloop.state import Hit

__all__ = ["build_parser", "main"]

_MODES = ("bm25", "dense", "hybrid")


# --- index --------------------------------------------------------------------------------------------


def _add_index(sub: Any) -> None:
    p = sub.add_parser("index", help="ingest documents and build a searchable index")
    p.add_argument(
        "path",
        nargs="?",
        help="a folder of documents (.md .txt .html .rst .pdf .docx), or a BEIR folder / corpus.jsonl[.gz]",
    )
    p.add_argument(
        "--out", help="index folder to write: new, empty or a ragloop index (replaced atomically); or pass --store"
    )
    add_ingest_options(p)
    add_index_options(p)
    p.set_defaults(func=_cmd_index)


def _cmd_index(args: argparse.Namespace) -> int:
    if args.explain:
        return cmd_explain(args)
    if args.store and args.out:
        raise RagloopError("pass either --out DIR (a local index) or --store URL (a shared store), not both")
    url = store_url(args)
    if url and not args.out:
        return cmd_index_store(args, url)
    if not args.out:
        raise RagloopError("pass --out DIR (a local index) or --store postgresql://… (a shared store)")
    if args.update and (status := cmd_index_update(args)) >= 0:
        return status
    from ragloop.retrievers.index import check_index_target

    started = time.perf_counter()
    check_index_target(args.out, source=args.path)  # refuse a bad --out before minutes of work
    check_rebuild(args)  # nor drop documents of other scopes (tenants) that --out holds
    embedder = make_embedder(args.embedder, args.embedder_base_url)
    result = ingest_for_index(args, embedder)
    embedding = Progress(f"embedding ({embedder.name})", quiet=args.quiet)
    try:
        index = build_index(attach_metadata(args, result.chunks), embedder, embedding, scope=index_scope(args))
    finally:
        embedding.close()
    out = index.save(args.out, source=args.path)
    seconds = time.perf_counter() - started
    if args.json:
        from ragloop.cli._ingest import summary_dict

        record = {
            **summary_dict(result),
            "to": str(out),
            "embedder": embedder.name,
            "runtime": getattr(embedder, "runtime", None),
            "activations": getattr(embedder, "activations", None),
            "threads": getattr(embedder, "threads", None),
            "seconds": round(seconds, 2),
            "cpu_seconds": round(_cpu_seconds(), 2),
        }
        print(json.dumps(record, ensure_ascii=False))
        return 0
    print(
        f"indexed {result.files} files into {len(index.chunks)} chunks in {seconds:.1f}s "
        f"({_cpu_seconds():.1f} CPU-s, file readers included) → {out}"
    )
    runs = getattr(embedder, "runtime", None)
    activations = getattr(embedder, "activations", None)
    runs = f"{runs} ({activations} activations)" if runs and activations else runs
    on = f", {runs} with {getattr(embedder, 'threads', '?')} threads" if runs else ""
    print(f"embedder {embedder.name} ({embedder.dim}-dim{on}), dense index {index.dense.kind}")
    print_skips(result)
    return 0


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (the file-reading workers)."""
    try:
        import resource
    except ImportError:  # Windows: this process only
        return time.process_time()
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# --- search -------------------------------------------------------------------------------------------


def _add_search(sub: Any) -> None:
    p = sub.add_parser("search", help="search an index built by `ragloop index`")
    p.add_argument("index", help="index directory (leave it out with --store)")
    p.add_argument("query", nargs="?", help="the search query")
    p.add_argument("--mode", choices=_MODES, default="hybrid")
    p.add_argument("-k", type=int, default=5, help="number of hits")
    p.add_argument("--json", action="store_true", help="print one JSON object per hit")
    add_store_options(p)
    add_filter_option(p)
    p.set_defaults(func=_cmd_search)


def _cmd_search(args: argparse.Namespace) -> int:
    import anyio

    url = store_url(args)
    if url:
        return cmd_search_store(args, url, args.query if args.query is not None else args.index)
    if args.query is None:
        raise RagloopError("pass INDEX QUERY, or --store URL QUERY")

    from ragloop.cli._common import close_embedder, embedder_for_index
    from ragloop.retrievers.index import KnowledgeIndex

    index = KnowledgeIndex.load(args.index, embedder_for_index(args.index))
    filters = parse_filters(args.filter)

    async def search() -> list[Hit]:
        try:
            return await index.search(args.query, args.k, args.mode, filters=filters)
        finally:
            await close_embedder(index.embedder)

    hits = anyio.run(search)
    print_hits(hits, args.json)
    return 0


# --- eval ---------------------------------------------------------------------------------------------


def _add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate retrieval on a BEIR-layout folder")
    p.add_argument("--beir", required=True, help="BEIR folder: corpus.jsonl[.gz], queries.jsonl, qrels/")
    p.add_argument("--split", default=None, help="qrels split (default: the only one, else test)")
    p.add_argument("--mode", choices=_MODES, default="hybrid")
    p.add_argument("--embedder", choices=("auto", "minilm", "hash"), default="auto")
    p.add_argument("--index-cache", default=None, help="reuse (or write) the built index in this directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_cmd_eval)


def _cmd_eval(args: argparse.Namespace) -> int:
    from ragloop.retrievers.embed import HashEmbedder
    from ragloop.retrievers.evaluate import evaluate_beir

    if args.embedder == "auto" and args.mode == "bm25":
        embedder: Embedder = HashEmbedder()  # BM25 results do not use vectors; skip the model
    else:
        embedder = make_embedder(args.embedder)
    progress = Progress(f"embedding ({embedder.name})")
    try:
        result = evaluate_beir(
            args.beir,
            args.split,
            args.mode,
            embedder,
            index_dir=args.index_cache,
            progress=progress,
        )
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.beir}  split={args.split or 'default'}  mode={args.mode}  embedder={embedder.name}")
    for key, value in result.items():
        shown = (
            f"{value:.4f}"
            if key.startswith(("ndcg", "recall", "mrr"))
            else (f"{value:.2f}" if isinstance(value, float) else str(value))
        )
        print(f"  {key:<16} {shown}")
    return 0


# --- main ---------------------------------------------------------------------------------------------

_COMMANDS: tuple[Callable[[Any], None], ...] = (
    add_ask,
    add_chat,
    _add_index,
    _add_search,
    _add_eval,
    add_serve,
    add_mcp,
    add_doctor,
    add_gaps,
    add_check,
    add_replay,
    add_handoff,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from ragloop import __version__

    parser = argparse.ArgumentParser(prog="ragloop", description="Agentic RAG in a small graph runner.")
    parser.add_argument("--version", action="version", version=f"ragloop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ragloop`` command.

    Args:
        argv: The arguments after the program's name (``["ask", "what is ragloop?"]``); ``None`` reads
            ``sys.argv``.

    Returns:
        The exit status: the subcommand's own (0 when it succeeded), 2 for a ragloop error (with one line on
        stderr), 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    configured = _configure_logging()
    try:
        status: int = args.func(args)
    except RagloopError as exc:
        print(f"ragloop {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if configured is not None:
            configured()
    return status


def _configure_logging() -> Callable[[], None] | None:
    """Send structlog warnings and worse to stderr (stdout carries results), unless the host configured it.

    One short, redacted line per event, storms counted (:mod:`ragloop.cli._logging`). Returns the function that
    undoes it (``main`` calls it afterwards, so that calling ``main`` in-process leaves no global state behind).
    """
    from ragloop.cli._logging import configure

    return configure()
