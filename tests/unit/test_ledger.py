"""The ledger's pure parts: the table of the ways a container holds cards (read from inspect data as the Engine API
gives it), when a container holds, holders and sharing, leases, the local lock's trust rules, and the engine's
address and clock parsing. No daemon here; tests/docker/test_ledger_docker.py runs the same rules against one."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.core.errors import CardHeldError, DockerUnavailableError, UsageError
from gpupin.core.nvml import MigDevice
from gpupin.hostagent import engine
from gpupin.hostagent.engine import address
from gpupin.hostagent.ledger import holding_forms as ledger
from gpupin.hostagent.ledger import lease, lock
from gpupin.hostagent.ledger.holders import Holder, blocking, held, holder, holding
from gpupin.hostagent.ledger.holding_forms import FORMS, HostCards
from gpupin.hostagent.ls.listing import holder_shown
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

MIG_A = "MIG-11111111-2222-3333-4444-555555555555"
MIG_B = "MIG-66666666-7777-8888-9999-000000000000"
ALL = uuids("mixed-4")
A800, RTX, A800B, A800C = ALL


def mig_host() -> HostCards:
    cards = scenario_cards()
    cards[0].mig_mode = True
    cards[0].mig_devices = [MigDevice(MIG_A, 1, 0, "3g.40gb", index=0), MigDevice(MIG_B, 2, 0, "3g.40gb", index=1)]
    for i, c in enumerate(cards):
        c.minor_number = i
    return HostCards(cards)


def container(
    *,
    requests: list[dict[str, Any]] | None = None,
    runtime: str = "runc",
    env: list[str] | None = None,
    devices: list[str] | None = None,
    privileged: bool = False,
    status: str = "running",
    labels: dict[str, str] | None = None,
    restart: str = "no",
    retries: int = 0,
    exit_code: int = 0,
    restart_count: int = 0,
    started: bool = True,
) -> dict[str, Any]:
    """`docker inspect` data in the Engine API's shape (the fields the ledger reads)."""
    return {
        "Id": "c" * 64,
        "Name": "/job",
        "RestartCount": restart_count,
        "State": {
            "Status": status,
            "ExitCode": exit_code,
            "StartedAt": "2026-11-30T10:00:00.5Z" if started else "0001-01-01T00:00:00Z",
        },
        "Config": {"Env": env or [], "Labels": labels or {}},
        "HostConfig": {
            "DeviceRequests": requests,
            "Runtime": runtime,
            "Privileged": privileged,
            "RestartPolicy": {"Name": restart, "MaximumRetryCount": retries},
            "Devices": [{"PathOnHost": d, "PathInContainer": d, "CgroupPermissions": "rwm"} for d in devices or []],
        },
    }


def gpus(
    ids: list[str] | None = None, count: int = 0, driver: str = "", caps: list[list[str]] | None = None
) -> list[dict[str, Any]]:
    return [{"Driver": driver, "Count": count, "DeviceIDs": ids, "Capabilities": caps or [["gpu"]], "Options": {}}]


# --- the table -------------------------------------------------------------------------------------------------


def test_the_table_names_each_form_once() -> None:
    names = [f.name for f in FORMS]
    assert names == [
        "device-request",
        "cdi",
        "cdi-annotation",
        "nvidia-runtime",
        "swarm-resource",
        "device-file",
        "bind-mount",
        "device-cgroup",
        "privileged",
        "oci-device",
    ]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    ("requests", "want", "how"),
    [
        (gpus(count=-1), ALL, "--gpus all"),
        (gpus(count=2), [A800, RTX], "--gpus 2"),
        (gpus(["2"]), [A800B], "--gpus device=2"),
        (gpus([A800C, "00000000:3B:00.0"], driver="nvidia"), [A800C, RTX], f"--gpus device={A800C},00000000:3B:00.0"),
        (gpus(["0:1"]), [MIG_B], "--gpus device=0:1"),
        (gpus([MIG_A]), [MIG_A], f"--gpus device={MIG_A}"),
        (gpus(["all"]), ALL, "--gpus device=all"),
        (gpus(["1"], caps=[["nvidia", "compute", "utility"]]), [RTX], "--gpus device=1"),
        (gpus(["1"], caps=[["tpu"], ["gpu"]]), [RTX], "--gpus device=1"),  # any one capability set that matches
    ],
)
def test_device_requests_as_the_daemon_hands_them_out(
    requests: list[dict[str, Any]], want: list[str], how: str
) -> None:
    got = ledger.grants(container(requests=requests), mig_host())
    assert [(g.form, list(g.uuids), g.how) for g in got] == [("device-request", want, how)]


