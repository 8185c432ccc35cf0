"""The ledger and its lock against the sandboxed daemon: every way a container can hold a card blocks it (75) and
`ls` shows it; look-then-create is exclusive among clients of one daemon whatever address they use (two spellings
of its socket, and TCP from a network namespace with no local lock); nothing planted in a world-writable place is
followed or trusted; dead and remote lock holders block no one for long; the daemon's failures are one line.
Containers are started with the real docker CLI; everything is labelled gpupin.test and removed afterwards."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent import engine
from gpupin.hostagent.ledger import lease, lock
from tests.support.host import REPO, idle_topology, saw, simhost_env
from tests.support.resident import Resident
from tests.support.sandbox import (
    PODMAN,
    TEST_IMAGE,
    WORK,
    Agent,
    Sandbox,
    intervals,
    never_two_at_once,
    serves_cdi,
)
from tests.support.scenarios import mig_devices, uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")
PROXY = [sys.executable, str(REPO / "tests" / "support" / "daemon_proxy.py")]


def socket_of(agent: Agent) -> str:
    """The sandbox daemon's socket path (the engine under test's)."""
    return agent.sandbox.host.removeprefix("unix://")


def held_error(r: subprocess.CompletedProcess[str]) -> str:
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 75 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    return errors[0]


def listing(agent: Agent) -> dict[str, dict[str, Any]]:
    r = agent("ls", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["docker"]["available"], data["docker"]
    return {g["uuid"]: g for g in data["gpus"]}


def docker_run(agent: Agent, *args: str, name: str | None = None) -> str:
    name = name or f"h-{uuid.uuid4().hex[:8]}"
    return agent.sandbox.docker(
        "run", "-d", "--name", name, "--label", f"gpupin.test={agent.tag}", *args, check=True
    ).stdout.strip()


def wait_state(agent: Agent, cid: str, state: str, timeout: float = 30) -> None:
    wait_for(
        lambda: agent.sandbox.docker("inspect", "-f", "{{.State.Status}}", cid).stdout.strip() == state,
        timeout,
        f"{cid[:12]} to be {state}",
    )


# --- every way to hold a card ----------------------------------------------------------------------------------

SLEEP = ["--entrypoint", "sleep", TEST_IMAGE, "300"]  # no entrypoint check: it needs no working GPU
FORMS: dict[str, tuple[list[str], str | None, str]] = {
    # name: (docker run arguments, then `docker stop`?, what `ls` and the refusal say)
    "gpus-device": (["--gpus", "device=2", *SLEEP], None, "--gpus device=2"),
    "gpus-count": (["--gpus", "3", *SLEEP], None, "--gpus 3"),
    "runtime-nvidia": (
        ["--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=2", *SLEEP],
        None,
        "--runtime nvidia NVIDIA_VISIBLE_DEVICES=2",
    ),
    "device-file": (["--device", "{tmp}/nvidia2:/dev/nvidia2", *SLEEP], None, "--device {tmp}/nvidia2"),
    "restart-always-stopped": (
        ["--restart", "always", "--gpus", "device=2", *SLEEP],
        "stop",
        "stopped, restart=always",
    ),
    # pinned (the ledger label, as hostagent writes it) or not, the same rule
    "unless-stopped-stopped": (
        ["--restart", "unless-stopped", "--label", f"gpupin.devices={A800B}", "--gpus", f"device={A800B}", *SLEEP],
        "stop",
        "stopped, restart=unless-stopped",
    ),
    "on-failure-stopped": (
        ["--restart", "on-failure:5", "--gpus", "device=2", *SLEEP],
        "stop",
        "stopped, restart=on-failure",
    ),
    # (it is running or restarting whenever it is looked at: both hold)
    "restarting": (
        ["--restart", "always", "--gpus", "device=2", TEST_IMAGE, "--quiet", "sh", "-c", "exit 3"],
        "restarting",
        "--gpus device=2",
    ),
    # CDI (Engine 26; on 20.10 the CLI takes no CDI name and nothing runs, so nothing is held)
    "cdi-index": (["--device", "nvidia.com/gpu=2", *SLEEP], None, "--device nvidia.com/gpu=2"),
    "cdi-uuid": (["--device", f"nvidia.com/gpu={A800B}", *SLEEP], None, f"--device nvidia.com/gpu={A800B}"),
    "cdi-restart-always-stopped": (
        ["--restart", "always", "--device", "nvidia.com/gpu=2", *SLEEP],
        "stop",
        "stopped, restart=always",
    ),
}


# What each form needs of the runtime (tests/support/sandbox.py LACKS): podman takes none of the nvidia driver's
# forms, and names its CDI and device-file holders by their nodes (tests/docker/test_podman.py).
FORM_NEEDS = {"runtime-nvidia": "nvidia-runtime", "device-file": "cdi-inspect", "cdi": "cdi-inspect"}


def form_param(form: str) -> Any:
    need = next((n for k, n in FORM_NEEDS.items() if form.startswith(k)), "gpus")
    return pytest.param(form, marks=pytest.mark.needs(need), id=form)


@pytest.mark.per_engine
@pytest.mark.parametrize("form", [form_param(f) for f in FORMS])
def test_each_holding_form_blocks_its_card_and_ls_shows_it(agent: Agent, form: str, tmp_path: Path) -> None:
    args, then, says = FORMS[form]
    agent.env["FAKEGPU_TOPOLOGY"] = idle_topology()  # card 2 free (mixed-4's pid 4242 holds it)
    tmp_path.chmod(0o755)
    if form == "device-file":
        subprocess.run(["mknod", str(tmp_path / "nvidia2"), "c", "195", "2"], check=True)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    says = says.replace("{tmp}", str(tmp_path))
    if form.startswith("cdi") and not serves_cdi(agent.sandbox):
        r = agent.sandbox.docker("run", "-d", "--label", f"gpupin.test={agent.tag}", *args)
        assert r.returncode != 0, r  # the 20.10 CLI reads a CDI name as a device path, and refuses it
        ok = agent("run", "--rm", "--gpu", "2", TEST_IMAGE)
        assert ok.returncode == 0 and saw(ok.stdout) == [A800B], ok.stderr
        return
    cid = docker_run(agent, *args)
    if then == "stop":
        agent.sandbox.docker("stop", "-t", "1", cid, check=True)
    elif then == "restarting":
        wait_state(agent, cid, "restarting")
    card = A800 if form == "gpus-count" else A800B  # --gpus 3 is indices 0, 1, 2
    error = held_error(agent("run", "--rm", "--gpu", card, TEST_IMAGE))
    assert f"{card} is held by h-" in error and f"({cid[:12]}, " in error and says in error
    cards = listing(agent)
    holders = [h for h in cards[card]["holders"] if h["id"] == cid]
    assert cards[card]["held"] and len(holders) == 1 and holders[0]["holds"], cards[card]
    assert says in holders[0]["describe"] and holders[0]["pinned"] == any("gpupin.devices" in a for a in args)
    free = [u for u, g in cards.items() if not g["held"]]
    assert free == ([A800C] if form == "gpus-count" else [A800, RTX, A800C])
    r = agent("run", "--rm", "--count", str(len(free)), TEST_IMAGE)  # what is free is still handed out
    assert r.returncode == 0 and sorted(saw(r.stdout)) == sorted(free), r.stderr


@pytest.mark.needs("nvidia-runtime")
@pytest.mark.per_engine
def test_privileged_under_the_nvidia_runtime_holds_every_card(agent: Agent) -> None:
    # Held while a hostagent starts it (a live lease), so that the reading is tested on any machine ...
    mine = {**lease.claim(), "gpupin.test": agent.tag}
    created = agent.sandbox.docker(
        "create",
        "--privileged",
        "--runtime",
        "nvidia",
        *(f"--label={k}={v}" for k, v in mine.items()),
        *SLEEP,
        check=True,
    ).stdout.strip()
    error = held_error(agent("run", "--rm", "--count", "1", TEST_IMAGE))
    assert "0 of 4 card(s) are free" in error
    cards = listing(agent)
    assert all(g["held"] and g["holders"][0]["id"] == created for g in cards.values())
    assert "--privileged --runtime nvidia, being started by hostagent" in cards[RTX]["holders"][0]["describe"]
    agent.sandbox.docker("rm", "-f", created, check=True)
    # ... and started, where this machine lets a privileged container run at all.
    r = agent.sandbox.docker(
        "run", "-d", "--label", f"gpupin.test={agent.tag}", "--privileged", "--runtime", "nvidia", *SLEEP
    )
    if r.returncode != 0 and "apply caps" in r.stderr:
        pytest.skip(f"this machine cannot run privileged containers: {r.stderr.strip().splitlines()[0]}")
    assert r.returncode == 0, r.stderr
    assert "--privileged --runtime nvidia" in held_error(agent("run", "--rm", "--gpu", "1", TEST_IMAGE))


@pytest.mark.needs("gpus")
@pytest.mark.per_engine
def test_mig_devices_held_by_index_pair(sandbox: Sandbox, tmp_path: Path) -> None:
    sandbox.restart("mig")
    a = Agent(sandbox, uuid.uuid4().hex[:12])
    a.env = simhost_env("mig", DOCKER_HOST=sandbox.host)
    mig0, mig1 = mig_devices("mig")
    try:
        hows = [["--gpus", "device=0:1"], ["--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0:1"]]
        if serves_cdi(sandbox):
            hows.append(["--device", "nvidia.com/gpu=0:1"])
        for how in hows:
            cid = docker_run(a, *how, *SLEEP)
            error = held_error(a("run", "--rm", "--gpu", "0:1", TEST_IMAGE))
            assert f"{mig1} is held by h-" in error and "0:1" in error
            assert "is held" in held_error(a("run", "--rm", "--gpu", mig1, TEST_IMAGE))
            r = a("run", "--rm", "--gpu", mig0, TEST_IMAGE)  # its sibling is free
            assert r.returncode == 0 and saw(r.stdout) == [mig0], r.stderr
            card = next(g for g in json.loads(a("ls", "--json").stdout)["gpus"] if g["mig_mode"])
            assert card["held"] and [h["uuids"] for h in card["holders"]] == [[mig1]]
            sandbox.docker("rm", "-f", cid, check=True)
    finally:
        ids = sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={a.tag}").stdout.split()
        if ids:
            sandbox.docker("rm", "-f", *ids)
        sandbox.restart("mixed-4")


def test_a_label_that_disagrees_is_a_mismatch_never_the_truth(agent: Agent) -> None:
    cid = docker_run(agent, "--label", f"gpupin.devices={A800C}", "--gpus", "device=2", *SLEEP, name="liar")
    error = held_error(agent("run", "--rm", "--gpu", "2", TEST_IMAGE))
    assert f"{A800B} is held by liar ({cid[:12]}, running, --gpus device=2, MISMATCH: labelled {A800C})" in error
    r = agent("run", "--rm", "--gpu", "3", TEST_IMAGE)  # the card its label names is free
    assert r.returncode == 0 and saw(r.stdout) == [A800C], r.stderr
    cards = listing(agent)
    assert cards[A800B]["holders"][0]["mismatch"] and not cards[A800C]["held"]
    assert [h["id"] for h in cards[A800C]["mislabelled"]] == [cid]
    table = agent("ls").stdout
    assert re.search(rf"^    MISMATCH +liar  {cid[:12]}  running  labelled for this card, given {A800B}$", table, re.M)


def test_share_shares_only_with_sharers(agent: Agent) -> None:
    first = agent("run", "-d", "--share", "--gpu", "1", TEST_IMAGE, "sleep", "60")
    assert first.returncode == 0, first.stderr
    second = agent("run", "--rm", "--share", "--gpu", "1", TEST_IMAGE)
    assert second.returncode == 0 and saw(second.stdout) == [RTX], second.stderr
    error = held_error(agent("run", "--rm", "--gpu", "1", TEST_IMAGE))
    assert "share it with --share (its holder shares)" in error
    # a monitoring container given every card says it shares with the label; one that does not, does not
    docker_run(agent, "--label", "gpupin.shared=true", "--gpus", "all", *SLEEP)
    r = agent("run", "--rm", "--share", "--gpu", "3", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [A800C], r.stderr
    assert "--gpus all" in held_error(agent("run", "--rm", "--gpu", "3", TEST_IMAGE))
    docker_run(agent, "--gpus", "device=3", *SLEEP)
    assert "--gpus device=3" in held_error(agent("run", "--rm", "--share", "--gpu", "3", TEST_IMAGE))


# --- the lock --------------------------------------------------------------------------------------------------


def as_nobody(*argv: str) -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]


@pytest.mark.parametrize("planted", ["symlink", "flocked-file"])
def test_nothing_planted_in_a_world_writable_place_is_followed_or_trusted(
    agent: Agent, tmp_path: Path, planted: str
) -> None:
    """A /run/lock-like directory (world-writable, sticky) named as the lock's place: an unprivileged user plants a
    link to a root file at the lock's name, or a file of its own there and holds an flock on it."""
    agent.env["FAKEGPU_TOPOLOGY"] = idle_topology()  # all four cards free (mixed-4's pid 4242 holds card 2)
    shared = Path(tempfile.mkdtemp(prefix="gpupin-ledger-lockdir-"))
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    name = lock.LocalLock(engine.Endpoint(agent.sandbox.host).lock_key()).name
    holder = None
    try:
        if planted == "symlink":
            subprocess.run(as_nobody("ln", "-s", str(victim), str(shared / name)), check=True)
        else:
            holder = subprocess.Popen(as_nobody("flock", str(shared / name), "sleep", "300"))
            wait_for((shared / name).exists, 10, "nobody's flock to create the lock file")
        before = {p.name: p.lstat() for p in shared.iterdir()}
        with ThreadPoolExecutor(8) as pool:
            results = list(
                pool.map(
                    lambda _: agent(
                        "run",
                        "--rm",
                        "--count",
                        "1",
                        TEST_IMAGE,
                        "--quiet",
                        "sh",
                        "-c",
                        WORK.format(8),
                        GPUPIN_LOCK_DIR=str(shared),
                    ),
                    range(8),
                )
            )
        assert sorted(r.returncode for r in results) == [0] * 4 + [75] * 4, [r.stderr for r in results]
        assert sorted(intervals([r.stdout for r in results if r.returncode == 0])) == sorted(
            [A800, RTX, A800B, A800C]
        )  # not blocked by the planted lock, and still exclusive
        assert all("Traceback" not in r.stderr for r in results)
        after = {p.name: p.lstat() for p in shared.iterdir()}
        assert {k: (v.st_uid, v.st_mode) for k, v in after.items()} == {
            k: (v.st_uid, v.st_mode) for k, v in before.items()
        }  # nothing created or changed there
        assert (victim.stat().st_mode & 0o777, victim.stat().st_uid, victim.read_text()) == (0o600, 0, "root's\n")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        shutil.rmtree(shared)
    # Its own place, /run/gpupin (the host's: left as found), is root's alone: an unprivileged user can plant nothing
    # there.
    own = Path("/run/gpupin")
    found = sorted(os.listdir(own)) if own.is_dir() else None
    try:
        r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE, GPUPIN_LOCK_DIR="")
        assert r.returncode == 0, r.stderr
        st = os.stat(own)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o700)
        assert (own / name).is_file()
        assert subprocess.run(as_nobody("ln", "-s", str(victim), str(own / name)), capture_output=True).returncode
    finally:
        if found is None:
            shutil.rmtree(own, ignore_errors=True)
        elif name not in found:
            (own / name).unlink(missing_ok=True)


