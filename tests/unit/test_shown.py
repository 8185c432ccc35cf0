"""Text that hostagent did not write is shown, never obeyed (issue 24), on the simulated host: a card name holding a
quote, a backslash, a newline and a screen clear survives a Prometheus scrape parse exactly (the metric labels are
escaped), and `ls` shows it on one line through the one rule (gpupin.core.errors.shown). With a daemon (labels,
refusals, the dashboard): tests/docker/test_shown.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.host import HOSTAGENT, simhost_env
from tests.support.resident import Resident
from tests.support.scenarios import topology, uuids

A800 = uuids("mixed-4")[0]
NAME = 'NVIDIA "A800" \\ x\nsecond\x1b[2J'


def odd_host(tmp_path: Path) -> dict[str, str]:
    topo = topology("mixed-4")
    next(g for g in topo["gpus"] if g["uuid"] == A800)["name"] = NAME
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(topo))
    return simhost_env("mixed-4", FAKEGPU_TOPOLOGY=str(path), DOCKER_HOST=f"unix://{tmp_path}/none.sock")


def test_metric_labels_survive_a_scrape_parse(fakegpu: Path, tmp_path: Path) -> None:
    agent = Resident(odd_host(tmp_path))
    try:
        assert agent.card(A800)["name"] == NAME  # the fake says it as written
        text = agent.get("/metrics")[1].decode()
    finally:
        agent.close()
    names = {
        s.labels.get("modelName")
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.labels.get("UUID") == A800
    }
    assert names == {NAME}, names
    # Quotes, backslashes and newlines are escaped (the text format's three): each sample stays one line.
    assert all(line.startswith(("#", "gpupin_", "process_", "python_")) for line in text.splitlines() if line), text


def test_ls_shows_a_card_name_on_one_line(fakegpu: Path, tmp_path: Path) -> None:
    r = subprocess.run([HOSTAGENT, "ls", "--color", "never"], env=odd_host(tmp_path), capture_output=True, text=True)
    assert "\x1b" not in r.stdout and "\nsecond" not in r.stdout, r.stdout
    assert "'NVIDIA \"A800\" \\\\ x\\nsecond\\x1b[2J'" in r.stdout, r.stdout
