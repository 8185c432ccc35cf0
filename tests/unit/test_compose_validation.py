"""compose validation as compose-go does it: a device request's `capabilities`, `count` and `device_ids` are read
as compose reads them (refused with compose's own words, one line, 64), and a service's `devices:` device files
(/dev/nvidiaN, or a folder above it) hold their cards in both of compose's syntaxes, for check and render alike.

The verdicts are compose's own: where Engine 26's compose v2 plugin is unpacked (build/engines/26, `make test`),
`docker compose config` is asked too and must agree with every row (it reads files without a daemon)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.compose import load
from gpupin.hostagent.compose.gpurequest import ALL
from gpupin.hostagent.compose.render import render as render_core
from gpupin.hostagent.compose.rules import examine
from tests.support.compose import V2
from tests.support.host import HOSTAGENT, required, simhost_env
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

DEPLOY = "    deploy: {{resources: {{reservations: {{devices: [{entry}]}}}}}}"


def deploy(entry: str) -> str:
    return DEPLOY.format(entry=entry)


def file(*services: str) -> str:
    """A compose file of services a, b, ... with these bodies."""
    return "services:\n" + "".join(f"  {chr(97 + i)}:\n    image: img\n{body}\n" for i, body in enumerate(services))


def hostagent(tmp_path: Path, *args: str, scenario: str = "mixed-4") -> subprocess.CompletedProcess[str]:
    # No daemon: the ledger is not read (a warning), which no row here depends on.
    env = simhost_env(scenario, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    return subprocess.run([HOSTAGENT, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def errors(text: str, scenario: str = "mixed-4") -> list[str]:
    exam = examine(load.parse(text), scenario_cards(scenario), {})
    return [p.line("f") for p in exam.problems if p.severity == "error"]


# (device request entry, what gpupin's line says or None when it passes, compose's own words or None)
ENTRIES = [
    ("{driver: nvidia, count: 1, capabilities: [gpu]}", None, None),
    ("{driver: nvidia, count: 1}", "has no `capabilities`", "capabilities is required"),
    ("{count: 1}", "has no `capabilities`", "capabilities is required"),
    ("{driver: cdi, device_ids: ['nvidia.com/gpu=0']}", "has no `capabilities`", "capabilities is required"),
    (
        "{driver: nvidia, count: 1, device_ids: ['0'], capabilities: [gpu]}",
        "both `count` and `device_ids`",
        '"count" and "device_ids" attributes are exclusive',
    ),
    ("{driver: nvidia, capabilities: gpu}", "`capabilities: 'gpu'` is not a list", "capabilities must be a list"),
    ("{driver: nvidia, capabilities: [gpu, gpu]}", "capabilities lists 'gpu' twice", "must be unique"),
    (
        "{driver: nvidia, device_ids: [0], capabilities: [gpu]}",
        "device_ids entry 0 is not text",
        "device_ids.0 must be a string",
    ),
    ("{driver: nvidia, device_ids: ['1', '1'], capabilities: [gpu]}", "device_ids lists '1' twice", "must be unique"),
    ("{driver: nvidia, device_ids: '1', capabilities: [gpu]}", "is not a list", "device_ids must be a list"),
    ("{driver: nvidia, gpus: 1, capabilities: [gpu]}", "has the key 'gpus'", "Additional property gpus"),
    (
        "{driver: nvidia, count: 1.5, capabilities: [gpu]}",
        "count: 1.5 is not a number",
        "count must be a string or integer",
    ),
    (
        "{driver: nvidia, count: true, capabilities: [gpu]}",
        "count: True is not a number",
        "count must be a string or integer",
    ),
    (
        "{driver: nvidia, count: null, capabilities: [gpu]}",
        "count: None is not a number",
        "count must be a string or integer",
    ),
    (
        "{driver: nvidia, count: ' 2', capabilities: [gpu]}",
        "count: ' 2' is not a number",
        "the only value allowed is 'all' or a number",
    ),
    (
        "{driver: nvidia, count: '1.0', capabilities: [gpu]}",
        "count: '1.0' is not a number",
        "the only value allowed is 'all' or a number",
    ),
    (
        "{driver: nvidia, count: two, capabilities: [gpu]}",
        "count: 'two' is not a number",
        "the only value allowed is 'all' or a number",
    ),
]


@pytest.mark.parametrize(("entry", "says", "compose_says"), ENTRIES)
def test_a_device_request_is_refused_where_compose_refuses_it(
    tmp_path: Path, entry: str, says: str | None, compose_says: str | None
) -> None:
    text = file(deploy(entry))
    found = errors(text)
    if says is None:
        assert found == []
        return
    # one line naming the service, gpupin's words and compose's own
    assert len(found) == 1 and found[0].startswith("f: service a: ") and says in found[0], found
    assert compose_says is not None and compose_says in found[0] and "compose refuses it" in found[0], found
    # the CLI: check and render alike, one line each, 64, nothing written
    (tmp_path / "f.yml").write_text(text)
    for args in (["compose", "check", "f.yml"], ["compose", "render", "f.yml", "-o", "out.yml"]):
        r = hostagent(tmp_path, *args)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "service a" in x]
        assert r.returncode == 64 and len(lines) == 1 and "service a" in lines[0] and says in lines[0], (args, r)
    assert not (tmp_path / "out.yml").exists()


@pytest.mark.parametrize(
    ("count", "means"),
    [
        ("1", 1),
        ("'2'", 2),
        ("'+2'", 2),
        ("'02'", 2),
        ("-1", ALL),
        ("'-1'", ALL),
        ("all", ALL),
        ("ALL", ALL),
        ("All", ALL),
        ("0x2", 2),
    ],
)
def test_count_takes_every_form_compose_go_reads(count: str, means: int) -> None:
    """compose-go's DeviceCount: an integer, `all` in any case (-1), or a base-10 integer as text."""
    exam = examine(
        load.parse(file(deploy(f"{{driver: nvidia, count: {count}, capabilities: [gpu]}}"))),
        scenario_cards("mixed-4"),
        {},
    )
    assert [r.count for r in exam.requests] == [means] and exam.ok, exam.problems


