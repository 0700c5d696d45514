"""The chat page renders a reply's markdown (bold, code, lists, tables, links) as safe DOM, in a real browser,
and takes its title and accent colour from the settings (``ragloop serve --title --colour``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from ragloop.serve import ServeSettings, create_app
from ragloop.state import ContextBlock, Message, Outcome
from tests._chromium import BROWSER_MARKS, HOW, headless_chromium, wait_in_browser
from tests.serve.conftest import fake_rag, serving

pytestmark = BROWSER_MARKS
webdriver = pytest.importorskip("selenium.webdriver", reason=f"selenium is not installed; {HOW}")

#: A reply in the offline answerer's markdown, with the hostile pieces a page or a model could put in one.
REPLY = (
    "Keys are rotated from **Settings → API keys**: create a new key with `lumen keys create` first. [1]\n\n"
    "| Plan | Keys per workspace |\n|---|---|\n| Team | **20** |\n\n[1]\n\n"
    "- deploy the new key\n- revoke the old one\n\n"
    "1. one\n2. two\n\n"
    "```\nlumen keys revoke <old-id>\n```\n\n"
    "See [the guide](https://docs.example.com/rotate) or [this](javascript:window.__xss=1). "
    '<img src=x onerror="window.__xss=1"> <script>window.__xss=1</script> '
    "**<svg onload=window.__xss=1>** `<b onmouseover=window.__xss=1>x</b>` [9]"
)


class _Markdown:
    """An answerer that streams :data:`REPLY` (what a model or the offline answerer could write)."""

    async def answer(
        self,
        question: str,
        blocks: Sequence[ContextBlock],
        outcome: Outcome,
        *,
        missing: Sequence[str] = (),
        direct_reply: str | None = None,
        history: Sequence[Message] = (),
    ) -> AsyncIterator[str]:
        for token in REPLY.split(" "):
            yield token + " "


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium for the chat page (console log kept: a CSP refusal shows there)."""
    with headless_chromium("1000,1100", console_log=True) as driver:
        yield driver


def _answer(browser: Any, url: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(url + "/")
    box = browser.find_element(By.ID, "question")
    box.send_keys("How do I rotate an API key?")
    box.send_keys(Keys.ENTER)
    bot = wait_in_browser(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.bot"))[-1]
    wait_in_browser(lambda: bot.find_element(By.CSS_SELECTOR, ".outcome").get_attribute("data-outcome"))
    return bot.find_element(By.CSS_SELECTOR, ".answer")


class TestMarkdown:
    def test_bold_code_lists_tables_and_links_render(self, browser: Any) -> None:
        """The finished reply shows bold as <strong>, code as <code>/<pre>, lists as <li>, a table with its
        header cells, an http(s) link as a new-tab link, and [n] as a link to its source."""
        from selenium.webdriver.common.by import By

        with serving(create_app(fake_rag(answerer=_Markdown()))) as url:
            answer = _answer(browser, url)
            assert [s.text for s in answer.find_elements(By.CSS_SELECTOR, "strong")][:2] == [
                "Settings → API keys",
                "20",
            ]
            assert "lumen keys create" in [c.text for c in answer.find_elements(By.CSS_SELECTOR, "p code")]
            assert answer.find_element(By.CSS_SELECTOR, "pre code").text == "lumen keys revoke <old-id>"
            assert [li.text for li in answer.find_elements(By.CSS_SELECTOR, "ul li")] == [
                "deploy the new key",
                "revoke the old one",
            ]
            assert len(answer.find_elements(By.CSS_SELECTOR, "ol li")) == 2
            assert [th.text for th in answer.find_elements(By.CSS_SELECTOR, "table th")] == [
                "Plan",
                "Keys per workspace",
            ]
            assert [td.text for td in answer.find_elements(By.CSS_SELECTOR, "table td")] == ["Team", "20"]
            guide = answer.find_element(By.LINK_TEXT, "the guide")
            assert guide.get_attribute("href") == "https://docs.example.com/rotate"
            assert guide.get_attribute("rel") == "noopener noreferrer" and guide.get_attribute("target") == "_blank"
            cites = answer.find_elements(By.CSS_SELECTOR, "sup a")
            assert cites and cites[0].get_attribute("href").endswith("-src-1")
            assert "**" not in answer.text and "`" not in answer.text.replace("`<b", "")

    def test_hostile_markup_stays_text(self, browser: Any) -> None:
        """<img onerror>, <script>, <svg onload> and a javascript: link stay text, an unknown [9] is no link:
        nothing runs, no element but the whitelisted ones exists in the answer, and the CSP is never violated."""
        from selenium.webdriver.common.by import By

        with serving(create_app(fake_rag(answerer=_Markdown()))) as url:
            browser.get_log("browser")  # drop what came before
            answer = _answer(browser, url)
            time.sleep(0.2)  # an onerror would have fired by now
            assert browser.execute_script("return window.__xss") is None
            tags = set(
                browser.execute_script(
                    "return [...arguments[0].querySelectorAll('*')].map((e) => e.tagName.toLowerCase())", answer
                )
            )
            assert tags <= {
                "p",
                "br",
                "strong",
                "em",
                "code",
                "pre",
                "ul",
                "ol",
                "li",
                "table",
                "tr",
                "th",
                "td",
                "a",
                "sup",
            }
            links = [a.get_attribute("href") for a in answer.find_elements(By.CSS_SELECTOR, "a")]
            assert all(h.startswith(("https://", url)) for h in links), links
            assert '<img src=x onerror="window.__xss=1">' in answer.text and "[this](javascript:" in answer.text
            assert not [a for a in answer.find_elements(By.CSS_SELECTOR, "sup a") if a.text == "[9]"]
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == []


class TestTitleAndColour:
    def test_the_page_takes_its_title_and_accent_colour(self, browser: Any) -> None:
        """``page_title`` names the page and its heading (escaped: markup in it is text); ``page_colour`` is the
        accent of its buttons."""
        from selenium.webdriver.common.by import By

        settings = ServeSettings(page_title="Acme help <b>centre</b>", page_colour="#aa2200")
        with serving(create_app(fake_rag(), settings=settings)) as url:
            browser.get(url + "/")
            assert browser.title == "Acme help <b>centre</b>"
            assert browser.find_element(By.CSS_SELECTOR, "header h1").text == "Acme help <b>centre</b>"
            assert browser.find_element(By.ID, "send").value_of_css_property("background-color") in (
                "rgb(170, 34, 0)",
                "rgba(170, 34, 0, 1)",
            )
            assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
