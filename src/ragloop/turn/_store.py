"""Opening a Postgres store for :meth:`ragloop.turn.Turn.from_store` and reading its corpus."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragloop.errors import ConfigError
from ragloop.turn._settings import TurnSettings

if TYPE_CHECKING:
    from ragloop.retrievers.postgres import PostgresStore
    from ragloop.retrievers.scope import Corpus


def open_store(url: str, opts: dict[str, Any]) -> tuple[PostgresStore, Corpus]:
    """The store at ``url`` and its corpus (texts and metadata, for the offline judges per caller scope, and the
    dense threshold per scope: :mod:`ragloop.retrievers.postgres._meaning`).

    Pops the store's own options (``mode``, ``embedder``, ``collection``, ``pool_size``) from ``opts``; the rest
    are the turn's.

    Raises:
        ConfigError: A mode other than ``hybrid``.
    """
    import concurrent.futures

    import anyio

    from ragloop.retrievers.postgres import PostgresStore

    mode = opts.pop("mode", "hybrid")
    if mode != "hybrid":
        raise ConfigError(f"the Postgres store searches in hybrid mode only, not {mode!r}")
    store = PostgresStore(
        url,
        opts.pop("embedder", None),
        collection=opts.pop("collection", "ragloop"),
        pool_size=opts.pop("pool_size", 10),
        statement_timeout_s=opts.get("settings", TurnSettings()).retrieve_timeout_s,
        create=False,
    )

    # A thread of its own: this works whether or not the caller is inside an event loop.
    def read() -> Corpus:
        return anyio.run(store.prepare_corpus)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return store, pool.submit(read).result()
