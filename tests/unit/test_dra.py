"""Kubernetes DRA device metadata (KEP-5304) as an expectation source (gpupin.entrypoint.dra): what it names, where
it stands among the sources (docs/design.md, Expectation sources), and bad or hostile metadata.

The files are planted as the kubelet plugin framework writes them (tests/support/dra.py); the whole entrypoint on
them, on the simulated host and in a container: tests/unit/test_entrypoint_contract.py (`test_a_dra_*`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpupin.core.errors import ExpectationError, MisalignedError
from gpupin.entrypoint.sources import find
from tests.support import dra
from tests.support.entrypoint import one_error_line
from tests.support.host import ENTRYPOINT, simhost_env
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

MIXED = scenario_cards("mixed-4")  # NVML order: A800 1B, RTX 3B, A800 86, A800 AF; minor numbers 0..3
A800, RTX, A800B, A800C = uuids("mixed-4")


def found(root: Path, **env: str) -> tuple[list[str], str | None, str]:
    f = find({"GPUPIN_DRA_METADATA_DIR": str(root), **env}, cards=lambda: MIXED)
    e = f.expectation
    return ([str(c) for c in e.cards] if e else []), (e.source if e else None), f.why_unpinned()


def test_uuids_bus_ids_and_minor_numbers_name_the_cards_in_bus_order(tmp_path: Path) -> None:
    """By UUID (with its bus id), by bus id alone (the standard attribute), by the driver's device name
    `gpu-<minor>` when it published no attribute (NVIDIA's driver attaches them to passthrough devices only)."""
    devices = [
        dra.gpu(A800C, "0000:af:00.0", "gpu-3"),
        dra.gpu(None, "0000:86:00.0", "gpu-2"),
        {"driver": "gpu.nvidia.com", "pool": "node-1", "name": "gpu-0"},
    ]
    dra.plant(tmp_path, dra.record(devices))
    cards, source, _ = found(tmp_path)
    assert cards == [f"{A800}@00000000:1B:00.0", f"{A800B}@00000000:86:00.0", f"{A800C}@00000000:AF:00.0"]
    assert source == "the DRA claim gpu-claim/gpu"


def test_every_claim_and_request_of_the_container_counts_and_a_shared_card_once(tmp_path: Path) -> None:
    dra.plant(tmp_path, dra.record([dra.gpu(RTX)], claim="a"), claim="a")
    dra.plant(tmp_path, dra.record([dra.gpu(A800)], claim="pod-gpu-x1"), claim="gpu", kind="resourceclaimtemplates")
    dra.plant(tmp_path, dra.record([dra.gpu(RTX)], claim="a", request="again"), claim="a", request="again")
    cards, source, _ = found(tmp_path)
    assert cards == [A800, RTX]
    assert source == "the DRA claim a/again, a/gpu, gpu/gpu"


def test_the_first_known_version_is_read_and_unknown_ones_skipped(tmp_path: Path) -> None:
    newer = dra.record([dra.gpu(A800)], versions=("metadata.resource.k8s.io/v2",))
    dra.plant(tmp_path, newer + dra.record([dra.gpu(RTX)]))
    assert found(tmp_path)[0] == [RTX]


def test_gpupin_expect_wins_and_the_claim_wins_over_nvidia_visible_devices(tmp_path: Path) -> None:
    dra.plant(tmp_path, dra.record([dra.gpu(RTX)]))
    assert found(tmp_path, GPUPIN_EXPECT=A800)[0] == [A800]
    assert found(tmp_path, NVIDIA_VISIBLE_DEVICES=A800B)[0] == [RTX]


def test_devices_of_other_drivers_name_no_gpu(tmp_path: Path) -> None:
    """A NIC's record carries a pciBusID too: only a GPU UUID, or NVIDIA's driver, names a GPU."""
    nic = dra.gpu(None, "0000:1b:00.0", "eth1", driver="dra.net")
    dra.plant(tmp_path, dra.record([nic]), driver="dra.net")
    cards, source, why = found(tmp_path, NVIDIA_VISIBLE_DEVICES="void")
    assert (cards, source) == ([], None)
    assert why.startswith("the DRA device metadata names no GPU (dra.net/eth1);"), why


def test_without_the_folder_nothing_is_read(tmp_path: Path) -> None:
    assert found(tmp_path / "absent") == (
        [],
        None,
        "GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_*, SLURM_STEP_GPUS/SLURM_JOB_GPUS unset",
    )
    (tmp_path / "resourceclaims").mkdir()  # the folder without a file: no claim of this container
    assert found(tmp_path)[0] == []


def test_a_card_the_container_does_not_see_is_refused_with_78(tmp_path: Path) -> None:
    dra.plant(tmp_path, dra.record([dra.gpu(None, "0000:5e:00.0")]))
    with pytest.raises(MisalignedError) as err:
        found(tmp_path)
    assert "gpu-claim/gpu device gpu.nvidia.com/gpu-0 names the GPU at 00000000:5E:00.0" in err.value.message


def _obj(**change: object) -> str:
    o = json.loads(dra.record([dra.gpu(RTX)], versions=dra.VERSIONS[:1]))
    o.update(change)
    return json.dumps(o)


HOSTILE = {
    "not-json": ('{"kind": "DeviceMetadata",', "not a stream of JSON objects"),
    "not-utf8": ("\udcff", "not UTF-8 text"),
    "requests-not-a-list": (_obj(requests={"name": "gpu"}), "requests is {'name': 'gpu'}, not a list"),
    "device-not-an-object": (_obj(requests=[{"name": "gpu", "devices": ["gpu-0"]}]), "'gpu-0' is not an object"),
    "driver-not-a-string": (
        _obj(requests=[{"name": "gpu", "devices": [{"driver": 7, "pool": "p", "name": "gpu-0"}]}]),
        "driver is 7, not a str",
    ),
    "uuid-not-a-string": (
        _obj(requests=[{"name": "gpu", "devices": [dict(dra.gpu(), attributes={"uuid": {"int": 1}})]}]),
        "attribute 'uuid' is not a string value",
    ),
    "uuid-not-a-uuid": (
        _obj(requests=[{"name": "gpu", "devices": [dra.gpu("GPU-nothex")]}]),
        "uuid 'GPU-nothex' is not a GPU or MIG UUID",
    ),
    "bus-not-a-bus-id": (
        _obj(requests=[{"name": "gpu", "devices": [dra.gpu(None, "0000:zz:00.0")]}]),
        "resource.kubernetes.io/pciBusID '0000:zz:00.0' is not a PCI bus id",
    ),
    "no-known-version": (dra.record([dra.gpu(RTX)], versions=("v9",)), "no DeviceMetadata object of a version"),
    "huge": (" " * (1 << 20) + "{}", "it is larger than 1 MiB"),
    "nested": ("[" * 200_000, "JSON nested too deeply"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_bad_metadata_is_refused_with_64_and_one_line(tmp_path: Path, name: str) -> None:
    text, why = HOSTILE[name]
    p = dra.path(tmp_path)
    p.parent.mkdir(parents=True)
    p.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ExpectationError) as err:
        found(tmp_path)
    assert err.value.message.startswith("DRA device metadata "), err.value.message
    assert why in err.value.message, err.value.message


def test_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    """A link planted in the image (the kubelet mounts files) would read another file as the claim."""
    secret = tmp_path / "elsewhere.json"
    secret.write_text(dra.record([dra.gpu(A800)]))
    p = dra.path(tmp_path / "dra")
    p.parent.mkdir(parents=True)
    p.symlink_to(secret)
    with pytest.raises(ExpectationError, match="it is a symbolic link"):
        found(tmp_path / "dra")
    p.unlink()  # a linked folder is not walked into either
    os.symlink(tmp_path, p.parent / "linked")
    (p.parent.parent / "other").symlink_to(secret.parent)
    assert found(tmp_path / "dra")[0] == []


def test_a_fifo_or_too_many_files_are_refused(tmp_path: Path) -> None:
    p = dra.path(tmp_path)
    p.parent.mkdir(parents=True)
    os.mkfifo(p)
    with pytest.raises(ExpectationError, match="a FIFO, not a regular file"):
        found(tmp_path)
    p.unlink()
    for k in range(65):
        dra.plant(tmp_path, dra.record([dra.gpu(RTX)]), request=f"r{k}")
    with pytest.raises(ExpectationError, match="more than 64 metadata files"):
        found(tmp_path)


@pytest.mark.timeout(120)
def test_the_entrypoint_refuses_bad_metadata_in_one_line_without_a_traceback(fakegpu: Path, tmp_path: Path) -> None:
    dra.plant(tmp_path, '{"kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v1beta1", "requests": 5}')
    env = simhost_env(GPUPIN_DRA_METADATA_DIR=str(tmp_path))
    r = subprocess.run(
        [ENTRYPOINT, "sh", "-c", "echo WORKLOAD-STARTED"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 64, r
    assert "WORKLOAD-STARTED" not in r.stdout and "Traceback" not in r.stderr
    line = one_error_line(r.stderr)
    assert line.startswith("gpupin-entrypoint: ERROR: DRA device metadata gpu-claim/gpu: requests is 5, not a list."), (
        line
    )
    assert "HINT:" in line


def test_a_record_of_many_devices_is_read_quickly_and_said_briefly(tmp_path: Path) -> None:
    """A file at its limit with thousands of devices: bounded work, and the unpinned line names four of them."""
    import time

    nics = [dra.gpu(None, None, f"eth{k}", driver="dra.net") for k in range(4000)]
    dra.plant(
        tmp_path, dra.record(nics, versions=dra.VERSIONS[:1]).replace("\n", "").replace("  ", ""), driver="dra.net"
    )
    start = time.monotonic()
    _, source, why = found(tmp_path, NVIDIA_VISIBLE_DEVICES="void")
    assert time.monotonic() - start < 5 and source is None
    assert "(dra.net/eth0, dra.net/eth1, dra.net/eth10, dra.net/eth100 and 3996 more)" in why, why


def test_a_mig_device_is_named_by_its_own_uuid(tmp_path: Path) -> None:
    """NVIDIA's driver gives a MIG device's record the MIG UUID (`uuid`), which is the CUDA device pinned."""
    mig = scenario_cards("mig")
    whole = mig[1].uuid
    part = mig[0].mig_devices[1].uuid
    assert whole is not None and part is not None
    dra.plant(tmp_path, dra.record([dra.gpu(whole, None, "gpu-1"), dra.gpu(part, None, "gpu-0-mig-1")]))
    e = find({"GPUPIN_DRA_METADATA_DIR": str(tmp_path)}, cards=lambda: mig).expectation
    assert e is not None and [c.uuid for c in e.cards] == [part, whole]  # NVML's order: card 0's MIG first


def test_names_with_control_characters_stay_on_one_line(tmp_path: Path) -> None:
    nic = dra.gpu(None, None, "eth\n0\x1b[2J", driver="dra.net")
    dra.plant(tmp_path, dra.record([nic]), claim="a\nb", driver="dra.net")
    why = found(tmp_path)[2]
    assert "\n" not in why and "\x1b" not in why and "'eth\\n0\\x1b[2J'" in why, why
    dra.plant(tmp_path, "{", claim="a\nb")
    with pytest.raises(ExpectationError) as err:
        found(tmp_path)
    assert "\n" not in err.value.message, err.value.message
