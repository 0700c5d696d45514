"""A knowledge index on disk: chunks + BM25 + dense vectors, with a checked manifest.

Layout of an index directory::

    manifest.json     format version, embedder name and dim, chunk count, settings, sha256 of every file
    chunks.jsonl      one chunk per line (JSON, no pickle), with its scope when it has one
    bm25/             bm25s's .npy arrays and JSON, plus ragloop.json (tokenizer settings, chunk ids)
    dense.faiss       the faiss index (faiss's own format)
    dense.json        faiss id → chunk id map and index settings
    headings.npz      the meaning scale's heading vectors (texts and float32 rows, no pickle); only with an
                      embedder that has meaning (MiniLM), optional (an index without it embeds them on use)

:meth:`KnowledgeIndex.save` is atomic: it writes a temporary sibling directory, fsyncs it, and renames it
into place (an existing index is renamed aside first and removed after), so a killed build never leaves a
half-written index under the target name. It only ever replaces a folder that already holds a ragloop index
(its manifest carries :data:`INDEX_MARKER` and the folder holds nothing the manifest does not list) or an empty
one; :func:`check_index_target` refuses a file, the current folder or one above it, the ingested source or a
folder above or inside it, and any other non-empty folder. :meth:`KnowledgeIndex.load` validates the
manifest's shape, refuses links and special files inside the index, verifies every checksum and refuses an
index built with a different embedder.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
import uuid
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ragloop._log import get_logger
from ragloop.errors import ConfigError, IndexError_
from ragloop.retrievers.base import Embedder, Retriever
from ragloop.retrievers.bm25 import BM25Index, BM25Retriever
from ragloop.retrievers.dense import DenseIndex, DenseRetriever
from ragloop.retrievers.embed import Progress, embed_batched, embedder_named, file_sha256
from ragloop.retrievers.filters import Filters, metadata_keys
from ragloop.retrievers.hybrid import HybridRetriever
from ragloop.retrievers.ingest._chunk import index_text
from ragloop.retrievers.meaning import MeaningScales, meaning_embed
from ragloop.retrievers.scope import Scope
from ragloop.state import Chunk, Hit

__all__ = [
    "FORMAT_VERSION",
    "INDEX_MARKER",
    "KnowledgeIndex",
    "Mode",
    "check_index_target",
    "glob_escape",
    "index_scopes",
    "index_text",
]

#: Version of the on-disk layout; a different version at load time asks for a rebuild.
FORMAT_VERSION = 1
#: Retrieval modes of :meth:`KnowledgeIndex.retriever`.
Mode = Literal["bm25", "dense", "hybrid"]
_MODES = ("bm25", "dense", "hybrid")
_MANIFEST = "manifest.json"
_CHUNKS = "chunks.jsonl"
#: The heading vectors of the index's meaning scale (:class:`~ragloop.retrievers.meaning.MeaningScales`), kept so
#: a loaded index measures its scale without embedding its headings again. Optional: an index saved without it
#: (an embedder with no meaning, or an older ragloop) embeds them on first use.
_HEADINGS = "headings.npz"
#: The ``"format"`` value of every manifest :meth:`KnowledgeIndex.save` writes: what marks a ragloop index.
INDEX_MARKER = "ragloop-index"
#: A manifest lists a handful of files; anything larger is not one of ours.
_MAX_MANIFEST_BYTES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>[0-9]+)-[0-9a-f]{12}")
#: Names a save writes at the top of an index folder (what a leftover temporary folder may hold).
_INDEX_ENTRIES = frozenset({_MANIFEST, _CHUNKS, "bm25", "dense.faiss", "dense.json", _HEADINGS})


_NO_SCOPE = Scope()
log = get_logger("ragloop.retrievers.index")


def _remove_dead_leftovers(parent: Path, name: str) -> None:
    """Remove ``.NAME.tmp-PID-…`` / ``.NAME.old-PID-…`` folders left by saves whose process has died.

    A killed save leaves its temporary folder behind; a live process's folder (a save running right now) is
    never touched, and neither is anything that merely resembles one: the name must be exactly ours, the
    entry a real folder (not a link) holding nothing but the files a save writes.
    """
    for leftover in parent.glob(f".{glob_escape(name)}.*-*-*"):
        match = _LEFTOVER.fullmatch(leftover.name)
        if match is None or match["name"] != name or _alive(int(match["pid"])):
            continue
        if leftover.is_symlink() or not leftover.is_dir():
            continue
        try:
            entries = {e.name for e in os.scandir(leftover)}
        except OSError:
            continue
        if entries <= _INDEX_ENTRIES:
            shutil.rmtree(leftover, ignore_errors=True)


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped (``[`` ``*`` ``?``), for :meth:`Path.glob`."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


def _read_manifest(path: Path) -> Any:
    """The parsed manifest at ``path``; raises OSError/ValueError/RecursionError when it cannot be one."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{_MANIFEST} is not a regular file (a link, folder or device)")
    if info.st_size > _MAX_MANIFEST_BYTES:
        raise ValueError(f"{_MANIFEST} is {info.st_size} bytes, more than a manifest ever holds")
    with path.open("rb") as fh:
        return json.loads(fh.read(_MAX_MANIFEST_BYTES + 1).decode("utf-8"))


