"""Cleaning of documents before they are chunked and embedded (moved to :mod:`ragloop.retrievers.ingest`).

The public names stay importable from here; the rules are described in
:mod:`ragloop.retrievers.ingest._clean`.
"""

from ragloop.retrievers.ingest._clean import (
    FORMATS,
    clean_text,
    clean_title,
    element_text,
    iter_segments,
    split_front_matter,
)

__all__ = ["FORMATS", "clean_text", "clean_title", "element_text", "iter_segments", "split_front_matter"]