def test_requests_for_other_drivers_and_unknown_ids() -> None:
    host = mig_host()
    assert ledger.grants(container(requests=gpus(count=-1, caps=[["tpu"]])), host) == []
    assert ledger.grants(container(requests=gpus(["vendor.com/fpga=1"], driver="cdi")), host) == []
    g = ledger.grants(container(requests=gpus(["7", "1"])), host)[0]
    assert (list(g.uuids), list(g.unknown)) == ([RTX], ["7"])


@pytest.mark.parametrize(
    ("requests", "want", "how"),
    [
        (gpus(["1"], driver="nvidia.cdi", caps=[]), [RTX], "--gpus driver=nvidia.cdi,device=1"),
        (gpus(count=-1, driver="nvidia.cdi", caps=[]), ALL, "--gpus driver=nvidia.cdi,count=all"),
        (
            gpus(count=2, driver="nvidia.runtime-hook", caps=[]),
            [A800, RTX],
            "--gpus driver=nvidia.runtime-hook,count=2",
        ),
        # nvidia.cdi passes a qualified CDI name on as it is (normalizeDeviceID)
        (gpus([f"nvidia.com/gpu={A800C}"]), [A800C], f"--gpus device=nvidia.com/gpu={A800C}"),
    ],
)
def test_engine_29s_nvidia_drivers_are_read_as_the_nvidia_driver(
    requests: list[dict[str, Any]], want: list[str], how: str
) -> None:
    """Docker 29 carries --gpus by CDI where nvidia-cdi-hook is installed (moby#50228): HostConfig keeps the
    request as sent, and a request may name `nvidia.cdi` or `nvidia.runtime-hook` itself. Each is a holder."""
    got = ledger.grants(container(requests=requests), mig_host())
    assert [(g.form, list(g.uuids), g.how) for g in got] == [("device-request", want, how)]


def test_gpus_beside_a_cdi_device_for_the_same_card_is_one_holder_of_it() -> None:
    """`--gpus device=1 --device nvidia.com/gpu=UUID`, or an engine that shows --gpus's card among its CDI
    devices too: two grants, one card, held once."""
    c = container(requests=gpus(["1"]) + cdi(f"nvidia.com/gpu={RTX}"))
    got = ledger.grants(c, mig_host())
    assert [(g.form, list(g.uuids)) for g in got] == [("device-request", [RTX]), ("cdi", [RTX])]
    h = holder(c, mig_host())
    assert h is not None and h.uuids == (RTX,)
    assert held([h]) == {RTX: [h]}
    # --gpus carried by CDI, seen only as CDI device paths (no DeviceRequests): the same card, never missed
    only_cdi = holder(container(devices=[f"nvidia.com/gpu={RTX}"]), mig_host())
    assert only_cdi is not None and only_cdi.uuids == (RTX,)


def cdi(*ids: str) -> list[dict[str, Any]]:
    """A CDI device request as `docker run --device nvidia.com/gpu=...` sends it (measured on Engine 26)."""
    return [{"Driver": "cdi", "Count": 0, "DeviceIDs": list(ids), "Capabilities": None, "Options": None}]


