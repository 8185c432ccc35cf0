"""`hostagent compose render` against podman (docs/podman.md, Compose): the pin is written as CDI names in `devices:`,
which podman-compose (Debian 12's 1.0.3) hands to podman's own create, where podman resolves them; each service then
proves its card inside. A request only the nvidia driver would carry, which podman's compose tools drop, is refused
at render (64), nothing written. (Compose's own tests run on Docker's engines: podman lacks `compose` there,
tests/support/sandbox.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.host import REPO, required
from tests.support.sandbox import PODMAN, Agent, Sandboxes, agent_on
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")
EXAMPLE = REPO / "compose" / "two-services.yml"
WANT = {"trainer": RTX, "evaluator": A800C}  # the example's specs on mixed-4 (GPU-95c6, GPU-e218)

pytestmark = [pytest.mark.docker, pytest.mark.podman]


@pytest.fixture
def pod(sandboxes: Sandboxes) -> Iterator[Agent]:
    yield from agent_on(sandboxes.get(PODMAN))


def podman_compose(pod: Agent, project: str, file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """podman-compose on the sandboxed service: it runs podman's CLI, which CONTAINER_HOST sends there (--remote)."""
    path = shutil.which("podman-compose")
    if path is None:
        if required():
            pytest.fail("podman-compose is needed here (CI): `make podman-up` installs it", pytrace=False)
        pytest.skip("podman-compose is not installed")
    return subprocess.run(
        [path, "-p", project, "-f", str(file), *args],
        env={**os.environ, "CONTAINER_HOST": pod.sandbox.host},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(
    os.environ.get("GPUPIN_PODMAN") == "5",
    reason="podman-compose 1.0.3 drives Debian 12's podman 4.3 CLI; against podman 5's service the containers' logs "
    "came back empty (seen, not investigated: docs/podman.md, Not done yet)",
)
def test_a_rendered_file_runs_on_podman_compose_and_each_service_proves_its_card(pod: Agent, tmp_path: Path) -> None:
    pinned = tmp_path / "compose.yml"
    r = pod("compose", "render", str(EXAMPLE), "-o", str(pinned))
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(pinned.read_text())["services"]
    for name, card in WANT.items():
        svc = services[name]
        assert svc["devices"] == [f"nvidia.com/gpu={card}"] and "deploy" not in svc, svc
        assert not [e for e in svc["environment"] if "NVIDIA_VISIBLE_DEVICES" in e]  # the CDI spec sets it
    project = f"gpupintest{pod.tag}"
    try:
        up = podman_compose(pod, project, pinned, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        for name, card in WANT.items():
            cid = pod.sandbox.podman("inspect", "--format", "{{.Id}}", f"{project}_{name}_1").stdout.strip()
            logs = pod.sandbox.podman("logs", cid)
            assert f"cuda:0 = {card}" in logs.stdout and "as expected" in logs.stdout, logs.stdout + logs.stderr
            assert pod.sandbox.exposed(cid) == [card]
    finally:
        podman_compose(pod, project, pinned, "down")


def test_a_request_only_the_nvidia_driver_carries_is_refused_at_render_nothing_written(
    pod: Agent, tmp_path: Path
) -> None:
    pinned = tmp_path / "compose.yml"
    capabilities = tmp_path / "caps.yml"
    capabilities.write_text(f"""services:
  job:
    image: gpupin:test
    deploy:
      resources:
        reservations:
          devices: [{{driver: nvidia, device_ids: ['{RTX}'], capabilities: [gpu, compute]}}]
""")
    for args in ([str(EXAMPLE), "--via", "nvidia"], [str(capabilities)]):
        r = pod("compose", "render", *args, "-o", str(pinned))
        lines = r.stderr.splitlines()
        assert r.returncode == 64 and lines and "Traceback" not in r.stderr, r
        assert all(ln.startswith("hostagent: ERROR: ") and "on podman" in ln and "HINT:" in ln for ln in lines), lines
        assert not pinned.exists()
