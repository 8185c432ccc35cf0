"""What a user or a container chose is shown, never obeyed (issue 24): a `gpupin.devices` label holding a screen
clear (ESC [ 2 J), an OSC 8 link, a newline and a quote, and a process whose name carries markup and escapes, on
the sandbox. `ls` and another user's refusal (75) show them through the one rule (gpupin.core.errors.shown: on
one line, escaped), and the dashboard shows them as text, in a real headless Chromium. The metrics' escaping:
tests/unit/test_serve.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.support.processes import error_line, on_cards
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")
CHROMIUM = "/usr/bin/chromium"
EVIL = 'x\x1b[2J\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\nsecond "line'
COMM = '<b id=pwn>\x1b[2J"'  # 15 bytes at most: the kernel's comm


@pytest.fixture
def evil_process() -> Iterator[int]:
    """A host process whose name (/proc/PID/status Name) carries markup and a screen clear."""
    code = f"open('/proc/self/comm', 'w').write({COMM!r}); print(flush=True); import time; time.sleep(300)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"\n"
    yield p.pid
    p.kill()
    p.wait()


def labelled(agent: Agent) -> str:
    """A container given card 1 by `--gpus`, labelled `gpupin.devices=EVIL` (a MISMATCH: shown with its label)."""
    return agent.sandbox.docker(
        "run", "-d", "--name", f"evil-{agent.tag}", "--label", f"gpupin.test={agent.tag}",
        "--label", f"gpupin.devices={EVIL}", "--gpus", f"device={RTX}", "--entrypoint", "sleep", TEST_IMAGE, "300",
        check=True,
    ).stdout.strip()  # fmt: skip


def test_ls_and_refusals_show_a_containers_text_escaped(agent: Agent, tmp_path: Path, evil_process: int) -> None:
    cid = labelled(agent)
    env = {**agent.env, **on_cards(tmp_path / "p.json", {A800: [evil_process]})}
    table = subprocess.run(agent.argv("ls", "--color", "never"), env=env, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "\x1b" not in table.stdout and "\x07" not in table.stdout, table.stdout
    assert "MISMATCH: labelled 'x\\x1b[2J\\x1b]8;;http://evil.example/\\x07click\\x1b]8;;\\x07\\nsecond \"line'" in (
        table.stdout
    ), table.stdout
    assert "'<b id=pwn>\\x1b[2J\"'" in table.stdout, table.stdout
    # Another user's refusal names the holder: one line, nothing the terminal obeys.
    held = subprocess.run(agent.argv("run", "--rm", "--gpu", "1", TEST_IMAGE), env=env, capture_output=True, text=True)
    line = error_line(held, 75)
    assert held.stderr.count("\n") == 1 and "\x1b" not in held.stderr, held.stderr
    assert f"evil-{agent.tag} ({cid[:12]}" in line and "MISMATCH: labelled 'x\\x1b[2J" in line, line
    used = subprocess.run(agent.argv("run", "--rm", "--gpu", "0", TEST_IMAGE), env=env, capture_output=True, text=True)
    line = error_line(used, 75)
    assert "\x1b" not in used.stderr and f"pid {evil_process} of " in line and "'<b id=pwn>\\x1b[2J\"'" in line, line


def test_the_dashboard_shows_a_process_name_as_text(agent: Agent, tmp_path: Path, evil_process: int) -> None:
    labelled(agent)
    resident = Resident({**agent.env, **on_cards(tmp_path / "p.json", {A800: [evil_process]})})
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                tab = browser.new_page()
                tab.goto(resident.url + "/")
                cell = f".card[data-uuid='{A800}'] table.processes tr:nth-child(2) td:nth-child(4)"
                tab.wait_for_selector(cell, timeout=10_000)
                assert tab.text_content(cell) == COMM  # the name itself, as text
                assert tab.query_selector("#pwn") is None  # no element made from it
                time.sleep(1.5)  # a refresh later, still none
                assert tab.query_selector("#pwn") is None and tab.query_selector_all("b#pwn") == []
            finally:
                browser.close()
    finally:
        resident.close()
