"""The package's public surface."""

from __future__ import annotations

import subprocess
import sys

import ragloop


def test_all_sorted_and_importable() -> None:
    """__all__ is sorted (constants first, as ruff sorts) and every name resolves."""
    assert ragloop.__all__ == sorted(ragloop.__all__, key=lambda n: (not n.isupper(), n))
    for name in ragloop.__all__:
        assert getattr(ragloop, name) is not None


def test_import_is_light() -> None:
    """`import ragloop` loads neither numpy, faiss, openai nor onnxruntime."""
    heavy = "('numpy', 'faiss', 'openai', 'onnxruntime', 'bm25s')"
    code = f"import sys, ragloop; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
