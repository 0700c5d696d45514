"""The runtimes that run the MiniLM ONNX model: ONNX Runtime (the ``[embed]`` extra) or OpenVINO (``[openvino]``).

Both load the same int8 ONNX file and return the same ``last_hidden_state``. OpenVINO runs it 2.2x faster on
the 2-core x86 machine of ``benchmarks/bench_ingest.py`` (its int8 kernels use VNNI where ONNX Runtime's
dynamic-quantised MatMuls do not), with embeddings within cosine 0.9997 of ONNX Runtime's. On top of that
(``benchmarks/results/bench_ingest-ov-variants.txt``):

- the export's NaN guard after each attention softmax (``Select(IsNaN(p), 0, p)``: never true here, every row
  attends to at least ``[CLS]``) is removed from the graph;
- the float parts run in bfloat16 where the CPU has native bf16 (``avx512_bf16``, AMX), float32 elsewhere;
- bulk work runs as one single-threaded stream per thread (``THROUGHPUT``; one blocking request per stream, each
  from its own Python thread), not one stream whose every operator is split across the cores;
- the model's weights are int8 but its activations float, so every projection runs as a float GEMM over
  decompressed weights (73 % of the time). With calibrated activation ranges (:func:`quantize_activations`, the
  ``minilm-activations.json`` asset), OpenVINO runs those projections as int8 x int8 GEMMs (VNNI / AMX).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ragloop.errors import ConfigError

__all__ = [
    "RUNTIMES",
    "ActivationRanges",
    "ModelRunner",
    "Releasable",
    "activation_ranges",
    "default_threads",
    "drop_nan_guards",
    "file_sha256",
    "input_key",
    "openvino_available",
    "quantize_activations",
    "ranges_for",
    "release_free_memory",
    "runner",
    "weight_projections",
]

_Tag = TypeVar("_Tag")
Feeds = dict[str, "npt.NDArray[np.int64]"]

#: Calibrated ``(low, high)`` of a projection input, keyed by :func:`input_key`.
ActivationRanges = Mapping[str, tuple[float, float]]
#: The asset holding MiniLM's calibrated activation ranges (``benchmarks/calibrate_activations.py`` writes it).
ACTIVATIONS_ASSET = "minilm-activations.json"

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

    def run_all(self, batches: Iterable[tuple[_Tag, Feeds]]) -> Iterator[tuple[_Tag, npt.NDArray[np.float32]]]:
        """``(tag, last_hidden_state)`` for every ``(tag, feeds)`` batch, in any order (several may run at once)."""
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

    def run_all(self, batches: Iterable[tuple[_Tag, Feeds]]) -> Iterator[tuple[_Tag, npt.NDArray[np.float32]]]:
        for tag, feeds in batches:
            yield tag, self.run(feeds)


def drop_nan_guards(model: Any) -> int:
    """Remove ``Select(IsNaN(p), 0, p)`` after every ``Softmax`` ``p`` of an OpenVINO model; return how many.

    The export guards each attention softmax against a row that masks every key (``NaN``). A MiniLM input
    always attends to ``[CLS]``, so the guard never fires and only costs two elementwise passes per layer.
    """
    dropped = 0
    for op in model.get_ops():
        if op.get_type_name() != "IsNaN" or op.input_value(0).get_node().get_type_name() != "Softmax":
            continue
        probs = op.input_value(0)
        for target in list(op.output(0).get_target_inputs()):
            select = target.get_node()
            if select.get_type_name() == "Select" and select.input_value(2) == probs:
                select.output(0).replace(probs)
                dropped += 1
    if dropped:
        model.validate_nodes_and_infer_types()
    return dropped


def weight_projections(model: Any) -> list[Any]:
    """The model's projections: every ``MatMul`` whose second input is a decompressed int8 weight
    (``Multiply(Convert(int8 constant), scale)``), in graph order."""
    found = []
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        weight = op.input_value(1).get_node()
        if weight.get_type_name() == "Multiply" and any(
            weight.input_value(i).get_node().get_type_name() == "Convert" for i in range(2)
        ):
            found.append(op)
    return found


def input_key(projection: Any) -> str:
    """The name of a projection's activation input: its producer's friendly name and output index (Q, K and V
    share one)."""
    source = projection.input_value(0)
    return f"{source.get_node().get_friendly_name()}:{source.get_index()}"


def quantize_activations(model: Any, ranges: ActivationRanges) -> int:
    """Put an 8-bit ``FakeQuantize`` over its calibrated ``(low, high)`` before every projection whose input is
    in ``ranges``; return how many projections got one.

    OpenVINO's low-precision passes then run those projections as int8 x int8 GEMMs with the int8 weights the
    model already holds (about half the time of the float GEMM over decompressed weights, on a VNNI CPU). A value
    outside its range is clipped to it; the ranges are the extremes seen over a calibration corpus.
    """
    from openvino import opset13 as ops

    quantized = 0
    made: dict[str, Any] = {}
    for projection in weight_projections(model):
        key = input_key(projection)
        if key not in ranges:
            continue
        if key not in made:
            low, high = (np.float32(v) for v in ranges[key])
            lo, hi = ops.constant(low), ops.constant(high)
            made[key] = ops.fake_quantize(projection.input_value(0), lo, hi, lo, hi, 256)
        projection.input(0).replace_source_output(made[key].output(0))
        quantized += 1
    if quantized:
        model.validate_nodes_and_infer_types()
    return quantized


def activation_ranges(model_sha256: str) -> ActivationRanges | None:
    """The calibrated activation ranges shipped for the model with this sha256, or ``None`` (another model)."""
    from importlib import resources

    asset = resources.files("ragloop.retrievers").joinpath("assets", ACTIVATIONS_ASSET)
    data = json.loads(asset.read_text(encoding="utf-8"))
    if data.get("model_sha256") != model_sha256:
        return None
    return {key: (float(lo), float(hi)) for key, (lo, hi) in data["ranges"].items()}


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity: a container's or ``taskset``'s limit, not the
    machine's count, so the runtime's pool never oversubscribes them), at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


def ranges_for(activations: str, runtime: str, model: Path, sha256: str | None) -> ActivationRanges | None:
    """The calibrated activation ranges bulk embedding of ``model`` runs with (``None``: float activations);
    ``sha256`` is the model's when it was verified already (else it is computed here).

    Raises:
        ConfigError: a bad ``activations``, or ``"int8"`` asked for a model other than the pinned one.
    """
    if activations not in ("auto", "int8", "float"):
        raise ConfigError(f"activations must be 'auto', 'int8' or 'float', got {activations!r}")
    on_openvino = runtime == "openvino" or (runtime == "auto" and openvino_available())
    if activations == "float" or not on_openvino:
        return None  # ONNX Runtime runs float activations; "int8" there is refused once the runtime is known
    # The ranges are calibrated for one file; an unverified file may be another model.
    ranges = activation_ranges(sha256 or file_sha256(model))
    if ranges is None and activations == "int8":
        raise ConfigError(
            f"activations='int8' needs the pinned MiniLM model; {model} is another: use activations='float'"
        )
    return ranges


class _OpenVINORunner:
    name = "openvino"
    #: Texts per call and the multiple sequences are padded to (texts are sorted by token count first). On
    #: single-threaded streams, batches of 4 cost the same CPU time as 8 or 16 and each stream's scratch memory
    #: is a quarter: 390 MB for two streams against 700 MB (``benchmarks/results/bench_ingest-ov-variants.txt``).
    batch_size = 4
    pad_to = 8

    def __init__(self, model: Path, threads: int, activations: ActivationRanges | None = None) -> None:
        import openvino as ov

        core = ov.Core()
        bf16 = "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        self.precision = "bf16" if bf16 else "f32"
        self.streams = threads
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": threads,  # one single-threaded stream per core
            "PERFORMANCE_HINT": "THROUGHPUT",
            "INFERENCE_PRECISION_HINT": self.precision,
            # Compiled kernels are otherwise kept for every input shape seen: hundreds of MB over a build.
            "CPU_RUNTIME_CACHE_CAPACITY": 0,
        }
        try:
            graph = core.read_model(str(model))
            drop_nan_guards(graph)
            #: Projections that run on int8 activations (0: all float).
            self.int8_projections = quantize_activations(graph, activations) if activations else 0
            self._compiled: Any = core.compile_model(graph, "CPU", config)
        except Exception as exc:  # openvino raises RuntimeError subclasses of its own
            raise ConfigError(
                f"OpenVINO could not load the MiniLM model {model}: {exc}; use runtime='onnxruntime'"
            ) from exc
        self._output = self._compiled.output("last_hidden_state")
        self._local = threading.local()  # an infer request serves one call at a time: one per thread
        # One infer here, on one thread, before any stream runs: the bindings set up their numpy API lazily under a
        # pybind11 call-once that deadlocks when two threads reach it first at the same time (seen as a build hung
        # for 13 minutes with both streams parked in ``tensor.data``).
        self.run({name: np.ones((1, self.pad_to), dtype=np.int64) for name in self.inputs()})

    def inputs(self) -> set[str]:
        return {name for port in self._compiled.inputs for name in port.get_names()}

    def run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        result = request.infer(feeds)
        return np.array(result[self._output], dtype=np.float32)  # a copy: the request reuses its buffer

    def run_all(self, batches: Iterable[tuple[_Tag, Feeds]]) -> Iterator[tuple[_Tag, npt.NDArray[np.float32]]]:
        # One blocking infer per stream at a time, each from its own thread (the infer releases the GIL), so the
        # streams run side by side; results come back in submission order.
        free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.streams):
            free.put(self._compiled.create_infer_request())

        def infer(tag: _Tag, feeds: Feeds) -> tuple[_Tag, npt.NDArray[np.float32]]:
            request = free.get()
            try:
                result = request.infer(feeds)
                return tag, np.array(result[self._output], dtype=np.float32)
            finally:
                free.put(request)

        with ThreadPoolExecutor(self.streams, thread_name_prefix="ragloop-openvino") as pool:
            pending: deque[Future[tuple[_Tag, npt.NDArray[np.float32]]]] = deque()
            for tag, feeds in batches:
                if len(pending) >= self.streams:
                    yield pending.popleft().result()
                pending.append(pool.submit(infer, tag, feeds))
            while pending:
                yield pending.popleft().result()


def runner(runtime: str, model: Path, threads: int, activations: ActivationRanges | None = None) -> ModelRunner:
    """A runner for ``runtime`` (see :data:`RUNTIMES`) over ``model`` with ``threads`` intra-op threads; on
    OpenVINO, the projections whose inputs ``activations`` gives a range for run on int8 activations
    (ONNX Runtime always runs float activations).

    Raises:
        ConfigError: an unknown runtime, ``"openvino"`` without the package, or a model the runtime rejects.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; use one of {', '.join(RUNTIMES)}")
    if runtime == "openvino" and not openvino_available():
        raise ConfigError("runtime 'openvino' needs the [openvino] extra: pip install 'ragloop[openvino]'")
    if runtime == "openvino" or (runtime == "auto" and openvino_available()):
        return _OpenVINORunner(model, threads, activations)
    return _OrtRunner(model, threads)


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``); ``False`` where there is none.

    A build's batches of every padded width leave the runtime's scratch freed but fragmented across its threads'
    heaps: on the whole python3-doc build about 130 MB stay resident until trimmed.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc (musl has no malloc_trim)
        return False
    trim(0)
    return True


