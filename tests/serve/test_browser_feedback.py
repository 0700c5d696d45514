"""Thumbs up and down on the chat page, in a real browser: shown only when the server keeps a turn log, and the
rating reaches the log under the asker's key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragloop.serve import ServeSettings, create_app
from ragloop.turnlog import TurnLog
from tests._chromium import wait_in_browser
from tests.serve.conftest import fake_rag, serving
from tests.serve.test_browser import _ask, browser, pytestmark

__all__ = ["browser", "pytestmark"]


def test_thumbs_down_reaches_the_turn_log(browser: Any, tmp_path: Path) -> None:
    """After the answer, 'Not helpful' posts the rating with the page's API key; the page thanks the user and the
    turn log holds the rating; a server without a log shows no thumbs."""
    from selenium.webdriver.common.by import By

    rag = fake_rag()
    rag.turn_log = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}")
    with serving(create_app(rag, settings=ServeSettings(api_keys=("key-alice",)))) as url:
        browser.get(url + "/")
        browser.execute_script("sessionStorage.setItem('ragloop-key', 'key-alice')")
        browser.get(url + "/")
        _ask(browser, "How do I rotate an API key?")
        bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
        down = wait_in_browser(lambda: bot.find_elements(By.CSS_SELECTOR, ".feedback button.rate-down"))[0]
        assert down.get_attribute("aria-label") == "Not helpful"
        down.click()
        status = bot.find_element(By.CSS_SELECTOR, ".feedback-status")
        wait_in_browser(lambda: status.text == "Thanks for the feedback.")
        assert down.get_attribute("aria-pressed") == "true"
        assert all(b.get_attribute("disabled") for b in bot.find_elements(By.CSS_SELECTOR, ".feedback button"))
        logs = browser.get_log("browser") if "browser" in browser.log_types else []
        assert not logs, logs
    rag.turn_log.close()
    [turn] = TurnLog.open(f"sqlite:{tmp_path / 'turns.db'}").turns()
    assert turn.rating == "down"

    plain = fake_rag()
    with serving(create_app(plain)) as url:
        browser.get(url + "/")
        _ask(browser, "How do I rotate an API key?")
        bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
        wait_in_browser(lambda: bot.find_element(By.CSS_SELECTOR, ".outcome").get_attribute("data-outcome"))
        assert bot.find_elements(By.CSS_SELECTOR, ".feedback") == []
