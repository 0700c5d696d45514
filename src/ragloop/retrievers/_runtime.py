"""The runtimes that run the MiniLM ONNX model: ONNX Runtime (the ``[embed]`` extra) or OpenVINO (``[openvino]``).

Both load the same int8 ONNX file and return the same ``last_hidden_state``. OpenVINO runs it 2.4–2.7× faster
on the 2-core x86 machine of ``benchmarks/bench_ingest.py`` (its int8 kernels use VNNI where ONNX Runtime's
dynamic-quantised MatMuls do not), with embeddings within cosine 0.9997 of ONNX Runtime's; it is compiled with
``INFERENCE_PRECISION_HINT=f32`` so the non-quantised parts stay in float32 on every CPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ragloop.errors import ConfigError

__all__ = ["RUNTIMES", "ModelRunner", "openvino_available", "runner"]

#: Runtimes :func:`runner` knows; ``"auto"`` is OpenVINO when installed, else ONNX Runtime.
RUNTIMES = ("auto", "onnxruntime", "openvino")


class ModelRunner(Protocol):
    """Runs the model on one batch of token ids."""

    name: str
    #: Texts per call the runtime runs best with.
    batch_size: int
    #: Sequences are padded to a multiple of this many tokens.
    pad_to: int

    def run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        """``last_hidden_state`` for ``feeds`` (``input_ids``, ``attention_mask``, maybe ``token_type_ids``)."""
        ...

    def inputs(self) -> set[str]:
        """The model's input names."""
        ...


def openvino_available() -> bool:
    """Whether the ``openvino`` package imports."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


class _OrtRunner:
    name = "onnxruntime"
    batch_size = 32
    pad_to = 1

    def __init__(self, model: Path, threads: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ConfigError(f"could not load the MiniLM ONNX model {model}: {exc}") from exc

    def inputs(self) -> set[str]:
        return {i.name for i in self._session.get_inputs()}

    def run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        (hidden,) = self._session.run(["last_hidden_state"], feeds)
        return np.asarray(hidden, dtype=np.float32)


class _OpenVINORunner:
    name = "openvino"
    #: Texts per call and the multiple sequences are padded to: the same CPU time as 32 (measured), about half
    #: the peak memory, and few distinct shapes.
    batch_size = 16
    pad_to = 32

    def __init__(self, model: Path, threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
            # Compiled kernels are otherwise kept for every input shape seen: hundreds of MB over a build.
            "CPU_RUNTIME_CACHE_CAPACITY": 0,
        }
        try:
            self._compiled: Any = core.compile_model(core.read_model(str(model)), "CPU", config)
        except Exception as exc:  # openvino raises RuntimeError subclasses of its own
            raise ConfigError(
                f"OpenVINO could not load the MiniLM model {model}: {exc}; use runtime='onnxruntime'"
            ) from exc
        self._output = self._compiled.output("last_hidden_state")
        self._local = threading.local()  # an infer request serves one call at a time: one per thread

    def inputs(self) -> set[str]:
        return {name for port in self._compiled.inputs for name in port.get_names()}

    def run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        result = request.infer(feeds)
        return np.array(result[self._output], dtype=np.float32)  # a copy: the request reuses its buffer


def runner(runtime: str, model: Path, threads: int) -> ModelRunner:
    """A runner for ``runtime`` (see :data:`RUNTIMES`) over ``model`` with ``threads`` intra-op threads.

    Raises:
        ConfigError: an unknown runtime, ``"openvino"`` without the package, or a model the runtime rejects.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    if runtime == "openvino" and not openvino_available():
        raise ConfigError("runtime 'openvino' needs the [openvino] extra: pip install 'ragloop[openvino]'")
    if runtime == "openvino" or (runtime == "auto" and openvino_available()):
        return _OpenVINORunner(model, threads)
    return _OrtRunner(model, threads)
