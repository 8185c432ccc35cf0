"""The agent's dashboard in a real headless Chromium (Debian's, driven by Playwright), against the sandboxed daemon:
the page loads, says how many cards are free and how many wait, shows every card with its last hour of load and
memory, a new holder (with the time it has held) without a reload, the queue with positions, GPU-hours by user
from the record ("no record" where the agent keeps none), markup in a process's or a user's name as text, and
stays readable at 8 and 16 cards (no sideways scroll, no clipped cell). Screenshots:
build/test-artefacts/dashboard/*.png (docs/testing.md)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from tests.support.host import REPO
from tests.support.processes import on_cards
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import scenario, uuids

CHROMIUM = "/usr/bin/chromium"  # Debian's (make test-tools): Playwright's own browser download is never used
SHOTS = REPO / "build" / "test-artefacts" / "dashboard"
A800, RTX, A800B, A800C = uuids("mixed-4")


class Browser:
    def __init__(self, p: Any) -> None:
        self.browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-background-networking"]
        )

    def tab(self, url: str, width: int = 1400) -> Page:
        tab: Page = self.browser.new_page(viewport={"width": width, "height": 900})
        tab.goto(url + "/")
        tab.wait_for_selector(".card", timeout=10_000)
        return tab


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = Browser(p)
        try:
            yield b
        finally:
            b.browser.close()


def shot(tab: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def readable(tab: Page) -> None:
    """No sideways scroll, and no cell whose text is cut (a holder's long name wraps)."""
    assert tab.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    cut = tab.eval_on_selector_all("td", "cells => cells.filter(c => c.scrollWidth > c.clientWidth + 1).length")
    assert cut == 0


def test_dashboard_summary_cards_charts_holder_queue_and_no_record(
    agent: Agent, browser: Browser, tmp_path: Path
) -> None:
    # A host process whose name is markup, on card 0: shown as written, never parsed.
    markup = "<img src=x>"
    (tmp_path / markup).symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(tmp_path / markup), "300"])
    env = {**agent.env, **on_cards(tmp_path / "p.json", {A800: [proc.pid]})}
    resident = Resident(env, "--interval", "0.2", "--http-per-user")  # the owner shows usage per user on HTTP
    agent.env["GPUPIN_AGENT_SOCKET"] = resident.socket  # the clients find this agent
    waiter: subprocess.Popen[str] | None = None
    try:
        tab = browser.tab(resident.url)
        shown = tab.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.uuid)")
        assert shown == uuids("mixed-4")
        assert tab.text_content("#hostname") == resident.ls()["hostname"]
        states = tab.eval_on_selector_all(".card", "cards => cards.map(c => c.dataset.state)")
        assert states == ["busy", "free", "busy", "free"]
        tab.wait_for_function("document.getElementById('summary').textContent === '2 of 4 free, 0 waiting'")
        # A chart of load and one of memory per card, drawn from /api/samples once it has a point.
        tab.wait_for_function("document.querySelectorAll('.chart svg polyline').length === 8", timeout=15_000)
        assert (
            tab.eval_on_selector_all(".card", "cs => cs.map(c => c.querySelectorAll('[data-chart]').length)") == [2] * 4
        )
        assert tab.locator(".processes td", has_text=markup).count() == 1
        assert tab.locator("img").count() == 0  # the markup was not parsed
        tab.evaluate("window.loadedOnce = 'yes'")  # gone if the page reloads

        name = f"dash-{uuid.uuid4().hex[:8]}-{'a-very-long-container-name-' * 3}end"
        res = agent("run", "-d", "--name", name, "--gpu", "3", "--for", "90m", TEST_IMAGE, "sleep", "300")
        assert res.returncode == 0, res.stderr
        card3 = f".card[data-uuid='{A800C}']"
        tab.wait_for_selector(f"{card3} .holder[data-name='{name}']", timeout=5_000)
        assert tab.get_attribute(card3, "data-state") == "held"
        assert tab.text_content(f"{card3} .holder td:nth-child(5)") == TEST_IMAGE
        assert tab.text_content(f"{card3} .holder .owner") == "root"  # the uid the agent created it for
        held = tab.text_content(f"{card3} .holder .held-for") or ""
        assert held.endswith("s") and held[:-1].isdigit(), held  # seconds since its start
        assert tab.text_content(f"{card3} .holder .time-left") in ("1h29m", "1h30m")  # its booking's end
        assert tab.get_attribute(f"{card3} .health-badge", "data-health") == "healthy"

        # A second run for card 3 waits in the queue: a row with its position and how long it has waited.
        waiter = agent.popen("run", "--wait", "--rm", "--gpu", "3", TEST_IMAGE, "true")
        tab.wait_for_selector(".waiter", timeout=15_000)
        row = tab.eval_on_selector_all(".waiter td", "cells => cells.map(c => c.textContent)")
        assert row[0] == "1" and row[3] in ("3", A800C) and row[4] == TEST_IMAGE and row[5].endswith("s"), row
        tab.wait_for_function("document.getElementById('summary').textContent === '1 of 4 free, 1 waiting'")
        # The record counts the holding as it runs: a bar for the user it was booked for (root, here).
        tab.evaluate("pollUsage()")
        tab.wait_for_selector(".bar[data-user='root']", timeout=10_000)
        assert (tab.text_content(".bar[data-user='root'] .value") or "").endswith(" GPU-h")
        assert tab.evaluate("window.loadedOnce") == "yes"
        readable(tab)
        shot(tab, "mixed-4")
    finally:
        if waiter is not None:
            waiter.kill()
            waiter.wait()
        resident.close()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("topology", ["dgx-8", "hgx-16"])
