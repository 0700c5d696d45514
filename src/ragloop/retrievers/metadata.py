"""Chunk metadata from front matter, the file path and the caller.

:func:`with_metadata` gives every chunk of an ingested folder the metadata that filters use:

- ``path``: the document id (its path under the folder);
- the scalar ``key: value`` lines of the document's YAML front matter (``version: 2.1``, ``tenant: acme``;
  lists and nested blocks are left out), keys lower-cased;
- the caller's pairs (``ragloop index --meta tenant=acme``), which win over the front matter.

The URL is the front matter's ``url:`` (or ``permalink:``), else ``url_base`` joined with the document path,
else none; it points at the chunk's section, ``page.html#anchor`` (the nearest heading's id; ``file.pdf#page=N``
for a PDF). The path keeps its real extension (``.html``, ``.pdf``, ``.txt``); only the markup sources that a
site generator publishes under another name (``.md``, ``.markdown``, ``.mdx``, ``.rst``) lose theirs, and a
Sphinx source copy (``_sources/library/argparse.rst.txt``) links its built page (``library/argparse.html``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from ragloop.retrievers.ingest._sphinx import built_page, is_sphinx_source
from ragloop.state import Chunk

__all__ = ["front_matter", "with_metadata"]

_BLOCK = re.compile(r"\A(?:\ufeff)?---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)
_PAIR = re.compile(r"^([A-Za-z_][\w.-]*)[ \t]*:[ \t]*(.*?)[ \t]*$")
_HEAD_BYTES = 16_384
#: Source suffixes a site generator publishes under another name (MkDocs: ``page.md`` → ``page/``).
_PUBLISHED_AS = re.compile(r"\.(?:md|markdown|mdx|rst)$", re.I)


def front_matter(text: str) -> dict[str, str]:
    """The scalar ``key: value`` pairs of a YAML front-matter block at the top of ``text`` (lists skipped)."""
    match = _BLOCK.match(text)
    if match is None:
        return {}
    out: dict[str, str] = {}
    for line in match.group(1).splitlines():
        pair = _PAIR.match(line)
        if pair is None:
            continue
        key, value = pair.group(1).lower(), pair.group(2)
        if not value or value.startswith(("[", "{", "|", ">", "#")):
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out


def _read_head(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(_HEAD_BYTES).decode("utf-8-sig", "replace")
    except OSError:
        return ""


def with_metadata(
    chunks: Iterable[Chunk],
    root: str | os.PathLike[str] | None = None,
    *,
    extra: Mapping[str, str] | None = None,
    url_base: str | None = None,
) -> list[Chunk]:
    """The chunks with metadata and URL filled in (see the module docstring).

    Args:
        chunks: Chunks from :func:`ragloop.retrievers.ingest.ingest_path`.
        root: The ingested folder, to read front matter from (``None``: no front matter, e.g. BEIR).
        extra: The caller's metadata, applied to every chunk.
        url_base: Base URL of the published documents.
    """
    base = Path(root) if root is not None else None
    cache: dict[str, dict[str, str]] = {}
    out = []
    for c in chunks:
        meta = cache.get(c.doc_id)
        if meta is None:
            meta = {}
            if base is not None and base.is_dir():
                file = base / c.doc_id
                if file.is_file():
                    meta = front_matter(_read_head(file))
            cache[c.doc_id] = meta
        merged = {**meta, "path": c.doc_id, **dict(extra or {})}
        url = merged.get("url") or merged.get("permalink") or c.url
        if not url and url_base:
            stem = built_page(c.doc_id) if is_sphinx_source(c.doc_id) else _PUBLISHED_AS.sub("", c.doc_id)
            url = url_base.rstrip("/") + "/" + stem.lstrip("/")
        anchor = c.meta().get("anchor", "")
        if url and anchor and "#" not in url:
            url = f"{url}#{anchor}"
        out.append(attrs.evolve(c, metadata={**c.meta(), **merged}, url=url))
    return out