def plant_lock(agent: Agent, owner: str, lease_s: int, squat: bool = False) -> str:
    labels = (
        {"gpupin.test": agent.tag}
        if squat
        else {
            "gpupin.test": agent.tag,
            lock.LOCK_LABEL: "ledger",
            lease.OWNER_LABEL: owner,
            lease.LEASE_LABEL: str(lease_s),
        }
    )
    return agent.sandbox.docker(
        "create",
        "--name",
        lock.LOCK_NAME,
        *(f"--label={k}={v}" for k, v in labels.items()),
        "--entrypoint",
        "gpupin-ledger-lock",
        TEST_IMAGE,
        check=True,
    ).stdout.strip()


def dead_owner() -> str:
    p = subprocess.Popen(["sleep", "60"])
    me = lease.this_process()
    owner = lease.Owner(me.host, p.pid, lease.start_time(p.pid) or "", me.boot, me.pidns)
    p.kill()
    p.wait()
    return str(owner)


def test_a_lock_whose_holder_died_here_is_broken_at_once(agent: Agent) -> None:
    planted = plant_lock(agent, dead_owner(), lease.MAX_LEASE_S)
    t0 = time.monotonic()
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    assert time.monotonic() - t0 < 60  # at once: not after the lease it was planted with (MAX_LEASE_S)
    assert agent.sandbox.docker("inspect", planted).returncode != 0  # removed, by its ID


