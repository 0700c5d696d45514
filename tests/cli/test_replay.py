"""`ragloop replay` through the CLI on a real index and a real SQLite turn log: fixed, broken, walls, outputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.cli import main
from ragloop.turn import Turn
from ragloop.turnlog import TurnLog

PAGES = {
    "keys.md": "---\ntenant: acme\n---\n# API keys\n\nTo rotate an API key, create a new key and revoke the old one.\n",
    "billing.md": "---\ntenant: acme\n---\n# Billing\n\nInvoices are sent on the first day of each month by email.\n",
    "globex.md": "---\ntenant: globex\n---\n# Globex exports\n\nExports are written as CSV files every night.\n",
}
ZAPIER = (
    "---\ntenant: acme\n---\n# Zapier\n\nTo connect Zapier, open Settings, then Integrations, and paste your "
    "Zapier webhook URL. The Zapier integration sends every new task to Zapier.\n"
)
QUESTIONS = [
    ("How do I rotate an API key?", "acme"),
    ("When are invoices sent?", "acme"),
    ("How do I connect Zapier?", "acme"),
    ("How do I connect Zapier?", "acme"),
    ("How do I connect Zapier?", "globex"),  # another tenant: acme's new page must not answer it
]


def index(root: Path, name: str, pages: dict[str, str]) -> Path:
    """An index (hash embedder) of ``pages``."""
    kb = root / f"{name}-kb"
    kb.mkdir()
    for page, text in pages.items():
        (kb / page).write_text(text, encoding="utf-8")
    assert main(["index", str(kb), "--out", str(root / name), "--embedder", "hash"]) == 0
    return root / name


def log_turns(idx: Path, url: str, questions: list[tuple[str, str]]) -> list[Any]:
    """Ask ``questions`` (question, tenant) through a chat that logs to ``url``; the replies."""
    log = TurnLog.open(url)
    rag = ChatRAG(Turn.from_index(idx), turn_log=log)

    async def run() -> list[Any]:
        try:
            return [await rag.ask(q, filters={"tenant": t}, principal=t) for q, t in questions]
        finally:
            await rag.aclose()

    replies = anyio.run(run)
    assert log.stats().written == len(questions)
    return replies


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The old index (no Zapier page), the new one (with it), one without billing, and a log on the old one."""
    root = tmp_path_factory.mktemp("replay")
    old = index(root, "old", PAGES)
    new = index(root, "new", {**PAGES, "zapier.md": ZAPIER})
    cut = index(root, "cut", {k: v for k, v in {**PAGES, "zapier.md": ZAPIER}.items() if k != "billing.md"})
    replies = log_turns(old, f"sqlite:{root / 'turns.db'}", QUESTIONS)
    assert [r.outcome for r in replies] == ["context", "context", "none", "none", "none"]
    return {"old": old, "new": new, "cut": cut, "log": root / "turns.db", "root": root}


def replay(kb: dict[str, Path], which: str, *extra: str) -> int:
    return main(["replay", "--turn-log", f"sqlite:{kb['log']}", "--index", str(kb[which]), *extra])


class TestReplayCommand:
    def test_fixed_exit_0_and_walls_hold(self, kb: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """Adding the page fixes acme's question (two turns, one line) and not globex's: exit 0."""
        capsys.readouterr()
        assert replay(kb, "new", "--json") == 0
        out, err = capsys.readouterr()
        data = json.loads(out)
        assert data["summary"]["fixed"] == 1 and data["summary"]["broken"] == 0 and data["summary"]["turns"] == 5
        [fixed] = [i for i in data["items"] if i["verdict"] == "fixed"]
        assert fixed["filters"] == {"tenant": ["acme"]} and fixed["turns"] == 2
        assert fixed["after"] == {"outcome": "context", "pages": ["zapier.md"]}
        globex = [i for i in data["items"] if i["filters"] == {"tenant": ["globex"]}]
        assert [(i["verdict"], i["after"]["outcome"]) for i in globex] == [("same", "none")]
        assert "ragloop replay: 4/4 questions" in err

    def test_deleted_page_broken_exit_1(
        self, kb: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Deleting the billing page breaks its question: exit 1, the table, the Markdown and the JUnit say so."""
        capsys.readouterr()
        junit = tmp_path / "replay.xml"
        assert replay(kb, "cut", "--junit", str(junit)) == 1
        out = capsys.readouterr().out
        assert "1 broken, 1 fixed" in out and "BROKEN   When are invoices sent?" in out
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "4"
        assert replay(kb, "cut", "--markdown") == 1
        md = capsys.readouterr().out
        assert md.startswith("### ragloop replay: ❌ something broke") and "`billing.md`" in md

    def test_same_log_same_report(self, kb: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """Two replays of the same log on the same index print the same report; the old index changes nothing."""
        capsys.readouterr()
        replay(kb, "new", "--json")
        first = json.loads(capsys.readouterr().out)
        replay(kb, "new", "--json")
        assert json.loads(capsys.readouterr().out) == first
        assert replay(kb, "old", "--json") == 0
        assert {i["verdict"] for i in json.loads(capsys.readouterr().out)["items"]} == {"same"}

    def test_limit_and_since(self, kb: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """--limit 1 replays the latest turn only; a bad --limit is one line, exit 2."""
        capsys.readouterr()
        assert replay(kb, "new", "--json", "--limit", "1") == 0
        data = json.loads(capsys.readouterr().out)
        assert data["summary"]["turns"] == 1 and data["items"][0]["filters"] == {"tenant": ["globex"]}
        assert replay(kb, "new", "--limit", "0") == 2
        assert "--limit must be at least 1" in capsys.readouterr().err

    def test_missing_log_and_missing_kb(self, kb: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
        """No such log: one line, exit 2; --index or --store is required."""
        capsys.readouterr()
        assert main(["replay", "--turn-log", f"sqlite:{kb['root'] / 'none.db'}", "--index", str(kb["new"])]) == 2
        assert capsys.readouterr().err.count("\n") == 1
        with pytest.raises(SystemExit):
            main(["replay", "--turn-log", f"sqlite:{kb['log']}"])