@pytest.mark.parametrize(
    ("ids", "want"),
    [
        (["nvidia.com/gpu=2"], [A800B]),
        ([f"nvidia.com/gpu={A800C}", "nvidia.com/gpu=1"], [A800C, RTX]),
        (["nvidia.com/gpu=0:1"], [MIG_B]),
        ([f"nvidia.com/gpu={MIG_A}"], [MIG_A]),
        (["nvidia.com/gpu=all"], ALL),
        (["nvidia.com/gpu=gpu3", "nvidia.com/gpu=mig0:0"], [A800C, MIG_A]),  # the type-index name strategy
        (["nvidia.com/gpu=1", "vendor.com/fpga=0", "nvidia.com/nic=1"], [RTX]),  # other kinds name no GPU
    ],
)
def test_cdi_device_requests_as_nvidias_spec_names_the_cards(ids: list[str], want: list[str]) -> None:
    got = ledger.grants(container(requests=cdi(*ids)), mig_host())
    gpu_ids = [i for i in ids if i.startswith("nvidia.com/gpu=")]
    assert [(g.form, list(g.uuids), g.how) for g in got] == [("cdi", want, " ".join(f"--device {i}" for i in gpu_ids))]


def test_cdi_names_the_host_has_no_card_for_stay_unknown_and_device_paths_count_too() -> None:
    host = mig_host()
    (g,) = ledger.grants(container(requests=cdi("nvidia.com/gpu=7", "nvidia.com/gpu=1")), host)
    assert (list(g.uuids), list(g.unknown)) == ([RTX], ["7"])
    # An engine that takes a CDI name among the device paths (compose's `devices:`) injects it as well.
    got = ledger.grants(container(devices=["nvidia.com/gpu=3", "/dev/null"]), host)
    assert [(g.form, list(g.uuids)) for g in got] == [("cdi", [A800C])]
    assert ledger.grants(container(requests=cdi("vendor.com/fpga=0")), host) == []


