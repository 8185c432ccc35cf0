"""hostagent against the sandboxed Docker daemon and the simulated mixed-4 host: the real thing, end to end.

Each container runs the project's image, whose entrypoint proves the pin; the tests read what the workload itself
saw (`cuda:k = UUID at BUS ..., as expected`). Everything a test creates carries the label gpupin.test and is
removed afterwards.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.support.host import idle_topology, saw
from tests.support.sandbox import PODMAN, TEST_IMAGE, Agent, serves_cdi
from tests.support.scenarios import uuids

# Every engine runs these (`hostagent run`'s whole path on the engine: create, attach, start, signals, exit;
# what hostagent refuses before it asks the daemon, `agent_any`, once): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine

A800, RTX, A800B, A800C = uuids("mixed-4")


# --- the asked card, whatever the request form -----------------------------------------------------------------


@pytest.mark.parametrize(
    "flag_spec",
    [
        ("--uuid", RTX),
        ("--gpu", RTX),
        ("--gpu", "GPU-95c6"),
        ("--gpu", "1"),
        ("--gpu", "3b:00.0"),
        ("--gpu", "0000:3B:00.0"),
        ("--gpu", "00000000:3b:00.0"),
    ],
)
def test_each_request_form_puts_the_asked_card_at_cuda0(agent: Agent, flag_spec: tuple[str, str]) -> None:
    r = agent("run", "--rm", *flag_spec, TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    assert saw(r.stdout) == [RTX]
    assert f"cuda:0  {RTX}  00000000:3B:00.0  NVIDIA GeForce RTX 4090  (local rank 0)" in r.stderr


def test_several_cards_in_the_order_asked(agent: Agent) -> None:
    r = agent("run", "--rm", "--gpu", "3", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    assert saw(r.stdout) == [A800C, RTX]
    assert "CUDA_VISIBLE_DEVICES=1,0" in r.stderr


def test_count_takes_the_best_free_card(agent: Agent) -> None:
    # mixed-4: the A800 at 86 is busy (40 GiB used) and the 4090 is small; 1B and AF are the empty A800s.
    r = agent("run", "--rm", "--count", "2", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    assert saw(r.stdout) == [A800, A800C]


# --- docker run's behaviour -----------------------------------------------------------------------------------


def test_exit_codes_and_streams_pass_through(agent: Agent) -> None:
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert agent.containers() == []  # --rm


def test_docker_run_options_reach_the_container(agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("payload\n")
    tmp_path.chmod(0o755)  # readable by the container's user 1234
    envf = tmp_path / "job.env"
    envf.write_text("FROM_FILE=1\n")
    r = agent(
        "run",
        "--rm",
        "--gpu",
        "0",
        "-e",
        "LR=0.1",
        "--env-file",
        str(envf),
        "-v",
        f"{tmp_path}:/data:ro",
        "-w",
        "/data",
        "-u",
        "1234:1234",
        "--shm-size",
        "256m",
        "--ipc",
        "private",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:2048",
        "--ulimit",
        "core=0",
        # podman puts its own default (2**20) for a limit not named once one is: above the kernel's hard limit on a
        # host whose root lacks CAP_SYS_RESOURCE (podman run --ulimit fails there too): named, as there
        "--ulimit",
        "nproc=4096:4096",
        "--name",
        f"opts-{agent.tag}",
        TEST_IMAGE,
        "--quiet",
        "sh",
        "-c",
        "echo \"$LR $FROM_FILE $(pwd) $(id -u) $(cat data.txt) $(df -m /dev/shm | tail -1 | tr -s ' ' "
        "| cut -d' ' -f2) $(ulimit -Sn) $(ulimit -Hn) $(ulimit -c) $(ulimit -p)\"",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0.1", "1", "/data", "1234", "payload", "256", "1024", "2048", "0", "4096"]


@pytest.mark.needs("cdi-inspect")
def test_detach_prints_the_id_and_the_container_carries_the_pin(agent: Agent) -> None:
    r = agent("run", "-d", "--gpu", "1", "--gpu", "0", "--verify", "nvml", TEST_IMAGE, "sleep", "30")
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", cid)
    info = json.loads(agent.sandbox.docker("inspect", cid, check=True).stdout)[0]
    assert info["Config"]["Labels"]["gpupin.devices"] == f"{RTX},{A800}"
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert env["GPUPIN_EXPECT"] == f"{RTX}@00000000:3B:00.0,{A800}@00000000:1B:00.0" and env["GPUPIN_VERIFY"] == "nvml"
    if serves_cdi(agent.sandbox):  # the spec sets NVIDIA_VISIBLE_DEVICES=void: the pin sets none
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert info["HostConfig"]["DeviceRequests"] == [
            {
                "Driver": "cdi",
                "Count": 0,
                "DeviceIDs": [f"nvidia.com/gpu={RTX}", f"nvidia.com/gpu={A800}"],
                "Capabilities": [],
                "Options": {},
            }
        ]
    else:
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"{RTX},{A800}"
        assert info["HostConfig"]["DeviceRequests"] == [
            {"Driver": "nvidia", "Count": 0, "DeviceIDs": [RTX, A800], "Capabilities": [["gpu"]], "Options": {}}
        ]
    assert info["State"]["Running"]


# --- refusals: the documented code, one line, and nothing created ---------------------------------------------


def refused_creating_nothing(agent: Agent, args: list[str], code: int, says: str) -> None:
    r = agent("run", *args)
    assert r.returncode == code, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(errors) == 1 and says in errors[0], r.stderr
    assert agent.containers() == []


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--gpu", "9", TEST_IMAGE], 64, "GPU index 9 is out of range"),
        (["--gpu", "GPU-6c", TEST_IMAGE], 64, "ambiguous"),
        (["--gpu", "zz:00.0", TEST_IMAGE], 64, "malformed PCI bus id"),
        (["--gpu", "1", "--gpu", RTX, TEST_IMAGE], 64, "already asked for"),
        (["--count", "5", TEST_IMAGE], 64, "only 4"),
        (["--gpu", "1", "-e", f"GPUPIN_EXPECT={A800}", TEST_IMAGE], 64, "sets GPUPIN_EXPECT itself"),
        (["--gpu", "1", "--bogus", TEST_IMAGE], 64, "unrecognized arguments"),
        (["--gpu", "1", "--shm-size", "lots", TEST_IMAGE], 64, "--shm-size"),
    ],
)
def test_refusals_before_the_daemon_is_asked_create_nothing(
    agent_any: Agent, args: list[str], code: int, says: str
) -> None:
    """The command line and the cards (NVML) alone refuse these: one engine shows it."""
    refused_creating_nothing(agent_any, args, code, says)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--gpu", "1", "--pull", "never", "no/such:image"], 125, "not found locally"),
        (["--gpu", "1", "no/such:image"], 125, "could not be pulled"),
        (["--gpu", "1", "-v", "/tmp:/x:badmode", TEST_IMAGE], 125, "RUNTIME refused to create the container"),
        (["--gpu", "1", "--entrypoint", "/no/such/binary", TEST_IMAGE], 127, "RUNTIME could not start the container"),
    ],
)
def test_refusals_of_the_daemon_create_nothing(agent: Agent, args: list[str], code: int, says: str) -> None:
    """In the runtime's words, and named: Docker, or podman."""
    runtime = "podman" if agent.sandbox.engine == PODMAN else "Docker"
    refused_creating_nothing(agent, args, code, says.replace("RUNTIME", runtime))


