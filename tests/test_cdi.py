"""CDI: how hostagent finds whether a daemon serves nvidia.com/gpu (its /info, its spec folders), the pin through
CDI, and, on the sandboxes, what each engine does with it: Engine 26 (CDI on, the fake `nvidia-ctk cdi generate`
spec) is pinned through CDI and its CDI holders block their cards; Docker 20.10 (no CDI) keeps the nvidia driver,
and refuses a forced CDI pin as `docker run` would, leaving nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.core.errors import UsageError
from gpupin.core.resolve import Target
from gpupin.hostagent import engine
from gpupin.hostagent.engine import address, cdi
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.pin import Pin
from gpupin.hostagent.run.request import RunRequest
from tests.cards import cards as scenario_cards
from tests.conftest import FAKEGPU, TEST_IMAGE, Agent, Sandbox, gpu_uuids, saw, scenario, serves_cdi

A800, RTX, A800B, A800C = gpu_uuids("mixed-4")
NAMES = ["0", A800, "1", RTX, "2", A800B, "3", A800C, "all"]


# --- names -----------------------------------------------------------------------------------------------------

def test_cdi_names_are_parsed_as_the_cdi_library_does() -> None:
    assert cdi.parse("nvidia.com/gpu=GPU-1c5e") == ("nvidia.com/gpu", "GPU-1c5e")
    assert cdi.parse(" vendor.com/fpga=0:1 ") == ("vendor.com/fpga", "0:1")
    for text in ("/dev/nvidia0", "gpu=0", "nvidia.com/gpu=", "nvidia.com/gpu=a b", "nvidia.com=0", "x/y/z=1"):
        assert cdi.parse(text) is None, text
    assert cdi.gpu_device("nvidia.com/gpu=all") == "all" and cdi.gpu_device("nvidia.com/nic=0") is None
    assert [cdi.as_spec(n) for n in ("gpu3", "mig0:1", "3", "0:1", RTX, "all")] == ["3", "0:1", "3", "0:1", RTX, "all"]
    assert cdi.name(RTX) == f"nvidia.com/gpu={RTX}"


# --- what the daemon serves --------------------------------------------------------------------------------------

def spec_text(style: str, kind: str = "nvidia.com/gpu", names: list[str] = NAMES) -> str:
    spec: dict[str, Any] = {"cdiVersion": "0.5.0", "kind": kind,
                            "devices": [{"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
                                        for n in names],
                            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}
    if style == "json":
        return json.dumps(spec)
    if style == "flow":
        return yaml.safe_dump(spec, default_flow_style=True)
    # nvidia-ctk's YAML: keys sorted, list items at their parent's indentation (sigs.k8s.io/yaml)
    return yaml.safe_dump(spec, sort_keys=True)


@pytest.mark.parametrize("style", ["yaml", "json", "flow"])
def test_a_local_daemons_spec_folders_are_read_for_the_kind_and_its_names(tmp_path: Path, style: str) -> None:
    ext = "json" if style == "json" else "yaml"
    (tmp_path / f"nvidia.{ext}").write_text(spec_text(style))
    (tmp_path / "fpga.yaml").write_text(spec_text("yaml", kind="vendor.com/fpga", names=["0"]))
    (tmp_path / "broken.yaml").write_text("kind: nvidia.com/gpu\ndevices: [\n")
    (tmp_path / "notes.txt").write_text(spec_text("yaml", names=["9"]))  # not a spec file: the library skips it
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.yaml").write_text(spec_text("yaml", names=["8"]))  # subfolders are skipped too
    d = cdi.detect({"CDISpecDirs": [str(tmp_path), str(tmp_path / "missing")]}, local=True)
    assert d.served and d.names == frozenset(NAMES) and f"{tmp_path}/nvidia.{ext} names 9" in d.why


def test_the_fast_yaml_reader_reads_the_fake_specs_layout_too() -> None:
    spec = "\n".join(["---", 'cdiVersion: "0.5.0"', 'kind: "nvidia.com/gpu"', "devices:", '  - name: "0"',
                      "    containerEdits:", "      deviceNodes:", '        - path: "/dev/nvidia0"',
                      "  - name: 'GPU-x' # a comment", "containerEdits:", "  env:", '    - "A=1"'])
    assert cdi._block_names(spec) == ("nvidia.com/gpu", ["0", "GPU-x"])
    assert cdi._block_names(spec_text("flow")) is None  # anything else is PyYAML's


def test_what_each_kind_of_info_says() -> None:
    discovered = {"DiscoveredDevices": [{"Source": "cdi", "ID": f"nvidia.com/gpu={RTX}"},
                                        {"Source": "cdi", "ID": "vendor.com/fpga=0"}], "CDISpecDirs": ["/nowhere"]}
    d = cdi.detect(discovered, local=False)  # the daemon's own list: no spec file read, remote or not
    assert d.served and d.names == frozenset({RTX})
    none = cdi.detect({"DiscoveredDevices": [{"Source": "cdi", "ID": "vendor.com/fpga=0"}]}, local=True)
    assert not none.served and "discovered no nvidia.com/gpu" in none.why
    assert not cdi.detect({"CDISpecDirs": []}, local=True).served  # CDI off
    assert "CDI off" in cdi.detect({"ServerVersion": "20.10.24"}, local=True).why  # API < 1.44
    remote = cdi.detect({"CDISpecDirs": ["/etc/cdi"]}, local=False)
    assert not remote.served and "not on this host" in remote.why and remote.names is None


def test_the_way_to_pin() -> None:
    served = cdi.Detection(True, "a spec", NAMES)
    assert served.via([RTX, A800C]) == "cdi"
    assert served.via([RTX], capabilities=["utility"]) == "nvidia"  # CDI carries no driver capabilities
    assert served.via([RTX], asked="nvidia") == "nvidia"
    assert cdi.Detection(True, "an index-only spec", ["0", "1", "all"]).via([RTX]) == "nvidia"
    assert cdi.Detection(True, "a remote list", None).via([RTX]) == "cdi"  # names unknown: trusted
    assert cdi.Detection(False, "CDI off").via([RTX]) == "nvidia"
    assert cdi.Detection(False, "CDI off").via([RTX], asked="cdi") == "cdi"


# --- the pin ---------------------------------------------------------------------------------------------------

def test_the_cdi_pin_is_the_nvidia_pin_but_for_the_request_and_the_variable_the_spec_owns() -> None:
    cards = scenario_cards("mixed-4")
    targets = [Target(cards[3]), Target(cards[1])]
    pin = Pin(targets, share=True, verify="nvml", via="cdi")
    nvidia = Pin(targets, share=True, verify="nvml")
    assert pin.env() == {"GPUPIN_EXPECT": f"{A800C}@00000000:AF:00.0,{RTX}@00000000:3B:00.0",
                         "GPUPIN_VERIFY": "nvml"}
    assert nvidia.env() == {"NVIDIA_VISIBLE_DEVICES": f"{A800C},{RTX}", **pin.env()}
    assert pin.labels() == nvidia.labels() == {"gpupin.devices": f"{A800C},{RTX}", "gpupin.shared": "true"}
    ids = [f"nvidia.com/gpu={A800C}", f"nvidia.com/gpu={RTX}"]
    assert pin.device_request() == {"Driver": "cdi", "Count": 0, "DeviceIDs": ids, "Capabilities": [],
                                    "Options": {}}
    assert dict(pin.sdk_device_request()) == pin.device_request()
    assert pin.compose_device() == {"driver": "cdi", "device_ids": ids, "capabilities": ["gpu"]}
    assert pin.docker_run_args() == ["--device", ids[0], "--device", ids[1]]


def test_a_way_to_pin_that_cannot_be_is_refused_before_any_io() -> None:
    with pytest.raises(UsageError, match="--gpu-capabilities compute with --via cdi") as e:
        RunRequest("img", gpus=["1"], via="cdi", gpu_capabilities="compute")
    assert e.value.exit_code == 64 and e.value.hint and "--via nvidia" in e.value.hint
    with pytest.raises(UsageError, match="not a way to pin"):
        RunRequest("img", gpus=["1"], via="vulkan")


# --- on the sandboxes --------------------------------------------------------------------------------------------

def test_each_engine_says_whether_it_serves_the_cards_by_cdi(mixed4_sandbox: Sandbox,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(address, "_ENDPOINT", engine.Endpoint(mixed4_sandbox.host, None, "DOCKER_HOST"))
    api = engine.connect(timeout=30)
    d = engine.cdi_detection(engine.info(api))
    if serves_cdi(mixed4_sandbox):
        spec = mixed4_sandbox.run_dir / "cdi" / "nvidia.yaml"
        assert d.served and d.names is not None and set(NAMES) <= d.names and str(spec) in d.why
    else:
        assert not d.served and "CDI off" in d.why


def inspect(sandbox: Sandbox, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sandbox.docker("inspect", cid, check=True).stdout)[0]
    return data


def test_run_pins_through_what_the_daemon_serves_and_the_entrypoint_proves_it(agent: Agent) -> None:
    r = agent("run", "--rm", "--name", f"cdi-{agent.tag}", "--uuid", RTX, TEST_IMAGE, "sh", "-c",
              'echo "NVD=$NVIDIA_VISIBLE_DEVICES"; python3 -m gpupin.entrypoint')
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    assert f"cuda:0  {RTX}  00000000:3B:00.0  NVIDIA GeForce RTX 4090  (local rank 0)" in r.stderr
    assert "expectation from GPUPIN_EXPECT" in r.stderr
    # CDI's spec sets the variable to void; the nvidia driver's pin sets it to the card
    assert r.stdout.splitlines()[0] == ("NVD=void" if serves_cdi(agent.sandbox) else f"NVD={RTX}")


def test_via_overrides_what_the_daemon_serves(agent: Agent) -> None:
    r = agent("run", "-d", "--via", "nvidia", "--gpu", "1", TEST_IMAGE, "sleep", "30")
    assert r.returncode == 0, r.stderr
    requests = inspect(agent.sandbox, r.stdout.strip())["HostConfig"]["DeviceRequests"]
    assert [(q["Driver"], q["DeviceIDs"]) for q in requests] == [("nvidia", [RTX])]
    forced = agent("run", "--rm", "--via", "cdi", "--gpu", "3", TEST_IMAGE)
    if serves_cdi(agent.sandbox):
        assert forced.returncode == 0 and saw(forced.stdout) == [A800C], forced.stderr
    else:  # as `docker run --device nvidia.com/gpu=...` would: refused, and the container removed
        errors = [ln for ln in forced.stderr.splitlines() if "ERROR:" in ln]
        assert forced.returncode == 125 and len(errors) == 1 and 'device driver "cdi"' in errors[0], forced.stderr
        assert "HINT: the daemon does not serve nvidia.com/gpu by this name" in errors[0]
        assert len(agent.containers()) == 1  # the first one only


def test_a_container_holding_a_card_by_cdi_index_makes_run_answer_75(agent26: Agent) -> None:
    a = agent26
    cid = a.sandbox.docker("run", "-d", "--name", f"cdi-holder-{a.tag}", "--label", f"gpupin.test={a.tag}",
                           "--device", "nvidia.com/gpu=1", "--entrypoint", "sleep", TEST_IMAGE, "300",
                           check=True).stdout.strip()
    r = a("run", "--rm", "--gpu", RTX, TEST_IMAGE)
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 75 and len(errors) == 1, r.stderr
    assert f"{RTX} is held by cdi-holder-{a.tag} ({cid[:12]}, running, --device nvidia.com/gpu=1)" in errors[0]
    listing = json.loads(a("ls", "--json").stdout)
    (holder,) = next(g for g in listing["gpus"] if g["uuid"] == RTX)["holders"]
    assert (holder["how"], holder["via"], holder["grants"][0]["form"]) == ("--device nvidia.com/gpu=1", "CDI", "cdi")


def test_privileged_with_a_cdi_gpu_holds_every_card(agent26: Agent) -> None:
    a = agent26
    mine = {**lease.claim(), "gpupin.test": a.tag}  # held while "being started": no privileged run needed
    a.sandbox.docker("create", "--privileged", "--device", "nvidia.com/gpu=1", *(f"--label={k}={v}"
                     for k, v in mine.items()), "--entrypoint", "sleep", TEST_IMAGE, "300", check=True)
    r = a("run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 75 and "0 of 4 card(s) are free" in r.stderr, r.stderr


@pytest.fixture
def index_only_spec(agent26: Agent) -> Iterator[Agent]:
    """The sandbox's spec regenerated with the `index` name strategy alone (nvidia-ctk's default before 1.14),
    then put back."""
    spec = agent26.sandbox.run_dir / "cdi" / "nvidia.yaml"
    kept = spec.read_bytes()
    env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario("mixed-4")))
    tmp = spec.with_name(f".{uuid.uuid4().hex}.tmp")
    subprocess.run([str(FAKEGPU / "bin" / "nvidia-ctk"), "cdi", "generate", "--device-name-strategy", "index",
                    "--output", str(tmp)], env=env, check=True, capture_output=True)
    os.replace(tmp, spec)
    try:
        yield agent26
    finally:
        tmp.write_bytes(kept)
        os.replace(tmp, spec)


def test_a_spec_that_names_no_uuid_is_no_pin_so_the_nvidia_driver_pins(index_only_spec: Agent) -> None:
    a = index_only_spec
    r = a("run", "--dry-run", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and r.stdout.startswith(f"docker run --gpus '\"device={RTX}\"'"), r
    r = a("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    forced = a("run", "--rm", "--via", "cdi", "--gpu", "1", TEST_IMAGE)  # the daemon cannot resolve the name
    errors = [ln for ln in forced.stderr.splitlines() if "ERROR:" in ln]
    assert forced.returncode == 125 and len(errors) == 1 and "nvidia-ctk cdi list" in errors[0], forced.stderr
    assert a.containers() == []


def test_a_plain_cdi_container_runs_unpinned_and_says_why(agent26: Agent) -> None:
    sb = agent26.sandbox
    r = sb.docker("run", "--rm", "--device", "nvidia.com/gpu=1", TEST_IMAGE)
    assert r.returncode == 0, r
    assert "no expectation (NVIDIA_VISIBLE_DEVICES=void: the cards came through CDI, which names none inside " \
           "the container;" in r.stderr and "running unpinned" in r.stderr
    r = sb.docker("run", "--rm", "--device", "nvidia.com/gpu=1", "-e", "GPUPIN_REQUIRE=1", TEST_IMAGE, "sh", "-c",
                  "echo WORKLOAD-STARTED")
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 78 and "WORKLOAD-STARTED" not in r.stdout and len(errors) == 1, r
    assert "NVIDIA_VISIBLE_DEVICES=void" in errors[0] and "expectation is required" in errors[0]
    r = sb.docker("run", "--rm", "--device", "nvidia.com/gpu=1", "-e", f"GPUPIN_EXPECT={RTX}", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r
