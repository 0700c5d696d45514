"""Tests for ragloop.retrievers.index."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex, index_text
from ragloop.state import Chunk
from tests.retrievers._corpus import CHUNKS, doc_texts, queries


def _build(chunks: tuple[Chunk, ...] = CHUNKS) -> KnowledgeIndex:
    return KnowledgeIndex.build(chunks, HashEmbedder(128))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return _build().save(tmp_path / "kb")


def _snapshot(hits: list) -> list:  # type: ignore[type-arg]
    return [(h.id, h.score, h.confidence, dict(h.ranks), dict(h.scores)) for h in hits]


class TestBuildAndSearch:
    @pytest.mark.anyio
    @pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
    async def test_modes_find_the_topic(self, mode: str) -> None:
        """Each mode ranks the on-topic chunk first."""
        hits = await _build().search("redis sorted set ZADD scores", 3, mode)  # type: ignore[arg-type]
        assert hits[0].id == "c3"

    def test_duplicate_ids_kept_once(self) -> None:
        """A chunk id given twice is indexed once."""
        assert len(_build(CHUNKS + CHUNKS[:2]).chunks) == len(CHUNKS)

    def test_unknown_mode(self) -> None:
        """An unknown mode is a ConfigError listing the valid ones."""
        with pytest.raises(ConfigError, match="hybrid"):
            _build().retriever("fuzzy")  # type: ignore[arg-type]

    def test_index_text_adds_title_once(self) -> None:
        """The indexed text leads with the title and heading path unless the text already starts with it."""
        c = Chunk(id="x", text="Body here.", title="Guide", title_path=("Guide", "Setup"))
        assert index_text(c) == "Guide\nSetup\nBody here."
        assert index_text(Chunk(id="y", text="Guide: body", title="Guide")) == "Guide: body"

    @pytest.mark.anyio
    async def test_abuild_matches_build(self) -> None:
        """The async build produces the same results as the sync one."""
        a = await KnowledgeIndex.abuild(CHUNKS, HashEmbedder(128))
        b = _build()
        q = "shipping europe business days"
        assert _snapshot(await a.search(q, 4)) == _snapshot(await b.search(q, 4))


class TestPersistence:
    @pytest.mark.anyio
    async def test_round_trip_identical(self, saved: Path) -> None:
        """A loaded index returns exactly the same hits as the one saved, in every mode."""
        built, loaded = _build(), KnowledgeIndex.load(saved)
        assert loaded.chunks == built.chunks
        for mode in ("bm25", "dense", "hybrid"):
            for q in ("password reset", "bone density vitamin", "cat mat"):
                assert _snapshot(await loaded.search(q, 5, mode)) == _snapshot(await built.search(q, 5, mode))  # type: ignore[arg-type]

    @settings(max_examples=15)
    @given(doc_texts, queries)
    def test_round_trip_property(self, texts: list[str], query: str) -> None:
        """For any small corpus and query, save → load gives identical hybrid results."""
        import anyio

        chunks = tuple(Chunk(id=f"k{i}", text=t, doc_id=f"d{i}") for i, t in enumerate(texts))
        built = KnowledgeIndex.build(chunks, HashEmbedder(32))
        with tempfile.TemporaryDirectory() as tmp:
            loaded = KnowledgeIndex.load(built.save(Path(tmp) / "kb"))
            a = anyio.run(built.search, query, 5)
            b = anyio.run(loaded.search, query, 5)
        assert _snapshot(a) == _snapshot(b)

    def test_manifest_describes_index(self, saved: Path) -> None:
        """The manifest records format version, embedder, chunk count and a checksum per file."""
        m = json.loads((saved / "manifest.json").read_text())
        assert m["format_version"] == 1 and m["embedder"] == {"name": "hash-128", "dim": 128}
        assert m["chunks"] == len(CHUNKS)
        assert {"chunks.jsonl", "dense.faiss", "dense.json", "bm25/ragloop.json"} <= set(m["files"])
        assert all(len(v) == 64 for v in m["files"].values())

    def test_tampered_file_is_refused(self, saved: Path) -> None:
        """Editing a file after saving makes load fail with a checksum error that says to rebuild."""
        path = saved / "chunks.jsonl"
        path.write_text(path.read_text().replace("cat", "dog"))
        with pytest.raises(IndexError_, match=r"checksum.*ragloop index"):
            KnowledgeIndex.load(saved)

    def test_missing_file_is_refused(self, saved: Path) -> None:
        """A deleted index file is named in the error."""
        (saved / "dense.faiss").unlink()
        with pytest.raises(IndexError_, match=r"missing dense\.faiss"):
            KnowledgeIndex.load(saved)

    def test_missing_directory(self, tmp_path: Path) -> None:
        """Loading a directory that does not exist says how to build one."""
        with pytest.raises(IndexError_, match=r"does not exist.*ragloop index"):
            KnowledgeIndex.load(tmp_path / "nope")

    def test_other_embedder_is_refused(self, saved: Path) -> None:
        """Loading with an embedder other than the one in the manifest is an IndexError_."""
        with pytest.raises(IndexError_, match=r"hash-128.*hash-64"):
            KnowledgeIndex.load(saved, HashEmbedder(64))

    def test_newer_format_version_is_refused(self, saved: Path) -> None:
        """An unknown format version asks for a rebuild."""
        path = saved / "manifest.json"
        m = json.loads(path.read_text())
        m["format_version"] = 99
        path.write_text(json.dumps(m))
        with pytest.raises(IndexError_, match="format version 99"):
            KnowledgeIndex.load(saved)

    def test_replace_leaves_no_debris(self, saved: Path) -> None:
        """Saving over an existing index replaces it and leaves no temporary folders."""
        small = KnowledgeIndex.build(CHUNKS[:3], HashEmbedder(128))
        small.save(saved)
        assert len(KnowledgeIndex.load(saved).chunks) == 3
        assert sorted(p.name for p in saved.parent.iterdir()) == ["kb"]

    def test_failed_save_keeps_old_index(self, saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A save that dies midway leaves the previous index loadable and no partial folder behind."""
        small = KnowledgeIndex.build(CHUNKS[:3], HashEmbedder(128))

        def boom(directory: Path) -> list[Path]:
            raise OSError("disk full")

        monkeypatch.setattr(small.dense, "save", boom)
        with pytest.raises(IndexError_, match=r"^cannot write the index to .*\(disk full\); nothing was replaced"):
            small.save(saved)
        assert len(KnowledgeIndex.load(saved).chunks) == len(CHUNKS)
        assert sorted(p.name for p in saved.parent.iterdir()) == ["kb"]

    def test_interrupted_swap_is_explained(self, saved: Path) -> None:
        """If a save died between its two renames, load points at the index left aside."""
        os.rename(saved, saved.parent / ".kb.old-123")
        with pytest.raises(IndexError_, match=r"\.kb\.old-123"):
            KnowledgeIndex.load(saved)


def test_save_clears_leftovers_of_dead_saves_only(saved: Path) -> None:
    """Temporary folders of killed saves are removed by the next save; a running save's are not."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    leftover = saved.parent / f".kb.tmp-{dead_pid}-abc123abc123"
    running = saved.parent / f".kb.tmp-{os.getpid()}-def456def456"
    leftover.mkdir()
    running.mkdir()
    _build().save(saved)
    assert not leftover.exists() and running.exists()
    assert KnowledgeIndex.load(saved).chunks
