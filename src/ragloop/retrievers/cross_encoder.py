"""Cross-encoders as rankers: a ``/rerank`` endpoint, or a local ONNX model, behind the Ranker seam.

A cross-encoder reads the question and one passage together and scores how well the passage answers it: the
most accurate reranker there is, and too heavy to ship in a wheel. Two ways to use one:

- :class:`RerankEndpoint`: the common ``/rerank`` HTTP API that llama.cpp's server (``--reranking``), vLLM,
  Hugging Face TEI, Infinity, Cohere and Jina expose: ``{"query", "documents", "top_n"}`` in,
  ``{"results": [{"index", "relevance_score"}]}`` out. Sent through the ``openai`` client the rest of ragloop
  uses (its HTTP stack, its connection pool), with a time limit per request.
- :class:`OnnxCrossEncoder`: a model you supply as ``model.onnx`` plus its ``tokenizer.json`` (a
  sequence-classification export: ``input_ids``, ``attention_mask`` [, ``token_type_ids``] → one logit per
  pair), run by ONNX Runtime (the ``[embed]`` extra the MiniLM embedder runs on), in a worker thread.

:class:`CrossEncoderRanker` puts either in front of the default ranking: it takes the first ``depth`` passages
of :class:`~ragloop.retrievers.ranking.FusionRanker`'s order, scores them (``batch_size`` per call, each passage
cut to ``max_chars``), and orders them by score; the rest keep the default order behind them. When it fails or
overruns, the answer node uses the default ranking for that turn and records the fault (fail-open).
:func:`cross_encoder` makes one from the CLI's ``--reranker URL|PATH``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio
import anyio.to_thread
import numpy as np
from attrs import define, field, validators

from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers.ranking import Candidates, FusionRanker
from ragloop.state import Hit

if TYPE_CHECKING:
    import openai

__all__ = ["CrossEncoderRanker", "OnnxCrossEncoder", "PairScorer", "RerankEndpoint", "cross_encoder"]


@runtime_checkable
class PairScorer(Protocol):
    """Scores (query, passage) pairs: higher is more relevant."""

    async def score(self, query: str, documents: Sequence[str]) -> Sequence[float]:
        """One score per document, in the order given. Raise on failure."""
        ...


def _scores_of(body: Any, n: int) -> list[float]:
    """The per-document scores of a ``/rerank`` answer for ``n`` documents (missing ones: ``-inf``).

    Raises:
        RetrievalError: The answer is not ``{"results": [{"index", "relevance_score"}, …]}`` over those
            documents.
    """
    results = body.get("results") if isinstance(body, dict) else body  # TEI's native route answers a bare list
    if not isinstance(results, list):
        raise RetrievalError(f"the /rerank answer has no results list: {str(body)[:200]}")
    scores = [-math.inf] * n
    for row in results:
        index = row.get("index") if isinstance(row, dict) else None
        score = row.get("relevance_score", row.get("score")) if isinstance(row, dict) else None
        if not isinstance(index, int) or not 0 <= index < n or isinstance(score, bool):
            raise RetrievalError(f"the /rerank answer names no document of the {n} sent: {str(row)[:200]}")
        if not isinstance(score, int | float) or not math.isfinite(score):
            raise RetrievalError(f"the /rerank answer's score for document {index} is not a number: {score!r}")
        scores[index] = float(score)
    return scores


@define
class RerankEndpoint:
    """A cross-encoder behind the common ``/rerank`` API (see the module docstring).

    Attributes:
        client: An ``openai.AsyncOpenAI`` client whose ``base_url`` is the server's API root
            (``http://localhost:8080/v1``); the request goes to ``{base_url}/rerank``.
        model: The ``model`` field sent (servers that host one model ignore it); ``None``: not sent.
        timeout_s: Time limit per request.
        path: The route under ``base_url``.
        owns_client: Close ``client`` in :meth:`aclose` (the client :func:`cross_encoder` made; not yours).
    """

    client: openai.AsyncOpenAI
    model: str | None = None
    timeout_s: float = field(default=5.0, validator=validators.gt(0))
    path: str = "/rerank"
    owns_client: bool = False

    async def aclose(self) -> None:
        """Close the client when this endpoint made it."""
        if self.owns_client:
            await self.client.close()

    async def score(self, query: str, documents: Sequence[str]) -> list[float]:
        """The server's relevance score of each document for ``query``.

        Raises:
            RetrievalError: The server failed, timed out, or answered something else than scores.
        """
        import openai

        if not documents:
            return []
        body: dict[str, Any] = {"query": query, "documents": list(documents), "top_n": len(documents)}
        if self.model is not None:
            body["model"] = self.model
        try:
            answer = await self.client.post(self.path, cast_to=object, body=body, options={"timeout": self.timeout_s})
        except openai.APIError as exc:
            raise RetrievalError(f"/rerank at {self.client.base_url}: {type(exc).__name__}: {exc}") from exc
        return _scores_of(answer, len(documents))


class OnnxCrossEncoder:
    """A local cross-encoder: ``model.onnx`` and its ``tokenizer.json`` (see the module docstring).

    Args:
        path: A folder holding ``model.onnx`` and ``tokenizer.json``, or the ``.onnx`` file (its tokenizer
            beside it).
        max_length: Tokens per (query, passage) pair; longer pairs are cut (the passage first).
        threads: ONNX Runtime's intra-op threads.

    Raises:
        ConfigError: A file is missing, or the runtime cannot load the model (the message says which).
    """

    def __init__(self, path: str | Path, *, max_length: int = 512, threads: int = 1) -> None:
        folder = Path(path)
        model = folder if folder.suffix == ".onnx" else folder / "model.onnx"
        tokenizer = model.parent / "tokenizer.json"
        missing = [str(p) for p in (model, tokenizer) if not p.is_file()]
        if missing:
            raise ConfigError(f"a cross-encoder needs model.onnx and its tokenizer.json; missing: {', '.join(missing)}")
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError("a local cross-encoder needs the [embed] extra: pip install 'ragloop[embed]'") from exc
        self.name = model.parent.name or model.stem
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        self._tokenizer.enable_truncation(max_length=max_length, strategy="only_second")
        self._tokenizer.enable_padding()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        try:
            self._session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ConfigError(f"ONNX Runtime could not load the cross-encoder {model}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise ConfigError(
                f"{model} is not a cross-encoder export: its inputs are {sorted(self._inputs)}, "
                "not input_ids and attention_mask"
            )

    def score_sync(self, query: str, documents: Sequence[str]) -> list[float]:
        """:meth:`score` in the calling thread."""
        if not documents:
            return []
        encoded = self._tokenizer.encode_batch([(query, d) for d in documents])
        feeds = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
        }
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in encoded], dtype=np.int64)
        (logits,) = self._session.run(None, feeds)[:1]
        out = np.asarray(logits, dtype=np.float32).reshape(len(documents), -1)
        return [float(row[-1]) for row in out]  # one logit, or the "relevant" class of two

    async def score(self, query: str, documents: Sequence[str]) -> list[float]:
        """The model's score (its last logit) of each (query, document) pair, in a worker thread."""
        return await anyio.to_thread.run_sync(self.score_sync, query, documents)


@define
class CrossEncoderRanker:
    """The default ranking with its head reordered by a cross-encoder (a :class:`~ragloop.retrievers.ranking.Ranker`).

    Attributes:
        scorer: What scores the pairs (:class:`RerankEndpoint`, :class:`OnnxCrossEncoder`, or yours).
        base: The ranking whose head is rescored (and the order of everything after it).
        depth: How many of its first passages are scored (the cap on work per turn).
        batch_size: Passages per scorer call; the calls of one turn run at once.
        max_chars: Each passage is cut to this many characters before it is sent.
    """

    scorer: PairScorer
    base: FusionRanker = field(factory=FusionRanker)
    depth: int = field(default=20, validator=validators.ge(1))
    batch_size: int = field(default=32, validator=validators.ge(1))
    max_chars: int = field(default=2000, validator=validators.ge(1))

    async def rank(self, candidates: Candidates) -> list[Hit]:
        """The first ``depth`` passages of ``base`` by the scorer's score (ties: ``base``'s order), then the rest.

        Raises:
            RetrievalError: The scorer answered the wrong number of scores (any scorer error propagates).
        """
        ordered = self.base.order(candidates)
        head, tail = ordered[: self.depth], ordered[self.depth :]
        if len(head) < 2:
            return ordered
        texts = [h.text[: self.max_chars] for h in head]
        batches = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
        scored: list[Sequence[float]] = [()] * len(batches)
        failed: list[Exception] = []

        async def one(i: int) -> None:
            try:
                scored[i] = await self.scorer.score(candidates.question, batches[i])
            except Exception as exc:  # noqa: BLE001 — re-raised below as itself, not inside an ExceptionGroup
                failed.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(len(batches)):
                tg.start_soon(one, i)
        if failed:
            raise failed[0]
        scores = [float(s) for batch in scored for s in batch]
        if len(scores) != len(head):
            raise RetrievalError(f"the cross-encoder scored {len(scores)} of the {len(head)} passages sent")
        position = {h.id: i for i, h in enumerate(head)}
        by_id = dict(zip((h.id for h in head), scores, strict=True))
        head.sort(key=lambda h: (-by_id[h.id], position[h.id]))
        return head + tail

    async def aclose(self) -> None:
        """Close the scorer's connections, if it has any (a chat's ``aclose`` calls this)."""
        closer = getattr(self.scorer, "aclose", None)
        if closer is not None:
            await closer()


def cross_encoder(spec: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> CrossEncoderRanker:
    """The ranker of the CLI's ``--reranker``: an ``http(s)://`` URL of a ``/rerank`` endpoint (the full URL,
    ``…/rerank``, or the API root), or the path of a local ONNX cross-encoder.

    Raises:
        ConfigError: A path without ``model.onnx`` and ``tokenizer.json`` (or a model the runtime rejects).
    """
    if spec.startswith(("http://", "https://")):
        import openai

        root = spec.rstrip("/")
        root = root[: -len("/rerank")] if root.endswith("/rerank") else root
        client = openai.AsyncOpenAI(base_url=root, api_key=api_key or "not-needed", max_retries=0)
        return CrossEncoderRanker(RerankEndpoint(client, timeout_s=timeout_s, owns_client=True))
    return CrossEncoderRanker(OnnxCrossEncoder(spec))
