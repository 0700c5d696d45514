"""Reliability-suite fixtures: the figures collector (written to ``$RAGLOOP_FIGURES`` as JSON when set)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability._support import FIGURES
from tests.retrievers.conftest import collection, pg_server, pg_url  # real PostgreSQL (issue 20's walls suites)

__all__ = ["collection", "pg_server", "pg_url", "reliability_figures"]


@pytest.fixture(scope="session", autouse=True)
def reliability_figures() -> Iterator[None]:
    """Collect the suite's figures (turns, faults per kind, cancellations …) and write them at the end."""
    started = time.perf_counter()
    yield
    FIGURES["suite_seconds"] = round(time.perf_counter() - started, 2)
    target = os.environ.get("RAGLOOP_FIGURES")
    if target:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:  # each xdist worker runs a share of the suite: its own file, never one over another's
            path = Path(target)
            target = str(path.with_name(f"{path.stem}.{worker}{path.suffix}"))
        Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
