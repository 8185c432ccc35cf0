"""Processes are holders, and unknown is not free (issue 17, parts 1 and 5).

Real processes, on the host and in containers of the sandbox, that the fake NVML reports on a card through its
processes file (FAKEGPU_PROCESSES, re-read on each call: tests/fakegpu/README.md): a host process or a process of a
container that was not given the card makes it busy for `hostagent run` (--count skips it, --gpu answers 75 naming
the pid and user or the container) and for `ls` (busy, ESCAPE); a container's own process does not; --share and
--count --max-load/--max-memory let a request in beside them. When the ledger cannot be read (Docker unreachable,
NVML will not list a card's processes), `ls` says unknown (`held` null, N/A) and nothing places a count.
In mixed-4, card 2 (A800 at 86) already carries the topology's pid 4242, whose owner /proc does not show: busy.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ledger import procs
from tests.conftest import HOSTAGENT, TEST_IMAGE, Agent, gpu_uuids, saw, simhost_env
from tests.conftest import topology as topology_of

A800, RTX, A800B, A800C = gpu_uuids("mixed-4")
ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def sleeper() -> Iterator[Callable[[], int]]:
    """Host processes: sleeper() starts one and gives its pid; all are ended after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        p = subprocess.Popen(["sleep", "300"])
        started.append(p)
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait()


def on_cards(path: Path, uses: dict[str, Any]) -> dict[str, str]:
    """The fake NVML reports these processes ({uuid: [pid, ...] or an NVML error name}); the env that says so."""
    path.write_text(json.dumps({u: v if isinstance(v, str) else [{"pid": p, "used_memory_mib": 256} for p in v]
                                for u, v in uses.items()}))
    return {"FAKEGPU_PROCESSES": str(path)}


def error_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == code and len(errors) == 1 and "Traceback" not in r.stderr, r
    return errors[0]


