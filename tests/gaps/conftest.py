"""The planted week of traffic, built once per session for the end-to-end and browser tests of ``ragloop gaps``."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.cli import main
from ragloop.turn import Turn
from ragloop.turnlog import TurnLog
from tests.gaps.scenario import START, planted_kb, traffic


@pytest.fixture(scope="session")
def week(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The planted knowledge base, its index (hash embedder) and a turn log of the scenario's 300 turns."""
    root = tmp_path_factory.mktemp("gaps-e2e")
    kb = planted_kb(root / "kb")
    assert main(["index", str(kb), "--out", str(root / "index"), "--embedder", "hash"]) == 0
    clock = {"now": START}
    log = TurnLog.open(f"sqlite:{root / 'turns.db'}", clock=lambda: clock["now"])
    rag = ChatRAG(Turn.from_index(root / "index"), turn_log=log)

    async def run() -> None:
        for turn in traffic():
            clock["now"] = turn.at
            reply = await rag.ask(turn.question, principal=turn.user)
            if turn.rate_down:
                assert await rag.feedback(reply.turn_id, "down", comment="which is it?", principal=turn.user)
        await rag.aclose()

    anyio.run(run)
    stats = log.stats()
    assert (stats.written, stats.dropped, stats.errors) == (300, 0, 0)
    return {"kb": kb, "index": root / "index", "log": root / "turns.db", "root": root}
