"""Cutting documents into chunks (moved to :mod:`ragloop.retrievers.ingest`).

The public names stay importable from here.
"""

from ragloop.retrievers.ingest._chunk import Piece, check_limits, chunk_blocks, chunk_id, index_text

__all__ = ["Piece", "check_limits", "chunk_blocks", "chunk_id", "index_text"]
