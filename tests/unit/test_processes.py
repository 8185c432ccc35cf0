"""Processes are holders, and unknown is not free (issue 17, parts 1 and 5), on the simulated host without a daemon:
the fake NVML's processes file, a process's container found in its cgroup, /proc not trusted in another pid
namespace, a MIG card asked device by device, and when the ledger cannot be read `ls` says unknown (`held` null,
N/A) and nothing places a count. On the sandbox: tests/docker/test_processes.py.
In mixed-4, card 2 (A800 at 86) already carries the topology's pid 4242, whose owner /proc does not show: busy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.nvml import Process
from gpupin.hostagent.ledger import processes as procs
from tests.support.host import HOSTAGENT, simhost_env
from tests.support.hypo import examples
from tests.support.processes import ME, error_line, on_cards
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE
from tests.support.scenarios import topology, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")


# --- the fake reports real pids ---------------------------------------------------------------------------------

READ = """
import json, pynvml as n
n.nvmlInit()
out = {}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    try:
        out[i] = [[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
                  [p.pid for p in n.nvmlDeviceGetGraphicsRunningProcesses(h)]]
    except n.NVMLError as e:
        out[i] = str(e)
print(json.dumps(out))
"""


def test_the_fake_rereads_its_processes_file_on_each_call(fakegpu: Path, tmp_path: Path) -> None:
    path = tmp_path / "procs.json"
    env = simhost_env("mixed-4", FAKEGPU_PROCESSES=str(path))

    def read() -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True, check=True)
        return dict(json.loads(out.stdout))

    assert read() == {"0": [[], []], "1": [[], []], "2": [[4242], []], "3": [[], []]}  # no file: none
    path.write_text(json.dumps({RTX: [{"pid": 11}, {"pid": 12, "kind": "graphics"}], A800C: "no_permission"}))
    assert read() == {"0": [[], []], "1": [[11], [12]], "2": [[4242], []], "3": "Insufficient Permissions"}
    path.write_text("{")
    r = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True)
    assert "fakegpu: " in r.stderr and '"0": "Unknown Error"' in r.stdout


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        ("0::/system.slice/crio-" + "d" * 64 + ".scope\n", "d" * 64),
        ("0::/machine.slice/libpod-" + "e" * 64 + ".scope/container\n", "e" * 64),  # podman, its init's sub-cgroup
        ("0::/system.slice/docker-" + "f" * 64 + ".scope/init.scope\n", "f" * 64),
        ("0::/default/" + "1" * 64 + "\n", "1" * 64),  # containerd (nerdctl), cgroupfs
        ("0::/system.slice/containerd.service\n", None),  # the engine itself, a host process
        ("0::/process_api/de60523d212cdb0b910e98b24144e911\n", None),  # seen on a real H200 host: no engine's naming
    ],
)
def test_any_engines_container_is_found_in_the_cgroup(cgroup: str, expected: str | None) -> None:
    assert procs.container_id(cgroup) == expected


def test_in_a_pid_namespace_of_its_own_proc_is_not_trusted(fakegpu: Path, tmp_path: Path) -> None:
    """NVML gives host pids: in another pid namespace /proc/<pid> is some other process (here: pid 1, itself)."""
    env = simhost_env(
        "mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock", **on_cards(tmp_path / "p.json", {RTX: [1]})
    )
    enter = ["unshare", "--pid", "--fork", "--mount-proc"] + (["--map-root-user"] if os.geteuid() else [])
    r = subprocess.run([*enter, HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    (p,) = {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}[RTX]["processes"]
    assert (p["owner"], p["user"], p["foreign"]) == ("unknown", None, True) and "pid namespace" in p["describe"]


def test_a_mig_card_that_lists_to_root_only_is_asked_device_by_device(
    fakegpu: Path, tmp_path: Path, sleeper: Callable[[], int]
) -> None:
    """NVML lists a MIG card's processes on its own handle to root only: the MIG devices' handles answer anyone."""
    pid = sleeper()
    card = uuids("mig")[0]
    mig = topology("mig")["gpus"][0]["mig"]["devices"]
    env = simhost_env(
        "mig",
        DOCKER_HOST=f"unix://{tmp_path}/none.sock",
        **on_cards(tmp_path / "p.json", {card: "no_permission", mig[0]["uuid"]: [pid]}),
    )
    r = subprocess.run([HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    g = {c["uuid"]: c for c in json.loads(r.stdout)["gpus"]}[card]
    assert sorted((p["pid"], p["mig_uuid"]) for p in g["processes"]) == sorted(
        [(pid, mig[0]["uuid"]), (5151, mig[1]["uuid"])]
    )  # 5151: the scenario's, in GPU instance 2
    assert "NVML would not list" not in g["unknown"] and [m["state"] for m in g["mig_devices"]] == ["busy", "busy"]


# --- unknown is not free, without a daemon -----------------------------------------------------------------------


def test_docker_unreachable_is_unknown_never_free(fakegpu: Path, tmp_path: Path, sleeper: Callable[[], int]) -> None:
    pid = sleeper()
    env = simhost_env(
        "mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock", **on_cards(tmp_path / "p.json", {RTX: [pid]})
    )
    r = subprocess.run([HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    cards = {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}
    assert [(cards[u]["held"], cards[u]["state"]) for u in (A800, RTX, A800B, A800C)] == [
        (None, "unknown"),
        (True, "busy"),
        (True, "busy"),
        (None, "unknown"),
    ]  # a host process is known in use
    assert "Docker unavailable" in cards[A800]["unknown"] and "does not answer" in cards[A800]["unknown"]
    (p,) = cards[RTX]["processes"]
    assert (p["pid"], p["owner"], p["user"], p["command"], p["foreign"]) == (pid, "host", ME, "sleep", True)
    fmt = subprocess.run(
        [HOSTAGENT, "ls", "--format", "{index} {held} {busy} {state}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert fmt.splitlines() == ["0 N/A N/A unknown", "1 true true busy", "2 true true busy", "3 N/A N/A unknown"]
    table = subprocess.run([HOSTAGENT, "ls"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"^\[0\].*  unknown$", table, re.M) and re.search(r"^\[1\].*  busy$", table, re.M), table
    assert re.search(rf"^    process +{pid}  C  {ME}  256 MiB  sleep  host$", table, re.M), table


def test_compose_render_places_no_count_when_the_ledger_is_unknown(fakegpu: Path, tmp_path: Path) -> None:
    f = tmp_path / "compose.yaml"
    f.write_text("services:\n  a:\n    image: i\n    x-gpupin: {count: 1}\n")
    r = subprocess.run(
        [HOSTAGENT, "compose", "render", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        env=simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock"),
    )
    assert r.returncode == 69 and "which cards are free is unknown" in r.stderr and not r.stdout, r


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "1", "--max-load", "50"], "--max-load goes with --count"),
        (["--count", "1", "--max-memory", "150"], "--max-memory 150: give a percentage from 0 to 100"),
        (["--count", "1", "--max-load", "nan"], "--max-load nan: give a percentage"),
    ],
)
def test_limits_are_checked_before_anything_is_asked(fakegpu: Path, args: list[str], says: str) -> None:
    r = subprocess.run(
        [HOSTAGENT, "run", *args, TEST_IMAGE],
        env=simhost_env("mixed-4", DOCKER_HOST="unix:///x"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert says in error_line(r, 64)


def test_dry_run_places_no_count_without_the_ledger(fakegpu: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        [HOSTAGENT, "run", "--dry-run", "--count", "1", TEST_IMAGE],
        capture_output=True,
        text=True,
        env=simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock"),
        timeout=60,
    )
    assert "which cards are free is unknown" in error_line(r, 69) and not r.stdout


# --- use that NVML names no process for is not free (issue 24) ---------------------------------------------------


def unseen_host(tmp_path: Path) -> dict[str, str]:
    """mixed-4 with card 0 at 95% load and 40 GB used, no process named (the issue's case); card 3 at 615 MiB and
    0% (what an idle H200 reads: bench/records); card 1 at 1000 MiB and 4%: under both thresholds. No daemon."""
    topo = topology("mixed-4")
    cards = {g["uuid"]: g for g in topo["gpus"]}
    cards[A800].update(memory_used_mib=40960, utilization_gpu=95)
    cards[A800C].update(memory_used_mib=615, utilization_gpu=0)
    cards[RTX].update(memory_used_mib=1000, utilization_gpu=4)
    path = tmp_path / "unseen.json"
    path.write_text(json.dumps(topo))
    return simhost_env("mixed-4", FAKEGPU_TOPOLOGY=str(path), DOCKER_HOST=f"unix://{tmp_path}/none.sock")


def test_a_card_in_use_that_nvml_names_no_process_for_is_busy(fakegpu: Path, tmp_path: Path) -> None:
    env = unseen_host(tmp_path)
    r = subprocess.run([HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    cards = {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}
    assert (cards[A800]["state"], cards[A800]["busy"], cards[A800]["processes"]) == ("busy", True, [])
    assert cards[A800]["unseen"] == "40960 MiB used, 95% load"
    # Docker is unreachable here: the others are unknown, never busy by their idle readings.
    assert [(cards[u]["state"], cards[u]["unseen"]) for u in (RTX, A800C)] == [("unknown", None)] * 2
    table = subprocess.run([HOSTAGENT, "ls"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"^\[0\].*  busy$", table, re.M), table
    assert re.search(r"^    in use +40960 MiB used, 95% load, owner unseen: no process listed$", table, re.M), table


def test_the_agent_shows_unseen_use_as_busy(fakegpu: Path, tmp_path: Path) -> None:
    agent = Resident(unseen_host(tmp_path))
    try:
        card = agent.card(A800)
        assert (card["state"], card["busy"], card["unseen"]) == ("busy", True, "40960 MiB used, 95% load")
        assert agent.card(A800C)["state"] != "busy"
    finally:
        agent.close()


def test_the_thresholds_never_call_an_idle_h200_busy() -> None:
    """An idle H200 reads 615-618 MiB of 143771 MiB at 0% (bench/records/real-gpu-session-3-2xH200-2026-11-30.log)."""
    from gpupin.core.nvml import Card

    def card(used_mib: int, load: int, total_mib: int = 143771) -> Card:
        c = Card(0, "GPU-x", None, "NVIDIA H200")
        c.memory_total, c.memory_used, c.utilization_gpu = total_mib * procs.MIB, used_mib * procs.MIB, load
        c.process_list, c.processes_error, c.mig_mode = [], None, False
        return c

    assert procs.unseen_use(card(618, 0)) is None
    assert procs.unseen_use(card(1437, 4)) is None  # 1% of an H200, under 5% load
    assert procs.unseen_use(card(1438, 0)) == "1438 MiB used"
    assert procs.unseen_use(card(600, 5)) == "5% load"
    assert procs.unseen_use(card(1025, 0, total_mib=24564)) == "1025 MiB used"  # 1 GiB on a small card
    (held,) = procs.blocking([card(40960, 95)], [])["GPU-x"]
    assert isinstance(held, procs.UnseenUse) and held.process


# --- a container's real cgroup (issue 24) ------------------------------------------------------------------------

CID = "c" * 64


@pytest.mark.parametrize(
    ("driver", "parent", "expected"),
    [
        ("systemd", "", f"/system.slice/docker-{CID}.scope"),
        ("systemd", "gpu-jobs.slice", f"/gpu.slice/gpu-jobs.slice/docker-{CID}.scope"),
        ("systemd", "-.slice", f"/docker-{CID}.scope"),
        ("systemd", "/not/a/slice", None),  # the daemon refuses it under systemd
        ("cgroupfs", "", f"/docker/{CID}"),  # what the sandboxed daemons use
        ("cgroupfs", "/jobs/", f"/jobs/{CID}"),
        ("", "", None),  # unknown: only the pid namespace can say
    ],
)
def test_a_containers_real_cgroup_comes_from_the_engines_facts(driver: str, parent: str, expected: str | None) -> None:
    assert procs.real_cgroup(driver, parent, CID) == expected


def test_only_the_real_cgroup_or_pid_namespace_names_a_container() -> None:
    places = procs.ContainerCgroups({CID: (0, "")}, "systemd", [CID])
    forged = f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{CID}.scope\n"
    real = f"0::/system.slice/docker-{CID}.scope\n"
    me = os.getpid()  # in the host's pid namespace: no container's
    assert places.owner(me, real, CID) == CID
    assert places.owner(me, f"0::/system.slice/docker-{CID}.scope/init.scope\n", CID) == CID  # its sub-cgroup
    assert places.owner(me, forged, CID) is None
    assert places.owner(me, f"0::/system.slice/docker-{CID}.scope-x\n", CID) is None  # a prefix is not a parent
    v1 = f"9:name=systemd:/user.slice/docker-{CID}.scope\n8:pids:/system.slice/docker-{CID}.scope\n"
    assert places.owner(me, v1, CID) == CID  # any hierarchy: only root can make the daemon's path


def test_a_process_in_a_containers_pid_namespace_is_its_own() -> None:
    """Whatever its cgroup says: a process that shares the pid namespace of the container's State.Pid is in it."""
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", "sleep 300 & sleep 300"])
    try:
        children: list[int] = []
        for _ in range(100):
            children = [int(c) for c in Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()]
            if children:
                break
            time.sleep(0.05)
        (init,) = children  # sh, pid 1 of the new namespace
        for _ in range(100):
            worker = Path(f"/proc/{init}/task/{init}/children").read_text().split()
            if worker:
                break
            time.sleep(0.05)
        places = procs.ContainerCgroups({CID: (init, "")}, None, [CID])  # the driver unknown: the namespace alone says
        assert places.owner(int(worker[0]), f"0::/user.slice/docker-{CID}.scope\n", CID) == CID
        assert places.owner(os.getpid(), f"0::/user.slice/docker-{CID}.scope\n", CID) is None
    finally:
        outer.kill()
        outer.wait()


# --- rootless containers: the kernel names the user, the cgroup only the container ------------------------------

LIBPOD = "7" * 64


@pytest.mark.parametrize(
    ("cgroup", "cid", "runtime"),
    [
        # podman 4 rootless on cgroup v2 with systemd: the user's manager's slice; crun's init sub-cgroup below it
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{LIBPOD}.scope/container\n",
            LIBPOD,
            "podman",
        ),
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-conmon-{LIBPOD}.scope\n",
            LIBPOD,
            "podman",
        ),
        (f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{LIBPOD}.scope\n", LIBPOD, "docker"),
        (f"0::/kubepods/burstable/pod1/crio-{LIBPOD}.scope\n", LIBPOD, None),  # another engine, no runtime said
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None, None),  # a rootless container on cgroup v1/none
    ],
)
def test_a_rootless_containers_cgroup_names_its_id_and_runtime(
    cgroup: str, cid: str | None, runtime: str | None
) -> None:
    assert (procs.container_id(cgroup), procs.runtime_named(cgroup)) == (cid, runtime)


