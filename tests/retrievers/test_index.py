"""Tests for ragloop.retrievers.index."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.index import KnowledgeIndex, check_index_target, index_text
from ragloop.state import Chunk
from tests.retrievers._corpus import CHUNKS, doc_texts, headed_chunks, queries


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


class _Releasing(HashEmbedder):
    """A hash embedder that records when a build asks it to release its model."""

    def __init__(self) -> None:
        super().__init__(64)
        self.calls: list[str] = []

    def embed_sync(self, texts: Any, progress: Any = None) -> Any:
        self.calls.append(f"embed {len(texts)}")
        return super().embed_sync(texts, progress)

    def release(self) -> None:
        self.calls.append("release")


class TestBuildReleasesTheModel:
    def test_build_releases_once_after_embedding(self) -> None:
        """``build`` asks the embedder to free its bulk model once every chunk is embedded, before BM25 and faiss,
        and the index still answers."""
        e = _Releasing()
        index = KnowledgeIndex.build(CHUNKS, e)
        assert e.calls == [f"embed {len(CHUNKS)}", "release"]
        assert len(index.chunks) == len(CHUNKS)
        assert index.dense.vectors([CHUNKS[0].id]).any()

    def test_abuild_releases_once_after_every_batch(self) -> None:
        """``abuild`` embeds in batches of 256 and releases once, after the last one."""
        import anyio

        e = _Releasing()
        many = [Chunk(id=f"c{i}", text=f"text number {i}", source="s", title="t") for i in range(300)]
        anyio.run(lambda: KnowledgeIndex.abuild(many, e))
        assert e.calls == ["embed 256", "embed 44", "release"]

    def test_an_embedder_without_release_builds_as_before(self) -> None:
        """An embedder with no ``release`` (the hash embedder, an API embedder) builds unchanged."""
        assert len(KnowledgeIndex.build(CHUNKS, HashEmbedder(64)).chunks) == len(CHUNKS)


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


# --- saving never destroys what is not an index (issue 12) ------------------------------------------------


def tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (relative path → file bytes, None for a folder), links not followed."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = (
                os.readlink(path).encode() if os.path.islink(path) else Path(path).read_bytes()
            )
    return found


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A source folder with a subfolder."""
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.md").write_text("# A\n")
    (folder / "sub" / "b.md").write_text("# B\n")
    return folder