def _is_index(folder: Path) -> bool:
    """True when ``folder`` holds a ragloop index and nothing else: a manifest with :data:`INDEX_MARKER`, and
    every top-level entry either the manifest or the first part of a file the manifest lists."""
    try:
        manifest = _read_manifest(folder / _MANIFEST)
        entries = {e.name for e in os.scandir(folder)}
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format") != INDEX_MARKER:
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
        return False
    listed = {_MANIFEST} | {k.split("/", 1)[0] for k in files}
    return entries <= listed


def check_index_target(directory: str | os.PathLike[str], *, source: str | os.PathLike[str] | None = None) -> Path:
    """Check that an index may be saved at ``directory`` without destroying anything; return its absolute path.

    Saving replaces what is at the target, so only three things are accepted: a path that does not exist yet,
    an empty folder, or a folder that already holds a ragloop index and nothing else. Refused, each with a
    one-line :class:`~ragloop.errors.IndexError_` naming the fix: a file, a link, the current folder or any
    folder above it, the ingested ``source`` itself or any folder above or inside it, and any other folder
    with something in it.

    Args:
        directory: Where the index would be saved.
        source: The folder or file the index is built from, when known.

    Raises:
        IndexError_: the target is refused.
    """
    given = os.fspath(directory)
    target = Path(os.path.abspath(given))
    fix = "pass a new folder name (or an existing ragloop index) instead"
    if target.is_symlink():
        raise IndexError_(f"refusing to write an index to {given!r}: it is a symbolic link; {fix}")
    if target.exists() and not target.is_dir():
        raise IndexError_(f"refusing to write an index to {given!r}: it is a file, not a folder; {fix}")
    real = target.resolve()
    here = Path.cwd().resolve()
    if real == here or real in here.parents:
        where = "the current folder" if real == here else "a folder above the current one"
        raise IndexError_(f"refusing to write an index to {given!r}: it is {where}; {fix}, e.g. --out ./index")
    if source is not None:
        src = Path(os.path.abspath(os.fspath(source))).resolve()
        relation = (
            "the source being indexed"
            if real == src
            else "a folder above the source"
            if real in src.parents
            else "inside the source folder"
            if src in real.parents
            else None
        )
        if relation is not None:
            raise IndexError_(
                f"refusing to write an index to {given!r}: it is {relation} ({os.fspath(source)!r}); "
                f"{fix}, outside the source"
            )
    if target.is_dir():
        try:
            entries = sorted(e.name for e in os.scandir(target))
        except OSError as exc:
            raise IndexError_(f"cannot use {given!r} for an index ({exc.strerror or exc}); {fix}") from exc
        if entries and not _is_index(target):
            raise IndexError_(
                f"refusing to replace {given!r}: it is a folder that is not a ragloop index (it holds "
                f"{len(entries)} entries, e.g. {entries[0]!r}); {fix}"
            )
    return target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True


