"""Tests for ingestion: cleaning, chunking, loaders and the whole pipeline."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import threading
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ragloop.errors import ConfigError, InputError
from ragloop.retrievers.embed import HashEmbedder, minilm_tokenizer
from ragloop.retrievers.index import KnowledgeIndex
from ragloop.retrievers.ingest import (
    Document,
    IngestResult,
    Skip,
    chunk_document,
    chunk_id,
    document_blocks,
    index_text,
    ingest_path,
    load_beir,
    load_folder,
    render,
    safe_name,
    skip_kinds,
)
from ragloop.retrievers.ingest._chunk import chunk_blocks
from tests.strategies import markdown_documents, markup_text

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"


def md(text: str, *, doc_id: str = "doc.md", title: str = "Doc") -> Document:
    return Document(id=doc_id, title=title, text=text, source=doc_id, fmt="markdown")


def in_order(needles: list[str], haystack: list[str]) -> bool:
    """Whether ``needles`` is a subsequence of ``haystack``."""
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


TOKENS = minilm_tokenizer()
assert TOKENS is not None  # the [embed] extra is part of [test]


def tokens(text: str) -> int:
    """MiniLM tokens of ``text``, [CLS] and [SEP] included (what the embedder sees)."""
    assert TOKENS is not None
    return len(TOKENS.token_spans([text])[0]) + TOKENS.special_tokens


class TestChunkDocument:
    def test_sections_carry_title_paths(self) -> None:
        """Each chunk carries its heading path, outermost first; a bare heading joins the next section."""
        doc = md("Intro words.\n\n# Guide\n\nAbout it.\n\n## Install\n\n### Linux\n\nRun apt.\n\n## Use\n\nCall it.")
        chunks = chunk_document(doc)
        assert [(c.title_path, c.text) for c in chunks] == [
            ((), "Intro words."),
            (("Guide",), "# Guide\n\nAbout it."),
            (("Guide", "Install", "Linux"), "## Install\n\n### Linux\n\nRun apt."),
            (("Guide", "Use"), "## Use\n\nCall it."),
        ]
        assert {c.doc_id for c in chunks} == {"doc.md"} and {c.title for c in chunks} == {"Doc"}

    def test_anchor_is_the_nearest_heading_id(self) -> None:
        """A chunk's anchor is its heading's explicit { #id }, else MkDocs' slug of the title."""
        chunks = chunk_document(md("# Big Title { #big }\n\ntext\n\n## Second Part\n\nmore"))
        assert [c.meta().get("anchor") for c in chunks] == ["big", "second-part"]

    def test_hash_lines_in_code_are_not_headings(self) -> None:
        """'# comment' inside a fenced block does not start a section."""
        chunks = chunk_document(md("# Top\n\n```\n# not a heading\n```\n\ntext"))
        assert [c.title_path for c in chunks] == [("Top",)]

    def test_long_section_is_cut_at_sentences_within_the_token_limit(self) -> None:
        """A long section splits into pieces of at most max_tokens (title and path included), at sentence ends."""
        sentences = [f"Sentence number {i} talks about topic {i % 7} at length." for i in range(60)]
        doc = md("# Long\n\n" + " ".join(sentences))
        chunks = chunk_document(doc, max_tokens=64, tokenizer=TOKENS)
        assert len(chunks) > 5
        assert all(tokens(index_text(c)) <= 64 for c in chunks)
        assert all(c.text.endswith(".") for c in chunks)
        assert " ".join(c.text.removeprefix("# Long\n\n") for c in chunks) == " ".join(sentences)
        assert all(c.title_path == ("Long",) for c in chunks)

    def test_code_is_cut_between_lines_and_fenced_again(self) -> None:
        """A long code block is cut between lines; every piece is a fenced block of whole lines."""
        code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(80))
        chunks = chunk_document(md(f"# Code\n\n```python\n{code}\n```"), max_tokens=96, tokenizer=TOKENS)
        assert len(chunks) > 2 and all(tokens(index_text(c)) <= 96 for c in chunks)
        lines = []
        for c in chunks:
            body = c.text.removeprefix("# Code\n\n")
            assert body.startswith("```python\n") and body.endswith("\n```")
            lines += body[len("```python\n") : -len("\n```")].split("\n")
        assert lines == code.split("\n")

    def test_tables_are_cut_between_rows(self) -> None:
        """A long table is cut between rows, never inside one."""
        rows = ["| key | value |", "| --- | --- |"] + [f"| k{i} | some value number {i} |" for i in range(60)]
        chunks = chunk_document(md("\n".join(rows)), max_tokens=80, tokenizer=TOKENS)
        assert len(chunks) > 2
        assert [line for c in chunks for line in c.text.split("\n")] == rows

    def test_lists_are_cut_between_items(self) -> None:
        """A long list (one block: its items wrap onto indented lines) is cut between its items, never inside one
        at a colon or a sentence end (the sample glossary's "MFA — Multi-Factor Authentication (MFA):" was once
        cut from its definition)."""
        items = [f"- **T{i}** — Term {i} (T{i}): what it means for the workspace. See\n  page {i}." for i in range(40)]
        chunks = chunk_document(md("# Glossary\n\n" + "\n".join(items)), max_tokens=80, tokenizer=TOKENS)
        bodies = [c.text.removeprefix("# Glossary\n\n") for c in chunks]
        assert len(chunks) > 3 and all(tokens(index_text(c)) <= 80 for c in chunks)
        assert all(b.startswith("- **T") and b.endswith(".") for b in bodies)
        assert "\n".join(bodies) == "\n".join(items).replace("\n  page", "\npage")

    def test_word_longer_than_the_limit_is_cut_at_tokens(self) -> None:
        """A single enormous word is the only thing cut mid-word, at a token boundary; nothing is lost."""
        word = "x" * 3000
        chunks = chunk_document(md("short " + word + " tail", title=""), max_tokens=64, tokenizer=TOKENS)
        assert all(tokens(index_text(c)) <= 64 for c in chunks)
        assert "".join("".join(c.text.split()) for c in chunks) == "short" + word + "tail"

    def test_ids_are_stable_content_hashes(self) -> None:
        """Ids depend only on the normalised chunk text, not on the document."""
        a = chunk_document(md("Same words here.", doc_id="a.md"))
        b = chunk_document(md("Same   words\nhere.", doc_id="b.md"))
        assert a[0].id == b[0].id == chunk_id("Same words here.")
        assert chunk_id("Other words.") != a[0].id

    def test_short_beir_document_is_one_chunk(self) -> None:
        """A BEIR document within the limit stays whole, keeps its title and _id."""
        doc = Document(id="d1", title="T", text="# A\n\nx\n\n# B\n\ny", source="c#d1", fmt="beir")
        (chunk,) = chunk_document(doc)
        assert (chunk.text, chunk.title, chunk.doc_id, chunk.title_path) == ("# A\n\nx\n\n# B\n\ny", "T", "d1", ())

    def test_bad_limits_rejected(self) -> None:
        """A token limit with no room for text is a ConfigError that names a good value."""
        with pytest.raises(ConfigError, match="max_tokens"):
            chunk_document(md("x"), max_tokens=4)

    @given(
        st.one_of(markdown_documents, markup_text),
        st.integers(24, 160),
        st.sampled_from(["markdown", "text", "html", "beir"]),
    )
    @example("Lorem " * 400, 24, "markdown")
    @example("[/caption]///---aababdgjaaaaaaaaaa", 24, "markdown")
    @example("```\n" + "a = 1\n" * 300 + "```", 30, "markdown")
    def test_never_loses_or_duplicates_text_and_never_exceeds_the_limit(
        self, text: str, max_tokens: int, fmt: str
    ) -> None:
        """Chunks are non-empty, within max_tokens in the embedder's own tokens (title and path included), and
        their pieces joined give the document's blocks back: nothing lost, nothing repeated."""
        doc = Document(id="d", title="t", text=text, source="s", fmt=fmt)
        blocks = document_blocks(doc)
        chunks = chunk_document(doc, max_tokens=max_tokens, tokenizer=TOKENS)
        assert bool(chunks) == any(b.kind != "heading" for b in blocks)
        for c in chunks:
            assert c.text.strip() and tokens(index_text(c)) <= max_tokens
        if chunks and not (fmt == "beir" and len(chunks) == 1):
            pieces = chunk_blocks(blocks, TOKENS, max_tokens=max_tokens, title="t")
            assert "".join("".join(p.split()) for piece in pieces for p in piece.parts) == "".join(
                "".join(b.text.split()) for b in blocks if b.text.strip()
            )
        if chunks and not any(b.kind == "code" for b in blocks):  # a cut code block is fenced again
            text_in = "".join("".join(render([b]).split()) for b in blocks if b.text.strip())
            assert "".join("".join(c.text.split()) for c in chunks) == text_in