def test_a_remote_holder_blocks_only_until_its_lease_is_up(agent: Agent) -> None:
    planted = plant_lock(agent, "host=elsewhere pid=1 start=1 boot=another-machine pidns=1", 3)
    t0 = time.monotonic()
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    waited = time.monotonic() - t0
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    assert 1.5 < waited < 20, waited  # the lease is counted by the daemon's clock from the lock's creation
    assert agent.sandbox.docker("inspect", planted).returncode != 0


def test_a_lock_name_taken_by_another_container_is_one_line(agent: Agent) -> None:
    plant_lock(agent, "", 0, squat=True)
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 125 and len(errors) == 1 and "not hostagent's ledger lock" in errors[0], r.stderr
    assert [c["Names"] for c in agent.containers()] == [lock.LOCK_NAME]


def test_a_container_being_started_holds_and_one_abandoned_is_removed(agent: Agent) -> None:
    def create(owner: str, lease_s: int, name: str, device: str) -> str:
        labels = {
            "gpupin.test": agent.tag,
            "gpupin.devices": device,
            lease.OWNER_LABEL: owner,
            lease.LEASE_LABEL: str(lease_s),
        }
        return agent.sandbox.docker(
            "create",
            "--name",
            name,
            *(f"--label={k}={v}" for k, v in labels.items()),
            "--gpus",
            f"device={device}",
            TEST_IMAGE,
            check=True,
        ).stdout.strip()

    live = create(str(lease.this_process()), lease.LEASE_S, f"starting-{agent.tag}", RTX)  # this test is its owner
    error = held_error(agent("run", "--rm", "--gpu", "1", TEST_IMAGE))
    assert f"starting-{agent.tag} ({live[:12]}, created, gpupin via --gpus, being started by hostagent)" in error
    dead = create(dead_owner(), lease.MAX_LEASE_S, f"abandoned-{agent.tag}", A800C)
    remote = create("host=far pid=1 start=1 boot=elsewhere pidns=1", 1, f"remote-{agent.tag}", A800)
    wait_for(
        lambda: (
            not any(
                h["name"] == f"remote-{agent.tag}" and h["holds"]
                for g in json.loads(agent("ls", "--json").stdout)["gpus"]
                for h in g["holders"]
            )
        ),
        30,
        "the remote one's lease to be up by the daemon's clock",
    )
    r = agent("run", "--rm", "--name", f"abandoned-{agent.tag}", "--gpu", "3", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [A800C], r.stderr
    for name, cid in ((f"abandoned-{agent.tag}", dead), (f"remote-{agent.tag}", remote)):
        assert f"removed {name} ({cid[:12]}): created by " in r.stderr and "never started" in r.stderr
    assert [c["ID"] for c in agent.containers()] == [live]  # the live one is left alone


def test_killed_between_create_and_start_frees_the_name_too(agent: Agent) -> None:
    name = f"job-{agent.tag}"
    r = agent("run", "--name", name, "--gpu", "1", TEST_IMAGE, GPUPIN_FAILPOINT="after-create")
    assert r.returncode == -signal.SIGKILL
    r = agent("run", "--rm", "--name", name, "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX] and f"removed {name} " in r.stderr, r.stderr
    assert agent.containers() == []


# --- one daemon, many addresses --------------------------------------------------------------------------------


@pytest.fixture
def netns(agent: Agent) -> Iterator[str]:
    """A network namespace of the test's own, with its loopback up."""
    name = f"gpupin-ledger-{agent.tag}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["nsenter", f"--net=/run/netns/{name}", "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def start_proxy(argv: list[str], netns: str | None = None) -> subprocess.Popen[str]:
    prefix = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
    p = subprocess.Popen([*prefix, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n", p.stderr.read() if p.stderr else ""
    return p


def stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait()


def test_32_clients_on_three_addresses_of_one_daemon_never_share_a_card(
    agent: Agent, netns: str, tmp_path: Path
) -> None:
    """Two spellings of the socket (/run and /var/run, one inode) and TCP from another network namespace, where
    the clients share no local lock with anyone (GPUPIN_LOCAL_LOCK=0): the daemon's lock alone keeps them apart.
    Half the socket's clients go through a resident agent (two agents, one on each spelling, one of them without
    the local lock), the others book for themselves, some without the local lock too: runs through an agent and
    runs without one never book a card twice."""
    agent.env["FAKEGPU_TOPOLOGY"] = idle_topology()  # all four cards free (mixed-4's pid 4242 holds card 2)
    sock = socket_of(agent)
    proxy = start_proxy([*PROXY, "--listen", "tcp://127.0.0.1:2375", "--to", sock], netns)
    addresses = [f"unix://{sock}", f"unix:///var{sock}", "tcp://127.0.0.1:2375"]
    assert os.path.samefile(sock, f"/var{sock}")
    residents = [
        Resident({**agent.env, "DOCKER_HOST": addresses[0]}),
        Resident({**agent.env, "DOCKER_HOST": addresses[1], "GPUPIN_LOCAL_LOCK": "0"}),
    ]

    def through_an_agent(i: int) -> bool:
        return i % 3 < 2 and (i // 3) % 2 == 0

    def one(i: int, sleep: float, wait: bool) -> subprocess.CompletedProcess[str]:
        host = addresses[i % 3]
        argv = agent.argv(
            "run",
            "--rm",
            "--count",
            "1",
            *(["--wait"] if wait else []),
            TEST_IMAGE,
            "--quiet",
            "sh",
            "-c",
            WORK.format(sleep),
        )
        env = {**agent.env, "DOCKER_HOST": host, "GPUPIN_TRACE": str(tmp_path / f"trace-{i}")}
        if through_an_agent(i):
            env["GPUPIN_AGENT_SOCKET"] = residents[i % 3].socket
        elif i % 4 == 1:
            env["GPUPIN_LOCAL_LOCK"] = "0"
        if host.startswith("tcp://"):
            argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
            env["GPUPIN_LOCAL_LOCK"] = "0"
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)

    def booked_by_an_agent() -> set[int]:
        """The clients that read no NVML themselves (the agent looked and created for them)."""
        out = set()
        for i in range(32):
            trace = tmp_path / f"trace-{i}"
            if "cards" not in trace.read_text().split():
                out.add(i)
            trace.unlink()
        return out

    try:
        with ThreadPoolExecutor(32) as pool:
            # Each winner holds its card for 60 s: every one of the 32 has asked before the first lets go, even
            # on a loaded machine (two engines' tiers side by side), so exactly 4 win and 28 are refused.
            results = list(pool.map(lambda i: one(i, 60, False), range(32)))
        codes = sorted(r.returncode for r in results)
        assert codes == [0] * 4 + [75] * 28, [r.stderr for r in results if r.returncode not in (0, 75)]
        won = intervals([r.stdout for r in results if r.returncode == 0])
        assert sorted(won) == sorted([A800, RTX, A800B, A800C])  # four cards, each once: no double holding
        assert {i % 3 for i, r in enumerate(results) if r.returncode in (0, 75)} == {0, 1, 2}
        assert booked_by_an_agent() == {i for i in range(32) if through_an_agent(i)}
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda i: one(i, 0.5, True), range(32)))
        assert [r.returncode for r in results] == [0] * 32, [r.stderr for r in results if r.returncode]
        by_card = intervals([r.stdout for r in results])
        assert sum(len(v) for v in by_card.values()) == 32
        never_two_at_once(by_card)
        assert booked_by_an_agent() == {i for i in range(32) if through_an_agent(i)}
    finally:
        stop(proxy)
        for r in residents:
            r.close()


def make_certs(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as `dockerd --tlsverify` setups use."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=gpupin test CA",
    )
    for who, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{who}.ext").write_text(ext + "\n")
        ssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{who}-key.pem",
            "-out",
            f"{who}.csr",
            "-subj",
            f"/CN={who}",
        )
        ssl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            f"{who}.pem",
            "-days",
            "2",
            "-extfile",
            f"{who}.ext",
        )
    client = d / "client"
    client.mkdir()
    for src, dst in (("ca.pem", "ca.pem"), ("client.pem", "cert.pem"), ("client-key.pem", "key.pem")):
        (client / dst).write_bytes((d / src).read_bytes())


