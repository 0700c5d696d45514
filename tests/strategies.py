"""Shared hypothesis strategies. Each layer keeps its own section."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["words"]

#: Lower-case ASCII words, a building block for queries and documents.
words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=10)

# --- runner -------------------------------------------------------------------------------------------

# --- retrieval ------------------------------------------------------------------------------------------

# --- ingestion ------------------------------------------------------------------------------------------

# --- judges ---------------------------------------------------------------------------------------------

# --- nodes ----------------------------------------------------------------------------------------------