def test_a_cdi_gpu_voids_the_images_variable_under_the_nvidia_runtime() -> None:
    """NVIDIA's spec sets NVIDIA_VISIBLE_DEVICES=void, over the image's `all`: the runtime then gives nothing."""
    host = mig_host()
    got = ledger.grants(
        container(runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=all"], requests=cdi("nvidia.com/gpu=1")), host
    )
    assert [(g.form, list(g.uuids)) for g in got] == [("cdi", [RTX])]
    other = ledger.grants(
        container(runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=2"], requests=cdi("vendor.com/fpga=0")), host
    )
    assert [(g.form, list(g.uuids)) for g in other] == [("nvidia-runtime", [A800B])]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        (["NVIDIA_VISIBLE_DEVICES=all"], ALL),
        (["NVIDIA_VISIBLE_DEVICES=0:1"], [MIG_B]),
        (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=3,1"], [A800C, RTX]),  # the last one wins
        (["NVIDIA_VISIBLE_DEVICES=void"], []),
        (["NVIDIA_VISIBLE_DEVICES=none"], []),
        ([], []),
    ],
)
def test_the_nvidia_runtime_reads_nvidia_visible_devices(env: list[str], want: list[str]) -> None:
    host = mig_host()
    got = ledger.grants(container(runtime="nvidia", env=env), host)
    assert [u for g in got for u in g.uuids] == want
    # under runc the variable gives nothing
    assert ledger.grants(container(env=env), host) == []


def test_docker_resource_holds_in_any_container() -> None:
    """DOCKER_RESOURCE_<KIND> naming UUIDs (or nvidia.com/gpu CDI names), under any runtime and beside a device
    request: the toolkit reads it before NVIDIA_VISIBLE_DEVICES where its swarm-resource setting names it; a
    discrete count is no card; an image's NVIDIA_VISIBLE_DEVICES counts too (what the runtime reads when
    swarm-resource does not name the variable)."""
    host = mig_host()
    env = [f"DOCKER_RESOURCE_GPU={RTX},{MIG_B}", "DOCKER_RESOURCE_SSD=1"]
    got = ledger.grants(container(runtime="nvidia", env=env), host)
    assert [(g.form, list(g.uuids), g.how) for g in got] == [
        ("swarm-resource", [RTX, MIG_B], f"DOCKER_RESOURCE_GPU={RTX},{MIG_B}")
    ]
    got = ledger.grants(
        container(runtime="nvidia", env=[f"DOCKER_RESOURCE_NVIDIA-GPU={A800C}", "NVIDIA_VISIBLE_DEVICES=all"]), host
    )
    assert [(g.form, len(g.uuids)) for g in got] == [("nvidia-runtime", 4), ("swarm-resource", 1)]
    for c in (container(env=env), container(env=env, requests=gpus(["2"]))):  # runc, a node's default runtime hooks
        assert [u for g in ledger.grants(c, host) if g.form == "swarm-resource" for u in g.uuids] == [RTX, MIG_B]
    got = ledger.grants(container(env=["DOCKER_RESOURCE_GPU=nvidia.com/gpu=3"]), host)
    assert [(g.form, list(g.uuids)) for g in got] == [("swarm-resource", [A800C])]
    unknown = ledger.grants(
        container(runtime="nvidia", env=["DOCKER_RESOURCE_GPU=GPU-00000000-0000-0000-0000-000000000000"]), host
    )
    assert [(list(g.uuids), list(g.unknown)) for g in unknown] == [([], ["GPU-00000000-0000-0000-0000-000000000000"])]


def test_a_device_request_wins_over_the_images_variable_and_runtimes_are_asked_for_by_path() -> None:
    host = mig_host()
    got = ledger.grants(container(runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=all"], requests=gpus(["1"])), host)
    assert [(g.form, list(g.uuids)) for g in got] == [("device-request", [RTX])]
    asked = []

    def runtimes() -> dict[str, str]:
        asked.append(1)
        return {"gpu-rt": "/usr/bin/nvidia-container-runtime", "kata": "/usr/bin/kata-runtime"}

    custom = HostCards(host.cards, runtimes)
    assert custom.is_nvidia_runtime("gpu-rt") and not custom.is_nvidia_runtime("kata")
    assert not custom.is_nvidia_runtime("runc") and custom.is_nvidia_runtime("nvidia")
    assert asked == [1]  # the daemon's /info is read once, and only for a runtime it must name


def test_device_files_name_cards_by_minor_number() -> None:
    host = mig_host()
    got = ledger.grants(
        container(
            devices=[
                "/dev/nvidia2",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-caps/nvidia-cap1",
                "/tmp/x/nvidia3",
                "/dev/nvidia9",
            ]
        ),
        host,
    )
    assert [(list(g.uuids), list(g.unknown), g.how) for g in got] == [
        ([A800B], [], "--device /dev/nvidia2"),
        ([A800C], [], "--device /tmp/x/nvidia3"),
        ([], ["/dev/nvidia9 (minor 9)"], "--device /dev/nvidia9"),
    ]


def test_privileged_with_the_nvidia_toolkit_holds_every_card() -> None:
    host = mig_host()
    for c in (
        container(privileged=True, runtime="nvidia", env=["NVIDIA_VISIBLE_DEVICES=1"]),
        container(privileged=True, requests=gpus(["1"])),
        container(privileged=True, requests=cdi("nvidia.com/gpu=1")),
    ):
        assert sorted({u for g in ledger.grants(c, host) for u in g.uuids}) == sorted(ALL)
    assert ledger.grants(container(privileged=True), host) == []  # no driver put in: no card
    assert ledger.grants(container(privileged=True, requests=cdi("vendor.com/fpga=0")), host) == []


# --- when it holds ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"status": "running"}, "running"),
        ({"status": "paused"}, "paused"),
        ({"status": "restarting"}, "restarting"),
        ({"status": "exited"}, None),
        ({"status": "dead", "restart": "always"}, None),
        ({"status": "exited", "restart": "always"}, "stopped, restart=always"),
        ({"status": "exited", "restart": "unless-stopped"}, "stopped, restart=unless-stopped"),
        ({"status": "exited", "restart": "on-failure", "exit_code": 1}, "stopped, restart=on-failure"),
        ({"status": "exited", "restart": "on-failure", "exit_code": 0}, None),
        ({"status": "exited", "restart": "on-failure", "exit_code": 1, "retries": 3, "restart_count": 3}, None),
        (
            {"status": "exited", "restart": "on-failure", "exit_code": 137, "retries": 3, "restart_count": 2},
            "stopped, restart=on-failure",
        ),
        ({"status": "exited", "restart": "always", "started": False}, None),  # never started: restore skips it
        ({"status": "created", "restart": "always", "started": False}, None),
    ],
)
def test_holding_follows_the_daemons_own_restart_rules(kw: dict[str, Any], why: str | None) -> None:
    assert holding(container(**kw)) == why


def test_a_created_container_holds_only_while_its_lease_is_live() -> None:
    c = container(status="created", started=False)
    assert holding(c, lease.LIVE) == "being started by hostagent"
    assert holding(c, lease.DEAD) is None and holding(c, lease.EXPIRED) is None and holding(c) is None


def test_the_engine_decides_what_a_labelled_container_holds() -> None:
    host = mig_host()
    honest = holder(container(requests=gpus([RTX], driver="nvidia"), labels={"gpupin.devices": RTX}), host)
    assert honest is not None and honest.how == "gpupin" and not honest.mismatch and honest.uuids == (RTX,)
    assert honest.via == "--gpus" and honest.describe() == "job (cccccccccccc, running, gpupin via --gpus)"
    by_cdi = holder(container(requests=cdi(f"nvidia.com/gpu={RTX}"), labels={"gpupin.devices": RTX}), host)
    assert by_cdi is not None and by_cdi.how == "gpupin" and not by_cdi.mismatch and by_cdi.via == "CDI"
    assert by_cdi.describe() == "job (cccccccccccc, running, gpupin via CDI)" and holder_shown(by_cdi, 0).via == "CDI"
    liar = holder(container(requests=gpus(["2"]), labels={"gpupin.devices": RTX}), host)
    assert liar is not None and liar.uuids == (A800B,) and liar.label == (RTX,) and liar.mismatch
    assert held([liar]) == {A800B: [liar]}  # the card it really has, not the one its label names
    assert "MISMATCH: labelled " + RTX in liar.describe()
    bare = holder(container(labels={"gpupin.devices": "1"}), host)  # a label, and no device at all
    assert bare is not None and bare.uuids == () and bare.mismatch and bare.label == (RTX,)
    assert holder(container(), host) is None  # no card, no label: not in the ledger
    stopped = holder(container(status="exited", requests=gpus(["3"]), labels={"gpupin.devices": A800C}), host)
    assert stopped is not None and not stopped.holds and held([stopped]) == {}


def test_holder_descriptions_say_how_and_why() -> None:
    h = Holder("0123456789abcdef", "web", "running", [A800], False, "--gpus all")
    assert h.describe() == "web (0123456789ab, running, --gpus all)" and h.holds
    c = holder(container(status="exited", restart="always", requests=gpus(["1"])), mig_host())
    assert c is not None and c.describe() == "job (cccccccccccc, exited, --gpus device=1, stopped, restart=always)"
    d = holder_shown(c, 0)
    assert (d.holds, d.why, d.grants[0].form, d.describe) == (
        True,
        "stopped, restart=always",
        "device-request",
        c.describe(),
    )


def test_share_lets_sharers_through_and_never_an_exclusive_holder() -> None:
    exclusive = Holder("a" * 64, "excl", "running", [RTX], True, "gpupin")
    sharer = Holder("b" * 64, "sharer", "running", [A800], True, "gpupin", shared=True)
    foreign = Holder("c" * 64, "dcgm", "running", [A800C], False, "--gpus all")
    busy = held([exclusive, sharer, foreign])
    assert blocking(busy, share=False) == busy
    assert blocking(busy, share=True) == {RTX: [exclusive], A800C: [foreign]}


# --- leases ----------------------------------------------------------------------------------------------------


def test_an_owner_round_trips_through_its_label_and_is_alive() -> None:
    me = lease.this_process()
    again = lease.Owner.parse(str(me))
    assert (
        again is not None
        and (again.pid, again.start, again.boot, again.pidns) == (os.getpid(), me.start, me.boot, me.pidns)
        and me.start
        and me.boot
        and me.pidns
    )
    assert again.alive() is True
    assert lease.Owner.parse("") is None and lease.Owner.parse("host=x pid=notanumber") is None


def test_a_dead_owner_of_this_host_is_dead_and_one_of_another_host_is_unknown() -> None:
    p = subprocess.Popen(["sleep", "30"])
    child = lease.Owner(
        socket.gethostname(),
        p.pid,
        lease.start_time(p.pid) or "",
        lease.this_process().boot,
        lease.this_process().pidns,
    )
    assert child.alive() is True
    p.kill()
    p.wait()
    assert child.alive() is False
    reused = lease.Owner(child.host, os.getpid(), "1", child.boot, child.pidns)  # a pid reused by another process
    assert reused.alive() is False
    elsewhere = lease.Owner("other", os.getpid(), lease.this_process().start, "another-boot-id", child.pidns)
    assert elsewhere.alive() is None


def test_lease_states_by_the_daemons_clock() -> None:
    mine = lease.claim()
    assert mine[lease.LEASE_LABEL] == str(lease.LEASE_S)
    assert lease.state(mine, created=1000.0, now=1010.0) == lease.LIVE
    # Its owner (this process) runs: a container's lease never expires; the lock's does, on time.
    assert lease.state(mine, created=1000.0, now=1000.0 + 100 * lease.LEASE_S) == lease.LIVE
    assert lease.state(mine, 1000.0, 1000.0 + lease.LEASE_S + 1, owner_alive_holds=False) == lease.EXPIRED
    remote = {lease.OWNER_LABEL: "host=far pid=1 start=1 boot=x pidns=1", lease.LEASE_LABEL: "3"}
    assert lease.state(remote, 1000.0, 1002.0) == lease.LIVE and lease.state(remote, 1000.0, 1004.0) == lease.EXPIRED
    # An owner that cannot be seen from here renews it on the daemon: live while its last renewal is recent.
    asked: list[int] = []

    def renewed(at: float | None) -> Any:
        def when() -> float | None:
            asked.append(1)
            return at

        return when

    assert lease.state(remote, 1000.0, 1002.0, renewed(None)) == lease.LIVE and asked == []  # not asked in time
    assert lease.state(remote, 1000.0, 1040.0, renewed(1038.0)) == lease.LIVE and asked == [1]
    assert lease.state(remote, 1000.0, 1040.0, renewed(1036.0)) == lease.EXPIRED
    assert lease.state(remote, 1000.0, 1040.0, renewed(None)) == lease.EXPIRED
    assert lease.seconds({lease.LEASE_LABEL: "1e9"}) == lease.MAX_LEASE_S
    assert lease.seconds({lease.LEASE_LABEL: "nan"}) == lease.LEASE_S == lease.seconds({})


# --- the local lock's trust rules ------------------------------------------------------------------------------


def test_the_local_lock_is_exclusive_in_a_private_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("GPUPIN_LOCK_DIR", str(d))
    a, b = lock.LocalLock("unix:1:2"), lock.LocalLock("unix:1:2")
    assert a.acquire(1) and not b.acquire(0.05)
    a.release()
    assert b.acquire(1)
    b.release()
    assert [p.stat().st_mode & 0o777 for p in d.iterdir()] == [0o600]
    monkeypatch.setenv("GPUPIN_LOCAL_LOCK", "0")
    assert not a.acquire(1)


@pytest.mark.parametrize("how", ["world-writable", "symlinked-dir", "planted-symlink", "planted-fifo"])
def test_the_local_lock_trusts_nothing_it_does_not_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o644)
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    name = lock.LocalLock("k").name
    if how == "world-writable":
        d.chmod(0o1777)
    elif how == "symlinked-dir":
        real, d = d, tmp_path / "link"
        d.symlink_to(real)
    elif how == "planted-symlink":
        (d / name).symlink_to(victim)
    else:
        os.mkfifo(d / name)
    monkeypatch.setenv("GPUPIN_LOCK_DIR", str(d))
    assert not lock.LocalLock("k").acquire(0.1)
    assert victim.stat().st_mode & 0o777 == 0o644 and victim.read_text() == "x"
    if how == "world-writable":
        assert list(d.iterdir()) == []  # nothing was created there either


