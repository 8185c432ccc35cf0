"""`compose render` is lossless: what compose reads from the rendered file is what it read from the source, the GPU
parts aside. Shown differentially over tests/data/compose-corpus (one file, one more case) with compose's own
`config`: compose v2 (Engine 26's plugin, `config --format json`) and docker-compose 1.29 (Debian's, `config`,
YAML). No daemon is needed; the tools are required under CI=true, as the sandbox is.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.hostagent.compose import load, roundtrip
from gpupin.hostagent.compose.render import header
from gpupin.hostagent.compose.render import render as render_core
from tests.support.compose import CORPUS, FILES, V1, V2, strip_gpu, tool
from tests.support.scenarios import cards


def rendered(text: str) -> str:
    """What `hostagent compose render` writes for `text` on the simulated mixed-4 host (no card busy)."""
    source = roundtrip.without_header(text)
    doc = load.parse(source)
    out, exam = render_core(doc, cards("mixed-4"), {})
    return header("f.yml", exam) + "\n" + roundtrip.edit(source, doc, out)


def config(command: list[str], path: Path) -> tuple[bool, Any]:
    """(True, the model without its GPU parts) or (False, compose's refusal, the file's name taken out)."""
    args = [*command, "-p", "corpus", "-f", path.name, "config"] + (
        ["--format", "json"] if command[0] == str(V2) else []
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    r = subprocess.run(args, cwd=path.parent, env=env, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return False, r.stderr.replace(str(path), "FILE").replace(path.name, "FILE").strip()
    return True, strip_gpu(json.loads(r.stdout) if command[0] == str(V2) else yaml.safe_load(r.stdout))


# The files a compose refuses, source and rendered alike: docker-compose 1.29 reads `DEBUG: yes` as a boolean
# (YAML 1.1) and refuses booleans in `environment`; compose v2 reads the text "yes".
REFUSED = {str(V2): set(), str(V1): {"env-scalars.yml"}}


def differences(command: list[str], tmp_path: Path) -> dict[str, tuple[Any, Any]]:
    """Corpus file -> (compose's view of the source, of the rendered file), for each file where they differ or
    that compose refuses though REFUSED does not say so."""
    found: dict[str, tuple[Any, Any]] = {}
    for src in FILES:
        folder = tmp_path / src.stem
        folder.mkdir()
        (folder / "source.yml").write_text(src.read_text())
        (folder / "rendered.yml").write_text(rendered(src.read_text()))
        before, after = config(command, folder / "source.yml"), config(command, folder / "rendered.yml")
        if before != after or (not before[0]) != (src.name in REFUSED[command[0]]):
            found[src.name] = (before, after)
    return found


def test_the_corpus_covers_what_pyyaml_used_to_change() -> None:
    text = "\n".join(f.read_text() for f in FILES)
    for needle in (
        ": yes",
        ": on",
        ": off",
        ": 0777",
        ": 1e3",
        "EMPTY:\n",
        "<<: *",
        "<<: [*",
        "&",
        "# ",
        ": >",
        ": |",
        "${",
        "$$",
        "x-gpupin",
        "device_ids",
        "count:",
        "runtime: nvidia",
    ):
        assert needle in text, needle
    assert len(FILES) >= 12


@pytest.mark.parametrize("command", [V2, V1], ids=["compose-v2", "docker-compose-1.29"])
def test_compose_reads_the_rendered_corpus_as_the_source_outside_the_gpu_parts(command: Path, tmp_path: Path) -> None:
    assert differences(tool(command), tmp_path) == {}


@pytest.mark.parametrize("command", [V2, V1], ids=["compose-v2", "docker-compose-1.29"])
def test_the_differential_sees_a_changed_value(command: Path, tmp_path: Path) -> None:
    """The comparison can fail: one environment value changed is a difference for both."""
    src, changed = tmp_path / "s.yml", tmp_path / "c.yml"
    src.write_text("services:\n  a:\n    image: busybox\n    environment:\n      - MODE=on\n")
    changed.write_text(src.read_text().replace("MODE=on", "MODE=true"))
    assert config(tool(command), src) != config(tool(command), changed)


def test_the_old_pyyaml_render_was_a_difference_for_compose_v2(tmp_path: Path) -> None:
    """What the issue found: PyYAML's dump writes `DEBUG: yes` as `true`, which compose v2 reads as "true"."""
    src, dumped = tmp_path / "s.yml", tmp_path / "d.yml"
    src.write_text("services:\n  a:\n    image: busybox\n    environment:\n      DEBUG: yes\n")
    dumped.write_text(yaml.safe_dump(yaml.safe_load(src.read_text()), sort_keys=False))  # what render did
    before, after = config(tool(V2), src), config(tool(V2), dumped)
    assert before[1]["services"]["a"]["environment"] == {"DEBUG": "yes"}
    assert after[1]["services"]["a"]["environment"] == {"DEBUG": "true"}


def test_the_rendered_text_keeps_comments_quotes_anchors_and_block_scalars() -> None:
    text = (CORPUS / "comments-multiline.yml").read_text()
    out = rendered(text)
    for kept in (
        "# A notebook and a server.",
        "x-project: lab   # the project name",
        "  # the notebook: one card",
        "    command: >\n      start-notebook.sh\n",
        "    entrypoint: |\n      #!/bin/sh\n",
        '      - "8888:8888"   # browser',
        '    healthcheck: {test: ["CMD", "curl"',
    ):
        assert kept in out, kept
    assert "x-gpupin" not in out and "GPU-6cd4e2b7" not in out
    merged = rendered((CORPUS / "anchors-merge.yml").read_text())
    for kept in (
        "x-common: &common",
        "  environment: &env",
        "x-unused: &unused {a: 1}",
        "    <<: *common",
        "    environment: *env",
        '  restart: "no"',
    ):
        assert kept in merged, kept


def test_environment_values_keep_their_spelling() -> None:
    out = rendered((CORPUS / "env-scalars.yml").read_text())
    for kept in (
        "DEBUG: yes",
        "VERBOSE: on",
        "CACHE: off",
        "UMASK: 0777",
        "SCALE: 1e3",
        "HEX: 0x1F",
        "TIME: 12:30",
        "HALF: .5",
        'BLANK: ""',
        "CAPS: Yes",
    ):
        assert f"      {kept}\n" in out, kept


def test_a_rendered_file_renders_to_itself_byte_for_byte() -> None:
    for src in FILES:
        once = rendered(src.read_text())
        assert rendered(once) == once, src.name


def test_each_service_sharing_an_anchor_gets_its_own_cards() -> None:
    out = yaml.safe_load(rendered((CORPUS / "inherited-request.yml").read_text()))
    one, two = out["services"]["one"], out["services"]["two"]
    ids = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in (one, two)]
    assert ids[0] != ids[1]
    assert two["labels"]["team"] == "audio" and one["labels"]["team"] == "vision"
    assert "x-gpupin" not in one and "x-gpupin" not in two
    assert out["x-gpu-service"]["x-gpupin"] == {"count": 1}  # the anchor's source is not a service: kept


