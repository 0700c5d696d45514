"""The ``--store``, ``--update``, ``--meta`` and ``--filter`` parts of the ``ragloop`` command.

``ragloop index DIR --store postgresql://…`` syncs a folder into a PostgreSQL collection (document by
document, reusing stored embeddings); ``ragloop index DIR --out IDX --update`` does the same for a local index;
``ragloop search/ask/chat --store …`` read from the collection. Kept apart from :mod:`ragloop.cli` so that the
index command's own code stays short.

Every index run owns one **scope** (:class:`~ragloop.retrievers.scope.Scope`): its ``--meta`` pairs, or
``--scope KEY=VALUE`` given explicitly, and changes only that scope's documents. ``--dry-run`` prints what it
would add, change and remove; removing more than 20% of the scope asks for ``--prune`` (``--yes``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragloop.errors import ConfigError, PruneRefused

if TYPE_CHECKING:
    from ragloop.retrievers.ingest import IngestResult
    from ragloop.retrievers.scope import Scope
    from ragloop.retrievers.update import SyncSummary
    from ragloop.state import Chunk, Hit

__all__ = [
    "add_filter_option",
    "add_index_options",
    "add_store_options",
    "attach_metadata",
    "check_rebuild",
    "cmd_index_store",
    "cmd_index_update",
    "index_scope",
    "parse_filters",
    "parse_pairs",
    "store_url",
]


def add_store_options(p: argparse.ArgumentParser) -> None:
    """``--store``, ``--collection`` and ``--pool-size``."""
    p.add_argument(
        "--store",
        metavar="URL",
        help="a PostgreSQL database with pgvector (postgresql://…; default $RAGLOOP_STORE) instead of an index folder",
    )
    p.add_argument("--collection", default="ragloop", help="collection (table prefix) in the store")
    p.add_argument("--pool-size", type=int, default=10, help="most connections to the store")


def add_filter_option(p: argparse.ArgumentParser) -> None:
    """``--filter KEY=VALUE[,VALUE…]`` (repeatable)."""
    p.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="KEY=VALUE[,VALUE…]",
        help="search only chunks whose metadata KEY is VALUE (or one of the comma-separated values); repeatable",
    )


#: ``ragloop.retrievers.update.MAX_REMOVED_SHARE``, written here so that building the parser (``--help``) imports
#: no retrieval code (numpy, faiss, bm25s); tests/cli/test_main.py checks the two agree.
REMOVED_SHARE_SHOWN = 0.2


def add_index_options(p: argparse.ArgumentParser) -> None:
    """The store and update options of ``ragloop index``."""
    add_store_options(p)
    p.add_argument(
        "--update",
        action="store_true",
        help="update --out in place: re-embed only new or changed chunks, drop deleted documents",
    )
    p.add_argument(
        "--meta",
        action="append",
        default=[],
        type=meta_item("--meta"),
        metavar="KEY=VALUE",
        help="metadata for every chunk (e.g. tenant=acme, version=2.1); repeatable",
    )
    p.add_argument("--url-base", help="base URL of the published documents: citations link to URL-BASE/PATH")
    p.add_argument("--json", action="store_true", help="print the update summary as one JSON object")
    _add_scope_options(p)


def _add_scope_options(p: argparse.ArgumentParser) -> None:
    """``--scope``, ``--dry-run`` and ``--prune``/``--yes`` of ``ragloop index``."""
    p.add_argument(
        "--scope",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the documents this run owns (default: its --meta pairs); only they are added, changed or removed. "
        "Give it when a --meta value changes between runs (e.g. --scope tenant=acme --meta build=42)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be added, changed and removed (by name), and write nothing",
    )
    p.add_argument(
        "--prune",
        "--yes",
        action="store_true",
        dest="prune",
        help=f"allow removing more than {REMOVED_SHARE_SHOWN:.0%}% of the scope's documents (refused without it), or "
        "replacing a local index that holds other scopes",
    )


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` → ``{"a": "1", "b": "2"}``; a ConfigError names a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE (e.g. {what} tenant=acme)")
        out[key.strip()] = value.strip()
    return out


#: Metadata keys ragloop sets per document or chunk: one value given to every chunk would be a lie about each.
RESERVED_META = frozenset({"path", "anchor", "url", "permalink"})
_META_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_META_VALUE = 256


def _meta_pair(item: str, what: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise ConfigError(f"{what} {item!r:.80} is not KEY=VALUE (e.g. {what} tenant=acme)")
    if not _META_KEY.fullmatch(key):
        raise ConfigError(
            f"{what} key {key!r:.80} must start with a letter or _ and hold only letters, digits, _ . - "
            "(at most 64 characters)"
        )
    if key in RESERVED_META:
        raise ConfigError(
            f"{what} {key}=… is refused: ragloop sets {key!r} for each document itself "
            f"({', '.join(sorted(RESERVED_META))} are reserved); use another key"
        )
    if not value or len(value) > MAX_META_VALUE or not value.isprintable():
        raise ConfigError(
            f"{what} {key}=… must have a value of 1 to {MAX_META_VALUE} printable characters (no control "
            f"characters), got {value!r:.80}"
        )
    return key, value


def meta_item(what: str) -> Any:
    """An argparse ``type`` for ``what`` (``--meta``, ``--scope``): refuses a bad pair when the command line is
    read, before any file is."""

    def check(item: str) -> str:
        try:
            _meta_pair(item, what)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return item

    return check


def parse_meta(items: Sequence[str], what: str) -> dict[str, str]:
    """``--meta`` / ``--scope`` pairs, checked: a key is a name (letters, digits, ``_ . -``, at most 64, not one
    ragloop sets itself such as ``path``), given once; a value is 1 to 256 printable characters."""
    out: dict[str, str] = {}
    for item in items:
        key, value = _meta_pair(item, what)
        if key in out:
            raise ConfigError(f"{what} {key} is given twice ({out[key]!r:.40} and {value!r:.40}); give it once")
        out[key] = value
    return out


def parse_filters(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--filter`` values as retriever filters: ``version=1,2`` allows either value."""
    from ragloop.retrievers.filters import normalize_filters

    pairs = parse_pairs(items, "--filter")
    return normalize_filters({k: [v for v in value.split(",") if v] for k, value in pairs.items()})