# --- the engine's address and clock ----------------------------------------------------------------------------


def test_two_spellings_of_one_socket_are_one_lock_key(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "d.sock"))
    (tmp_path / "alias.sock").symlink_to(tmp_path / "d.sock")
    a = engine.Endpoint(f"unix://{tmp_path}/d.sock")
    b = engine.Endpoint(f"unix://{tmp_path}/alias.sock")
    assert a.unix_path == f"{tmp_path}/d.sock" and a.lock_key() == b.lock_key() != a.url
    assert engine.Endpoint("tcp://Host:2375").lock_key() == "tcp://host:2375"
    assert engine.Endpoint("unix://").unix_path == "/var/run/docker.sock"
    sock.close()


def test_the_address_is_read_as_docker_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_CONTEXT", "DOCKER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))

    def read() -> engine.Endpoint:
        monkeypatch.setattr(address, "_ENDPOINT", None)
        return engine.endpoint()

    assert (read().url, read().origin) == ("unix:///var/run/docker.sock", "default")
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2376")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    with pytest.raises(DockerUnavailableError, match="DOCKER_TLS_VERIFY/DOCKER_CERT_PATH"):
        read()  # no certificates there
    for f in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / f).write_text("")
    ep = read()
    assert ep.url == "tcp://10.0.0.1:2376" and ep.tls is not None and ep.tls.ca_cert == str(tmp_path / "ca.pem")
    assert ep.tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("DOCKER_CONTEXT", "nowhere")
    with pytest.raises(DockerUnavailableError, match="context 'nowhere' does not exist"):
        read()