def test_tls_from_docker_tls_verify_and_docker_cert_path(agent: Agent, netns: str, tmp_path: Path) -> None:
    sock = socket_of(agent)
    make_certs(tmp_path)
    proxy = start_proxy(
        [
            *PROXY,
            "--listen",
            "tcp://127.0.0.1:2376",
            "--to",
            sock,
            "--tls",
            *(str(tmp_path / f) for f in ("server.pem", "server-key.pem", "ca.pem")),
        ],
        netns,
    )
    inside = ["nsenter", f"--net=/run/netns/{netns}"]

    def ha(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*inside, *agent.argv(*args)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**agent.env, "DOCKER_HOST": "tcp://127.0.0.1:2376", **env},
        )

    # REQUESTS_CA_BUNDLE names another CA: requests would verify the daemon with it (psf/requests#3829) where the
    # docker CLI uses DOCKER_CERT_PATH's.
    other = tmp_path / "other"
    other.mkdir()
    make_certs(other)
    tls = {
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(tmp_path / "client"),
        "REQUESTS_CA_BUNDLE": str(other / "ca.pem"),
        "CURL_CA_BUNDLE": str(other / "ca.pem"),
    }
    try:
        r = ha("run", "--rm", "--gpu", "1", TEST_IMAGE, **tls)
        assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
        data = json.loads(ha("ls", "--json", **tls).stdout)
        assert data["docker"] == {"host": "tcp://127.0.0.1:2376", "available": True, "error": None}
        for env, says in (({}, "does not answer"), ({**tls, "DOCKER_CERT_PATH": str(tmp_path)}, "cert.pem")):
            r = ha("run", "--rm", "--gpu", "1", TEST_IMAGE, **env)
            errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
            assert r.returncode == 69 and len(errors) == 1 and says in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
    finally:
        stop(proxy)


