"""The chat page in a real browser: Debian's chromium, driven by selenium through the system chromedriver.

Install the browser with ``apt-get install -y chromium chromium-driver`` (``.ci/run`` does); without it these
tests skip and say so.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ragloop.chat import ChatRAG
from ragloop.events import Token
from ragloop.serve import create_app
from tests._chromium import BROWSER_MARKS, HOW, headless_chromium, wait_in_browser
from tests.serve.conftest import serving

pytestmark = BROWSER_MARKS
webdriver = pytest.importorskip("selenium.webdriver", reason=f"selenium is not installed; {HOW}")


class _SlowTokens(ChatRAG):
    """The sample chat, with a pause after each answer token so that streaming is visible."""

    pause_s = 0.03

    async def stream(self, question: str, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for event in super().stream(question, **kwargs):
            yield event
            if isinstance(event, Token):
                await anyio.sleep(self.pause_s)


class _VerySlowTokens(_SlowTokens):
    pause_s = 2.0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium for the chat page."""
    with headless_chromium("1100,900") as driver:
        yield driver


def _ask(driver: Any, question: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, "question")
    assert driver.switch_to.active_element == box  # focused on load: type straight away
    box.send_keys(question)
    box.send_keys(Keys.ENTER)  # Enter sends


def test_streamed_cited_answer(browser: Any, sample_cache: Path, tmp_path: Path) -> None:
    """Type a question, see progress and tokens stream in, then numbered citations linking to sources."""
    from selenium.webdriver.common.by import By

    rag = _SlowTokens.sample(cache_dir=sample_cache)
    app = create_app(rag, source_url=lambda source: "https://docs.example.com/lumen/" + source)
    with serving(app) as url:
        browser.get(url + "/")
        assert browser.title == "Ask the docs · ragloop"
        _ask(browser, "How do I rotate an API key?")
        bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
        answer = bot.find_element(By.CSS_SELECTOR, ".answer")
        outcome = bot.find_element(By.CSS_SELECTOR, ".outcome")
        # streaming: part of the answer is on screen while the turn is still running
        partial = wait_in_browser(lambda: answer.text if answer.text and not outcome.text else "")
        wait_in_browser(lambda: outcome.get_attribute("data-outcome"))
        browser.save_screenshot(str(tmp_path / "chat.png"))
        final = answer.text
        assert len(final) > len(partial) and final.startswith(partial[:10])
        assert outcome.get_attribute("data-outcome") == "context"
        assert outcome.text == "Answered from the knowledge base."
        sources = bot.find_elements(By.CSS_SELECTOR, "ol.sources li")
        assert sources
        links = bot.find_elements(By.CSS_SELECTOR, "ol.sources li a")
        hrefs = [a.get_attribute("href") for a in links]
        assert "https://docs.example.com/lumen/api-keys.md" in hrefs
        assert all(a.get_attribute("rel") == "noopener noreferrer" for a in links)
        markers = bot.find_elements(By.CSS_SELECTOR, ".answer sup a")
        assert markers, "the [n] markers are links to their sources"
        target = markers[0].get_attribute("href").split("#")[1]
        assert browser.find_element(By.ID, target).tag_name == "li"
        # keyboard: focus is back in the message box, ready for the next question
        assert browser.switch_to.active_element.get_attribute("id") == "question"
        logs = browser.get_log("browser") if "browser" in browser.log_types else []
        assert not logs, logs


def test_partial_answer_says_what_is_missing_on_a_phone(browser: Any, sample_cache: Path, tmp_path: Path) -> None:
    """On a phone-sized screen, an answer the knowledge base cannot fully cover says so honestly."""
    from selenium.webdriver.common.by import By

    rag = ChatRAG.sample(cache_dir=sample_cache, live_sources=())
    with serving(create_app(rag)) as url:
        browser.set_window_size(390, 844)
        try:
            browser.get(url + "/")
            _ask(browser, "What is the status of ticket #4242?")
            bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
            outcome = bot.find_element(By.CSS_SELECTOR, ".outcome")
            kind = wait_in_browser(lambda: outcome.get_attribute("data-outcome"))
            browser.save_screenshot(str(tmp_path / "phone.png"))
            assert kind in ("partial", "none")
            assert ("Nothing found about" in outcome.text) or ("No answer found" in outcome.text)
            width = browser.execute_script("return document.documentElement.scrollWidth")
            assert width <= 390, "no sideways scrolling on a phone"
        finally:
            browser.set_window_size(1100, 900)


def test_escape_stops_the_answer_and_the_turn(browser: Any, sample_cache: Path) -> None:
    """Esc while the answer streams stops it in the page and cancels the turn on the server."""
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    rag = _VerySlowTokens.sample(cache_dir=sample_cache)
    with serving(create_app(rag)) as url:
        browser.get(url + "/")
        _ask(browser, "How do I rotate an API key?")
        bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
        answer = bot.find_element(By.CSS_SELECTOR, ".answer")
        wait_in_browser(lambda: answer.text)
        assert browser.find_element(By.ID, "send").text == "Stop"
        browser.switch_to.active_element.send_keys(Keys.ESCAPE)
        outcome = bot.find_element(By.CSS_SELECTOR, ".outcome")
        wait_in_browser(lambda: outcome.text == "Stopped.")
        assert outcome.get_attribute("role") == "alert"
        assert browser.find_element(By.ID, "send").text == "Ask"
        wait_in_browser(lambda: "ragloop_turns_cancelled_total 1.0" in httpx.get(url + "/metrics").text, timeout_s=5)


def test_the_page_keeps_a_server_session_and_starts_anew_after_a_404(browser: Any, sample_cache: Path) -> None:
    """The page holds a session id the server does not know (a restart, another key): its first question gets
    the 404, starts a new session (server-made id) and answers; the next question continues that session."""
    from selenium.webdriver.common.by import By

    from ragloop.serve import MemorySessionStore

    store = MemorySessionStore()
    rag = ChatRAG.sample(cache_dir=sample_cache)
    with serving(create_app(rag, sessions=store)) as url:
        browser.get(url + "/")
        browser.execute_script('sessionStorage.setItem("ragloop-session", "stale-or-foreign-id")')
        browser.get(url + "/")  # the page reads the stored id when it loads
        for n, question in enumerate(("How do I rotate an API key?", "And how do I revoke the old key?"), 1):
            _ask(browser, question)
            wait_in_browser(
                lambda n=n: len(browser.find_elements(By.CSS_SELECTOR, ".msg.bot .outcome[data-outcome]")) == n
            )
        outcomes = browser.find_elements(By.CSS_SELECTOR, ".msg.bot .outcome")
        assert all(o.get_attribute("data-outcome") != "error" for o in outcomes), [o.text for o in outcomes]
        sid = browser.execute_script('return sessionStorage.getItem("ragloop-session")')
    assert sid != "stale-or-foreign-id" and len(sid) == 24
    kept = anyio.run(store.load, "anonymous", sid)
    assert kept is not None and [m.role for m in kept] == ["user", "assistant", "user", "assistant"]
    assert anyio.run(store.load, "anonymous", "stale-or-foreign-id") is None