@pytest.mark.parametrize("count", ["0", "-2", "'0'"])
def test_a_count_compose_reads_but_that_gives_no_card_is_refused(count: str) -> None:
    found = errors(file(deploy(f"{{driver: nvidia, count: {count}, capabilities: [gpu]}}")))
    assert len(found) == 1 and "asks for no card" in found[0], found


def test_gpus_key_entries_are_read_as_compose_reads_them_and_need_no_capabilities() -> None:
    assert errors(file("    gpus: [{count: '2'}]")) == []
    found = errors(file("    gpus: [{count: 1, device_ids: ['0']}]"))
    assert len(found) == 1 and 'services.a.gpus.0: "count" and "device_ids" attributes are exclusive' in found[0]


def test_a_malformed_device_request_that_is_not_a_gpus_is_refused_too() -> None:
    """compose refuses the whole file for it, so render's output would not run either."""
    found = errors(file("    x-gpupin: {count: 1}\n" + deploy("{driver: fpga, count: 1}")))
    assert len(found) == 1 and "capabilities is required" in found[0], found


@pytest.mark.skipif(not V2.exists() and not required(), reason="compose v2 is not unpacked")
@pytest.mark.parametrize(("entry", "says", "compose_says"), ENTRIES)
def test_compose_itself_agrees_with_every_row(
    tmp_path: Path, entry: str, says: str | None, compose_says: str | None
) -> None:
    (tmp_path / "compose.yaml").write_text(file(deploy(entry)))
    r = subprocess.run(
        [str(V2), "-f", "compose.yaml", "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COMPOSE_PROJECT_NAME="v"),
    )
    if compose_says is None:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and compose_says in r.stderr, r.stderr


# --- device files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "devices",
    [
        "[/dev/nvidia1]",
        "['/dev/nvidia1:/dev/nvidia1']",
        "['/dev/nvidia1:/dev/nvidia1:rwm']",
        "[{source: /dev/nvidia1, target: /dev/nvidia1, permissions: rwm}]",
        "[{source: /dev/nvidia1}]",
        "['/dev:/dev']",
        "[{source: /dev/, target: /dev}]",
    ],
)
def test_a_device_file_holds_its_card_in_both_syntaxes(devices: str) -> None:
    found = errors(file(f"    devices: {devices}", "    x-gpupin: {gpus: ['1']}"))
    assert len(found) == 1 and found[0].startswith("f: service b: ") and uuids("mixed-4")[1] in found[0], found
    assert "also given to service a (by device file)" in found[0]