def test_the_edited_text_reads_back_as_exactly_the_pinned_document() -> None:
    """What the rules pinned (the plain tree) is what the written text holds, to the last key."""
    for src in FILES:
        doc = load.parse(src.read_text())
        out, _ = render_core(doc, cards("mixed-4"), {})
        assert load.parse(roundtrip.edit(src.read_text(), doc, out)) == out, src.name


# Anchors, aliases and merge keys around the keys the pin changes: each reads back as exactly the pinned document.
SHARED = {
    "a service merged into another": "services:\n  a: &a\n    image: i\n    x-gpupin: {gpus: ['0']}\n"
    "    environment: {K: v}\n  b:\n    <<: *a\n    x-gpupin: {gpus: ['1']}\n",
    "a service aliased whole": "services:\n  a: &a\n    image: i\n    environment: [K=v]\n    deploy: {resources: "
    "{reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
    "  b: *a\n",
    "one deploy for two services": "x-dep: &dep\n  resources:\n    reservations:\n      devices:\n"
    "        - driver: nvidia\n          count: 1\n          capabilities: [gpu]\n"
    "services:\n  a: {image: i, deploy: *dep}\n"
    "  b: {image: i, deploy: *dep, labels: [x=1]}\n",
    "one environment list for two": "services:\n  a:\n    image: i\n    environment: &e\n      - K=v\n    x-gpupin: "
    "{count: 1}\n  b:\n    image: i\n    environment: *e\n",
    "a chain of merges": "x-base: &base\n  image: i\nx-gpu: &gpu\n  <<: *base\n  x-gpupin: {count: 1}\nservices:\n"
    "  a:\n    <<: *gpu\n  b:\n    <<: *gpu\n    environment: {B: '1'}\n",
    "a device entry from a merge": "x-dev: &dev\n  driver: nvidia\n  count: 1\n  capabilities: [gpu]\n"
    "services:\n  a:\n    image: i\n"
    "    deploy: {resources: {reservations: {devices: [{<<: *dev}]}}}\n",
}


