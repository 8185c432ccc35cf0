"""Every path to a card, without a daemon: the normalisation of a host path and what it reaches (by name, and on
this host through symlinks and device numbers: real nodes made with mknod), the variables a runtime reads to pick
devices (-e and --env-file), the ledger's rows for device folders, bind mounts, device-cgroup rules, CDI names in
NVIDIA_VISIBLE_DEVICES and CDI annotations, and which gpupin labels are a container's own.
tests/test_ledger_docker.py runs the same rules against both engines."""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupin.core.errors import UsageError
from gpupin.hostagent.ledger import holders, holding_forms, lease, nodes
from gpupin.hostagent.ledger.holding_forms import HostCards
from gpupin.hostagent.pin import Pin
from tests.support.scenarios import cards as mixed4
from tests.support.scenarios import uuids
from tests.unit.test_hostagent_unit import request
from tests.unit.test_ledger import container

A800, RTX, A800B, A800C = uuids("mixed-4")

ALL = [A800, RTX, A800B, A800C]


def host(local: bool = False) -> HostCards:
    cards = mixed4()
    for i, c in enumerate(cards):
        c.minor_number = i
    return HostCards(cards, local=local)


# --- normalisation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/dev//nvidia1", "/dev/nvidia1"),
        ("/dev/./nvidia1", "/dev/nvidia1"),
        ("/dev/../dev/nvidia1", "/dev/nvidia1"),
        ("//dev/nvidia1", "/dev/nvidia1"),
        ("/dev/", "/dev"),
        ("/dev/.", "/dev"),
        ("/../dev", "/dev"),
        ("///", "/"),
    ],
)
def test_a_path_is_normalised_as_the_kernel_reads_it(path: str, want: str) -> None:
    assert nodes.normalised(path) == want and nodes.names_gpu_node(path)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps",
        "/dev/char/195:1",
        "/dev/char",
        "/dev",
        "/",
    ],
)
def test_the_paths_that_reach_a_node_on_every_gpu_host(path: str) -> None:
    assert nodes.names_gpu_node(path)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/shm",
        "/dev/null",
        "/dev/fuse",
        "/data",
        "/dev/shm/../null",
        "/devices",
        "/dev/char/1:3",
        "/home/me/nvidia-smi-logs",
        "/tmp",
    ],
)
def test_the_paths_that_reach_none_by_name(path: str) -> None:
    assert not nodes.names_gpu_node(path)


COMPONENT = st.sampled_from(
    ["dev", "nvidia0", "nvidia1", "nvidiactl", "char", "195:2", "shm", "data", "x", "nvidia-caps"]
)


@given(
    st.lists(COMPONENT, max_size=4),
    st.lists(st.sampled_from(["//", "/./", "/x/../", "/"]), min_size=4, max_size=4),
    st.booleans(),
)
def test_noise_in_a_path_changes_nothing(parts: list[str], seps: list[str], trailing: bool) -> None:
    """`//`, `/./`, `/x/../` between components and a trailing `/` are the same path: the same verdict."""
    clean = "/" + "/".join(parts)
    noisy = "/" + "".join(p + s for p, s in zip(parts, seps)) if parts else "/"
    noisy = noisy if trailing else noisy.rstrip("/") or "/"
    assert nodes.normalised(noisy) == posixpath.normpath(clean)
    assert nodes.names_gpu_node(noisy) == nodes.names_gpu_node(clean)
    assert nodes.named_minors(noisy) == nodes.named_minors(clean)


def test_gpu_majors_are_195_and_every_nvidia_major_of_proc_devices(tmp_path: Path) -> None:
    f = tmp_path / "devices"
    f.write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps-imex-channels\n"
        "236 nvidia-caps\n237 nvidia-uvm\n248 bsg\n\nBlock devices:\n  8 sd\n238 nvidia-fake-block\n"
    )
    assert nodes.gpu_majors(str(f)) == {195, 235, 236, 237}
    assert nodes.gpu_majors(str(tmp_path / "missing")) == {195}


# --- on this host: real nodes ----------------------------------------------------------------------------------