def test_the_card_is_the_one_of_that_minor_number_not_that_index() -> None:
    """slurm-shuffled: minor numbers 1, 3, 0, 2 in NVML (PCI) order."""
    cards = scenario_cards("slurm-shuffled")
    minor0 = next(c for c in cards if c.minor_number == 0)
    assert minor0.index != 0
    found = errors(file("    devices: [/dev/nvidia0]", f"    x-gpupin: {{gpus: ['{minor0.index}']}}"), "slurm-shuffled")
    assert len(found) == 1 and str(minor0.uuid) in found[0], found
    assert errors(file("    devices: [/dev/nvidia0]", "    x-gpupin: {gpus: ['0']}"), "slurm-shuffled") == []


def test_control_files_and_cdi_names_hold_no_card() -> None:
    devices = "[/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-caps/nvidia-cap1, /dev/dri, /dev/nvidia1x]"
    assert errors(file(f"    devices: {devices}", "    x-gpupin: {gpus: ['1']}")) == []


def test_a_long_syntax_device_without_source_is_refused_as_compose_refuses_it() -> None:
    found = errors(file("    devices: [{target: /dev/nvidia1}]"))
    assert len(found) == 1 and "services.a.devices.0 source is required" in found[0], found


def test_a_device_file_no_card_has_is_refused() -> None:
    found = errors(file("    devices: [/dev/nvidia9]"))
    assert len(found) == 1 and "service a: devices: /dev/nvidia9: no card has the minor number 9" in found[0]


def test_replicas_of_a_device_file_holder_share_its_card() -> None:
    found = errors(file("    devices: [/dev/nvidia1]\n    deploy: {replicas: 2}"))
    assert len(found) == 1 and "2 replicas, and its device files give every replica the same cards" in found[0]


def test_sharing_device_file_holders_may_share_on_purpose() -> None:
    shared = "    labels: [gpupin.shared=true]"
    assert errors(file(f"    devices: [/dev/nvidia1]\n{shared}", "    x-gpupin: {gpus: ['1'], share: true}")) == []


def render(text: str) -> dict[str, Any]:
    doc, _ = render_core(load.parse(text), scenario_cards("mixed-4"), {})
    return doc


def test_render_places_counts_off_the_cards_device_files_hold_and_keeps_the_files() -> None:
    first = uuids("mixed-4")[0]
    doc = render(file("    devices: ['/dev/nvidia0:/dev/nvidia0']", "    x-gpupin: {count: 1}"))
    assert doc["services"]["a"]["devices"] == ["/dev/nvidia0:/dev/nvidia0"]
    assert "deploy" not in doc["services"]["a"]  # no pin written for a device-file holder
    pinned = doc["services"]["b"]["deploy"]["resources"]["reservations"]["devices"][0]
    given = pinned.get("device_ids") or pinned.get("options", {}).values()
    assert first not in str(given) and first not in str(doc["services"]["b"])


def test_check_and_render_on_the_cli_refuse_a_card_two_services_hold(tmp_path: Path) -> None:
    (tmp_path / "f.yml").write_text(
        file("    devices: [{source: /dev/nvidia3, target: /dev/nvidia3}]", "    x-gpupin: {gpus: ['3']}")
    )
    for args in (["compose", "check", "f.yml"], ["compose", "render", "f.yml", "-o", "out.yml"]):
        r = hostagent(tmp_path, *args)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "service b" in x]
        assert r.returncode == 64 and len(lines) == 1, (args, r.stderr)
        assert uuids("mixed-4")[3] in lines[0] and "service a (by device file)" in lines[0]
    assert not (tmp_path / "out.yml").exists()


