"""The issue's "done when", through the real CLI, on SQLite (log) + a local index and on PostgreSQL (log) + a
PostgreSQL store: log turns on a knowledge base missing a topic → `gaps` shows it open → add the page →
`replay --mark-gaps` reports its questions fixed, exit 0 → `gaps` shows it fixed (same id) → users are answered
→ delete the page → `replay` reports broken, exit 1 → `gaps` shows it reopened."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.cli import main
from ragloop.turn import Turn
from ragloop.turnlog import TurnLog
from tests.retrievers.conftest import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]

PAGES = {
    "keys.md": "# API keys\n\nTo rotate an API key, create a new key and revoke the old one.\n",
    "billing.md": "# Billing\n\nInvoices are sent on the first day of each month by email.\n",
    "exports.md": "# Exports\n\nExports are written as CSV files every night and kept for 30 days.\n",
}
ZAPIER = (
    "# Zapier\n\nTo connect Zapier to your workspace, open Settings, then Integrations, and paste your Zapier "
    "webhook URL. The Zapier integration sends every new task to Zapier.\n"
)
GAP = ["How do I connect Zapier?", "How can I connect Zapier to my workspace?", "Connect Zapier: how?"]
ANSWERED = ["How do I rotate an API key?", "When are invoices sent?"]
_dbs = itertools.count()


def _ask(chat: ChatRAG, questions: list[str]) -> list[str]:
    async def run() -> list[str]:
        try:
            return [(await chat.ask(q, principal="key:1")).outcome for q in questions]
        finally:
            await chat.aclose()

    return anyio.run(run)


def _gaps(log: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["gaps", "--turn-log", log, "--since", "1d", "--json", "--min-turns", "2"]) == 0
    [topic] = [t for t in json.loads(capsys.readouterr().out)["topics"] if "zapier" in t["label"]]
    return topic  # type: ignore[no-any-return]


def _replay(log: str, kb: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    status = main(["replay", "--turn-log", log, *kb, "--since", "1", "--mark-gaps", "--json"])
    return status, json.loads(capsys.readouterr().out)


class _Site:
    """One backend pairing: where the turn log lives, and how the knowledge base is written and opened."""

    def __init__(self, log: str, write: Callable[[Path], list[str]], open_chat: Callable[[list[str]], ChatRAG]):
        self.log, self.write, self.open_chat = log, write, open_chat


@pytest.fixture(params=["sqlite", "postgres"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> _Site:
    """SQLite log + local index, or Postgres log + Postgres store (one fresh database each)."""
    if request.param == "sqlite":
        out = tmp_path / "index"

        def write_index(kb: Path) -> list[str]:
            assert main(["index", str(kb), "--out", str(out), "--embedder", "hash"]) == 0
            return ["--index", str(out)]

        return _Site(f"sqlite:{tmp_path / 'turns.db'}", write_index, lambda kb: ChatRAG(Turn.from_index(kb[1])))
    import psycopg

    url = request.getfixturevalue("pg_url")
    name = f"loop{next(_dbs)}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"drop database if exists {name}")
        admin.execute(f"create database {name}")
    db = url.replace("/postgres?", f"/{name}?")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("create extension if not exists vector")

    def write_store(kb: Path) -> list[str]:
        assert main(["index", str(kb), "--store", db, "--collection", "kb", "--embedder", "hash", "--prune"]) == 0
        return ["--store", db, "--collection", "kb"]

    return _Site(db, write_store, lambda kb: ChatRAG(Turn.from_store(kb[1], collection="kb")))


def test_gap_open_fixed_broken_reopened(site: _Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole loop, each step through `ragloop` itself."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for page, text in PAGES.items():
        (docs / page).write_text(text, encoding="utf-8")
    kb = site.write(docs)

    def logged_chat() -> ChatRAG:
        chat = site.open_chat(kb)
        chat.turn_log = TurnLog.open(site.log)
        return chat

    assert _ask(logged_chat(), GAP + ANSWERED) == ["none", "none", "none", "context", "context"]

    opened = _gaps(site.log, capsys)
    assert opened["status"] == "open" and opened["turns"] == 3 and opened["gap_id"].startswith("g-")

    (docs / "zapier.md").write_text(ZAPIER, encoding="utf-8")
    kb = site.write(docs)
    status, report = _replay(site.log, kb, capsys)
    assert status == 0 and report["summary"]["broken"] == 0
    fixed = {i["question"]: i for i in report["items"] if i["verdict"] == "fixed"}
    assert set(fixed) == set(GAP) and all(i["after"]["pages"] == ["zapier.md"] for i in fixed.values())

    now_fixed = _gaps(site.log, capsys)
    assert now_fixed["gap_id"] == opened["gap_id"] and now_fixed["status"] == "fixed"

    assert _ask(logged_chat(), GAP[:2]) == ["context", "context"]  # users now get answers from the page

    (docs / "zapier.md").unlink()
    kb = site.write(docs)
    status, report = _replay(site.log, kb, capsys)
    assert status == 1
    broken = {i["question"]: i for i in report["items"] if i["verdict"] == "broken"}
    assert set(broken) == set(GAP[:2]) and broken[GAP[0]]["before"]["pages"] == ["zapier.md"]

    reopened = _gaps(site.log, capsys)
    assert reopened["gap_id"] == opened["gap_id"] and reopened["status"] == "reopened"