class TestSaveTarget:
    @pytest.mark.parametrize("which", ["docs", "docs/sub", "."])
    def test_source_its_children_and_parents_are_refused(self, docs: Path, which: str) -> None:
        """The source, a folder inside it and a folder above it are refused; nothing changes."""
        before = tree(docs.parent)
        target = docs.parent / which
        with pytest.raises(IndexError_, match=r"^refusing to write an index to .*(source|not a ragloop index)"):
            _build().save(target, source=docs)
        assert tree(docs.parent) == before

    def test_current_folder_and_above_are_refused(self, docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """'.' and '..' are refused even without a source, naming the fix."""
        monkeypatch.chdir(docs / "sub")
        before = tree(docs.parent)
        for target in (".", "..", "../.."):
            with pytest.raises(IndexError_, match="current"):
                _build().save(target)
        assert tree(docs.parent) == before

    def test_a_file_is_refused_and_left_in_place(self, tmp_path: Path) -> None:
        """A file at the target is refused (it used to be hidden away as .name.tmp-…)."""
        (tmp_path / "notes.txt").write_text("precious")
        with pytest.raises(IndexError_, match="it is a file, not a folder; pass a new folder name"):
            _build().save(tmp_path / "notes.txt")
        assert tree(tmp_path) == {"notes.txt": b"precious"}

    def test_a_folder_that_is_not_an_index_is_refused(self, tmp_path: Path) -> None:
        """A non-empty folder without an index manifest is refused and untouched."""
        (tmp_path / "photos").mkdir()
        (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
        with pytest.raises(IndexError_, match=r"not a ragloop index \(it holds 1 entries, e\.g\. 'cat\.jpg'\)"):
            _build().save(tmp_path / "photos")
        assert tree(tmp_path) == {"photos": None, "photos/cat.jpg": b"\xff\xd8"}

    def test_an_index_with_a_foreign_file_inside_is_refused(self, saved: Path) -> None:
        """An index folder that also holds something the manifest does not list is not replaced."""
        (saved / "my-notes.md").write_text("mine")
        with pytest.raises(IndexError_, match="not a ragloop index"):
            _build().save(saved)
        assert (saved / "my-notes.md").read_text() == "mine"

    def test_a_fake_manifest_is_not_a_marker(self, tmp_path: Path) -> None:
        """A manifest.json without the ragloop marker does not make a folder replaceable."""
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "manifest.json").write_text(json.dumps({"files": {}}))
        with pytest.raises(IndexError_, match="not a ragloop index"):
            _build().save(tmp_path / "x")

    def test_a_link_is_refused(self, saved: Path) -> None:
        """A symbolic link at the target is refused (the index it points at is untouched)."""
        (saved.parent / "link").symlink_to(saved)
        with pytest.raises(IndexError_, match="symbolic link"):
            _build().save(saved.parent / "link")

    def test_new_empty_and_existing_index_are_accepted(self, tmp_path: Path, saved: Path) -> None:
        """A new path, an empty folder and an existing index are written."""
        (tmp_path / "empty").mkdir()
        for target in (tmp_path / "new" / "kb", tmp_path / "empty", saved):
            assert len(KnowledgeIndex.load(_build().save(target)).chunks) == len(CHUNKS)

    def test_check_index_target_spots_a_relative_spelling(self, docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """'docs/sub/..' is still the source."""
        monkeypatch.chdir(docs.parent)
        with pytest.raises(IndexError_, match="the source being indexed"):
            check_index_target("docs/sub/..", source="docs")

    def test_write_failure_is_one_line(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """An OSError while creating the folder (read-only, disk full) is an IndexError_ with the reason."""

        def refuse(self: Path, *args: object, **kwargs: object) -> None:
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(Path, "mkdir", refuse)
        with pytest.raises(IndexError_, match=r"^cannot write the index to .*\(Read-only file system\)") as info:
            _build().save(tmp_path / "kb")
        assert "\n" not in str(info.value)

    def test_a_lookalike_of_a_leftover_is_kept(self, saved: Path) -> None:
        """A folder named like a dead save's leftover but holding other files is never removed."""
        import subprocess
        import sys

        dead = int(
            subprocess.run(
                [sys.executable, "-c", "print(__import__('os').getpid())"], capture_output=True, text=True
            ).stdout
        )
        lookalike = saved.parent / f".kb.tmp-{dead}-0123456789ab"
        lookalike.mkdir()
        (lookalike / "thesis.tex").write_text("years of work")
        _build().save(saved)
        assert (lookalike / "thesis.tex").read_text() == "years of work"


def rewrite(index: Path, rel: str, data: bytes) -> None:
    """Replace one index file and record its new checksum in the manifest (a consistent tamper)."""
    (index / rel).write_bytes(data)
    manifest = json.loads((index / "manifest.json").read_text())
    manifest["files"][rel] = hashlib.sha256(data).hexdigest()
    (index / "manifest.json").write_text(json.dumps(manifest))


class TestManifestShapes:
    @pytest.mark.parametrize(
        ("change", "message"),
        [
            (lambda m: [m], "a JSON list, not an object"),
            (lambda m: {**m, "format": "other"}, "'format' is not 'ragloop-index'"),
            (lambda m: {**m, "embedder": "hash"}, "'embedder' is not an object"),
            (lambda m: {**m, "embedder": {"name": "hash-64", "dim": "64"}}, "'embedder.dim' is not a positive integer"),
            (lambda m: {**m, "files": ["chunks.jsonl"]}, "'files' is not an object"),
            (lambda m: {**m, "chunks": None}, "'chunks' is not a count"),
            (lambda m: {**m, "files": {**m["files"], "../outside": "0" * 64}}, "not a plain path inside"),
            (lambda m: {**m, "files": {**m["files"], "/etc/passwd": "0" * 64}}, "not a plain path inside"),
            (lambda m: {**m, "files": {**m["files"], "chunks.jsonl": 7}}, "not a sha256 hex digest"),
            (lambda m: {k: v for k, v in m.items() if k != "embedder"}, "'embedder' is not an object"),
        ],
    )
    def test_wrong_shapes_are_clear_errors(self, saved: Path, change: Any, message: str) -> None:
        """Valid JSON with wrong contents is an IndexError_ naming the field (not AttributeError/KeyError)."""
        path = saved / "manifest.json"
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
        with pytest.raises(IndexError_, match=re.escape(message)):
            KnowledgeIndex.load(saved)

    def test_deeply_nested_manifest(self, saved: Path) -> None:
        """A manifest nested 100,000 deep is an IndexError_, not a RecursionError."""
        (saved / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
        with pytest.raises(IndexError_, match="unreadable"):
            KnowledgeIndex.load(saved)

    def test_link_inside_the_index_is_refused(self, saved: Path, tmp_path: Path) -> None:
        """chunks.jsonl replaced by a link to a file outside (checksum updated) is refused, not read."""
        outside = tmp_path / "outside.jsonl"
        outside.write_bytes((saved / "chunks.jsonl").read_bytes())
        rewrite(saved, "chunks.jsonl", outside.read_bytes())
        (saved / "chunks.jsonl").unlink()
        (saved / "chunks.jsonl").symlink_to(outside)
        with pytest.raises(IndexError_, match="is a symbolic link"):
            KnowledgeIndex.load(saved)

    @pytest.mark.parametrize(
        "line",
        [
            b"[1, 2]\n",
            b'{"text": "no id"}\n',
            b'{"id": 5, "text": "x"}\n',
            b'{"id": "x", "text": "t", "url": 5}\n',
            b'{"id": "x", "text": "t", "metadata": 3}\n',
            b"[" * 100_000 + b"\n",
        ],
    )
    def test_malformed_chunk_line(self, saved: Path, line: bytes) -> None:
        """A chunks.jsonl line of the wrong shape (checksum updated) is an IndexError_ naming the line."""
        rewrite(saved, "chunks.jsonl", line)
        with pytest.raises(IndexError_, match="line 1 is not a chunk"):
            KnowledgeIndex.load(saved)

    @pytest.mark.parametrize("rel", ["bm25/ragloop.json", "dense.json"])
    @pytest.mark.parametrize("data", [b"[]", b'{"k1": {}}', b"[" * 100_000])
    def test_malformed_bm25_or_dense_file(self, saved: Path, rel: str, data: bytes) -> None:
        """Any JSON in the BM25/dense metadata (checksum updated) is an IndexError_, never a traceback."""
        rewrite(saved, rel, data)
        with pytest.raises(IndexError_):
            KnowledgeIndex.load(saved)

    def test_a_docs_folder_is_not_suggested_as_out(self, tmp_path: Path) -> None:
        """Loading a folder of documents says it is not an index and never suggests --out <that folder>."""
        (tmp_path / "a.md").write_text("# A\n")
        with pytest.raises(IndexError_) as info:
            KnowledgeIndex.load(tmp_path)
        assert f"--out {tmp_path}`" not in str(info.value)
        assert "is not a ragloop index" in str(info.value) and "--out NEW_FOLDER" in str(info.value)


class _MeaningEmbedder:
    """An embedder with meaning (not ``hash-``): a unit vector from each text's digest, calls recorded."""

    name = "test-meaning"
    dim = 8

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed_sync(self, texts: Any, progress: Any = None) -> Any:
        import numpy as np

        self.calls.append(list(texts))
        rows = [
            np.random.default_rng(int.from_bytes(hashlib.blake2b(t.encode(), digest_size=4).digest())).normal(size=8)
            for t in texts
        ]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), 8)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    async def embed(self, texts: Any) -> Any:
        return self.embed_sync(texts)


def _headed(shared: str | None = None) -> list[Chunk]:
    """Two tenants' pages, 15 each, every page with its title and a section heading; ``shared``: one more page
    per tenant under that one title (a heading two documents share: not in the whole index's sample)."""
    chunks = headed_chunks("acme", 15) + headed_chunks("globex", 15)
    if shared:
        chunks += [
            Chunk(f"{t}-s", f"{t} shared", title=shared, doc_id=f"{t}/shared.md", metadata={"tenant": t})
            for t in ("acme", "globex")
        ]
    return chunks


class TestHeadingVectors:
    """A save keeps the meaning scale's heading vectors, so a loaded index measures it without embedding them."""

    def test_a_loaded_index_measures_the_same_scale_without_embedding(self, tmp_path: Path) -> None:
        index = KnowledgeIndex.build(_headed(), _MeaningEmbedder())
        scales = index.meaning_scales()
        assert scales is not None
        before = scales(None)
        index.save(tmp_path / "kb")
        fresh = _MeaningEmbedder()
        loaded = KnowledgeIndex.load(tmp_path / "kb", fresh)
        loaded_scales = loaded.meaning_scales()
        assert loaded_scales is not None
        assert before is not None and loaded_scales(None) == before
        assert fresh.calls == []

    def test_a_save_embeds_the_headings_once_even_if_no_turn_asked(self, tmp_path: Path) -> None:
        """An index saved straight after its build (``ragloop index``) keeps them too."""
        KnowledgeIndex.build(_headed(), _MeaningEmbedder()).save(tmp_path / "kb")
        assert "headings.npz" in json.loads((tmp_path / "kb" / "manifest.json").read_text())["files"]
        fresh = _MeaningEmbedder()
        loaded_scales = KnowledgeIndex.load(tmp_path / "kb", fresh).meaning_scales()
        assert loaded_scales is not None and loaded_scales(None) is not None and fresh.calls == []

    def test_a_scope_embeds_only_the_headings_the_save_did_not_keep(self, tmp_path: Path) -> None:
        """ "Billing" titles a page of each tenant: two documents share it, so the whole index's sample leaves it
        out, but within one tenant it is one page's: that tenant's scale embeds it, and only it."""
        KnowledgeIndex.build(_headed("Billing"), _MeaningEmbedder()).save(tmp_path / "kb")
        fresh = _MeaningEmbedder()
        loaded = KnowledgeIndex.load(tmp_path / "kb", fresh)
        scales = loaded.meaning_scales()
        assert scales is not None
        acme = [i for i, c in enumerate(loaded.chunks) if c.doc_id.startswith("acme/")]
        alone = KnowledgeIndex.build([loaded.chunks[i] for i in acme], _MeaningEmbedder()).meaning_scales()
        assert alone is not None and scales(acme) == alone(None)
        assert [t for call in fresh.calls for t in call] == ["Billing"]

    def test_an_index_saved_without_them_still_measures(self, tmp_path: Path) -> None:
        """An index from before heading vectors were kept (no file, not in the manifest) embeds them on use."""
        index = KnowledgeIndex.build(_headed(), _MeaningEmbedder())
        saved = index.save(tmp_path / "kb")
        (saved / "headings.npz").unlink()
        manifest = json.loads((saved / "manifest.json").read_text())
        del manifest["files"]["headings.npz"]
        (saved / "manifest.json").write_text(json.dumps(manifest))
        fresh = _MeaningEmbedder()
        loaded_scales = KnowledgeIndex.load(saved, fresh).meaning_scales()
        first = index.meaning_scales()
        assert loaded_scales is not None and first is not None and loaded_scales(None) == first(None)
        assert fresh.calls and max(len(c) for c in fresh.calls) <= 4

    def test_an_embedder_that_fails_on_headings_never_fails_the_save(self, tmp_path: Path) -> None:
        """The vectors are a cache: when embedding the headings raises, the index is saved without them (and
        loads, and says nothing on stdout), as an index from an older ragloop."""

        class Failing(_MeaningEmbedder):
            def embed_sync(self, texts: Any, progress: Any = None) -> Any:
                if len(texts) <= 4:
                    raise RuntimeError("the query session is gone")
                return super().embed_sync(texts, progress)

        saved = KnowledgeIndex.build(_headed(), Failing()).save(tmp_path / "kb")
        assert not (saved / "headings.npz").exists()
        assert "headings.npz" not in json.loads((saved / "manifest.json").read_text())["files"]
        assert len(KnowledgeIndex.load(saved, _MeaningEmbedder()).chunks) == 30

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.text(min_size=3, max_size=40), min_size=30, max_size=30, unique=True))
    def test_any_heading_text_round_trips_or_is_embedded_again(self, titles: list[str]) -> None:
        """Titles of any unicode (NUL, a trailing NUL numpy's text arrays drop, lone surrogates, control
        characters, only spaces): the save never fails, the load never fails, and the loaded scale is the one
        measured before the save."""
        import tempfile

        chunks = [
            Chunk(f"c{i}", f"text {i}", title=title, title_path=(title,), doc_id=f"{i}.md")
            for i, title in enumerate(titles)
        ]
        index = KnowledgeIndex.build(chunks, _MeaningEmbedder())
        scales = index.meaning_scales()
        assert scales is not None
        before = scales(None)
        with tempfile.TemporaryDirectory() as tmp:
            index.save(Path(tmp) / "kb")
            loaded = KnowledgeIndex.load(Path(tmp) / "kb", _MeaningEmbedder()).meaning_scales()
            assert loaded is not None and loaded(None) == before

    def test_a_hash_embedder_index_keeps_none(self, saved: Path) -> None:
        assert not (saved / "headings.npz").exists()

    @pytest.mark.parametrize(
        ("arrays", "message"),
        [
            (None, "unreadable"),
            ({"texts": ["a", "b"], "vectors": [[0.0] * 8]}, "one per text"),
            ({"texts": ["a"], "vectors": [[0.0] * 4]}, "8-wide"),
            ({"texts": ["a"], "vectors": [[float("nan")] * 8]}, "heading vectors"),
            ({"texts": [1.0], "vectors": [[0.0] * 8]}, "heading vectors"),
            ({"texts": ["a"], "vectors": [[0.0] * 8], "object": [{"x": 1}]}, None),
            ({"texts": [{"x": 1}], "vectors": [[0.0] * 8]}, "unreadable"),
            ({"vectors": [[0.0] * 8]}, "unreadable"),
        ],
    )
    def test_a_tampered_file_is_a_clear_error(self, tmp_path: Path, arrays: Any, message: str | None) -> None:
        """Heading vectors rewritten along with the manifest's checksum (any bytes, a pickle, other shapes) are
        refused with the rebuild command, never unpickled; an extra array beside the two is ignored."""
        import io

        import numpy as np

        saved = KnowledgeIndex.build(_headed(), _MeaningEmbedder()).save(tmp_path / "kb")
        if arrays is None:
            data = b"not a zip"
        else:
            buf = io.BytesIO()
            np.savez(
                buf,
                **{
                    k: np.array(v, dtype=object if isinstance(v[0], dict) else np.float32 if k == "vectors" else None)
                    for k, v in arrays.items()
                },
            )
            data = buf.getvalue()
        rewrite(saved, "headings.npz", data)
        if message is None:
            assert KnowledgeIndex.load(saved, _MeaningEmbedder()).meaning_scales() is not None
            return
        with pytest.raises(IndexError_, match=rf"(?s){message}.*ragloop index"):
            KnowledgeIndex.load(saved, _MeaningEmbedder())