def _write_error(target: Path, exc: OSError) -> IndexError_:
    reason = exc.strerror or str(exc)
    return IndexError_(
        f"cannot write the index to {os.fspath(target)!r} ({reason}); nothing was replaced: free disk space or "
        "pass a writable folder"
    )


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # pragma: no cover - libc without renameat2 (glibc < 2.28, musl)
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _chunk_to_json(chunk: Chunk, scope: Scope) -> str:
    return json.dumps(
        {
            "id": chunk.id,
            "text": chunk.text,
            "source": chunk.source,
            "title": chunk.title,
            "title_path": list(chunk.title_path),
            "doc_id": chunk.doc_id,
            **({"url": chunk.url} if chunk.url else {}),
            **({"metadata": dict(chunk.metadata)} if chunk.metadata else {}),
            **({"scope": dict(scope.pairs)} if scope.pairs else {}),
        },
        ensure_ascii=False,
    )


def _chunk_from_json(line: str) -> tuple[Chunk, Scope]:
    d = json.loads(line)
    scope = d.get("scope") or {}
    if not isinstance(scope, dict) or not all(isinstance(v, str) for v in scope.values()):
        raise ValueError("'scope' is not an object of strings")
    return Chunk(
        id=d["id"],
        text=d["text"],
        source=d.get("source", ""),
        title=d.get("title", ""),
        title_path=tuple(d.get("title_path", ())),
        doc_id=d.get("doc_id", ""),
        url=d.get("url", ""),
        metadata=d.get("metadata", {}),
    ), Scope(scope)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "…"


def _manifest_fields(manifest: Any, path: Path, rebuild: str) -> tuple[Any, str, int, dict[str, str], int]:
    """``(format_version, embedder name, dim, files, chunk count)`` from a parsed manifest, every shape checked."""

    def bad(what: str) -> IndexError_:
        return IndexError_(f"manifest {path} is malformed: {what}; {rebuild}")

    if not isinstance(manifest, dict):
        raise bad(f"a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != INDEX_MARKER:
        raise bad(f"'format' is not {INDEX_MARKER!r} (not written by ragloop)")
    embedder = manifest.get("embedder")
    if not isinstance(embedder, dict):
        raise bad("'embedder' is not an object with 'name' and 'dim'")
    name, dim = embedder.get("name"), embedder.get("dim")
    if not isinstance(name, str) or not name:
        raise bad("'embedder.name' is not a non-empty string")
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 < dim <= 65536:
        raise bad("'embedder.dim' is not a positive integer")
    count = manifest.get("chunks")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise bad("'chunks' is not a count")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise bad("'files' is not an object of path: sha256")
    for rel, digest in files.items():
        parts = rel.split("/")
        if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts) or rel == _MANIFEST:
            raise bad(f"file {rel!r} is not a plain path inside the index folder")
        if not isinstance(digest, str) or _SHA256.fullmatch(digest) is None:
            raise bad(f"the checksum of {rel!r} is not a sha256 hex digest")
    version = manifest.get("format_version")
    if isinstance(version, (dict, list)):
        version = type(version).__name__
    return version, name, dim, files, count


def _check_index_files(root: Path, files: dict[str, str], *, verify: bool, rebuild: str) -> None:
    """Check the files a manifest lists: the required ones are there, every one matches its checksum (with
    ``verify``), and there are no links or special files anywhere inside the index (so nothing outside it is
    ever read)."""
    for required in (_CHUNKS, "dense.faiss", "dense.json", "bm25/ragloop.json"):
        if required not in files:
            raise IndexError_(f"index {root} manifest does not list {required}; {rebuild}")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            try:
                mode = os.lstat(path).st_mode
            except OSError as exc:
                raise IndexError_(f"cannot read {path} ({exc.strerror or exc}); {rebuild}") from exc
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise IndexError_(f"index file {path} is {kind}; an index holds only its own files; {rebuild}")
    for rel, want in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise IndexError_(f"index {root} is missing {rel}; {rebuild}")
        if verify and file_sha256(path) != want:
            raise IndexError_(f"index file {path} does not match its checksum (corrupt or edited); {rebuild}")