def test_dashboard_reads_at_8_and_16_cards(agent: Agent, browser: Browser, topology: str) -> None:
    # The agent reads this topology's NVML (the daemon's containers hold other cards: every card shows free).
    topo = {**agent.env, "FAKEGPU_TOPOLOGY": str(scenario(topology))}
    resident = Resident(topo, "--interval", "0.2", "--record", "none")
    try:
        for width in (1400, 900):
            tab = browser.tab(resident.url, width)
            n = len(uuids(topology))
            assert tab.locator(".card").count() == n
            tab.wait_for_function(
                f"document.querySelectorAll('.chart svg polyline').length === {2 * n}", timeout=15_000
            )
            summary = tab.text_content("#summary") or ""
            assert summary.endswith(f"of {n} free, 0 waiting"), summary
            assert tab.text_content(".no-record") == "no record: this agent keeps no usage record"
            readable(tab)
            shot(tab, f"{topology}-{width}")
            tab.close()
    finally:
        resident.close()


def test_usage_bars_from_the_record(agent: Agent, browser: Browser) -> None:
    """The usage view draws a bar per user, longest first, from rows of /api/usage's form, a user name that holds
    markup as text (no user of this host has one: the page's fetch is answered with such rows); an agent that serves
    no usage per user on HTTP (no --http-per-user) gets a line that says so, neither bars nor "no record"."""
    resident = Resident(agent.env, "--interval", "0.2")
    try:
        tab = browser.browser.new_page()
        rows = [{"user": "<b>bob</b>", "gpu_seconds": 7200.0, "gpu_hours": 2.0}, {"user": "alice", "gpu_hours": 10.0}]
        answer = {"since": 0, "by": "user", "rows": rows}
        # Without --http-per-user the agent serves no usage per user on HTTP: the box says so, and where to look.
        off = browser.browser.new_page()
        off.goto(resident.url + "/")
        off.wait_for_selector(".per-user-off", timeout=10_000)
        assert "hostagent usage" in (off.text_content(".per-user-off") or "")
        assert off.locator(".bar").count() == 0 and off.locator(".no-record").count() == 0
        off.close()
        tab.route("**/api/usage*", lambda route: route.fulfill(status=200, json=answer))
        tab.goto(resident.url + "/")
        tab.wait_for_selector(".bar", timeout=10_000)
        bars = tab.eval_on_selector_all(".bar", "bs => bs.map(b => [b.dataset.user, b.textContent])")
        assert bars == [["alice", "alice10.0 GPU-h"], ["<b>bob</b>", "<b>bob</b>2.0 GPU-h"]], json.dumps(bars)
        assert tab.locator("#usage b").count() == 0
        widths = tab.eval_on_selector_all(".bar .fill", "fs => fs.map(f => f.getBoundingClientRect().width)")
        assert widths[0] > 4 * widths[1]
        shot(tab, "usage")
    finally:
        resident.close()