class Releasable:
    """A :class:`ModelRunner` whose model can be dropped between bulk jobs (:meth:`release`) and is loaded again
    at its next use.

    The compiled model holds memory a built index never needs (OpenVINO's compiled graph and its streams' scratch:
    about 240 MB after a python3-doc build), while queries run on their own small session. It is loaded when
    built, so a model the runtime rejects fails there, not at the first batch.

    Args:
        runtime: One of :data:`RUNTIMES`.
        model: The ONNX file.
        threads: Intra-op threads (OpenVINO: single-threaded streams).
        activations: Calibrated activation ranges (OpenVINO only), see :func:`runner`.
    """

    def __init__(self, runtime: str, model: Path, threads: int, activations: ActivationRanges | None = None) -> None:
        self._args = (runtime, model, threads, activations)
        self._lock = threading.Lock()
        self._runner: ModelRunner | None = runner(*self._args)
        self.name, self.batch_size, self.pad_to = self._runner.name, self._runner.batch_size, self._runner.pad_to
        self.int8_projections: int = getattr(self._runner, "int8_projections", 0)
        self._inputs = self._runner.inputs()

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory now."""
        return self._runner is not None

    def _get(self) -> ModelRunner:
        with self._lock:
            if self._runner is None:
                self._runner = runner(*self._args)
            return self._runner

    def release(self) -> None:
        """Drop the model and hand its memory back; the next call loads it again. A job already running keeps
        the model it started with until it ends."""
        with self._lock:
            self._runner = None
        release_free_memory()

    def inputs(self) -> set[str]:
        return set(self._inputs)

    def run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        return self._get().run(feeds)

    def run_all(self, batches: Iterable[tuple[_Tag, Feeds]]) -> Iterator[tuple[_Tag, npt.NDArray[np.float32]]]:
        return self._get().run_all(batches)
