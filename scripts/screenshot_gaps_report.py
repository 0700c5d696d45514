"""Make docs/gaps-report.png: the ``ragloop gaps`` HTML report of the planted week, as Chromium shows it.

The week is the end-to-end test's scenario (``tests/gaps/scenario.py``: 300 turns over a copy of the sample
knowledge base with five planted gap topics, a stale page and a contradicting page), run offline with the hash
embedder. Needs chromium, chromedriver and selenium (the ``[test]`` extra)::

    .venv/bin/python scripts/screenshot_gaps_report.py [--out docs/gaps-report.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.gaps.scenario import START, planted_kb, traffic  # noqa: E402

from ragloop.chat import ChatRAG  # noqa: E402
from ragloop.cli import main  # noqa: E402
from ragloop.turn import Turn  # noqa: E402
from ragloop.turnlog import TurnLog  # noqa: E402


def week(root: Path) -> Path:
    """The scenario's turn log under ``root``."""
    kb = planted_kb(root / "kb")
    main(["index", str(kb), "--out", str(root / "index"), "--embedder", "hash"])
    clock = {"now": START}
    log = TurnLog.open(f"sqlite:{root / 'turns.db'}", clock=lambda: clock["now"])
    rag = ChatRAG(Turn.from_index(root / "index"), turn_log=log)

    async def run() -> None:
        for turn in traffic():
            clock["now"] = turn.at
            reply = await rag.ask(turn.question, principal=turn.user)
            if turn.rate_down:
                await rag.feedback(reply.turn_id, "down", comment="which is it?", principal=turn.user)
        await rag.aclose()

    anyio.run(run)
    return root / "turns.db"


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "gaps-report.png"))
    parser.add_argument("--height", type=int, default=1250, help="window height: how much of the page is shown")
    args = parser.parse_args(argv)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = week(root)
        html = root / "report.html"
        main(
            [
                "gaps",
                "--turn-log",
                f"sqlite:{log}",
                "--since",
                "2025-05-05",
                "--until",
                "2025-05-12",
                "--html",
                str(html),
            ]
        )
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--window-size=900,{args.height}",
            "--force-device-scale-factor=1",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
        try:
            driver.get(html.as_uri())
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
    print(f"wrote {args.out} ({Path(args.out).stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
