"""The gap report in a real browser (Debian's chromium through selenium): one file that renders its charts and
topics from disk, with nothing fetched and nothing refused by its Content-Security-Policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragloop.cli import main
from tests._chromium import BROWSER_MARKS, HOW, headless_chromium

pytestmark = BROWSER_MARKS
webdriver = pytest.importorskip("selenium.webdriver", reason=f"selenium is not installed; {HOW}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium that keeps its console log."""
    with headless_chromium("1000,1400", console_log=True) as driver:
        yield driver


class TestReportPage:
    def test_report_renders_offline(
        self, week: dict[str, Path], browser: Any, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The bar chart has a bar per topic shown (the first is the top topic), the trend plot a line per series,
        every topic a section; the page loads no resource and the browser logs no error (a CSP refusal is one)."""
        from selenium.webdriver.common.by import By

        html = week["root"] / "browser.html"
        assert (
            main(
                [
                    "gaps",
                    "--turn-log",
                    f"sqlite:{week['log']}",
                    "--since",
                    "2025-05-05",
                    "--until",
                    "2025-05-12",
                    "--html",
                    str(html),
                ]
            )
            == 0
        )
        capsys.readouterr()
        browser.get(html.as_uri())
        assert browser.title == "Content gaps · ragloop"
        bars = browser.find_elements(By.CSS_SELECTOR, "#topics-chart g.bar rect")
        sections = browser.find_elements(By.CSS_SELECTOR, "section.topic")
        assert len(bars) == min(12, len(sections)) and len(sections) >= 5
        widths = [float(b.get_attribute("width")) for b in bars]
        assert widths[0] == max(widths) and all(w > 0 for w in widths)
        chart = browser.find_element(By.ID, "topics-chart")
        assert chart.size["width"] > 500 and chart.size["height"] > 100
        assert len(browser.find_elements(By.CSS_SELECTOR, "#trend-chart polyline.series")) == 4
        first = sections[0].text
        assert "contradicting sources" in first or "no passage" in first or "partly covered" in first
        assert "billing-team" in browser.find_element(By.ID, "stale").text
        badge = browser.find_element(By.CSS_SELECTOR, "section.topic .badge")
        assert badge.value_of_css_property("background-color") not in ("rgba(0, 0, 0, 0)", "transparent")
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