_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.@", min_size=1, max_size=20)


@settings(max_examples=examples(200))
@given(
    above=st.lists(_PART, max_size=4),
    uid=st.integers(min_value=0, max_value=2**32 - 1),
    prefix=st.sampled_from(["libpod-", "libpod-conmon-", "docker-", "crio-", ""]),
    cid=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    below=st.lists(st.sampled_from(["container", "init.scope", "payload"]), max_size=2),
)
def test_the_cgroups_user_parts_never_change_what_it_names(
    above: list[str], uid: int, prefix: str, cid: str, below: list[str]
) -> None:
    """A user names every part below their slice; the uid in `user-<uid>.slice` is never read (the kernel's is),
    and only the innermost part that is a container's name gives the id and runtime."""
    tail = "/".join([f"{prefix}{cid}.scope", *below])
    plain = f"0::/{'/'.join([*above, tail])}\n"
    slice_ = f"0::/user.slice/user-{uid}.slice/user@{uid}.service/{'/'.join([*above, tail])}\n"
    for cgroup in (plain, slice_):
        assert procs.container_id(cgroup) == cid
        assert procs.runtime_named(cgroup) == {
            "libpod-": "podman",
            "libpod-conmon-": "podman",
            "docker-": "docker",
        }.get(prefix)


def _rootless(uid: int, cid: str | None, runtime: str | None) -> procs.GpuProcess:
    """A Use whose /proc reading was this (a process of a rootless container of `uid`)."""
    u = procs.GpuProcess(Process(4242, None), RTX, RTX, {}, {})
    u._where = procs.HostProcess(4242, container_id=cid, visible=True, rootless_uid=uid, runtime=runtime)
    return u