def test_check_reports_what_render_refuses_when_the_ledger_is_unread(tmp_path: Path) -> None:
    """Issue 23, trap 2: with no daemon reachable, render refuses a count (which cards are free is unknown), and
    check said OK. Both now share the rule: check reports render's line and fails, with render's code and `run
    --dry-run --count`'s for the same reason (69: the ledger could not be read; issue 33)."""
    (tmp_path / "f.yml").write_text(file("    x-gpupin: {count: 1}"))
    rendered = hostagent(tmp_path, "compose", "render", "f.yml", "-o", "out.yml")
    refused = [ln.removeprefix("hostagent: ERROR: ") for ln in rendered.stderr.splitlines() if "ERROR:" in ln]
    assert rendered.returncode == 69 and len(refused) == 1, rendered.stderr
    assert "which cards are free is unknown" in refused[0] and not (tmp_path / "out.yml").exists()
    checked = hostagent(tmp_path, "compose", "check", "f.yml")
    assert checked.returncode == 69 and refused[0] in checked.stdout.splitlines(), (checked.stdout, checked.stderr)
    as_json = hostagent(tmp_path, "compose", "check", "f.yml", "--json")
    assert as_json.returncode == 69 and len(json.loads(as_json.stdout)) == 1, as_json.stdout
    dry = hostagent(tmp_path, "run", "--dry-run", "--count", "1", "img", "true")
    assert dry.returncode == 69 and "which cards are free is unknown" in dry.stderr, dry.stderr
    # with another error of the file beside it, check says 64, as render does
    (tmp_path / "g.yml").write_text(file("    x-gpupin: {count: 1}\n    x-gpu-pin: {gpus: ['1']}"))
    both = [hostagent(tmp_path, "compose", *a) for a in (["check", "g.yml"], ["render", "g.yml", "-o", "out.yml"])]
    assert [r.returncode for r in both] == [64, 64], [r.stdout + r.stderr for r in both]


@pytest.mark.parametrize("key", ["x-gpu-pin", "x-gpupins", "x_gpupin", "X-GPUPIN", "gpupin", "x-gpupn"])
def test_a_misspelt_x_gpupin_in_a_service_is_an_error_that_names_the_key(tmp_path: Path, key: str) -> None:
    """Issue 23, trap 3: a lookalike of x-gpupin quietly gave the service no card. It is an error (64) for check
    and render, with "did you mean x-gpupin"."""
    (tmp_path / "f.yml").write_text(file(f"    {key}: {{gpus: ['1']}}"))
    for args in (["compose", "check", "f.yml"], ["compose", "render", "f.yml", "-o", "out.yml"]):
        r = hostagent(tmp_path, *args)
        lines = [x for x in (r.stdout + r.stderr).splitlines() if "service a" in x]
        assert r.returncode == 64 and len(lines) == 1, (args, r.stdout, r.stderr)
        assert f"`{key}`" in lines[0] and "HINT: did you mean x-gpupin?" in lines[0], lines[0]
    assert not (tmp_path / "out.yml").exists()


def test_a_misspelt_x_gpupin_at_the_top_level_is_a_warning(tmp_path: Path) -> None:
    """Issue 23, trap 3: at the top level an x- key asks for no card (x-gpupin is read in a service; a top-level x-
    key often only holds an anchor), so a lookalike there is a warning, said by check and render alike."""
    (tmp_path / "f.yml").write_text("x-gpu-pin: {gpus: ['1']}\n" + file("    x-gpupin: {gpus: ['1']}"))
    checked = hostagent(tmp_path, "compose", "check", "f.yml")
    warned = [x for x in checked.stdout.splitlines() if "x-gpu-pin" in x]
    assert checked.returncode == 0 and len(warned) == 1, checked.stdout
    assert "warning:" in warned[0] and "did you mean x-gpupin?" in warned[0], warned[0]
    rendered = hostagent(tmp_path, "compose", "render", "f.yml", "-o", "out.yml")
    assert rendered.returncode == 0 and "hostagent: " + warned[0] in rendered.stderr.splitlines(), rendered.stderr
    for fine in ("x-gpu", "x-gpus", "x-common", "x-gpupin-defaults"):  # not lookalikes: nothing said
        (tmp_path / "g.yml").write_text(f"{fine}: &a {{}}\n" + file("    x-gpupin: {gpus: ['1']}"))
        r = hostagent(tmp_path, "compose", "check", "g.yml")
        assert r.returncode == 0 and "did you mean" not in r.stdout, (fine, r.stdout)