def call(agent: Agent, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The hostagent CLI on the simulated host, with these variables (the processes file)."""
    return subprocess.run(agent.argv(*args), env={**agent.env, **env}, capture_output=True, text=True, timeout=120)


def listing(agent: Agent, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    r = call(agent, env, "ls", "--json")
    assert r.returncode == 0, r.stderr
    return {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}


def container_pid(agent: Agent, cid: str) -> int:
    return int(agent.sandbox.docker("inspect", "-f", "{{.State.Pid}}", cid, check=True).stdout)


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


@pytest.mark.parametrize(("cgroup", "expected"), [
    ("0::/system.slice/crio-" + "d" * 64 + ".scope\n", "d" * 64),
    ("0::/machine.slice/libpod-" + "e" * 64 + ".scope/container\n", "e" * 64),  # podman, its init's sub-cgroup
    ("0::/system.slice/docker-" + "f" * 64 + ".scope/init.scope\n", "f" * 64),
    ("0::/default/" + "1" * 64 + "\n", "1" * 64),  # containerd (nerdctl), cgroupfs
    ("0::/system.slice/containerd.service\n", None),  # the engine itself, a host process
    ("0::/process_api/de60523d212cdb0b910e98b24144e911\n", None),  # seen on a real H200 host: no engine's naming
])
def test_any_engines_container_is_found_in_the_cgroup(cgroup: str, expected: str | None) -> None:
    assert procs.container_id(cgroup) == expected


def test_in_a_pid_namespace_of_its_own_proc_is_not_trusted(fakegpu: Path, tmp_path: Path) -> None:
    """NVML gives host pids: in another pid namespace /proc/<pid> is some other process (here: pid 1, itself)."""
    env = simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock",
                      **on_cards(tmp_path / "p.json", {RTX: [1]}))
    enter = ["unshare", "--pid", "--fork", "--mount-proc"] + (["--map-root-user"] if os.geteuid() else [])
    r = subprocess.run([*enter, HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    (p,) = {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}[RTX]["processes"]
    assert (p["owner"], p["user"], p["foreign"]) == ("unknown", None, True) and "pid namespace" in p["describe"]


def test_a_mig_card_that_lists_to_root_only_is_asked_device_by_device(fakegpu: Path, tmp_path: Path,
                                                                       sleeper: Callable[[], int]) -> None:
    """NVML lists a MIG card's processes on its own handle to root only: the MIG devices' handles answer anyone."""
    pid = sleeper()
    card = gpu_uuids("mig")[0]
    mig = topology_of("mig")["gpus"][0]["mig"]["devices"]
    env = simhost_env("mig", DOCKER_HOST=f"unix://{tmp_path}/none.sock",
                      **on_cards(tmp_path / "p.json", {card: "no_permission", mig[0]["uuid"]: [pid]}))
    r = subprocess.run([HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    g = {c["uuid"]: c for c in json.loads(r.stdout)["gpus"]}[card]
    assert sorted((p["pid"], p["mig_uuid"]) for p in g["processes"]) == sorted(
        [(pid, mig[0]["uuid"]), (5151, mig[1]["uuid"])])  # 5151: the scenario's, in GPU instance 2
    assert "NVML would not list" not in g["unknown"] and [m["state"] for m in g["mig_devices"]] == ["busy", "busy"]


# --- unknown is not free, without a daemon -----------------------------------------------------------------------

def test_docker_unreachable_is_unknown_never_free(fakegpu: Path, tmp_path: Path, sleeper: Callable[[], int]) -> None:
    pid = sleeper()
    env = simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock",
                      **on_cards(tmp_path / "p.json", {RTX: [pid]}))
    r = subprocess.run([HOSTAGENT, "ls", "--json"], env=env, capture_output=True, text=True, timeout=60)
    cards = {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}
    assert [(cards[u]["held"], cards[u]["state"]) for u in (A800, RTX, A800B, A800C)] == [
        (None, "unknown"), (True, "busy"), (True, "busy"), (None, "unknown")]  # a host process is known in use
    assert "Docker unavailable" in cards[A800]["unknown"] and "does not answer" in cards[A800]["unknown"]
    (p,) = cards[RTX]["processes"]
    assert (p["pid"], p["owner"], p["user"], p["command"], p["foreign"]) == (pid, "host", ME, "sleep", True)
    fmt = subprocess.run([HOSTAGENT, "ls", "--format", "{index} {held} {busy} {state}"], env=env,
                         capture_output=True, text=True, timeout=60).stdout
    assert fmt.splitlines() == ["0 N/A N/A unknown", "1 true true busy", "2 true true busy", "3 N/A N/A unknown"]
    table = subprocess.run([HOSTAGENT, "ls"], env=env, capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"^\[0\].*  unknown$", table, re.M) and re.search(r"^\[1\].*  busy$", table, re.M), table
    assert re.search(rf"^    process +{pid}  C  {ME}  256 MiB  sleep  host$", table, re.M), table


def test_compose_render_places_no_count_when_the_ledger_is_unknown(fakegpu: Path, tmp_path: Path) -> None:
    f = tmp_path / "compose.yaml"
    f.write_text("services:\n  a:\n    image: i\n    x-gpupin: {count: 1}\n")
    r = subprocess.run([HOSTAGENT, "compose", "render", str(f)], capture_output=True, text=True, timeout=60,
                       env=simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock"))
    assert r.returncode == 69 and "which cards are free is unknown" in r.stderr and not r.stdout, r


@pytest.mark.parametrize(("args", "says"), [
    (["--gpu", "1", "--max-load", "50"], "--max-load goes with --count"),
    (["--count", "1", "--max-memory", "150"], "--max-memory 150: give a percentage from 0 to 100"),
    (["--count", "1", "--max-load", "nan"], "--max-load nan: give a percentage"),
])
def test_limits_are_checked_before_anything_is_asked(fakegpu: Path, args: list[str], says: str) -> None:
    r = subprocess.run([HOSTAGENT, "run", *args, TEST_IMAGE], env=simhost_env("mixed-4", DOCKER_HOST="unix:///x"),
                       capture_output=True, text=True, timeout=60)
    assert says in error_line(r, 64)


def test_dry_run_places_no_count_without_the_ledger(fakegpu: Path, tmp_path: Path) -> None:
    r = subprocess.run([HOSTAGENT, "run", "--dry-run", "--count", "1", TEST_IMAGE], capture_output=True, text=True,
                       env=simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock"), timeout=60)
    assert "which cards are free is unknown" in error_line(r, 69) and not r.stdout


# --- on the sandbox, both engines --------------------------------------------------------------------------------

def test_a_host_process_makes_its_card_busy(agent: Agent, tmp_path: Path, sleeper: Callable[[], int]) -> None:
    first, second = sleeper(), sleeper()
    env = on_cards(tmp_path / "p.json", {A800: [first], A800C: [second]})
    # Without processes --count 1 takes an A800 (the most free memory); both have users, and 86 has pid 4242.
    r = call(agent, env, "run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "0", TEST_IMAGE), 75)
    assert f"{A800} is in use by pid {first} of {ME} (sleep), a process of the host" in line, line
    assert "HINT:" in line and "--share" in line
    refused = error_line(call(agent, env, "run", "--rm", "--count", "2", TEST_IMAGE), 75)
    assert f"1 of 4 card(s) are free (in use by other processes: {A800}, {A800B}, {A800C})" in refused, refused
    shared = call(agent, env, "run", "--rm", "--share", "--gpu", "0", TEST_IMAGE)  # sharing on purpose
    assert shared.returncode == 0 and saw(shared.stdout) == [A800], shared.stderr
    cards = listing(agent, env)
    assert (cards[A800]["state"], cards[A800]["held"], cards[A800]["busy"]) == ("busy", True, True)
    assert [(p["pid"], p["owner"], p["user"]) for p in cards[A800]["processes"]] == [(first, "host", ME)]
    assert (cards[RTX]["state"], cards[RTX]["held"]) == ("free", False)


def test_a_process_of_a_container_not_given_the_card_is_an_escape(agent: Agent, tmp_path: Path) -> None:
    name = f"escape-{agent.tag}"
    cid = agent.sandbox.docker("run", "-d", "--name", name, "--label", f"gpupin.test={agent.tag}", "--entrypoint",
                               "sleep", TEST_IMAGE, "300", check=True).stdout.strip()  # no GPU at all
    env = on_cards(tmp_path / "p.json", {RTX: [container_pid(agent, cid)]})
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"in container {name} ({cid[:12]}), which was not given this card: ESCAPE" in line, line
    r = call(agent, env, "run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) in ([A800], [A800C]), r.stderr
    (p,) = listing(agent, env)[RTX]["processes"]
    assert (p["container"], p["container_id"], p["escape"], p["foreign"]) == (name, cid, True, True)
    table = call(agent, env, "ls").stdout
    assert re.search(r"^\[1\].*  busy$", table, re.M), table
    assert re.search(rf"^    process +\d+  C  \S+  256 MiB  sleep  {name}  ESCAPE: not given this card$", table,
                     re.M), table


def test_a_containers_own_process_is_not_foreign(agent: Agent, tmp_path: Path) -> None:
    cid = agent("run", "-d", "--gpu", "1", TEST_IMAGE, "sleep", "300").stdout.strip()
    env = on_cards(tmp_path / "p.json", {RTX: [container_pid(agent, cid)]})
    card = listing(agent, env)[RTX]
    (p,) = card["processes"]
    assert (p["container_id"], p["foreign"], p["escape"], card["state"], card["busy"]) == (cid, False, False, "held",
                                                                                           False)
    line = error_line(agent("run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"{RTX} is held by " in line and "in use by" not in line, line  # its container holds it: no process line


def test_count_limits_take_a_card_others_use_when_it_is_loaded_little(agent: Agent, tmp_path: Path,
                                                                        sleeper: Callable[[], int]) -> None:
    env = on_cards(tmp_path / "p.json", {A800: [sleeper()], RTX: [sleeper()], A800C: [sleeper()]})
    dry = ["run", "--dry-run", "--count"]
    assert "0 of 4 card(s) are free" in error_line(call(agent, env, *dry, "1", TEST_IMAGE), 75)
    r = call(agent, env, *dry, "4", "--max-load", "90", TEST_IMAGE)  # 86 runs at 87%
    assert r.returncode == 0 and all(u in r.stdout for u in (A800, RTX, A800B, A800C)), r.stderr
    over = error_line(call(agent, env, *dry, "4", "--max-load", "80", TEST_IMAGE), 75)
    assert f"over --max-load/--max-memory: {A800B}" in over, over
    assert error_line(call(agent, env, *dry, "4", "--max-memory", "40", TEST_IMAGE), 75)  # 86 uses 50% of its memory
    r = call(agent, env, *dry, "4", "--max-memory", "60", "--max-load", "90", TEST_IMAGE)
    assert r.returncode == 0, r.stderr


def test_a_card_whose_processes_nvml_will_not_list_is_unknown(agent: Agent, tmp_path: Path) -> None:
    env = on_cards(tmp_path / "p.json", {A800C: "no_permission"})
    card = listing(agent, env)[A800C]
    assert (card["held"], card["state"]) == (None, "unknown") and "Insufficient Permissions" in card["unknown"]
    table = call(agent, env, "ls").stdout
    assert re.search(r"^    unknown +NVML would not list its processes: Insufficient Permissions$", table, re.M), table
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "3", TEST_IMAGE), 75)
    assert f"{A800C} is in use by someone NVML would not name (NVML would not list its processes" in line, line
    r = call(agent, env, "run", "--rm", "--count", "2", TEST_IMAGE)
    assert r.returncode == 0 and sorted(saw(r.stdout)) == sorted([A800, RTX]), r.stderr
    shared = call(agent, env, "run", "--rm", "--share", "--gpu", "3", TEST_IMAGE)
    assert shared.returncode == 0 and saw(shared.stdout) == [A800C], shared.stderr