class TestLoadFolder:
    def test_reads_supported_files_sorted_skipping_hidden(self, tmp_path: Path) -> None:
        """Supported files are read recursively in path order; hidden dirs and other suffixes are ignored."""
        (tmp_path / "b").mkdir()
        (tmp_path / ".git").mkdir()
        (tmp_path / "b" / "z.md").write_text("---\ntitle: Zed\n---\n# Heading\n\nbody", encoding="utf-8")
        (tmp_path / "a.txt").write_text("plain", encoding="utf-8")
        (tmp_path / "c.html").write_text("<title>Page</title><p>hi</p>", encoding="utf-8")
        (tmp_path / ".git" / "x.md").write_text("hidden", encoding="utf-8")
        (tmp_path / "image.png").write_bytes(b"\x89PNG")
        docs = list(load_folder(tmp_path))
        assert [(d.id, d.title, d.fmt) for d in docs if isinstance(d, Document)] == [
            ("a.txt", "a", "text"),
            ("b/z.md", "Zed", "markdown"),
            ("c.html", "Page", "html"),
        ]
        assert docs[1].text == "# Heading\n\nbody"  # type: ignore[union-attr]

    def test_non_utf8_is_decoded_and_binary_files_skipped_with_reason(self, tmp_path: Path) -> None:
        """A Latin-1 file is decoded (its encoding recorded), a stray NUL removed; binary junk and an unknown
        type come back as Skips naming the file and the problem."""
        (tmp_path / "latin.md").write_bytes("Un café crème pour la table du fond, s'il vous plaît.".encode("latin-1"))
        (tmp_path / "nul.txt").write_bytes(b"ab\x00cd")
        (tmp_path / "blob.txt").write_bytes(bytes(range(256)) * 8)
        (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n")
        items = {Path(i.path if isinstance(i, Skip) else i.id).name: i for i in load_folder(tmp_path)}
        latin, nul = items["latin.md"], items["nul.txt"]
        assert isinstance(latin, Document) and "café crème" in latin.text and latin.encoding == "cp1252"
        assert isinstance(nul, Document) and nul.text == "abcd"
        blob, image = items["blob.txt"], items["image.png"]
        assert isinstance(blob, Skip) and "binary" in blob.reason
        assert isinstance(image, Skip) and image.reason.startswith("unsupported type '.png'")


def write_corpus(path: Path, lines: list[str]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class TestLoadBeir:
    def test_gz_corpus_with_malformed_lines_reported_by_number(self, tmp_path: Path) -> None:
        """Good lines become documents; bad ones are reported with their line numbers."""
        write_corpus(
            tmp_path / "corpus.jsonl.gz",
            [
                json.dumps({"_id": "d1", "title": "One { #one }", "text": "First."}),
                "{not json",
                json.dumps({"_id": "d2", "text": 5}),
                json.dumps({"_id": 3, "text": "---\ntitle: Three\n---\nThird."}),
            ],
        )
        skips: list[tuple[str, str]] = []
        docs = list(load_beir(tmp_path, on_skip=lambda where, why: skips.append((where, why))))
        assert [(d.id, d.title, d.text, d.fmt) for d in docs] == [
            ("d1", "One", "First.", "beir"),
            ("3", "Three", "Third.", "beir"),
        ]
        assert [where.rsplit(":", 1)[1] for where, _ in skips] == ["2", "3"]
        assert "not valid JSON" in skips[0][1] and "'text' is int" in skips[1][1]

    def test_truncated_gz_reported_not_raised(self, tmp_path: Path) -> None:
        """A cut-off gzip file yields the lines before the cut and reports the rest."""
        write_corpus(tmp_path / "full.gz", [json.dumps({"_id": str(i), "text": f"doc {i} " * 50}) for i in range(200)])
        data = (tmp_path / "full.gz").read_bytes()
        (tmp_path / "corpus.jsonl.gz").write_bytes(data[: len(data) // 2])
        skips: list[tuple[str, str]] = []
        docs = list(load_beir(tmp_path / "corpus.jsonl.gz", on_skip=lambda w, r: skips.append((w, r))))
        assert 0 < len(docs) < 200 and len(skips) == 1 and "truncated" in skips[0][1]


class TestIngestPath:
    def test_folder_ingested_deduplicated_with_progress(self, tmp_path: Path) -> None:
        """Identical chunks are stored once; empty and non-UTF-8 files are skipped; progress counts every file
        (read in workers, so a skipped one is a step too)."""
        (tmp_path / "a.md").write_text("# A\n\nShared paragraph.\n\n# B\n\nOnly in a.", encoding="utf-8")
        (tmp_path / "b.md").write_text("# A\n\nShared paragraph.", encoding="utf-8")
        (tmp_path / "empty.html").write_text("<script>x()</script><img src='logo.png' alt='logo'>", encoding="utf-8")
        (tmp_path / "bad.txt").write_bytes(bytes(range(256)) * 4)
        calls: list[tuple[int, int]] = []
        result = ingest_path(tmp_path, progress=lambda done, total: calls.append((done, total)))
        assert isinstance(result, IngestResult)
        assert [c.text for c in result.chunks] == ["# A\n\nShared paragraph.", "# B\n\nOnly in a."]
        assert result.files == 2 and result.seconds >= 0
        assert [(Path(p).name, "binary" in r or "empty" in r) for p, r in result.skipped] == [
            ("bad.txt", True),
            ("empty.html", True),
        ]
        assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]

    def test_beir_file_and_folder_detected(self, tmp_path: Path) -> None:
        """A folder with corpus.jsonl and the file itself are both read as BEIR."""
        (tmp_path / "corpus.jsonl").write_text(
            json.dumps({"_id": "x", "title": "X", "text": "Hello there."}) + "\n", encoding="utf-8"
        )
        for target in (tmp_path, tmp_path / "corpus.jsonl"):
            (chunk,) = ingest_path(target).chunks
            assert (chunk.doc_id, chunk.title, chunk.text) == ("x", "X", "Hello there.")

    def test_missing_path_says_what_to_pass(self, tmp_path: Path) -> None:
        """A missing path raises InputError explaining what to pass."""
        with pytest.raises(InputError, match=r"no such file or folder.*corpus\.jsonl"):
            ingest_path(tmp_path / "nope")

    def test_folder_without_documents_rejected(self, tmp_path: Path) -> None:
        """A folder with nothing to read (only hidden or excluded files) is an InputError, not an empty index."""
        (tmp_path / ".hidden.md").write_text("# x\n\ny")
        (tmp_path / "notes.md").write_text("# x\n\ny")
        with pytest.raises(InputError, match=r"found no files.*1 excluded"):
            ingest_path(tmp_path, exclude=["*.md"])

    def test_include_and_exclude_globs(self, tmp_path: Path) -> None:
        """--include keeps only matching files, --exclude wins; both are counted, not reported as skips."""
        for name in ("docs/a.md", "docs/_sources/a.txt", "docs/deep/b.md", "top.txt"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(f"# {name}\n\ntext of {name}")
        result = ingest_path(tmp_path, include=["docs/**"], exclude=["_sources/**", "docs/_sources/**"])
        assert sorted({c.doc_id for c in result.chunks}) == ["docs/a.md", "docs/deep/b.md"]
        assert (result.excluded, result.skipped) == (2, ())
        result = ingest_path(tmp_path, exclude=["*.txt"])
        assert sorted({c.doc_id for c in result.chunks}) == ["docs/a.md", "docs/deep/b.md"]

    def test_unsupported_files_are_reported_not_silently_dropped(self, tmp_path: Path) -> None:
        """A file of a type ragloop cannot read is a skip of kind 'unsupported type', never silently ignored."""
        (tmp_path / "a.md").write_text("# A\n\ntext")
        (tmp_path / "diagram.svg").write_text("<svg/>")
        result = ingest_path(tmp_path)
        assert skip_kinds(result.skipped) == [("unsupported type", 1)]

    @pytest.mark.parametrize("name", ["fastapi-docs", "redis-docs"])
    def test_real_docs_corpus_is_clean(self, name: str) -> None:
        """On the shared docs corpora no shortcode, template or HTML residue is left outside code."""
        if not (DATA / name / "corpus.jsonl.gz").exists():
            pytest.skip(f"shared data {name} not present")
        result = ingest_path(DATA / name)
        assert result.files > 100 and len(result.chunks) > 1000
        residue = re.compile(r"\{\{|\{%|\{\*|<(?:script|style|img|div|span)\b|\]\(http|\{ #")
        for chunk in result.chunks:
            prose = re.sub(r"```.*?(```|\Z)|`[^`\n]*`", "", chunk.text, flags=re.S)
            assert not residue.search(prose), (chunk.doc_id, prose[:200])
        assert sum(1 for c in result.chunks if c.title_path) > len(result.chunks) // 2


# --- hostile files (issue 12) -----------------------------------------------------------------------------


def ingest_in_thread(path: Path, seconds: float = 20, **kwargs: object) -> IngestResult:
    """``ingest_path`` in a daemon thread, failing the test (instead of hanging it) if it takes too long."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = ingest_path(path, **kwargs)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"ingesting {path} took more than {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    result = box["result"]
    assert isinstance(result, IngestResult)
    return result


def reasons(result: IngestResult) -> dict[str, str]:
    """Skipped file name → reason."""
    return {Path(where).name: why for where, why in result.skipped}


class TestHostileFolder:
    def test_link_to_a_file_outside_is_refused_and_reported(self, tmp_path: Path) -> None:
        """A symlinked file pointing outside the folder is not read; the skip names the reason."""
        secret = tmp_path / "secret.txt"
        secret.write_text("root:x:0:0:SECRET-PASSWD-LINE\n")
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "good.md").write_text("# Good\n\nWebhooks retry five times.\n")
        (docs / "passwd.md").symlink_to(secret)
        result = ingest_path(docs)
        assert not any("SECRET-PASSWD-LINE" in c.text for c in result.chunks)
        assert reasons(result)["passwd.md"].startswith("symbolic link out of the folder")
        assert result.files == 1

    def test_link_inside_the_folder_is_read(self, tmp_path: Path) -> None:
        """A link to another file inside the folder stays allowed."""
        (tmp_path / "real.md").write_text("# Real\n\nExports take ten minutes.\n")
        (tmp_path / "alias.md").symlink_to(tmp_path / "real.md")
        result = ingest_path(tmp_path)
        assert not result.skipped and result.files == 2

    def test_linked_folder_is_not_followed(self, tmp_path: Path) -> None:
        """A linked folder (here: one outside) is reported, never walked."""
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "leak.md").write_text("# Leak\n\nLEAKED-CONTENT here.\n")
        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "a.md").write_text("# A\n\nAlpha text.\n")
        (docs / "linked").symlink_to(outside)
        result = ingest_path(docs)
        assert not any("LEAKED-CONTENT" in c.text for c in result.chunks)
        assert reasons(result)["linked"].startswith("linked folder, not followed")

    def test_fifo_is_refused_without_hanging(self, tmp_path: Path) -> None:
        """A FIFO named ``*.md`` is classified from os.stat and never opened (it used to hang indexing)."""
        os.mkfifo(tmp_path / "pipe.md")
        (tmp_path / "a.md").write_text("# A\n\nAlpha text.\n")
        result = ingest_in_thread(tmp_path, seconds=10)
        assert reasons(result)["pipe.md"] == "not a regular file (a FIFO); only regular files are read"

    def test_link_to_dev_zero_is_refused(self, tmp_path: Path) -> None:
        """A link to /dev/zero is refused (it used to end in MemoryError)."""
        (tmp_path / "zero.md").symlink_to("/dev/zero")
        (tmp_path / "a.md").write_text("# A\n\nAlpha text.\n")
        result = ingest_in_thread(tmp_path, seconds=10)
        assert "zero.md" in reasons(result) and result.files == 1

    def test_device_file_is_refused(self, tmp_path: Path) -> None:
        """A character device inside the folder is refused as 'not a regular file (a device)'."""
        try:
            os.mknod(tmp_path / "null.md", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except (PermissionError, OSError):
            pytest.skip("cannot create device nodes here")
        (tmp_path / "a.md").write_text("# A\n\nAlpha text.\n")
        result = ingest_in_thread(tmp_path, seconds=10)
        assert reasons(result)["null.md"].startswith("not a regular file (a device)")

    def test_file_over_the_byte_cap_is_skipped(self, tmp_path: Path) -> None:
        """A file larger than max_file_bytes is skipped with its size, before it is read."""
        (tmp_path / "big.md").write_text("word " * 5000)
        (tmp_path / "a.md").write_text("# A\n\nAlpha text.\n")
        result = ingest_path(tmp_path, max_file_bytes=10_000)
        assert reasons(result)["big.md"].startswith("too large (25,000 bytes, over 10,000)")

    def test_non_utf8_file_name_gets_a_safe_id_and_saves(self, tmp_path: Path) -> None:
        """A file name that is not UTF-8 gets an escaped id, and the index saves (it used to crash at save)."""
        os.close(os.open(os.fsencode(tmp_path) + b"/caf\xe9.md", os.O_CREAT | os.O_WRONLY, 0o644))
        with open(os.fsencode(tmp_path) + b"/caf\xe9.md", "wb") as fh:
            fh.write(b"# Cafe\n\nEspresso menu and opening hours.\n")
        result = ingest_path(tmp_path)
        (chunk,) = result.chunks
        assert chunk.doc_id == "caf\\xe9.md" and chunk.source == "caf\\xe9.md"
        index = KnowledgeIndex.build(result.chunks, HashEmbedder(64))
        assert KnowledgeIndex.load(index.save(tmp_path.parent / f"{tmp_path.name}-kb")).chunks[0].doc_id == chunk.doc_id

    def test_control_characters_in_names_are_escaped(self) -> None:
        """Names are safe to print: escapes, bidi overrides and undecodable bytes become visible escapes."""
        assert safe_name("a\x1b]52;c;x\x07.md") == "a\\x1b]52;c;x\\x07.md"
        assert safe_name("evil\u202etxt.md") == "evil\\u202etxt.md"
        assert safe_name("caf\udce9.md") == "caf\\xe9.md"
        assert safe_name("lone\ud800") == "lone\\ud800"
        assert safe_name("plain/ünïcode.md") == "plain/ünïcode.md"

    def test_skips_are_counted_by_kind(self) -> None:
        """skip_kinds groups reasons by kind (unreadable, outside the folder, …), most common first."""
        skipped = [
            ("a", "not a regular file (a FIFO); only regular files are read"),
            ("b", "not a regular file (a device); only regular files are read"),
            ("c", "symbolic link out of the folder (to '/etc/passwd'); copy the file"),
        ]
        assert skip_kinds(skipped) == [("unreadable", 2), ("outside the folder", 1)]


def write_gz_bomb(path: Path, line_bytes: int, after: str) -> None:
    """A corpus.jsonl.gz whose first line inflates to ``line_bytes`` bytes, then one good line."""
    with gzip.open(path, "wb", compresslevel=1) as fh:
        fh.write(b'{"_id": "bomb", "text": "')
        block = b"A" * (1 << 20)
        for _ in range(line_bytes >> 20):
            fh.write(block)
        fh.write(b'"}\n')
        fh.write((after + "\n").encode())


class TestHostileCorpus:
    def test_gzip_bomb_line_is_skipped_in_bounded_memory(self, tmp_path: Path) -> None:
        """A line inflating past max_line_bytes is read in pieces and skipped; the next line is kept."""
        write_gz_bomb(tmp_path / "corpus.jsonl.gz", 96 << 20, json.dumps({"_id": "ok", "text": "Refunds take 5 days."}))
        tracemalloc.start()
        try:
            result = ingest_path(tmp_path, max_line_bytes=1 << 20)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [c.doc_id for c in result.chunks] == ["ok"]
        assert any("line too long" in why for _, why in result.skipped)
        assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MiB while reading a 96 MiB line"

    def test_deeply_nested_line_is_reported(self, tmp_path: Path) -> None:
        """A line of 100,000 nested arrays is a reported skip, not a RecursionError."""
        nested = "[" * 100_000 + "]" * 100_000
        write_corpus(tmp_path / "corpus.jsonl.gz", [nested, json.dumps({"_id": "1", "text": "x y"})])
        result = ingest_path(tmp_path)
        assert any("nested too deeply" in why for _, why in result.skipped)
        assert [c.doc_id for c in result.chunks] == ["1"]

    def test_undecodable_ids_are_escaped(self, tmp_path: Path) -> None:
        """A BEIR _id holding a lone surrogate gets an escaped, storable id."""
        write_corpus(tmp_path / "corpus.jsonl.gz", ['{"_id": "d\\ud800", "text": "Invoices are monthly."}'])
        (chunk,) = ingest_path(tmp_path).chunks
        assert chunk.doc_id == "d\\ud800"
        chunk.doc_id.encode("utf-8")

    def test_corpus_link_out_of_the_folder_is_refused(self, tmp_path: Path) -> None:
        """corpus.jsonl inside a folder that links elsewhere is an InputError naming the link."""
        elsewhere = tmp_path / "elsewhere.jsonl"
        write_corpus(elsewhere, [json.dumps({"_id": "1", "text": "x"})])
        (tmp_path / "beir").mkdir()
        (tmp_path / "beir" / "corpus.jsonl").symlink_to(elsewhere)
        with pytest.raises(InputError, match="link out of the folder"):
            ingest_path(tmp_path / "beir")


class TestCitationUrls:
    def test_url_points_at_the_section_and_keeps_the_real_extension(self, tmp_path: Path) -> None:
        """With --url-base, a chunk links page.html#anchor (extension kept); a markdown source loses .md only."""
        from ragloop.retrievers.metadata import with_metadata

        (tmp_path / "guide").mkdir()
        (tmp_path / "guide" / "errors.html").write_text(
            '<html><body><main><h1 id="errors">Errors</h1><p>One.</p>'
            '<section id="syntax"><h2>Syntax</h2><p>Two.</p></section></main></body></html>'
        )
        (tmp_path / "intro.md").write_text("# Intro { #start }\n\nHello.")
        chunks = with_metadata(ingest_path(tmp_path).chunks, tmp_path, url_base="https://docs.example/v1/")
        assert sorted(c.url for c in chunks) == [
            "https://docs.example/v1/guide/errors.html#errors",
            "https://docs.example/v1/guide/errors.html#syntax",
            "https://docs.example/v1/intro#start",
        ]

    def test_pdf_chunks_link_their_page(self, tmp_path: Path) -> None:
        """A PDF chunk's URL is file.pdf#page=N and its metadata carries the page."""
        from ragloop.retrievers.metadata import with_metadata
        from tests.retrievers._docs import write_pdf

        write_pdf(tmp_path / "manual.pdf", ["First page text.", "Second page text."])
        chunks = with_metadata(ingest_path(tmp_path).chunks, tmp_path, url_base="https://x.test")
        assert [(c.url, c.meta()["page"]) for c in chunks] == [
            ("https://x.test/manual.pdf#page=1", "1"),
            ("https://x.test/manual.pdf#page=2", "2"),
        ]