def _read_chunks(path: Path, rebuild: str) -> tuple[list[Chunk], dict[str, Scope]]:
    """Every chunk in ``chunks.jsonl``, each line's shape checked (strings where strings belong), and the
    scopes of the scoped ones (chunk id → scope)."""
    chunks: list[Chunk] = []
    scopes: dict[str, Scope] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                chunk, scope = _chunk_from_json(line)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError, ConfigError) as exc:
                raise IndexError_(f"{path} line {lineno} is not a chunk ({_short(exc)}); {rebuild}") from exc
            texts = (chunk.id, chunk.text, chunk.source, chunk.title, chunk.doc_id, chunk.url, *chunk.title_path)
            if not all(isinstance(t, str) for t in texts) or not chunk.id:
                raise IndexError_(f"{path} line {lineno} is not a chunk (a field has the wrong type); {rebuild}")
            chunks.append(chunk)
            if scope.pairs:
                scopes[chunk.id] = scope
    return chunks, scopes


def index_scopes(directory: str | os.PathLike[str]) -> dict[Scope, int]:
    """Documents per scope in the index at ``directory`` (``{}`` when it holds no readable index).

    Reads only the manifest and ``chunks.jsonl`` (no checksums, no vectors): what a rebuild checks before it
    would replace an index that holds other scopes' documents.
    """
    root = Path(directory)
    if not _is_index(root):
        return {}
    try:
        chunks, scopes = _read_chunks(root / _CHUNKS, "")
    except (OSError, IndexError_):
        return {}
    docs: dict[Scope, set[str]] = {}
    for c in chunks:
        docs.setdefault(scopes.get(c.id, Scope()), set()).add(c.doc_id)
    return {scope: len(ids) for scope, ids in docs.items()}


def _embedder_for(name: str, dim: int) -> Embedder:
    embedder = embedder_named(name, dim)
    if embedder is None:
        raise IndexError_(
            f"the index was built with embedder {name!r} ({dim}-dim), which ragloop cannot rebuild by name; "
            "pass the same embedder to KnowledgeIndex.load(dir, embedder=...)"
        )
    return embedder


def _release(embedder: Embedder) -> None:
    """Let an embedder that can (``MiniLMEmbedder.release``) free its bulk model once a build's chunks are
    embedded, before BM25 and faiss are built: the index only embeds queries from then on."""
    release = getattr(embedder, "release", None)
    if callable(release):
        release()


