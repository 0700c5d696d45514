"""The ``--store``, ``--update``, ``--meta`` and ``--filter`` parts of the ``ragloop`` command.

``ragloop index DIR --store postgresql://…`` syncs a folder into a PostgreSQL collection (document by
document, reusing stored embeddings); ``ragloop index DIR --out IDX --update`` does the same for a local index;
``ragloop search/ask/chat --store …`` read from the collection. Kept apart from :mod:`ragloop.cli` so that the
index command's own code stays short.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragloop.errors import ConfigError

if TYPE_CHECKING:
    from ragloop.retrievers.ingest import IngestResult
    from ragloop.state import Chunk, Hit

__all__ = [
    "add_filter_option",
    "add_index_options",
    "add_store_options",
    "attach_metadata",
    "cmd_index_store",
    "cmd_index_update",
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
        metavar="KEY=VALUE",
        help="metadata for every chunk (e.g. tenant=acme, version=2.1); repeatable",
    )
    p.add_argument("--url-base", help="base URL of the published documents: citations link to URL-BASE/PATH")
    p.add_argument("--json", action="store_true", help="print the update summary as one JSON object")


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` → ``{"a": "1", "b": "2"}``; a ConfigError names a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE (e.g. {what} tenant=acme)")
        out[key.strip()] = value.strip()
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
    from ragloop.cli_ingest import ingest_for_index

    result = ingest_for_index(args)
    return result, attach_metadata(args, result.chunks)


def attach_metadata(args: argparse.Namespace, chunks: Sequence[Chunk]) -> list[Chunk]:
    """The chunks with metadata from front matter, the path, ``--meta`` and a URL from ``--url-base``."""
    from ragloop.retrievers.metadata import with_metadata

    root = Path(args.path)
    return with_metadata(
        chunks,
        root if root.is_dir() else None,
        extra=parse_pairs(args.meta, "--meta"),
        url_base=args.url_base,
    )


def _report(summary: Any, result: IngestResult, where: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({**summary.as_dict(), "files": result.files, "skipped": len(result.skipped), "to": where}))
        return
    print(f"{where}: {summary.line()}")
    if result.skipped:
        print(f"skipped {len(result.skipped)}:")
        for path, why in result.skipped[:20]:
            print(f"  {path}: {why}")


def cmd_index_store(args: argparse.Namespace, url: str) -> int:
    """``ragloop index DIR --store URL``: sync the folder into the collection, document by document."""
    import anyio

    from ragloop.cli import _make_embedder, _Progress
    from ragloop.retrievers.postgres import PostgresStore

    started = time.perf_counter()
    result, chunks = _ingest(args)
    embedder = _make_embedder(args.embedder)
    embedding = _Progress(f"embedding ({embedder.name})")

    async def run() -> Any:
        async with PostgresStore(url, embedder, collection=args.collection, pool_size=args.pool_size) as store:
            return await store.sync(chunks, progress=embedding)

    try:
        summary = anyio.run(run)
    finally:
        embedding.close()
    _report(summary, result, f"collection {args.collection}", args.json)
    if not args.json:
        print(f"embedder {embedder.name} ({embedder.dim}-dim); {time.perf_counter() - started:.1f}s in all")
    return 0


def cmd_index_update(args: argparse.Namespace) -> int:
    """``ragloop index DIR --out IDX --update``: rebuild IDX reusing the vectors of unchanged chunks."""
    from ragloop.cli import _Progress
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.update import update_index

    out = Path(args.out)
    if not (out / "manifest.json").is_file():
        print(f"ragloop index: no index at {out} yet; building it from scratch", file=sys.stderr)
        return -1  # the caller builds as usual
    old = KnowledgeIndex.load(out)
    if args.embedder != "auto":
        from ragloop.cli import _make_embedder

        wanted = _make_embedder(args.embedder)
        if wanted.name != old.embedder.name:
            raise ConfigError(
                f"{out} was built with {old.embedder.name!r}; --update keeps the embedder (drop --update to "
                f"rebuild with {wanted.name!r})"
            )
    result, chunks = _ingest(args)
    embedding = _Progress(f"embedding ({old.embedder.name})")
    try:
        index, summary = update_index(old, chunks, progress=embedding)
    finally:
        embedding.close()
    saved = index.save(out, source=args.path)  # refuses to write inside the ingested source
    _report(summary, result, str(saved), args.json)
    return 0


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