def store_url(args: argparse.Namespace) -> str | None:
    """``--store``, else ``$RAGLOOP_STORE`` (environment variables are read by the CLI only)."""
    url: str | None = getattr(args, "store", None) or os.environ.get("RAGLOOP_STORE") or None
    return url


def _ingest(args: argparse.Namespace) -> tuple[IngestResult, list[Chunk]]:
    from ragloop.cli._ingest import ingest_for_index

    result = ingest_for_index(args)
    return result, attach_metadata(args, result.chunks)


def attach_metadata(args: argparse.Namespace, chunks: Sequence[Chunk]) -> list[Chunk]:
    """The chunks with metadata from front matter, the path, ``--meta`` (and ``--scope``) and a URL from
    ``--url-base``."""
    from ragloop.retrievers.metadata import with_metadata

    root = Path(args.path)
    return with_metadata(
        chunks,
        root if root.is_dir() else None,
        extra={**parse_meta(args.meta, "--meta"), **dict(index_scope(args).pairs)},
        url_base=args.url_base,
    )


def index_scope(args: argparse.Namespace) -> Scope:
    """The run's scope: ``--scope`` pairs when given (each agreeing with ``--meta``), else the ``--meta`` pairs."""
    from ragloop.retrievers.scope import Scope

    given = parse_pairs(getattr(args, "scope", []), "--scope")
    if "path" in given:
        raise ConfigError("--scope path=… would give every document the same path; scope by another key (tenant=…)")
    meta = parse_meta(getattr(args, "meta", []), "--meta")
    given = parse_meta(getattr(args, "scope", []), "--scope")
    if not given:
        return Scope(meta)
    for key, value in given.items():
        if key in meta and meta[key] != value:
            raise ConfigError(
                f"--scope {key}={value} contradicts --meta {key}={meta[key]}: a run's documents carry its scope; "
                f"drop one of them or make them agree"
            )
    return Scope(given)