def test_a_docker_context_names_the_daemon(agent: Agent, tmp_path: Path) -> None:
    sock = socket_of(agent)
    cfg = tmp_path / "docker-config"
    env = {k: v for k, v in agent.env.items() if k != "DOCKER_HOST"}
    for args in (["context", "create", "sandbox", "--docker", f"host=unix://{sock}"], ["context", "use", "sandbox"]):
        subprocess.run(
            [agent.sandbox.docker_cli, "--config", str(cfg), *args], env=env, check=True, capture_output=True
        )
    agent.env = {**env, "DOCKER_CONFIG": str(cfg)}
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    data = json.loads(agent("ls", "--json").stdout)
    assert data["docker"]["available"] and data["docker"]["host"] == f"unix://{sock} (context sandbox)"
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE, DOCKER_CONTEXT="nowhere")
    assert r.returncode == 69 and "context 'nowhere' does not exist" in r.stderr, r.stderr


# --- the daemon's failures are one line --------------------------------------------------------------------------

FAULTS = [
    (["--fail", "GET /containers/json=500"], 69, "answered 500"),
    (["--fail", r"GET /containers/[0-9a-f]{64}/json=500"], 69, "answered 500"),
    (["--drop", "GET /containers/json"], 69, "does not answer"),
    (["--drop", "POST /containers/[0-9a-f]{64}/start"], 69, "does not answer"),
    (["--fail", "POST /containers/create$=500"], 125, "RUNTIME refused to create the container"),
    (["--fail", "POST /containers/create[?]name=gpupin-ledger-lock=500"], 69, "could not take the ledger lock"),
]


