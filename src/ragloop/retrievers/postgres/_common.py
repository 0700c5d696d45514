"""Helpers of the Postgres store: the driver import, credentials hiding, tsvector literals, vectors read back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread
from attrs import frozen

from ragloop._redact import hide_credentials, hide_password
from ragloop.errors import ConfigError, StoreBusy, StoreUnavailable
from ragloop.retrievers.base import Embedder
from ragloop.retrievers.bm25 import Tokenizer

if TYPE_CHECKING:
    from psycopg import AsyncConnection

_APP = "ragloop"
_NULL = logging.NullHandler()


@frozen
class StoreInfo:
    """What a collection holds.

    Attributes:
        collection: The collection name.
        chunks: Stored chunks.
        documents: Stored documents.
        embedder: Name of the embedder its vectors came from.
        dim: Vector dimension.
    """

    collection: str
    chunks: int
    documents: int
    embedder: str
    dim: int


class Store(Protocol):
    """What the schema, search and sync modules use of a :class:`~ragloop.retrievers.postgres.PostgresStore`."""

    collection: str
    create: bool
    depth: int
    ef_search: int
    lexical_budget: int
    lexical_share: float
    exact_knn_max: int
    low: float
    high: float
    rrf_k: int
    k1: float
    b: float
    statement_timeout_s: float
    weights: dict[str, float]
    tokenizer: Tokenizer
    _t: dict[str, str]
    _embedder: Embedder | None
    missing_indexes: tuple[str, ...]
    repaired: tuple[str, ...]
    url: str
    _keys: frozenset[str] | None
    scope_statistics: bool
    scope_stats_fallbacks: int
    _scope_stats: Any

    @property
    def embedder(self) -> Embedder:
        """The collection's embedder."""
        ...

    @property
    def version(self) -> str:
        """The collection's version as last seen."""
        ...

    async def _run(self, fn: Callable[[AsyncConnection[Any]], Any]) -> Any: ...

    async def document_hashes(self, scope: Any = None) -> dict[str, str]:
        """Stored document id → document hash, for one scope."""
        ...

    async def info(self) -> StoreInfo:
        """Counts and embedder of the collection."""
        ...

    async def read_metadata_keys(self) -> frozenset[str] | None:
        """The metadata keys of the collection's chunks, read now (``None``: it holds no chunk)."""
        ...

    def metadata_keys(self) -> frozenset[str] | None:
        """The metadata keys as last read."""
        ...

    def _saw_version(self, version: str) -> None: ...


def tsvector(tokens: Sequence[str]) -> str:
    """A ``tsvector`` literal holding exactly ``tokens`` with their positions (1-based, capped by Postgres)."""
    positions: dict[str, list[int]] = {}
    for pos, tok in enumerate(tokens, start=1):
        positions.setdefault(tok, []).append(min(pos, 16383))
    parts = []
    for tok, where in positions.items():
        quoted = tok.replace("\\", "\\\\").replace("'", "''")
        parts.append(f"'{quoted}':{','.join(map(str, where[:256]))}")
    return " ".join(parts)


#: SQLSTATE ``too_many_connections``: the server answered, and refused one more connection.
TOO_MANY_CONNECTIONS = "53300"


def at_connection_limit(exc: BaseException) -> bool:
    """Whether a failed connection attempt was refused by a server at its connection limit (it is up, and busy).

    ``max_connections`` reached ("sorry, too many clients already"), the reserved slots left ("remaining
    connection slots are reserved"), or the database's or role's ``CONNECTION LIMIT`` ("too many connections
    for database"); psycopg does not always carry the SQLSTATE of a refused connection, so the text counts too.
    """
    if getattr(exc, "sqlstate", None) == TOO_MANY_CONNECTIONS:
        return True
    text = str(exc).casefold()
    return any(m in text for m in ("too many clients", "too many connections", "connection slots are reserved"))


async def probe(url: str, timeout_s: float) -> None:
    """Open and close one connection to ``url`` within ``timeout_s``.

    Raises:
        StoreUnavailable: it failed (refused, no such host or socket, no answer); the message hides passwords.
        StoreBusy: the server answered and refused the connection at its connection limit.
    """
    psycopg = psycopg_module()
    try:
        with anyio.fail_after(timeout_s):
            conn = await psycopg.AsyncConnection.connect(
                url, autocommit=True, fallback_application_name=_APP, connect_timeout=2
            )
    except (psycopg.Error, TimeoutError) as exc:
        reason = hide_credentials(str(exc), url) if isinstance(exc, psycopg.Error) else "no answer to a connection"
        if isinstance(exc, psycopg.Error) and at_connection_limit(exc):
            raise StoreBusy(
                f"the Postgres store at {hide_password(url)} is at its connection limit ({reason}); raise the "
                "server's max_connections (or the database's connection limit) or lower pool sizes"
            ) from exc
        raise StoreUnavailable(
            f"the Postgres store is unreachable ({reason}); check that the database at {hide_password(url)} is up"
        ) from exc
    await conn.close()


def install_hint(dbname: str) -> str:
    return (
        "install pgvector on the server (e.g. `apt install postgresql-16-pgvector`, or pick a provider with "
        f"pgvector) and run `CREATE EXTENSION vector;` as a superuser in database {dbname!r}"
    )


def as_array(value: Any) -> Any:
    """A pgvector value as something numpy reads (the adapter returns ``Vector`` or an ndarray by version)."""
    to_numpy = getattr(value, "to_numpy", None)
    return to_numpy() if to_numpy is not None else value


def psycopg_module() -> Any:
    # psycopg logs a warning when a query is cancelled (a turn's retrieval timeout) and the pool logs failed
    # reconnects; with logging unconfigured, Python's last-resort handler would print them on stderr. A
    # NullHandler keeps the library silent then, and the records still propagate to the application's handlers.
    logging.getLogger("psycopg").addHandler(_NULL)
    try:
        import pgvector.psycopg
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ConfigError("the Postgres store needs the [postgres] extra: pip install 'ragloop[postgres]'") from exc
    del pgvector, psycopg_pool
    return psycopg