def check_rebuild(args: argparse.Namespace) -> None:
    """Before a full local build over an existing index: refuse to drop documents of other scopes.

    Raises:
        PruneRefused: ``--out`` holds documents of another scope and neither ``--update`` nor ``--prune`` says
            what to do with them.
        ConfigError: ``--dry-run`` without ``--update`` (a full build has no plan to print).
    """
    from ragloop.retrievers.index import index_scopes

    if getattr(args, "dry_run", False):
        raise ConfigError("--dry-run previews an update: add --update (local index) or use --store")
    scope = index_scope(args)
    others = {s: n for s, n in index_scopes(args.out).items() if s != scope}
    if others and not args.prune:
        held = "; ".join(f"{s.describe()}: {n} documents" for s, n in sorted(others.items(), key=lambda x: x[0].label))
        raise PruneRefused(
            f"refusing to replace {args.out}: it holds documents of other scopes ({held}) that a full build of "
            f"scope {scope.describe()} would delete; pass --update to change only scope {scope.describe()}, or "
            "--prune to replace the whole index"
        )


def _report(summary: SyncSummary, result: IngestResult, where: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**summary.as_dict(), "files": result.files, "skipped": len(result.skipped), "to": where}))
        return
    scope = f", scope {summary.scope.describe()}" if summary.scope.pairs else ""
    print(f"{where}{scope}: {summary.line()}")
    shown = ((("would add", summary.added_ids), ("would change", summary.changed_ids)) if summary.dry_run else ()) + (
        ("would remove" if summary.dry_run else "removed", summary.removed_ids),
    )
    for what, ids in shown:
        if ids:
            more = f" … and {len(ids) - 20} more" if len(ids) > 20 else ""
            print(f"  {what}: {', '.join(ids[:20])}{more}")
    if summary.refusal:
        print(f"  without --prune the run would stop: {summary.refusal}")
    if result.skipped:
        print(f"skipped {len(result.skipped)}:")
        for path, why in result.skipped[:20]:
            print(f"  {path}: {why}")


def cmd_index_store(args: argparse.Namespace, url: str) -> int:
    """``ragloop index DIR --store URL``: sync the folder into the collection, document by document."""
    import anyio

    from ragloop.cli._common import Progress, make_embedder
    from ragloop.retrievers.postgres import PostgresStore, collection_exists

    started = time.perf_counter()
    scope = index_scope(args)  # a contradictory --scope is refused before any work
    result, chunks = _ingest(args)
    embedder = make_embedder(args.embedder)
    embedding = Progress(f"embedding ({embedder.name})", quiet=getattr(args, "quiet", False))

    repaired: tuple[str, ...] = ()

    async def run() -> Any:
        nonlocal repaired
        if args.dry_run and not await collection_exists(url, args.collection):
            return None
        # A dry run opens as a reader: it creates, upgrades and repairs nothing either.
        opened = PostgresStore(
            url, embedder, collection=args.collection, pool_size=args.pool_size, create=not args.dry_run
        )
        async with opened as store:
            repaired = store.repaired
            return await store.sync(chunks, scope=scope, prune=args.prune, dry_run=args.dry_run, progress=embedding)

    try:
        summary = anyio.run(run)
    finally:
        embedding.close()
    if summary is None:
        docs = len({c.doc_id for c in chunks})
        print(
            f"collection {args.collection} does not exist yet; dry run, nothing written: a run would create it and "
            f"add {docs} documents ({len(chunks)} chunks)"
        )
        return 0
    for what in repaired:
        print(f"collection {args.collection}: repaired: {what}", file=sys.stdout if not args.json else sys.stderr)
    _report(summary, result, f"collection {args.collection}", args.json)
    if not args.json:
        print(f"embedder {embedder.name} ({embedder.dim}-dim); {time.perf_counter() - started:.1f}s in all")
    return 0