class TestHeadingVectorsAcrossAnUpdate:
    def test_an_update_embeds_only_new_headings_and_its_save_drops_gone_ones(self, tmp_path: Path) -> None:
        """A sync that retitles one page embeds that page's new title only (the others' vectors are handed over
        like unchanged chunks'); the saved file holds the new title, not the old one."""
        import numpy as np

        from ragloop.retrievers.update import update_index

        KnowledgeIndex.build(_headed(), _MeaningEmbedder()).save(tmp_path / "kb")
        fresh = _MeaningEmbedder()
        old = KnowledgeIndex.load(tmp_path / "kb", fresh)
        chunks = [
            Chunk(c.id, c.text, title="acme renamed page", title_path=("acme renamed page", c.title_path[1]),
                  doc_id=c.doc_id, metadata=c.metadata)
            if c.id == "acme3" else c
            for c in old.chunks
        ]  # fmt: skip
        new, _ = update_index(old, chunks)
        new.save(tmp_path / "kb")
        headings = [t for call in fresh.calls for t in call if "\n" not in t]  # not the chunk embedded
        assert headings == ["acme renamed page"]
        with np.load(tmp_path / "kb" / "headings.npz") as data:
            kept = set(data["texts"].tolist())
        assert "acme renamed page" in kept and "acme page 3" not in kept and "acme section 3" in kept
