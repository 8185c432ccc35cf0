"""`hostagent ls` on the sandboxed daemons: the holders of every kind (pinned by hostagent, foreign `--gpus`, a
label that lies, an exited pinned container), a container's process named by its container, and the table with
holders against tests/golden/ls-holders-<engine>[-color].txt. Without a daemon: tests/unit/test_hostagent_ls.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.host import HOSTAGENT, simhost_env
from tests.support.ls import by_uuid, check_golden, ls, ls_on_golden_host, shown, write_topology
from tests.support.sandbox import TEST_IMAGE, Sandbox, serves_cdi
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")


# --- holders, on the sandbox -----------------------------------------------------------------------------------


@pytest.fixture
def tagged(mixed4_sandbox: Sandbox) -> Iterator[str]:
    tag = uuid.uuid4().hex[:12]
    yield tag
    ids = mixed4_sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={tag}").stdout.split()
    if ids:
        mixed4_sandbox.docker("rm", "-f", *ids)


def test_holders_pinned_and_foreign(mixed4_sandbox: Sandbox, tagged: str) -> None:
    sb = mixed4_sandbox
    env = simhost_env("mixed-4", DOCKER_HOST=sb.host)
    run = [HOSTAGENT, "run", "-d", "--label", f"gpupin.test={tagged}"]
    pinned = subprocess.run(
        [*run, "--name", f"pinned-{tagged}", "--gpu", "1", TEST_IMAGE, "sleep", "60"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(
        [
            HOSTAGENT,
            "run",
            "--label",
            f"gpupin.test={tagged}",
            "--name",
            f"done-{tagged}",
            "--gpu",
            "3",
            TEST_IMAGE,
            "true",
        ],
        env=env,
        capture_output=True,
        check=True,
    )
    sb.docker(
        "run",
        "-d",
        "--name",
        f"legacy-{tagged}",
        "--label",
        f"gpupin.test={tagged}",
        "--gpus",
        "1",
        TEST_IMAGE,
        "sleep",
        "60",
        check=True,
    )
    sb.docker(
        "run",
        "-d",
        "--name",
        f"bydevice-{tagged}",
        "--label",
        f"gpupin.test={tagged}",
        "--gpus",
        "device=2",
        TEST_IMAGE,
        "sleep",
        "60",
        check=True,
    )
    r = ls("--json", DOCKER_HOST=sb.host)
    assert r.returncode == 0, r.stderr
    cards = by_uuid(json.loads(r.stdout))
    who = {
        u: sorted((h["name"], h["state"], h["how"], h["via"], h["holds"]) for h in g["holders"])
        for u, g in cards.items()
    }
    way = "CDI" if serves_cdi(sb) else "--gpus"  # which way the daemon gave hostagent's containers their cards
    assert who[RTX] == [(f"pinned-{tagged}", "running", "gpupin", way, True)]
    assert who[A800] == [(f"legacy-{tagged}", "running", "--gpus 1", "--gpus", True)]
    assert who[A800B] == [(f"bydevice-{tagged}", "running", "--gpus device=2", "--gpus", True)]
    assert who[A800C] == [(f"done-{tagged}", "exited", "gpupin", way, False)]
    assert [cards[u]["held"] for u in (A800, RTX, A800B, A800C)] == [True, True, True, False]
    assert cards[RTX]["holders"][0]["id"] == pinned
    table = ls(DOCKER_HOST=sb.host).stdout
    assert re.search(
        rf"^    held by +pinned-{tagged}  {pinned[:12]}  running  unverified \(claims uid {os.getuid()}\)  "
        rf"gpupin via {re.escape(way)}$",
        table,
        re.M,
    ), table  # made without the agent: its label's uid is a claim
    assert re.search(rf"^    held by +legacy-{tagged}  \w{{12}}  running  unverified  --gpus 1$", table, re.M), table
    assert re.search(rf"^    not holding  done-{tagged} \(exited\)$", table, re.M), table


def test_a_containers_process_names_its_container(mixed4_sandbox: Sandbox, tagged: str, tmp_path: Path) -> None:
    """NVML's pid is a host pid: /proc/<pid>/cgroup names the container, the ledger its name."""
    sb = mixed4_sandbox
    env = simhost_env("mixed-4", DOCKER_HOST=sb.host)
    cid = subprocess.run(
        [
            HOSTAGENT,
            "run",
            "-d",
            "--label",
            f"gpupin.test={tagged}",
            "--name",
            f"proc-{tagged}",
            "--gpu",
            "1",
            TEST_IMAGE,
            "sleep",
            "60",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pid = int(sb.docker("inspect", "-f", "{{.State.Pid}}", cid, check=True).stdout)
    comm = Path(f"/proc/{pid}/comm")
    wait_for(lambda: comm.read_text().strip() == "sleep", 30, "the entrypoint to exec sleep")
    # `run -d` returns once the container started: its entrypoint may still be verifying before it execs the workload.
    wait_for(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep", 30, "the workload (sleep) to start")
    topo = write_topology(tmp_path, "mixed-4", pid)
    data = json.loads(ls("--json", FAKEGPU_TOPOLOGY=str(topo), DOCKER_HOST=sb.host).stdout)
    (proc,) = by_uuid(data)[RTX]["processes"]
    assert (proc["pid"], proc["command"], proc["container_id"], proc["container"]) == (
        pid,
        "sleep",
        cid,
        f"proc-{tagged}",
    )
    table = ls(FAKEGPU_TOPOLOGY=str(topo), DOCKER_HOST=sb.host).stdout
    assert re.search(rf"^    process +{pid}  C  \S+  512 MiB  sleep  proc-{tagged}$", table, re.M), table


def test_golden_holders(mixed4_sandbox: Sandbox, tagged: str, request: pytest.FixtureRequest) -> None:
    """Several holders on one card, a shared card, a MISMATCH under both its cards, a pinned container that holds
    nothing: the table and --json against tests/golden/ls-holders-<way>[-color].txt and .json, container ids
    replaced by placeholders."""
    sb = mixed4_sandbox
    env = simhost_env("mixed-4", DOCKER_HOST=sb.host)
    before = json.loads(ls("--json", DOCKER_HOST=sb.host).stdout)["gpus"]
    others = [h["name"] for g in before for h in g["holders"] + g["mislabelled"]]
    assert not others, f"the sandbox has containers of another test, which would show in the listing: {others}"
    names = ["g-train-a", "g-train-b", "g-legacy", "g-liar", "g-done"]
    sb.docker("rm", "-f", *names)  # left by an interrupted run
    label = ["--label", f"gpupin.test={tagged}"]
    sleep = [TEST_IMAGE, "sleep", "300"]
    for name in ("g-train-a", "g-train-b"):
        subprocess.run(
            [HOSTAGENT, "run", "-d", *label, "--share", "--name", name, "--gpu", "1", *sleep],
            env=env,
            capture_output=True,
            check=True,
        )
    sb.docker("run", "-d", *label, "--name", "g-legacy", "--gpus", f"device={A800B}", *sleep, check=True)
    # Labelled for card 3, given card 2: a MISMATCH under both.
    sb.docker(
        "run",
        "-d",
        *label,
        "--name",
        "g-liar",
        "--label",
        f"gpupin.devices={A800C}",
        "--gpus",
        "device=2",
        *sleep,
        check=True,
    )
    subprocess.run(
        [HOSTAGENT, "run", *label, "--name", "g-done", "--gpu", "3", TEST_IMAGE, "true"],
        env=env,
        capture_output=True,
        check=True,
    )
    ids = {name: sb.docker("inspect", "-f", "{{.Id}}", name, check=True).stdout.strip() for name in names}
    # The way hostagent pins differs by engine (--gpus on 20.10, CDI on 26 and 28.5): a golden file each way,
    # named by the engine it was first written on.
    way = "26" if serves_cdi(sb) else "20.10"
    for args, golden in [
        ([], f"ls-holders-{way}.txt"),
        (["--color", "always"], f"ls-holders-{way}-color.txt"),
        (["--json"], f"ls-holders-{way}.json"),  # byte for byte too: what scripts read
    ]:
        text = shown(ls_on_golden_host(args, env))
        for n, name in enumerate(names):
            text = text.replace(ids[name], f"<id-{n}>".ljust(64, "-")).replace(
                ids[name][:12], f"<id-{n}>".ljust(12, "-")
            )
        # When each started and was booked: the times of this run.
        text = re.sub(r'"started": "[^"]*"', '"started": "<started>"', text)
        text = re.sub(r'"since": [0-9]+', '"since": "<since>"', text)
        # The sandbox's socket path holds its name (GPUPIN_SANDBOX_NAME): another checkout's is another path.
        text = text.replace(json.dumps(sb.host), '"<docker-host>"')
        check_golden(request, golden, text)
