"""Shared pytest configuration: anyio's plugin on asyncio, hypothesis profiles."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tests.llamacpp_server import LlamaCppServer

settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI replays the same examples on every run (derandomize): a red CI then means a regression, not a new draw.
settings.register_profile(
    "ci", max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("soak", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))


@pytest.fixture(autouse=True)
def _structlog_as_it_was() -> Iterator[None]:
    """Each test ends with structlog as unconfigured as it began.

    ``structlog.testing.capture_logs`` (and any ``structlog.configure``) leaves ``structlog.is_configured()`` true
    for the rest of the process, so every ragloop event of every later test went through structlog's default
    console pipeline, each error with a rendered traceback (the runner's state-machine test took 45 s instead of
    1 s after one ``capture_logs``), and the library's "prints nothing unless configured" could not be tested.
    """
    import structlog

    before = structlog.is_configured()
    yield
    if not before and structlog.is_configured():
        structlog.reset_defaults()


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio (the backend chat services use)."""
    return "asyncio"


@pytest.fixture(scope="session")
def sample_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the sample knowledge base's index (default embedder), built once per session."""
    from ragloop.sample import sample_index

    path = tmp_path_factory.mktemp("ragloop-cache")
    sample_index(path)
    return path


@pytest.fixture(scope="session")
def llamacpp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    """llama.cpp's server with SmolLM2 in a child process (one slot, 2 threads, 2k context), once per session.

    Its log is in the session's temporary folder (``llamacpp*/server.log``).
    """
    from tests.llamacpp_server import LlamaCppServer

    log = tmp_path_factory.mktemp("llamacpp") / "server.log"
    with LlamaCppServer(n_ctx=2048, slots=1, threads=2, log_path=log) as server:
        yield server


@pytest.fixture(scope="session")
def llamacpp_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    """The same server with ``tests/smollm2_tools.jinja`` as chat template: SmolLM2 makes real tool calls.

    Its log is in the session's temporary folder (``llamacpp-tools*/server.log``).
    """
    from tests.llamacpp_server import TOOLS_TEMPLATE, LlamaCppServer

    log = tmp_path_factory.mktemp("llamacpp-tools") / "server.log"
    with LlamaCppServer(n_ctx=2048, slots=1, threads=2, log_path=log, chat_template=TOOLS_TEMPLATE) as server:
        yield server