def mknod(path: Path, major: int, minor: int) -> None:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.fail("these tests make device nodes: run them as root (as make test does)")


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A folder holding `c 195:1` two levels down, a link to it, a link to a card, and a harmless node."""
    (tmp_path / "gpus" / "deep").mkdir(parents=True)
    mknod(tmp_path / "gpus" / "deep" / "card", 195, 1)
    (tmp_path / "flat").mkdir()
    mknod(tmp_path / "flat" / "renamed", 195, 3)
    mknod(tmp_path / "flat" / "ctl", 195, 255)
    mknod(tmp_path / "null", 1, 3)
    (tmp_path / "link-to-card").symlink_to(tmp_path / "flat" / "renamed")
    (tmp_path / "link-to-folder").symlink_to(tmp_path / "gpus")
    return tmp_path


def test_a_node_is_known_by_its_device_number_through_links(planted: Path) -> None:
    for path in ("link-to-card", "flat/renamed", "flat/../flat//renamed", "flat", "gpus", "link-to-folder"):
        assert nodes.reaches_gpu_node(str(planted / path), local=True, deep=True), path
    assert not nodes.reaches_gpu_node(str(planted / "null"), local=True, deep=True)
    # a bind mount: the node or a node right in the folder; a --device folder: its whole tree (docker walks it)
    assert nodes.reaches_gpu_node(str(planted / "flat"), local=True, deep=False)
    assert not nodes.reaches_gpu_node(str(planted / "gpus"), local=True, deep=False)
    # a daemon elsewhere: its paths are not this machine's, by name only
    assert not nodes.reaches_gpu_node(str(planted / "link-to-card"), local=False, deep=True)


def test_device_folders_count_by_the_minor_numbers_they_grant(planted: Path) -> None:
    here = host(local=True)
    got = holding_forms.grants(
        container(
            devices=[
                str(planted / "gpus"),
                str(planted / "link-to-card"),
                str(planted / "flat" / "ctl"),
                str(planted / "null"),
            ]
        ),
        here,
    )
    assert [(g.form, list(g.uuids)) for g in got] == [("device-file", [RTX]), ("device-file", [A800C])]
    # by name where the daemon is elsewhere: /dev holds every card
    got = holding_forms.grants(container(devices=["/dev", "/dev/char/195:2", "/dev/nvidia-uvm"]), host())
    assert [list(g.uuids) for g in got] == [ALL, [A800B]]


def with_host_config(c: dict[str, Any], **fields: Any) -> dict[str, Any]:
    c["HostConfig"].update(fields)
    return c


def binds(c: dict[str, Any], *sources: str) -> dict[str, Any]:
    c["Mounts"] = [{"Type": "bind", "Source": s, "Destination": "/mnt" + str(i)} for i, s in enumerate(sources)]
    return c


def test_device_cgroup_rules_granting_major_195() -> None:
    h = host()
    for rule, want in (
        ("c 195:* rwm", ALL),
        ("a *:* rwm", ALL),
        ("a", ALL),
        ("c 195:2 rwm", [A800B]),
        ("c *:* rwm", ALL),
        ("c 195:255 rwm", []),
        ("c 1:3 rwm", []),
        ("b 195:* rwm", []),
        ("c 195:* rw", []),
    ):  # no `m`: it cannot make the node, and nothing brings one in
        got = holding_forms.grants(with_host_config(container(), DeviceCgroupRules=[rule]), h)
        assert sorted(u for g in got for u in g.uuids) == sorted(want), rule
    # without CAP_MKNOD the rule opens only what a mount brings in
    dropped = with_host_config(container(), DeviceCgroupRules=["c 195:* rwm"], CapDrop=["ALL"])
    assert holding_forms.grants(dropped, h) == []
    assert (
        holding_forms.grants(
            with_host_config(container(), DeviceCgroupRules=["c 195:* rwm"], CapDrop=["MKNOD"], CapAdd=["CAP_MKNOD"]), h
        )
        != []
    )


def test_bind_mounts_of_nodes_count_when_the_cgroup_lets_them_through(planted: Path) -> None:
    rw = with_host_config(container(), DeviceCgroupRules=["c 195:* rw"])
    got = holding_forms.grants(binds(rw, "/dev", "/data"), host())
    assert [(g.form, len(g.uuids), g.how) for g in got] == [
        ("bind-mount", 4, "-v /dev:/mnt0 --device-cgroup-rule 'c 195:* rw'")
    ]
    one = with_host_config(container(), DeviceCgroupRules=["c 195:3 rw"], CapDrop=["ALL"])
    got = holding_forms.grants(binds(one, str(planted / "flat")), host(local=True))
    assert [(g.form, list(g.uuids)) for g in got] == [("bind-mount", [A800C])]
    # no rule: the device cgroup refuses the nodes, the mount grants nothing
    assert holding_forms.grants(binds(container(), "/dev"), host()) == []
    # -v /dev:/dev with 'c 195:* rwm': both ways in
    both = with_host_config(container(), DeviceCgroupRules=["c 195:* rwm"])
    assert {g.form for g in holding_forms.grants(binds(both, "/dev"), host())} == {"bind-mount", "device-cgroup"}


def test_cdi_names_in_nvidia_visible_devices_under_the_nvidia_runtime() -> None:
    got = holding_forms.grants(
        container(
            runtime="nvidia", env=[f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1,nvidia.com/gpu={A800C},vendor.com/fpga=0"]
        ),
        host(),
    )
    assert [(g.form, list(g.uuids), list(g.unknown)) for g in got] == [("nvidia-runtime", [RTX, A800C], [])]
    assert holding_forms.grants(container(env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"]), host()) == []  # runc


def test_cdi_annotations_in_any_container() -> None:
    c = with_host_config(
        container(),
        Annotations={
            "cdi.k8s.io/job": "nvidia.com/gpu=2,vendor.com/fpga=0",
            "cdi.k8s.io/all": "nvidia.com/gpu=all",
            "other/x": "nvidia.com/gpu=1",
        },
    )
    got = holding_forms.grants(c, host())
    assert [(g.form, len(g.uuids), g.how) for g in got] == [
        ("cdi-annotation", 4, "--annotation cdi.k8s.io/all=nvidia.com/gpu=all"),
        ("cdi-annotation", 1, "--annotation cdi.k8s.io/job=nvidia.com/gpu=2,vendor.com/fpga=0"),
    ]
    assert (
        holding_forms.grants(with_host_config(container(), Annotations={"cdi.k8s.io/x": "vendor.com/fpga=0"}), host())
        == []
    )


# --- refused by run --------------------------------------------------------------------------------------------


def test_run_refuses_a_folder_or_link_that_reaches_a_node(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/gpupin-test.sock")
    monkeypatch.setattr("gpupin.hostagent.engine.address._ENDPOINT", None)
    for opt, value in (
        ("devices", f"{planted / 'gpus'}:/gpus"),
        ("devices", str(planted / "link-to-card")),
        ("volumes", f"{planted / 'flat'}:/flat"),
        ("mounts", f"type=bind,src={planted / 'flat'},dst=/f"),
    ):
        with pytest.raises(UsageError) as e:
            request(**{opt: [value]})  # type: ignore[arg-type]
        assert e.value.exit_code == 64 and "reaches an NVIDIA device node" in e.value.message
        assert "\n" not in e.value.message
    with pytest.raises(UsageError, match=r"\(a link to .*/flat/renamed\)"):
        request(devices=[str(planted / "link-to-card")])
    request(volumes=[f"{planted / 'gpus'}:/g", "/data:/data", "named-volume:/v"], devices=[str(planted / "null")])


@pytest.mark.parametrize(
    "var",
    [
        "DOCKER_RESOURCE_GPU",
        "DOCKER_RESOURCE_NVIDIA-GPU",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
    ],
)
def test_run_refuses_the_variables_a_runtime_reads_to_pick_devices(var: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        request(env=[f"{var}={A800}"])
    assert e.value.message.startswith(f"-e {var}: the NVIDIA runtime reads {var}") and e.value.exit_code == 64
    f = tmp_path / "job.env"
    f.write_text(f"LR=0.1\n{var}={A800}\n")
    with pytest.raises(UsageError) as e:
        request(env_files=[str(f)])
    assert e.value.message.startswith(f"--env-file {f}: {var}: the NVIDIA runtime reads {var}")
    with pytest.raises(UsageError, match=f"-e {var}: "):  # passed from this shell
        request(env=[var], environ={var: "0"})
    request(env=["NVIDIA_DRIVER_CAPABILITIES=compute,utility", "CUDA_VISIBLE_DEVICES=0"])  # libraries, not devices


# --- labels belong to the container that set them -------------------------------------------------------------


def test_a_label_equal_to_the_images_is_inherited() -> None:
    image = {
        "gpupin.devices": RTX,
        "gpupin.shared": "true",
        "team": "ml",
        lease.OWNER_LABEL: "host=h pid=1 start=1 boot=b pidns=1",
        lease.LEASE_LABEL: "30",
    }
    # docker create from a committed image: every gpupin label is the image's
    assert holders.not_inherited(dict(image), image) == {"team": "ml"}
    # set again by hand to another value: that one is the container's own
    assert holders.not_inherited({**image, "gpupin.devices": A800}, image) == {"team": "ml", "gpupin.devices": A800}
    # pinned by hostagent from that image: signed by its own owner, so every label is its own, even one that
    # equals the image's
    ours = {**image, **Pin([], share=False).labels(), "gpupin.devices": RTX, **lease.claim()}
    assert holders.not_inherited(ours, image) == ours and ours["gpupin.shared"] == "false"
    assert holders.not_inherited({"gpupin.devices": RTX}, {}) == {"gpupin.devices": RTX}


def test_every_pinned_container_writes_all_of_the_ledgers_labels() -> None:
    assert Pin([]).labels() == {"gpupin.devices": "", "gpupin.shared": "false"}
    assert Pin([], share=True).labels()["gpupin.shared"] == "true"


def test_a_device_folder_too_big_to_walk_is_refused_as_such(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/gpupin-test.sock")
    monkeypatch.setattr("gpupin.hostagent.engine.address._ENDPOINT", None)
    monkeypatch.setattr(nodes, "WALK_LIMIT", 2)
    with pytest.raises(UsageError) as e:
        request(devices=[str(planted)])
    assert e.value.exit_code == 64 and "\n" not in e.value.message
    assert "holds more than 2 entries, too many to tell whether it reaches" in e.value.message


def test_the_agent_leaves_a_device_folders_walk_to_the_caller(planted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the agent (root), a --device folder is not walked: the caller's own run walks it with its own rights."""
    from gpupin.hostagent.run import request_json
    from gpupin.hostagent.run.reads import CallersOwn

    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/gpupin-test.sock")
    monkeypatch.setattr("gpupin.hostagent.engine.address._ENDPOINT", None)
    sent = request_json.dump(request(devices=[str(planted / "null")]))
    request_json.load(sent)  # a node: judged in the agent, as before
    with pytest.raises(CallersOwn, match="a --device folder is walked with the caller's own rights"):
        request_json.load({**sent, "options": {**sent["options"], "devices": [str(planted / "gpus")]}})