def cmd_index_update(args: argparse.Namespace) -> int:
    """``ragloop index DIR --out IDX --update``: rebuild IDX reusing the vectors of unchanged chunks."""
    from ragloop.cli._common import Progress
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.update import update_index

    out = Path(args.out)
    scope = index_scope(args)  # a contradictory --scope is refused before any work
    if not (out / "manifest.json").is_file():
        if args.dry_run:
            raise ConfigError(f"no index at {out} yet, so nothing to compare; run without --dry-run to build it")
        print(f"ragloop index: no index at {out} yet; building it from scratch", file=sys.stderr)
        return -1  # the caller builds as usual
    old = KnowledgeIndex.load(out)
    if args.embedder != "auto":
        from ragloop.cli._common import make_embedder

        wanted = make_embedder(args.embedder)
        if wanted.name != old.embedder.name:
            raise ConfigError(
                f"{out} was built with {old.embedder.name!r}; --update keeps the embedder (drop --update to "
                f"rebuild with {wanted.name!r})"
            )
    result, chunks = _ingest(args)
    if args.dry_run:
        _report(_plan(old, chunks, scope, args.prune), result, str(out), args.json)
        return 0
    embedding = Progress(f"embedding ({old.embedder.name})", quiet=getattr(args, "quiet", False))
    try:
        index, summary = update_index(old, chunks, scope=scope, prune=args.prune, progress=embedding)
    finally:
        embedding.close()
    saved = index.save(out, source=args.path)  # refuses to write inside the ingested source
    _report(summary, result, str(saved), args.json)
    return 0


def _plan(old: Any, chunks: Sequence[Chunk], scope: Scope, prune: bool) -> SyncSummary:
    """What ``--update`` would do to the local index (``--dry-run``): nothing embedded, nothing written."""
    from ragloop.retrievers.update import SyncSummary, check_removals, content_hash, plan_update

    new, diff, stored, adopted = plan_update(old, chunks, scope=scope)
    try:
        check_removals(len(diff.removed), stored, scope=scope, where="the index", prune=prune)
        refusal = ""
    except PruneRefused as exc:  # a dry run reports the refusal a real run would meet
        refusal = str(exc)
    known = {content_hash(c) for c in old.chunks}
    fresh = sum(1 for c in new if content_hash(c) not in known)
    return SyncSummary.of(
        diff,
        embedded=fresh,
        reused=len(new) - fresh,
        chunks=len(old.chunks),
        seconds=0.0,
        scope=scope,
        dry_run=True,
        refusal=refusal,
        adopted=len(adopted),
    )


def print_hits(hits: Sequence[Hit], as_json: bool) -> None:
    """Hits as ``ragloop search`` prints them (one JSON object each with ``--json``)."""
    for n, hit in enumerate(hits, start=1):
        c = hit.chunk
        if as_json:
            record = {
                "rank": n,
                "id": c.id,
                "score": hit.score,
                "confidence": hit.confidence,
                "ranks": dict(hit.ranks),
                "scores": dict(hit.scores),
                "title": c.title,
                "title_path": list(c.title_path),
                "source": c.source,
                "url": c.url or None,
                "doc_id": c.doc_id,
                "metadata": dict(c.metadata),
                "text": c.text,
            }
            print(json.dumps(record, ensure_ascii=False))
            continue
        where = " › ".join(p for p in (c.title, *c.title_path) if p) or c.source
        text = " ".join(c.text.split())
        print(f"{n}. [{hit.score:.4f} conf {hit.confidence:.2f}] {where}")
        print(f"   {c.url or c.source}")
        print(f"   {text[:240]}{'…' if len(text) > 240 else ''}")
    if not hits and not as_json:
        print("no hits")


def cmd_search_store(args: argparse.Namespace, url: str, query: str) -> int:
    """``ragloop search --store URL QUERY``."""
    import anyio

    from ragloop.retrievers.postgres import PostgresStore

    async def run() -> list[Hit]:
        async with PostgresStore(url, collection=args.collection, pool_size=args.pool_size, create=False) as store:
            return await store.search(query, args.k, filters=parse_filters(args.filter))

    print_hits(anyio.run(run), args.json)
    return 0