def test_the_daemons_clock_is_parsed_exactly() -> None:
    assert engine.http_date("Mon, 30 Nov 2026 10:45:01 GMT") == 1796035501.0
    assert engine.http_date("garbage") is None and engine.http_date(None) is None
    assert engine.created_time("2026-11-30T10:45:01.123456789Z") == pytest.approx(1796035501.123456789)
    assert engine.created_time("2026-11-30T12:45:01+02:00") == 1796035501.0
    assert engine.created_time("2026-11-30T10:45:01Z") == 1796035501.0


# --- refusals whose hints fit the case -------------------------------------------------------------------------


def _refusal(specs: list[str] | None, count: int | None, holders: list[Holder], share: bool = False) -> Any:
    from gpupin.hostagent import gpus as placement
    from gpupin.hostagent.run import launch
    from gpupin.hostagent.run.request import RunRequest
    from gpupin.hostagent.run.waiting import WaitLoop

    cards = scenario_cards()
    req = RunRequest("img", gpus=specs or [], count=count, share=share)
    picks = placement.resolve_specs(specs, cards) if specs else None
    chosen, refusal = launch._choose(req, cards, picks, held(holders))
    assert chosen is None and refusal is not None
    now = launch._held_error(refusal)
    req.wait = 12.0
    wait_loop = WaitLoop(req)
    wait_loop.started -= 12.4  # --wait 12 is up: the refusal, saying how long it waited
    with pytest.raises(CardHeldError) as later:
        wait_loop.refused(now)
    return now, later.value