@pytest.mark.per_engine
@pytest.mark.parametrize(("fault", "code", "says"), FAULTS, ids=[" ".join(f[0]) for f in FAULTS])
def test_daemon_failures_are_one_line_and_leave_nothing(
    agent: Agent, tmp_path: Path, fault: list[str], code: int, says: str
) -> None:
    sock = socket_of(agent)
    held = agent("run", "-d", "--gpu", "0", TEST_IMAGE, "sleep", "300")  # a running container to inspect
    assert held.returncode == 0, held.stderr
    proxy = start_proxy([*PROXY, "--listen", f"unix://{tmp_path}/d.sock", "--to", sock, *fault])
    try:
        r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE, DOCKER_HOST=f"unix://{tmp_path}/d.sock")
        errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
        says = says.replace("RUNTIME", "podman" if agent.sandbox.engine == PODMAN else "Docker")  # named
        assert r.returncode == code and len(errors) == 1 and says in errors[0], r.stderr
        assert "Traceback" not in r.stderr and "HINT:" in errors[0]
        wait_for(lambda: len(agent.containers()) == 1, 10, "the lock to be let go (in the background)")
        assert agent.sandbox.docker("inspect", lock.LOCK_NAME).returncode != 0
        ls = agent("ls", DOCKER_HOST=f"unix://{tmp_path}/d.sock")
        assert ls.returncode == 0 and "Traceback" not in ls.stderr
        if "GET /containers" in fault[1] and "[0-9a-f]" not in fault[1]:
            assert re.match(r"hostagent: WARNING: Docker unavailable at unix://\S+ \(", ls.stderr), ls.stderr
            # stdout is the listing, which says its holders are unknown; why is on stderr.
            assert "WARNING" not in ls.stdout and "answer" not in ls.stdout
            assert ls.stdout.splitlines()[0].endswith("Docker unavailable: who holds which card is unknown")
    finally:
        stop(proxy)


def test_a_daemon_lost_while_following_is_one_line_69(agent: Agent, tmp_path: Path) -> None:
    # The container runs on; hostagent, which can no longer learn how it ends, says so and where to look.
    proxy = start_proxy([*PROXY, "--listen", f"unix://{tmp_path}/d.sock", "--to", socket_of(agent)])
    p = agent.popen(
        "run",
        "--rm",
        "--gpu",
        "1",
        TEST_IMAGE,
        "--quiet",
        "sh",
        "-c",
        "echo started; sleep 30",
        DOCKER_HOST=f"unix://{tmp_path}/d.sock",
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "started\n"
    finally:
        stop(proxy)
    _, err = p.communicate(timeout=60)
    errors = [ln for ln in err.splitlines() if "ERROR:" in ln]
    assert p.returncode == 69 and len(errors) == 1 and "Traceback" not in err, err
    assert "lost the Docker daemon" in errors[0] and "the container may still be running" in errors[0]