def test_a_daemon_that_is_down_is_69_and_nothing_is_created(agent_any: Agent, tmp_path: Path) -> None:
    # No engine answers here: one run shows it.
    r = agent_any("run", "--gpu", "1", TEST_IMAGE, DOCKER_HOST=f"unix://{tmp_path}/no.sock")
    assert r.returncode == 69, r.stderr
    assert "does not answer" in r.stderr and "HINT:" in r.stderr
    assert agent_any.containers() == []


def test_dry_run_prints_the_docker_command_and_creates_nothing(agent: Agent) -> None:
    r = agent("run", "--dry-run", "--gpu", "1", "--rm", TEST_IMAGE, "python3", "train.py")
    assert r.returncode == 0, r.stderr
    cdi = serves_cdi(agent.sandbox)
    assert r.stdout.startswith(
        f"docker run --rm --device nvidia.com/gpu={RTX} -e GPUPIN_EXPECT="
        if cdi
        else f"docker run --rm --gpus '\"device={RTX}\"' -e NVIDIA_VISIBLE_DEVICES={RTX} "
    )
    assert r.stdout.rstrip().endswith(f"{TEST_IMAGE} python3 train.py")
    r = agent("run", "--dry-run", "--json", "--gpu", "1", TEST_IMAGE)
    payload = json.loads(r.stdout)
    assert payload["config"]["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == [
        f"nvidia.com/gpu={RTX}" if cdi else RTX
    ]
    assert agent.containers() == []


# --- the ledger: no card twice -------------------------------------------------------------------------------