def test_each_refusal_hints_only_what_can_help() -> None:
    def on(*uuids: str, shared: bool = False) -> list[Holder]:
        return [Holder(f"{i:064x}", f"job{i}", "running", [u], True, "gpupin", shared) for i, u in enumerate(uuids)]

    now, later = _refusal(["1"], None, on(RTX))
    assert "pick a free card (0, 2, 3: `hostagent ls`)" in now.hint and "--share" not in now.hint
    assert "still after waiting 12 s" in later.message and "wait longer" in later.hint
    assert "wait for it with --wait" not in (later.hint or "")
    now, _ = _refusal(["1"], None, on(*ALL))
    assert "pick a free card" not in now.hint and "--wait" in now.hint
    now, _ = _refusal(["1"], None, on(RTX, shared=True))
    assert "share it with --share (its holder shares)" in now.hint
    now, _ = _refusal(["1"], None, on(RTX), share=True)  # --share, but the holder keeps its card
    assert "is held by job0" in now.message and "--share" not in now.hint
    now, _ = _refusal(None, 2, on(A800, RTX, A800B))
    assert now.message.startswith("--count 2: 1 of 4 card(s) are free") and "ask for at most 1 (--count 1)" in now.hint
    now, _ = _refusal(None, 1, on(*ALL))
    assert "0 of 4" in now.message and "ask for at most" not in now.hint and "--wait" in now.hint
    with pytest.raises(UsageError) as e:
        _refusal(None, 5, [])
    assert e.value.hint == "ask for at most 4 (`hostagent ls` lists them)"
