"""A real PostgreSQL 16 with pgvector (the ``pgserver`` wheel), one per test session."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A running pgserver on a Unix socket in a temporary folder; stopped and removed at the end of the session.

    The folder is made with ``tempfile`` rather than pytest's ``tmp_path``: as root, pgserver runs the server
    as a separate ``pgserver`` user, and pytest keeps its own temporary root private (mode 0700), which
    another pytest process on the machine may reset at any moment.
    """
    pgserver = pytest.importorskip("pgserver")
    root = Path(tempfile.mkdtemp(prefix="ragloop-pg-"))
    root.chmod(0o755)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' RuntimeDirWarning about XDG_RUNTIME_DIR is harmless
        server = pgserver.get_server(root / "data", cleanup_mode="stop")
    try:
        yield server
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The server's ``postgresql://`` URL."""
    url: str = pg_server.get_uri()
    return url


@pytest.fixture
def collection() -> str:
    """A collection name no other test uses."""
    return f"t{next(_names)}"
