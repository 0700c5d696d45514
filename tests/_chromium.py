"""Debian's chromium through selenium and the system chromedriver, for the tests that need a real browser.

Install it with ``apt-get install -y chromium chromium-driver`` (``.ci/run`` does); without it, the modules that
use :data:`BROWSER_MARKS` skip and say so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = os.environ.get("SE_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
HOW = "install it with: apt-get install -y chromium chromium-driver && pip install selenium"

#: The module marks of a browser test: slow, and skipped (saying how to install) without chromium or its driver.
BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"chromium is not installed; {HOW}"),
    pytest.mark.skipif(not Path(DRIVER).exists(), reason=f"chromedriver is not installed; {HOW}"),
]


@contextlib.contextmanager
def headless_chromium(window: str, *, console_log: bool = False) -> Iterator[Any]:
    """A headless chromium (as root: no sandbox), quiet: no background networking, no updates, no sync.

    Args:
        window: ``"WIDTH,HEIGHT"``.
        console_log: Keep the page's console log (``driver.get_log("browser")``).
    """
    webdriver = pytest.importorskip("selenium.webdriver", reason=f"selenium is not installed; {HOW}")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--window-size={window}",
    ):
        options.add_argument(flag)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_in_browser(condition: Any, timeout_s: float = 20.0) -> Any:
    """``condition()``'s first truthy value, polled every 20 ms for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting in the browser")
