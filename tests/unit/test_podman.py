"""Podman (gpupin.hostagent.engine.podman): the create payload hostagent builds for Docker as podman's own create
(CDI devices, never a dropped option), the nvidia driver's request refused, and podman holders read from the card
nodes of their OCI spec. On the sandboxed podman: tests/docker/test_podman.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpupin.core.errors import UsageError
from gpupin.hostagent.engine import podman
from gpupin.hostagent.ledger.holding_forms import HostCards, grants
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")


def payload(**host: Any) -> dict[str, Any]:
    """A create payload as gpupin.hostagent.run.request builds it (the docker SDK's types), CDI-pinned to RTX."""
    hc: dict[str, Any] = {
        "NetworkMode": "default",
        "DeviceRequests": [
            {"Driver": "cdi", "Count": 0, "DeviceIDs": [f"nvidia.com/gpu={RTX}"], "Capabilities": [], "Options": {}}
        ],
        "Dns": [],
        "Devices": [],
        "PortBindings": {},
        "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
    }
    hc.update(host)
    return {
        "Hostname": None,
        "Tty": False,
        "OpenStdin": False,
        "AttachStdout": True,
        "AttachStderr": True,
        "Env": ["A=B=C", "UNSET", f"GPUPIN_EXPECT={RTX}@00000000:3B:00.0"],
        "Cmd": ["python3", "-m", "gpupin.entrypoint"],
        "Image": "gpupin:test",
        "Entrypoint": None,
        "Labels": {"gpupin.devices": RTX, "gpupin.shared": "false"},
        "HostConfig": hc,
    }


def test_the_cdi_request_becomes_podmans_cdi_device_and_the_rest_is_carried() -> None:
    spec = podman.spec_generator(
        payload(AutoRemove=True, Binds=["/data:/data:ro"], Ulimits=[{"Name": "nofile", "Soft": 1024, "Hard": 1024}]),
        "job",
    )
    assert spec["devices"] == [{"path": f"nvidia.com/gpu={RTX}"}]
    assert spec["env"] == {"A": "B=C", "GPUPIN_EXPECT": f"{RTX}@00000000:3B:00.0"}
    assert spec["labels"]["gpupin.devices"] == RTX and spec["name"] == "job" and spec["remove"] is True
    assert spec["command"] == ["python3", "-m", "gpupin.entrypoint"] and spec["image"] == "gpupin:test"
    assert spec["mounts"] == [{"destination": "/data", "source": "/data", "type": "bind", "options": ["rbind", "ro"]}]
    # libpod names a limit as the docker CLI does (it adds the RLIMIT_ itself) and reads it unsigned.
    assert spec["r_limits"] == [{"type": "nofile", "soft": 1024, "hard": 1024}]
    unlimited = podman.spec_generator(payload(Ulimits=[{"Name": "memlock", "Soft": -1, "Hard": -1}]), None)
    assert unlimited["r_limits"] == [{"type": "memlock", "soft": 2**64 - 1, "hard": 2**64 - 1}]


def test_the_nvidia_drivers_request_is_never_sent_to_podman() -> None:
    nvidia = [{"Driver": "nvidia", "Count": 0, "DeviceIDs": [RTX], "Capabilities": [["gpu"]], "Options": {}}]
    with pytest.raises(UsageError, match="unpinned"):
        podman.spec_generator(payload(DeviceRequests=nvidia), None)
    with pytest.raises(UsageError, match="no card pinned"):
        podman.refuse_nvidia("nvidia", "4.3.1")
    podman.refuse_nvidia("cdi", "4.3.1")


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ({"Privileged": True}, "HostConfig.Privileged"),
        ({"PortBindings": {"80/tcp": [{"HostPort": "8080"}]}}, "HostConfig.PortBindings"),
        ({"CapAdd": ["SYS_ADMIN"]}, "HostConfig.CapAdd"),
    ],
)
def test_an_option_without_a_translation_is_refused_by_name_not_dropped(host: dict[str, Any], named: str) -> None:
    with pytest.raises(UsageError, match=named):
        podman.spec_generator(payload(**host), None)


def test_an_anonymous_volume_or_a_network_endpoint_is_refused_not_dropped() -> None:
    with pytest.raises(UsageError, match="Volumes"):
        podman.spec_generator({**payload(), "Volumes": {"/scratch": {}}}, None)
    networking = {"EndpointsConfig": {"net": {"Aliases": ["job"]}}}
    with pytest.raises(UsageError, match="NetworkingConfig"):
        podman.spec_generator({**payload(), "NetworkingConfig": networking}, None)


def test_stop_timeout_shm_size_ipc_and_network_modes_are_carried_as_libpods() -> None:
    spec = podman.spec_generator(
        {**payload(ShmSize=256 << 20, IpcMode="host", NetworkMode="container:abc"), "StopTimeout": 1}, None
    )
    assert spec["shm_size"] == 256 << 20 and spec["stop_timeout"] == 1
    assert spec["ipcns"] == {"nsmode": "host"} and spec["netns"] == {"nsmode": "container", "value": "abc"}
    with pytest.raises(UsageError, match=r"HostConfig\.NetworkMode"):  # a named network: not translated
        podman.spec_generator(payload(NetworkMode="mynet"), None)


def test_every_bind_option_goes_to_podman_none_dropped() -> None:
    # podman refuses one it does not know (125), as Docker does: nothing is silently left out here.
    spec = podman.spec_generator(payload(Binds=["/tmp:/x:ro,badmode"]), None)
    assert spec["mounts"][0]["options"] == ["rbind", "ro", "badmode"]


def test_podmans_500_for_a_name_in_use_is_a_conflict() -> None:
    from gpupin.hostagent.engine import is_conflict
    from gpupin.hostagent.engine.failures import EngineError

    taken = 'container create: creating container storage: the container name "gpupin-ledger-lock" is already in use'
    assert is_conflict(
        EngineError(500, f"{taken} by abc. You have to remove that container: that name is already in use")
    )
    assert is_conflict(EngineError(409, "Conflict"))
    assert not is_conflict(EngineError(500, "container create: no space left on device"))


def test_a_named_volume_is_refused_on_podman() -> None:
    with pytest.raises(UsageError, match="host paths only"):
        podman.spec_generator(payload(Binds=["cache:/cache"]), None)


def inspect(devices: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Podman's compatible inspect of a CDI container: no device anywhere, the OCI spec's nodes beside it."""
    return {"Id": "p" * 64, "HostConfig": {"Devices": [], "DeviceRequests": None}, podman.OCI_KEY: devices}


def test_podmans_holders_are_read_from_the_card_nodes_of_their_oci_spec() -> None:
    host = HostCards(scenario_cards("mixed-4"))
    nodes = [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": 120, "minor": 0},
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},
    ]
    got = grants(inspect(nodes), host)
    assert [(g.form, sorted(g.uuids)) for g in got] == [("oci-device", sorted([RTX, A800C]))]
    assert grants(inspect(None), host) == []  # created, never started: no OCI spec yet
    assert grants(inspect([{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]), host) == []
