"""`hostagent doctor` against the sandbox's daemon on each engine: a clean host gives exit 0 and one OK line, each
trap planted (a topology, a stale CDI spec) one line with a HINT and exit 1. The traps that need no daemon:
tests/unit/test_doctor.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupin.hostagent import doctor
from tests.support.host import doctor_on
from tests.support.sandbox import Sandbox
from tests.support.scenarios import topology, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A host root with nothing planted: /dev without NVIDIA nodes, no CDI spec, no toolkit config."""
    for d in ("dev", "etc", "sys"):
        (tmp_path / d).mkdir()
    return tmp_path


def test_a_clean_host_is_exit_0_with_one_ok_line(root: Path, mixed4_sandbox: Sandbox) -> None:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / doctor.HOOK).write_text("")
    r = doctor_on(root, mixed4_sandbox.host)
    assert r.returncode == 0, r
    (line,) = r.stdout.splitlines()
    assert line.startswith("OK: 4 card(s), cgroup v"), line
    assert r.stderr == ""
    data = json.loads(doctor_on(root, mixed4_sandbox.host, "--json").stdout)
    assert data["ok"] is True and data["findings"] == []


def test_each_planted_trap_is_a_line_with_a_hint_and_exit_1(
    root: Path, mixed4_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topo = topology("mixed-4")
    topo["gpus"][0]["persistence_mode"] = 0
    path = tmp_path_factory.mktemp("topo") / "pm-off.json"
    path.write_text(json.dumps(topo))
    # Where the daemon reads CDI specs (Engine 26 names its own folders; 20.10 none, and doctor reads /etc/cdi).
    info = json.loads(mixed4_sandbox.docker("info", "--format", "{{json .}}", check=True).stdout)
    spec_dir = root / (info.get("CDISpecDirs") or ["/etc/cdi"])[0].lstrip("/")
    spec_dir.mkdir(parents=True)
    (spec_dir / "nvidia.json").write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": A800}]})
    )
    r = doctor_on(root, mixed4_sandbox.host, FAKEGPU_TOPOLOGY=str(path))
    assert r.returncode == doctor.EX_FINDINGS, r
    lines = r.stdout.splitlines()
    assert lines[-1].startswith(f"{len(lines) - 1} finding(s): 4 card(s)")
    assert any("persistence mode: warning: off on card(s)" in ln for ln in lines), lines
    assert any("nvidia.json" in ln and RTX in ln for ln in lines), lines
    assert all(" HINT: " in ln for ln in lines[:-1]) and r.stderr == ""


@pytest.mark.per_engine  # the engine decides where its specs are and whether it reads CDI 0.7
def test_a_spec_of_another_driver_is_a_line_and_cdi_07_only_before_engine_26_1(
    root: Path, mixed4_sandbox: Sandbox
) -> None:
    """The sandbox's NVML reports the topology's driver (580.159.04); a spec generated for 550.54.15 is stale. Its
    CDI 0.7.0 is no finding here: Docker 20.10 has CDI off, and the sandbox's Engine 26 is 26.1, which reads it."""
    info = json.loads(mixed4_sandbox.docker("info", "--format", "{{json .}}", check=True).stdout)
    spec_dir = root / (info.get("CDISpecDirs") or ["/etc/cdi"])[0].lstrip("/")
    spec_dir.mkdir(parents=True)
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    spec = {
        "cdiVersion": "0.7.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": u, "containerEdits": {}} for u in uuids("mixed-4")],
        "containerEdits": {"mounts": [{"hostPath": lib, "containerPath": lib, "options": ["ro"]}]},
    }
    (spec_dir / "nvidia.json").write_text(json.dumps(spec))
    r = doctor_on(root, mixed4_sandbox.host)
    assert r.returncode == doctor.EX_FINDINGS, r
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(str(spec_dir / "nvidia.json"))]
    assert len(lines) == 1, r.stdout
    assert "was generated for driver 550.54.15, older than the loaded driver 580.159.04" in lines[0], lines
    assert "nvidia-cdi-refresh" in lines[0] and r.stderr == ""