@pytest.mark.parametrize("text", list(SHARED.values()), ids=list(SHARED))
def test_shared_nodes_are_copied_before_the_pin_changes_them(text: str) -> None:
    doc = load.parse(text)
    out, _ = render_core(doc, cards("mixed-4"), {})
    edited = roundtrip.edit(text, doc, out)
    assert load.parse(edited) == out
    assert load.parse(rendered(edited).split("\n\n", 1)[1]) == out  # and renders to itself


def podman_rendered(text: str, via: str | None = None) -> dict[str, Any]:
    """What render pins on podman (4.3.1, which resolves CDI names itself), as a plain document."""
    from gpupin.hostagent.engine import podman

    source = roundtrip.without_header(text)
    doc = load.parse(source)
    out, _ = render_core(doc, cards("mixed-4"), {}, podman.DETECTION, via, podman="4.3.1")
    plain: dict[str, Any] = yaml.safe_load(roundtrip.edit(source, doc, out))
    return plain


def test_on_podman_every_form_is_pinned_by_cdi_names_in_devices_and_renders_to_itself() -> None:
    # podman's compose tools drop every device request; `devices:` reaches podman's own create.
    forms = {
        "x": "x-gpupin: {gpus: ['1']}",
        "deploy": "deploy: {resources: {reservations: {devices: "
        "[{driver: nvidia, device_ids: ['1'], capabilities: [gpu]}]}}}",
        "cdi": "devices: [nvidia.com/gpu=1, /dev/fuse]",
    }
    for name, form in forms.items():
        out = podman_rendered(f"services:\n  job:\n    image: gpupin:test\n    {form}\n")
        svc = out["services"]["job"]
        uuid = svc["labels"]["gpupin.devices"]
        want = [f"nvidia.com/gpu={uuid}"] if name != "cdi" else ["/dev/fuse", f"nvidia.com/gpu={uuid}"]
        assert svc["devices"] == want and "deploy" not in svc and "x-gpupin" not in svc, (name, svc)
        assert not [e for e in svc.get("environment") or [] if e.startswith("NVIDIA_VISIBLE_DEVICES")], name
        again = podman_rendered(yaml.safe_dump(out))["services"]["job"]
        assert again["devices"] == svc["devices"], name  # the rendered file renders to itself


def test_on_podman_the_nvidia_drivers_request_is_refused_not_written() -> None:
    from gpupin.hostagent.compose.problems import RenderRefused

    text = "services:\n  job:\n    image: gpupin:test\n    x-gpupin: {gpus: ['1']}\n"
    with pytest.raises(RenderRefused) as refused:
        podman_rendered(text, via="nvidia")
    assert [p.service for p in refused.value.problems] == ["job"]
    assert "on podman 4.3.1" in refused.value.problems[0].problem
