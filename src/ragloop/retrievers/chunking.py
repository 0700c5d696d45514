"""Splitting cleaned text into bounded, heading-aware pieces (moved to :mod:`ragloop.retrievers.ingest`).

The public names stay importable from here.
"""

from ragloop.retrievers.ingest._chunk import Section, check_limits, chunk_id, split_long, split_sections

__all__ = ["Section", "check_limits", "chunk_id", "split_long", "split_sections"]
