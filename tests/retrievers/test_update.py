"""In-place updates of the local index (`ragloop index --update`), metadata and filters on local retrievers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragloop.cli import main
from ragloop.errors import ConfigError, PruneRefused, UnknownFilterKey
from ragloop.retrievers.embed import HashEmbedder
from ragloop.retrievers.filters import check_filter_keys, matches, normalize_filters
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.metadata import front_matter, with_metadata
from ragloop.retrievers.scope import Scope
from ragloop.retrievers.update import (
    check_removals,
    content_hash,
    diff_documents,
    document_hash,
    group_documents,
    update_index,
)
from ragloop.state import Chunk


class CountingEmbedder(HashEmbedder):
    """The hash embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        super().__init__(64)
        self.texts: list[str] = []

    def embed_sync(self, texts, progress=None):  # type: ignore[no-untyped-def]
        self.texts.extend(texts)
        return super().embed_sync(texts, progress)


def _folder(root: Path) -> Path:
    root.mkdir()
    (root / "a.md").write_text(
        "---\ntitle: Alpha\nversion: 2\ntags: [x, y]\n---\n"
        "# Alpha\n\n## One\n\nAlpha one text.\n\n## Two\n\nAlpha two text.\n"
    )
    (root / "b.md").write_text("# Beta\n\nBeta body about shipping.\n")
    (root / "c.md").write_text("# Gamma\n\nGamma body about invoices.\n")
    return root


def _chunks(root: Path) -> list[Chunk]:
    from ragloop.retrievers.ingest import ingest_path

    return with_metadata(ingest_path(root).chunks, root, extra={"tenant": "acme"})


