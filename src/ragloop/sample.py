"""The bundled sample knowledge base: help-center pages of the fictional "Lumen" product, and its tickets.

:func:`sample_index` builds the index on first use and caches it; later calls load the cached copy. The cache
key covers the pages' content and the embedder, so editing a page or installing the ``[embed]`` extra makes
a fresh index. A cached index an older ragloop saved without heading vectors is saved again once with them, so
later starts load them instead of embedding the sample's headings.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from ragloop._log import get_logger

if TYPE_CHECKING:
    from ragloop.retrievers.base import Embedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.sql import TenantKey

__all__ = [
    "SAMPLE_CRM_ALLOW",
    "SAMPLE_CRM_TENANTS",
    "default_cache_dir",
    "sample_crm_path",
    "sample_index",
    "sample_kb_path",
    "sample_plan_questions_path",
    "sample_questions_path",
]

log = get_logger("ragloop.sample")
_DATA = Path(__file__).parent / "data"


def sample_kb_path() -> Path:
    """Folder of the sample knowledge base's markdown pages."""
    return _DATA / "sample_kb"


def sample_questions_path() -> Path:
    """JSON lines of sample questions with their expected sources (for tests and benchmarks)."""
    return _DATA / "sample_questions.jsonl"


#: The tables and columns of the sample CRM database a SQL source may read (its ``secrets`` table is left out).
SAMPLE_CRM_ALLOW: dict[str, tuple[str, ...]] = {
    "customers": ("id", "name", "plan", "region", "seats", "status", "signed_up", "churned_on"),
    "orders": ("id", "customer_id", "plan", "seats", "amount_usd", "status", "ordered"),
    "tickets": ("id", "customer_id", "priority", "status", "opened", "error_code"),
}


def _crm_tenants() -> dict[str, TenantKey]:
    from ragloop.retrievers.sql import TenantKey

    by_customer = TenantKey("customer_id", via=("customers", "id", "name"))
    return {"customers": TenantKey("name"), "orders": by_customer, "tickets": by_customer}


#: Whose rows are whose in the sample CRM: the organisation is the customer's ``name`` (as in the sample ticket
#: database), and orders and tickets belong to it through ``customer_id``. ``SQLiteSource(…, tenants=…)`` with
#: these shows a caller only their own organisation's rows.
SAMPLE_CRM_TENANTS: dict[str, TenantKey] = _crm_tenants()


def sample_crm_path() -> Path:
    """The sample CRM database (customers, orders, ticket index) built by ``scripts/build_sample_crm.py``."""
    return _DATA / "crm.sqlite"


def sample_plan_questions_path() -> Path:
    """JSON lines of sample questions that need SQL, then documents (for the planner's tests and benchmark)."""
    return _DATA / "plan_questions.jsonl"


def default_cache_dir() -> Path:
    """``~/.cache/ragloop``."""
    return Path.home() / ".cache" / "ragloop"


def _content_key(embedder: Embedder) -> str:
    from ragloop.retrievers.ingest import INGEST_VERSION

    digest = hashlib.sha256(f"{embedder.name}:{embedder.dim}:ingest-{INGEST_VERSION}".encode())
    for page in sorted(sample_kb_path().rglob("*.md")):
        digest.update(page.name.encode())
        digest.update(page.read_bytes())
    return digest.hexdigest()[:16]


def sample_index(cache_dir: Path | None = None, *, embedder: Embedder | None = None) -> KnowledgeIndex:
    """The sample knowledge base's index, built on first use and cached under ``cache_dir``."""
    from ragloop.errors import IndexError_
    from ragloop.retrievers.embed import default_embedder
    from ragloop.retrievers.index import KnowledgeIndex
    from ragloop.retrievers.ingest import ingest_path

    emb = embedder or default_embedder()
    target = (cache_dir or default_cache_dir()) / f"sample-{_content_key(emb)}"
    if target.exists():
        try:
            cached = KnowledgeIndex.load(target, emb)
        except IndexError_ as exc:
            log.warning("sample_index.rebuild", path=str(target), reason=str(exc))
        else:
            if cached.lacks_heading_vectors:  # cached by an older ragloop: keep them now, once
                _cache(cached, target)
            return cached
    result = ingest_path(sample_kb_path())
    index = KnowledgeIndex.build(result.chunks, emb)
    _cache(index, target)
    log.info("sample_index.built", chunks=len(result.chunks), path=str(target), seconds=round(result.seconds, 3))
    return index


def _cache(index: KnowledgeIndex, target: Path) -> None:
    """Save ``index`` to the cache folder ``target``; a read-only home or a full disk still answers (logged
    ``sample_index.not_cached``): the next start builds or saves again."""
    from ragloop.errors import IndexError_

    try:
        index.save(target)
    except (OSError, IndexError_) as exc:
        log.warning("sample_index.not_cached", path=str(target), error=str(exc))
