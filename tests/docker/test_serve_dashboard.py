"""The agent's dashboard in a real headless Chromium (Debian's, driven by Playwright), against the sandboxed daemon:
the page loads, shows every card, and shows a new holder without a reload."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids

CHROMIUM = "/usr/bin/chromium"  # Debian's (make test-tools): Playwright's own browser download is never used


@pytest.fixture
def page(agent: Agent) -> Iterator[tuple[Resident, Page]]:
    resident = Resident(agent.env)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-background-networking"]
        )
        try:
            tab = browser.new_page()
            yield resident, tab
        finally:
            browser.close()
            resident.close()


def test_dashboard_shows_every_card_and_a_new_holder_without_reload(agent: Agent, page: tuple[Resident, Page]) -> None:
    resident, tab = page
    tab.goto(resident.url + "/")
    tab.wait_for_selector(".card", timeout=10_000)
    shown = tab.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.uuid)")
    assert shown == uuids("mixed-4")
    assert tab.text_content("#hostname") == resident.ls()["hostname"]
    states = tab.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.state)")
    assert states == ["free", "free", "busy", "free"]
    tab.evaluate("window.loadedOnce = 'yes'")  # gone if the page reloads
    name = f"dash-{uuid.uuid4().hex[:8]}"
    res = agent("run", "-d", "--name", name, "--gpu", "3", TEST_IMAGE, "sleep", "300")
    assert res.returncode == 0, res.stderr
    card3 = f".card[data-uuid='{uuids('mixed-4')[3]}']"
    tab.wait_for_selector(f"{card3} .holder[data-name='{name}']", timeout=5_000)
    assert tab.get_attribute(card3, "data-state") == "held"
    assert tab.text_content(f"{card3} .holder td:nth-child(3)") == TEST_IMAGE
    assert tab.evaluate("window.loadedOnce") == "yes"
