"""A real PostgreSQL 16 with pgvector (the ``pgserver`` wheel), one per test session."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running pgserver on a Unix socket in a temporary folder; stopped at the end of the session."""
    pgserver = pytest.importorskip("pgserver")
    data = Path(tmp_path_factory.mktemp("pgdata"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' RuntimeDirWarning about XDG_RUNTIME_DIR is harmless
        server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        yield server
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The server's ``postgresql://`` URL."""
    url: str = pg_server.get_uri()
    return url


@pytest.fixture
def collection() -> str:
    """A collection name no other test uses."""
    return f"t{next(_names)}"