@pytest.mark.needs("gpus")
def test_a_held_card_is_75_naming_the_holder(agent: Agent) -> None:
    holder = agent("run", "-d", "--name", f"holder-{agent.tag}", "--gpu", "1", TEST_IMAGE, "sleep", "60")
    assert holder.returncode == 0, holder.stderr
    r = agent("run", "--rm", "--gpu", RTX, TEST_IMAGE)
    assert r.returncode == 75, r.stderr
    assert f"{RTX} is held by holder-{agent.tag}" in r.stderr and "--wait" in r.stderr
    assert len(agent.containers()) == 1
    # --share shares with sharers only: this holder was started without it (tests/docker/test_ledger_docker.py shares)
    shared = agent("run", "--rm", "--share", "--gpu", "1", TEST_IMAGE)
    assert shared.returncode == 75 and f"{RTX} is held by holder-{agent.tag}" in shared.stderr, shared.stderr
    # a foreign container given every card with plain --gpus all holds them too
    agent.sandbox.docker("rm", "-f", f"holder-{agent.tag}", check=True)
    agent.sandbox.docker(
        "run", "-d", "--label", f"gpupin.test={agent.tag}", "--gpus", "all", TEST_IMAGE, "sleep", "60", check=True
    )
    r = agent("run", "--rm", "--gpu", "2", TEST_IMAGE)
    assert r.returncode == 75 and "--gpus all" in r.stderr, r.stderr


def test_wait_runs_once_the_card_is_free_and_gives_up_after_its_limit(agent: Agent) -> None:
    """The holder is freed once the waiter says it waits (a holder that ends by itself races a loaded machine)."""
    holder = f"hold-{agent.tag}"
    r = agent("run", "-d", "--rm", "--name", holder, "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    try:
        r = agent("run", "--rm", "--gpu", "1", "--wait", "1", TEST_IMAGE)
        # gives up at its limit: the line says how long it waited (its last look may end past the limit, loaded)
        assert r.returncode == 75 and re.search(r"still after waiting \d+ s\.", r.stderr), r.stderr
        waiter = agent.popen("run", "--rm", "--gpu", "1", "--wait", TEST_IMAGE)
        assert waiter.stderr is not None
        said = ""
        while "waiting: " not in said and waiter.poll() is None:
            said += waiter.stderr.readline()
    finally:
        agent.sandbox.docker("stop", "-t", "0", holder)
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0 and saw(out) == [RTX] and "waiting: " in said, said + err


# The concurrent runs (32 clients, three addresses of one daemon): tests/docker/test_ledger_docker.py.


# --- a hostagent killed mid-launch leaves no card held -------------------------------------------------------


def test_killed_while_holding_the_lock_blocks_no_one(agent: Agent) -> None:
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE, GPUPIN_FAILPOINT="after-lock")
    assert r.returncode == -signal.SIGKILL
    t0 = time.monotonic()
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    assert time.monotonic() - t0 < 30
    assert agent.containers() == []


def test_killed_between_create_and_start_leaves_no_phantom_hold(agent: Agent) -> None:
    r = agent("run", "--gpu", "1", TEST_IMAGE, GPUPIN_FAILPOINT="after-create")
    assert r.returncode == -signal.SIGKILL
    left = agent.containers()
    assert [c["State"] for c in left] == ["created"]  # what the kill left: never started
    listing = json.loads(agent("ls", "--json").stdout)
    rtx = next(g for g in listing["gpus"] if g["uuid"] == RTX)
    assert not rtx["held"] and [h["state"] for h in rtx["holders"]] == ["created"]
    r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr


def test_kills_at_any_moment_leave_every_card_free(agent: Agent) -> None:
    agent.env["FAKEGPU_TOPOLOGY"] = idle_topology()  # all four cards free (mixed-4's pid 4242 holds card 2)
    for delay in (0.05, 0.15, 0.25, 0.35, 0.5, 0.7, 0.9, 1.2):
        p = agent.popen("run", "--rm", "--count", "4", TEST_IMAGE, "--quiet", "sleep", "0.2")
        time.sleep(delay)
        p.kill()
        p.communicate(timeout=60)
    # whatever the kills left (created containers, or runs that finish on their own), every card is free again
    r = agent("run", "--rm", "--count", "4", "--wait", "60", TEST_IMAGE)
    assert r.returncode == 0 and sorted(saw(r.stdout)) == sorted([A800, RTX, A800B, A800C]), r.stderr
    assert {c["State"] for c in agent.containers()} <= {"created"}
