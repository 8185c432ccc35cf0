"""CDI without a daemon: how hostagent finds whether a daemon serves nvidia.com/gpu (its /info, its spec folders)
and the pin through CDI. What each engine does with it, on the sandboxes: tests/docker/test_cdi.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.core.errors import UsageError
from gpupin.core.resolve import Target
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.pin import Pin
from gpupin.hostagent.run.request import RunRequest
from tests.support.planted import plant_hostile_specs
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")
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
    spec: dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}} for n in names],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }
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


@pytest.mark.timeout(60)
def test_a_planted_spec_never_hangs_nor_exhausts_the_reader(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text(spec_text("yaml"))
    plant_hostile_specs(tmp_path)
    began = time.monotonic()
    d = cdi.detect({"CDISpecDirs": [str(tmp_path)]}, local=True)
    assert time.monotonic() - began < 5
    assert (
        d.served and d.names == frozenset(NAMES) and d.why == f"{tmp_path}/nvidia.yaml names 9 nvidia.com/gpu device(s)"
    )
    refused: list[tuple[str, str]] = []
    cdi.read_spec_dirs([str(tmp_path)], refused)
    assert sorted((Path(p).name, why) for p, why in refused) == [
        ("fifo.yaml", "it is a FIFO, not a regular file"),
        ("huge.json", "it is larger than 1 MiB, the limit for this file"),
        ("zero.json", "it is a character device, not a regular file"),
    ]


def test_at_most_64_spec_files_of_a_folder_are_read(tmp_path: Path) -> None:
    for i in range(cdi.MAX_FILES + 1):
        (tmp_path / f"{i:03}.json").write_text(spec_text("json", names=[str(i)]))
    assert len(cdi.read_spec_dirs([str(tmp_path)])) == cdi.MAX_FILES


def test_the_fast_yaml_reader_reads_the_fake_specs_layout_too() -> None:
    spec = "\n".join(
        [
            "---",
            'cdiVersion: "0.5.0"',
            'kind: "nvidia.com/gpu"',
            "devices:",
            '  - name: "0"',
            "    containerEdits:",
            "      deviceNodes:",
            '        - path: "/dev/nvidia0"',
            "  - name: 'GPU-x' # a comment",
            "containerEdits:",
            "  env:",
            '    - "A=1"',
        ]
    )
    assert cdi._block_names(spec) == ("nvidia.com/gpu", ["0", "GPU-x"])
    assert cdi._block_names(spec_text("flow")) is None  # anything else is PyYAML's


def test_what_each_kind_of_info_says() -> None:
    discovered = {
        "DiscoveredDevices": [
            {"Source": "cdi", "ID": f"nvidia.com/gpu={RTX}"},
            {"Source": "cdi", "ID": "vendor.com/fpga=0"},
        ],
        "CDISpecDirs": ["/nowhere"],
    }
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
    assert pin.env() == {"GPUPIN_EXPECT": f"{A800C}@00000000:AF:00.0,{RTX}@00000000:3B:00.0", "GPUPIN_VERIFY": "nvml"}
    assert nvidia.env() == {"NVIDIA_VISIBLE_DEVICES": f"{A800C},{RTX}", **pin.env()}
    assert pin.labels() == nvidia.labels() == {"gpupin.devices": f"{A800C},{RTX}", "gpupin.shared": "true"}
    ids = [f"nvidia.com/gpu={A800C}", f"nvidia.com/gpu={RTX}"]
    assert pin.device_request() == {"Driver": "cdi", "Count": 0, "DeviceIDs": ids, "Capabilities": [], "Options": {}}
    assert dict(pin.sdk_device_request()) == pin.device_request()
    assert pin.compose_device() == {"driver": "cdi", "device_ids": ids, "capabilities": ["gpu"]}
    assert pin.docker_run_args() == ["--device", ids[0], "--device", ids[1]]


def test_a_way_to_pin_that_cannot_be_is_refused_before_any_io() -> None:
    with pytest.raises(UsageError, match="--gpu-capabilities compute with --via cdi") as e:
        RunRequest("img", gpus=["1"], via="cdi", gpu_capabilities="compute")
    assert e.value.exit_code == 64 and e.value.hint and "--via nvidia" in e.value.hint
    with pytest.raises(UsageError, match="not a way to pin"):
        RunRequest("img", gpus=["1"], via="vulkan")