class TestUpdateIndex:
    def test_only_changed_chunks_are_embedded(self, tmp_path: Path) -> None:
        """Editing one section of one file embeds that chunk only; a deleted file is dropped; the rest is reused."""
        root = _folder(tmp_path / "docs")
        embedder = CountingEmbedder()
        old = KnowledgeIndex.build(_chunks(root), embedder)
        n_old = len(old.chunks)
        embedder.texts.clear()
        (root / "a.md").write_text((root / "a.md").read_text().replace("Alpha two text.", "Alpha two, edited."))
        (root / "c.md").unlink()
        new, summary = update_index(old, _chunks(root), prune=True)  # 1 of 3 documents removed: over 20%
        assert (summary.added, summary.changed, summary.removed, summary.unchanged) == (0, 1, 1, 1)
        assert summary.embedded == 1 and len(embedder.texts) == 1 and "edited" in embedder.texts[0]
        assert summary.reused == len(new.chunks) - 1 == n_old - 2
        fresh = KnowledgeIndex.build(_chunks(root), HashEmbedder(64))
        assert [c.id for c in new.chunks] == [c.id for c in fresh.chunks]
        assert (
            new.dense.vectors([c.id for c in new.chunks]) == fresh.dense.vectors([c.id for c in fresh.chunks])
        ).all()

    def test_cli_update_summary(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`ragloop index DIR --out IDX --update --json` reports added/changed/removed/reused and keeps metadata."""
        root = _folder(tmp_path / "docs")
        out = tmp_path / "idx"
        assert main(["index", str(root), "--out", str(out), "--embedder", "hash", "--meta", "tenant=acme"]) == 0
        capsys.readouterr()
        (root / "b.md").write_text("# Beta\n\nBeta body about shipping to Mars.\n")
        (root / "d.md").write_text("# Delta\n\nDelta is new.\n")
        argv = ["index", str(root), "--out", str(out), "--update", "--json", "--meta", "tenant=acme"]
        assert main(argv) == 0
        got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (got["added"], got["changed"], got["removed"], got["embedded"]) == (1, 1, 0, 2)
        assert got["reused"] == got["chunks"] - 2
        assert main(["search", str(out), "shipping", "--json", "--filter", "path=b.md"]) == 0
        hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert hits and all(h["doc_id"] == "b.md" and h["metadata"]["tenant"] == "acme" for h in hits)
        assert "Mars" in hits[0]["text"]


class TestDiff:
    def test_diff_documents(self) -> None:
        """Documents are added, changed, removed or unchanged by their hash."""
        a = Chunk(id="1", text="x", doc_id="a")
        b = Chunk(id="2", text="y", doc_id="b")
        b2 = Chunk(id="3", text="y!", doc_id="b")
        stored = {"a": document_hash([a]), "b": document_hash([b]), "gone": "h"}
        diff = diff_documents(group_documents([a, b2, Chunk(id="4", text="z", doc_id="new")]), stored)
        assert (diff.added, diff.changed, diff.removed, diff.unchanged) == (("new",), ("b",), ("gone",), ("a",))

    def test_content_hash_covers_the_embedded_title(self) -> None:
        """A new title changes what is embedded, so the content hash changes too; metadata does not."""
        c = Chunk(id="1", text="body", title="T")
        assert content_hash(c) != content_hash(Chunk(id="1", text="body", title="U"))
        assert content_hash(c) == content_hash(Chunk(id="1", text="body", title="T", metadata={"k": "v"}))


class TestRemovalLimit:
    @pytest.mark.parametrize(
        ("removed", "stored", "refused"),
        [(0, 0, False), (2, 10, False), (3, 10, True), (1, 4, True), (1, 5, False), (17, 17, True)],
    )
    def test_more_than_a_fifth_of_the_scope_is_refused(self, removed: int, stored: int, refused: bool) -> None:
        """Up to 20% of the scope's documents may go; more is refused naming counts, scope and --prune."""
        scope = Scope({"tenant": "acme"})
        if refused:
            with pytest.raises(PruneRefused, match=rf"{removed} of {stored} .*tenant=acme.*--prune"):
                check_removals(removed, stored, scope=scope, where="the index")
        else:
            check_removals(removed, stored, scope=scope, where="the index")
        check_removals(removed, stored, scope=scope, where="the index", prune=True)

    def test_update_index_refuses_before_building(self, tmp_path: Path) -> None:
        """update_index raises PruneRefused when 2 of 3 documents would go, and the old index is untouched."""
        root = _folder(tmp_path / "docs")
        old = KnowledgeIndex.build(_chunks(root), HashEmbedder(64))
        with pytest.raises(PruneRefused, match="2 of 3"):
            update_index(old, [c for c in _chunks(root) if c.doc_id == "a.md"])
        assert len({c.doc_id for c in old.chunks}) == 3


class TestFilterKeys:
    def test_unknown_keys_are_named_with_the_known_ones(self) -> None:
        """A misspelled key lists the known keys; two unknown keys are both named; known keys pass."""
        with pytest.raises(UnknownFilterKey, match=r"unknown filter key 'tenat'.*known keys: path, tenant$"):
            check_filter_keys({"tenat": ("acme",)}, {"tenant", "path"})
        with pytest.raises(UnknownFilterKey, match="filter keys 'a', 'b'"):
            check_filter_keys({"b": ("1",), "a": ("1",)}, {"tenant"})
        check_filter_keys({"tenant": ("nobody",)}, {"tenant"})

    def test_no_known_keys_or_no_index(self) -> None:
        """Chunks without metadata: every key is unknown ("none"); an empty index (None): nothing is checked."""
        with pytest.raises(UnknownFilterKey, match="known keys: none"):
            check_filter_keys({"tenant": ("acme",)}, frozenset())
        check_filter_keys({"tenant": ("acme",)}, None)
        check_filter_keys(None, frozenset())


class TestMetadataAndFilters:
    def test_front_matter_scalars(self) -> None:
        """Scalar front-matter lines become metadata; lists and missing blocks are left out."""
        assert front_matter("---\nTitle: 'A'\nversion: 2\ntags: [a]\n---\nbody") == {"title": "A", "version": "2"}
        assert front_matter("no front matter") == {}

    def test_normalize_and_match(self) -> None:
        """Equality and set membership; every key must match; bad filters say what is wrong."""
        f = normalize_filters({"tenant": "acme", "version": ["2", "1", "2"]})
        assert f == {"tenant": ("acme",), "version": ("1", "2")}
        assert matches(Chunk(id="1", text="x", metadata={"tenant": "acme", "version": "1"}), f)
        assert not matches(Chunk(id="1", text="x", metadata={"tenant": "acme"}), f)
        with pytest.raises(ConfigError, match="empty set"):
            normalize_filters({"tenant": []})

    @pytest.mark.anyio
    @pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
    async def test_local_filters_in_every_mode(self, tmp_path: Path, mode: str) -> None:
        """Every local retrieval mode returns only chunks matching the filter, best first."""
        root = _folder(tmp_path / "docs")
        index = KnowledgeIndex.build(_chunks(root), HashEmbedder(64))
        hits = await index.search("body text about", 10, mode, filters={"path": ("b.md", "c.md")})  # type: ignore[arg-type]
        assert hits and {h.chunk.doc_id for h in hits} <= {"b.md", "c.md"}
        unfiltered = await index.search("body text about", 10, mode)  # type: ignore[arg-type]
        assert [h.id for h in unfiltered if h.chunk.doc_id in ("b.md", "c.md")][: len(hits)] == [h.id for h in hits]