def _read_headings(path: Path, dim: int, rebuild: str) -> dict[str, npt.NDArray[np.float32]]:
    """The heading vectors a save kept (:data:`_HEADINGS`): texts and ``dim``-wide finite float32 rows, one each."""
    try:
        with np.load(path, allow_pickle=False) as data:
            texts, vectors = data["texts"], data["vectors"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise IndexError_(f"index file {path} is unreadable ({_short(exc)}); {rebuild}") from exc
    if (
        texts.ndim != 1
        or texts.dtype.kind != "U"
        or vectors.dtype != np.float32
        or vectors.shape != (len(texts), dim)
        or not np.isfinite(vectors).all()
    ):
        raise IndexError_(
            f"index file {path} does not hold {dim}-wide heading vectors, one per text "
            f"(texts {texts.dtype} {texts.shape}, vectors {vectors.dtype} {vectors.shape}); {rebuild}"
        )
    return dict(zip(texts.tolist(), vectors, strict=True))


class KnowledgeIndex:
    """Chunks with a BM25 index and a dense index over them, searchable in three modes.

    Build with :meth:`build` (or :meth:`abuild` inside an event loop), persist with :meth:`save`, reopen
    with :meth:`load`.

    Args:
        chunks: The chunks, in index order (ids unique).
        bm25: BM25 over :func:`index_text` of the chunks.
        dense: Vectors of the same chunks.
        embedder: The embedder the vectors came from (used to embed queries).
        weights: Hybrid fusion weights keyed ``"bm25"`` / ``"dense"``.
        rrf_k: The RRF constant for hybrid search.
        scopes: Chunk id → the scope it was indexed under (chunks not named belong to the empty scope).
        headings: Heading vectors by text that ``embedder`` embedded earlier for the meaning scale (a saved
            index's), used instead of embedding those headings again.
    """

    def __init__(
        self,
        chunks: Sequence[Chunk],
        bm25: BM25Index,
        dense: DenseIndex,
        embedder: Embedder,
        *,
        weights: Mapping[str, float] | None = None,
        rrf_k: int = 60,
        scopes: Mapping[str, Scope] | None = None,
        headings: Mapping[str, npt.NDArray[np.float32]] | None = None,
    ) -> None:
        if embedder.dim != dense.dim:
            raise ConfigError(f"embedder {embedder.name!r} has dim {embedder.dim}, the index has {dense.dim}")
        self._chunks = tuple(chunks)
        self._by_id = {c.id: c for c in self._chunks}
        self.bm25 = bm25
        self.dense = dense
        self.embedder = embedder
        self.weights = dict(weights) if weights is not None else {"bm25": 1.0, "dense": 1.0}
        self.rrf_k = rrf_k
        self._retrievers: dict[str, Retriever] = {}
        self._version: str | None = None
        self._scopes = {cid: s for cid, s in (scopes or {}).items() if s.pairs and cid in self._by_id}
        self._keys: frozenset[str] | None = None
        self._scales: MeaningScales | None = None
        self._known_headings = dict(headings or {})

    @property
    def chunks(self) -> tuple[Chunk, ...]:
        """The indexed chunks, in index order."""
        return self._chunks

    def chunk(self, chunk_id: str) -> Chunk | None:
        """The chunk with this id, if indexed."""
        return self._by_id.get(chunk_id)

    def scope_of(self, chunk_id: str) -> Scope:
        """The scope the chunk was indexed under (the empty scope for an unscoped or unknown chunk)."""
        return self._scopes.get(chunk_id, _NO_SCOPE)

    def scopes(self) -> dict[Scope, int]:
        """Documents per scope."""
        docs: dict[Scope, set[str]] = {}
        for c in self._chunks:
            docs.setdefault(self.scope_of(c.id), set()).add(c.doc_id)
        return {scope: len(ids) for scope, ids in docs.items()}

    def metadata_keys(self) -> frozenset[str] | None:
        """Every metadata key of the indexed chunks (a filter on another key is refused); ``None``: no chunks."""
        if self._keys is None:
            self._keys = metadata_keys(self._chunks) or frozenset()
        return self._keys if self._chunks else None

    def meaning_scales(self) -> MeaningScales | None:
        """The dense threshold of any scope of this index, measured on its own headings
        (:mod:`ragloop.retrievers.meaning`); ``None`` for an embedder without meaning (the lexical hash
        embedder: its cosines only restate the term overlap) or one that cannot embed in the calling thread."""
        embed = meaning_embed(self.embedder)
        if embed is None:
            return None
        if self._scales is None:
            self._scales = MeaningScales(self._chunks, self.dense.vectors, embed, self._known_headings)
        return self._scales

    def _headings_to_keep(self) -> dict[str, npt.NDArray[np.float32]]:
        """The heading vectors a save keeps (the whole index's embedded now if need be); none when the embedder
        has no meaning, or when embedding them fails: they are a cache, and the save goes on without them
        (logged ``heading_vectors_not_kept``; a loaded index embeds them on first use)."""
        scales = self.meaning_scales()
        if scales is None:
            return {}
        try:
            scales.measure_headings()
        except Exception as exc:  # noqa: BLE001 — an optional cache never fails the save
            log.warning("heading_vectors_not_kept", error=_short(exc))
            return {}
        return scales.headings()

    @property
    def lacks_heading_vectors(self) -> bool:
        """Whether no heading vectors were handed to this index although its embedder has meaning: it was built
        here, or loaded from a save that kept none (a ragloop from before they were kept, or a save whose
        embedding of them failed). Every process that loads such a save embeds them again, until it is saved
        once more."""
        return not self._known_headings and meaning_embed(self.embedder) is not None

    def _known_heading_vectors(self) -> dict[str, npt.NDArray[np.float32]]:
        """The meaning scale's heading vectors this index knows (embedded, or loaded with it), by text: an update
        hands them to the index it makes, as it hands over the vectors of unchanged chunks."""
        return self._scales.headings() if self._scales is not None else dict(self._known_headings)

    @property
    def version(self) -> str:
        """A fingerprint of what the index holds (the embedder, every chunk's id and text, the fusion
        settings): caches of search results key on it, so an index rebuilt with other content misses them."""
        if self._version is None:
            digest = hashlib.sha256(f"{self.embedder.name}\0{self.weights}\0{self.rrf_k}".encode())
            for c in self._chunks:
                digest.update(f"\0{c.id}\0{index_text(c)}\0{c.metadata}".encode())
            self._version = digest.hexdigest()[:16]
        return self._version

    @staticmethod
    def _dedupe(chunks: Iterable[Chunk]) -> list[Chunk]:
        seen: set[str] = set()
        out = []
        for c in chunks:
            if c.id not in seen:
                seen.add(c.id)
                out.append(c)
        return out

    @classmethod
    def _assemble(
        cls,
        chunks: list[Chunk],
        vectors: npt.NDArray[np.float32],
        embedder: Embedder,
        *,
        hnsw_threshold: int,
        stem: bool,
        scopes: Mapping[str, Scope] | None = None,
        headings: Mapping[str, npt.NDArray[np.float32]] | None = None,
    ) -> KnowledgeIndex:
        ids = [c.id for c in chunks]
        bm25 = BM25Index(stem=stem)
        bm25.build(ids, [index_text(c) for c in chunks])
        dense = DenseIndex(embedder.dim, hnsw_threshold=hnsw_threshold)
        if chunks:
            dense.add(ids, vectors)
        return cls(chunks, bm25, dense, embedder, scopes=scopes, headings=headings)

    @classmethod
    def build(
        cls,
        chunks: Iterable[Chunk],
        embedder: Embedder,
        *,
        progress: Progress | None = None,
        hnsw_threshold: int = 50_000,
        stem: bool = True,
        scope: Scope | Mapping[str, str] | None = None,
    ) -> KnowledgeIndex:
        """Embed and index ``chunks`` (duplicate ids are kept once); ``progress(done, total)`` per batch.

        Embedders with an ``embed_sync`` method run in this thread; others (e.g.
        :class:`~ragloop.retrievers.embed.OpenAIEmbedder`) through ``anyio.run``, so call :meth:`abuild` instead
        from inside an event loop. An embedder with a ``release`` method is asked to free its bulk model once
        the chunks are embedded (it loads it again for its next bulk job). With a ``scope``, every chunk is stored
        under it (:meth:`Scope.apply`).
        """
        scoped = Scope.of(scope)
        unique = cls._dedupe(scoped.apply(chunks))
        texts = [index_text(c) for c in unique]
        embed_sync = getattr(embedder, "embed_sync", None)
        if embed_sync is not None:
            vectors = np.asarray(embed_sync(texts, progress=progress), dtype=np.float32)
        else:
            vectors = anyio.run(embed_batched, embedder, texts, progress)
        _release(embedder)
        scopes = {c.id: scoped for c in unique}
        return cls._assemble(unique, vectors, embedder, hnsw_threshold=hnsw_threshold, stem=stem, scopes=scopes)

    @classmethod
    async def abuild(
        cls,
        chunks: Iterable[Chunk],
        embedder: Embedder,
        *,
        progress: Progress | None = None,
        hnsw_threshold: int = 50_000,
        stem: bool = True,
        scope: Scope | Mapping[str, str] | None = None,
    ) -> KnowledgeIndex:
        """:meth:`build` for async callers: embeds off the event loop, batch by batch
        (:func:`~ragloop.retrievers.embed.embed_batched`), and indexes in a thread."""
        scoped = Scope.of(scope)
        unique = cls._dedupe(scoped.apply(chunks))
        vectors = await embed_batched(embedder, [index_text(c) for c in unique], progress)
        _release(embedder)
        scopes = {c.id: scoped for c in unique}

        def assemble() -> KnowledgeIndex:
            return cls._assemble(unique, vectors, embedder, hnsw_threshold=hnsw_threshold, stem=stem, scopes=scopes)

        return await anyio.to_thread.run_sync(assemble)

    def retriever(self, mode: Mode = "hybrid") -> Retriever:
        """A retriever over this index: ``"bm25"``, ``"dense"`` or ``"hybrid"`` (RRF of both)."""
        if mode not in _MODES:
            raise ConfigError(f"unknown retrieval mode {mode!r}; use one of {', '.join(_MODES)}")
        found = self._retrievers.get(mode)
        if found is not None:
            return found
        bm25 = BM25Retriever(self.bm25, self._by_id, text_of=index_text)  # a filtered search: its scope's IDF
        dense = DenseRetriever(self.dense, self.embedder, self._by_id)
        made: Retriever
        if mode == "bm25":
            made = bm25
        elif mode == "dense":
            made = dense
        else:
            made = HybridRetriever(bm25, dense, weights=self.weights, rrf_k=self.rrf_k)
        self._retrievers[mode] = made
        return made

    async def search(self, query: str, k: int = 10, mode: Mode = "hybrid", filters: Filters | None = None) -> list[Hit]:
        """Return at most ``k`` hits for ``query``, best first, among chunks whose metadata matches ``filters``."""
        return list(await self.retriever(mode).search(query, k, filters=filters))

    # --- persistence ------------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike[str], *, source: str | os.PathLike[str] | None = None) -> Path:
        """Write the index to ``directory`` atomically (replacing an index already there); returns the path.

        Args:
            directory: The index folder: new, empty, or an existing ragloop index (see :func:`check_index_target`).
            source: The folder or file the index was built from; the target may be neither it nor above or
                inside it.

        Raises:
            IndexError_: the target is refused (nothing was written), or writing failed (disk full, read-only
                folder); only this save's own temporary folder is removed on failure.
        """
        target = check_index_target(directory, source=source)
        headings = self._headings_to_keep()
        parent = target.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            _remove_dead_leftovers(parent, target.name)
            tmp = parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            tmp.mkdir()
        except OSError as exc:
            raise _write_error(target, exc) from exc
        try:
            with (tmp / _CHUNKS).open("w", encoding="utf-8") as fh:
                for c in self._chunks:
                    fh.write(_chunk_to_json(c, self.scope_of(c.id)) + "\n")
            self.bm25.save(tmp)
            self.dense.save(tmp)
            if headings:
                with (tmp / _HEADINGS).open("wb") as fh:
                    np.savez(fh, texts=np.array(list(headings)), vectors=np.stack(list(headings.values())))
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            manifest = {
                "format": "ragloop-index",
                "format_version": FORMAT_VERSION,
                "embedder": {"name": self.embedder.name, "dim": self.embedder.dim},
                "chunks": len(self._chunks),
                "dense": {"kind": self.dense.kind},
                "bm25": self.bm25.tokenizer.config(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "files": {p.relative_to(tmp).as_posix(): file_sha256(p) for p in files},
            }
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            _fsync_tree(tmp)
            check_index_target(target, source=source)  # again: the folder may have changed during the build
            if target.exists() and _exchange(tmp, target):
                # One atomic step: a crash leaves either the old index or the new one at ``target``.
                _fsync_dir(parent)
                shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous index
            elif target.exists():
                # No atomic exchange here (not Linux, or the filesystem refuses it): two renames, and load()
                # explains the leftover if a crash falls between them.
                old = parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                os.rename(target, old)
                os.rename(tmp, target)
                _fsync_dir(parent)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, target)
            _fsync_dir(parent)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(target, exc) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        embedder: Embedder | None = None,
        *,
        verify: bool = True,
        weights: Mapping[str, float] | None = None,
        rrf_k: int = 60,
    ) -> KnowledgeIndex:
        """Open an index written by :meth:`save`.

        Args:
            directory: The index directory.
            embedder: The embedder for queries; must match the one the index was built with. By default
                it is rebuilt from the manifest (MiniLM or the hash embedder).
            verify: Check every file's sha256 against the manifest.
            weights: Hybrid fusion weights.
            rrf_k: The RRF constant.

        Raises:
            IndexError_: the directory or a file is missing, a checksum differs, the format version is
                unknown, or ``embedder`` differs from the one in the manifest.
        """
        root = Path(directory)
        rebuild = f"rebuild it with `ragloop index PATH --out {root}`"
        manifest_path = root / _MANIFEST
        if not manifest_path.is_file():
            leftovers = sorted(root.absolute().parent.glob(f".{glob_escape(root.name)}.old-*"))
            if not root.exists() and leftovers:
                raise IndexError_(
                    f"no index at {root}, but an interrupted save left the previous one at {leftovers[-1]}; "
                    f"rename it back to {root} or {rebuild}"
                )
            if root.is_dir() and any(root.iterdir()):
                # A folder of documents, say: never suggest writing an index over it.
                raise IndexError_(
                    f"{root} is not a ragloop index (it has no {_MANIFEST}); build one with "
                    f"`ragloop index {root} --out NEW_FOLDER` and pass NEW_FOLDER"
                )
            what = "does not exist" if not root.exists() else f"has no {_MANIFEST}"
            raise IndexError_(f"index directory {root} {what}; {rebuild}")
        try:
            manifest = _read_manifest(manifest_path)
        except (OSError, ValueError, RecursionError) as exc:
            raise IndexError_(f"manifest {manifest_path} is unreadable ({_short(exc)}); {rebuild}") from exc
        version, emb_name, emb_dim, files, count = _manifest_fields(manifest, manifest_path, rebuild)
        if version != FORMAT_VERSION:
            raise IndexError_(
                f"index {root} has format version {version}, this ragloop reads {FORMAT_VERSION}; {rebuild}"
            )
        _check_index_files(root, files, verify=verify, rebuild=rebuild)
        if embedder is None:
            embedder = _embedder_for(emb_name, emb_dim)
        elif embedder.name != emb_name or embedder.dim != emb_dim:
            raise IndexError_(
                f"index {root} was built with embedder {emb_name!r} ({emb_dim}-dim) but {embedder.name!r} "
                f"({embedder.dim}-dim) was given; load it with the same embedder, or rebuild it with "
                f"`ragloop index PATH --out {root} --embedder ...`"
            )
        chunks, scopes = _read_chunks(root / _CHUNKS, rebuild)
        try:
            bm25 = BM25Index.load(root)
            dense = DenseIndex.load(root)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, RuntimeError) as exc:
            # Files whose checksums were rewritten along with the manifest can still hold any JSON at all.
            raise IndexError_(f"index {root} has a malformed BM25 or dense file ({_short(exc)}); {rebuild}") from exc
        if not (len(chunks) == count == len(bm25) == len(dense)):
            raise IndexError_(
                f"index {root} is inconsistent: manifest says {count} chunks, found {len(chunks)} chunks, "
                f"{len(bm25)} BM25 rows, {len(dense)} vectors; {rebuild}"
            )
        headings = _read_headings(root / _HEADINGS, emb_dim, rebuild) if _HEADINGS in files else None
        return cls(chunks, bm25, dense, embedder, weights=weights, rrf_k=rrf_k, scopes=scopes, headings=headings)

    def describe(self) -> dict[str, Any]:
        """A summary: chunk count, embedder, dense index kind."""
        return {
            "chunks": len(self._chunks),
            "embedder": self.embedder.name,
            "dim": self.embedder.dim,
            "dense": self.dense.kind,
        }
