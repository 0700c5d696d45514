"""The bundled sample's cached index (``ragloop.sample.sample_index``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragloop.retrievers.index import KnowledgeIndex
from ragloop.sample import sample_index


def _cached(root: Path) -> Path:
    [folder] = [p for p in root.iterdir() if p.name.startswith("sample-")]
    return folder


def _as_an_older_ragloop_saved_it(folder: Path) -> None:
    (folder / "headings.npz").unlink()
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["headings.npz"]
    (folder / "manifest.json").write_text(json.dumps(manifest))


class TestSampleCache:
    def test_the_cached_index_keeps_heading_vectors(self, sample_cache: Path) -> None:
        folder = _cached(sample_cache)
        assert "headings.npz" in json.loads((folder / "manifest.json").read_text())["files"]
        assert not sample_index(sample_cache).lacks_heading_vectors

    def test_a_cache_an_older_ragloop_wrote_gets_them_once(self, sample_cache: Path, tmp_path: Path) -> None:
        """An index cached before heading vectors were kept is loaded (not rebuilt) and saved again with them:
        the next start loads them instead of embedding the sample's headings again."""
        shutil.copytree(sample_cache, tmp_path / "cache")
        folder = _cached(tmp_path / "cache")
        _as_an_older_ragloop_saved_it(folder)
        chunks = (folder / "chunks.jsonl").read_bytes()
        first = sample_index(tmp_path / "cache")
        assert "headings.npz" in json.loads((folder / "manifest.json").read_text())["files"]
        assert (folder / "chunks.jsonl").read_bytes() == chunks  # the same index, not a rebuild
        again = sample_index(tmp_path / "cache")
        assert not again.lacks_heading_vectors
        scales, fresh = first.meaning_scales(), again.meaning_scales()
        assert scales is not None and fresh is not None and scales(None) == fresh(None)

    def test_an_older_cache_that_cannot_be_saved_again_still_answers(
        self, sample_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A cache that cannot be written again (a read-only home, a full disk) is loaded as it is: logged,
        never raised."""
        from ragloop.errors import IndexError_

        shutil.copytree(sample_cache, tmp_path / "cache")
        folder = _cached(tmp_path / "cache")
        _as_an_older_ragloop_saved_it(folder)

        def refuse(self: KnowledgeIndex, directory: object, **kwargs: object) -> Path:
            raise IndexError_(f"cannot write {directory}: No space left on device")

        monkeypatch.setattr(KnowledgeIndex, "save", refuse)
        index = sample_index(tmp_path / "cache")
        assert index.lacks_heading_vectors and len(index.chunks) > 0
        assert "headings.npz" not in json.loads((folder / "manifest.json").read_text())["files"]


def test_a_built_index_has_no_vectors_handed_to_it(sample_cache: Path) -> None:
    index = sample_index(sample_cache)
    assert KnowledgeIndex.build(index.chunks[:5], index.embedder).lacks_heading_vectors