def test_a_rootless_owner_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(procs._USERS, 1001, "alice")
    monkeypatch.setitem(procs._USERS, 7, "ev\x1b[2Jil")  # a hostile account name (useradd takes much)
    monkeypatch.setitem(procs._USERS, 5026, "5026")  # no account: the number
    cases = [
        (_rootless(1001, LIBPOD, "podman"), f"rootless podman container {LIBPOD[:12]} of uid 1001 (alice)"),
        (_rootless(5026, None, None), "a user namespace of uid 5026 (a rootless container)"),
        (_rootless(7, LIBPOD, None), f"rootless container {LIBPOD[:12]} of uid 7 ('ev\\x1b[2Jil')"),  # read, not obeyed
    ]
    for use, whose in cases:
        assert (use.owner, use.foreign, use.escape) == ("rootless", True, False)
        assert use.rootless() == {**(use.rootless() or {}), "whose": whose}
        assert use.describe().endswith(f" in {whose}")
    assert _rootless(1001, LIBPOD, "podman").rootless() == {
        "uid": 1001, "user": "alice", "runtime": "podman", "whose": cases[0][1]
    }  # fmt: skip


def _in_userns(argv: list[str]) -> subprocess.Popen[bytes]:
    """argv's last process, once every `unshare` in it has exec'd the sleep at its end."""
    p = subprocess.Popen(argv)
    for _ in range(100):
        if Path(f"/proc/{p.pid}/comm").read_text().strip() == "sleep":
            break
        time.sleep(0.05)
    return p


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run as another uid and read its namespaces")
def test_the_user_of_a_user_namespace_is_the_kernels_word() -> None:
    unshare = ["unshare", "--user", "--map-root-user"]
    as_5028 = ["setpriv", "--reuid=5028", "--regid=5028", "--clear-groups"]
    started = [
        _in_userns([*as_5028, *unshare, "sleep", "300"]),  # a rootless container's process: uid 5028's
        _in_userns([*as_5028, *unshare, *unshare, "sleep", "300"]),  # nested: still 5028's (the outermost)
        _in_userns([*unshare, "sleep", "300"]),  # root's own namespace (userns-remap, podman --userns): no user's
        _in_userns([*as_5028, "sleep", "300"]),  # uid 5028 on the host: a host process, not a container
    ]
    try:
        assert [procs.userns_owner(p.pid) for p in started] == [5028, 5028, 0, None]
        assert procs.userns_owner(os.getpid()) is None and procs.userns_owner(2**22 + 1) is None  # gone
        where = [procs.locate(p.pid) for p in started]
        assert [w.rootless_uid for w in where] == [5028, 5028, None, None]
    finally:
        for p in started:
            p.kill()
            p.wait()
