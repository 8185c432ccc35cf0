"""Other users' rootless containers, as the root agent sees them (docs/podman.md, "Rootless"): their runtime is
theirs, so the ledger knows them only through NVML's processes. A process in a user namespace that a uid other than
root made is that uid's rootless container (the kernel names the uid, never the cgroup's name): busy for `ls`,
refused by `run` on Docker (75), naming the user.

Two ways in: a real rootless podman 4.3 of the bare uid 5026 (`tests/sandbox/podman.sh rootless`; skipped without
podman unless GPUPIN_TEST_REQUIRE_PODMAN=1, as tests/docker/test_podman.py) holding card 1 through CDI; and, for
what only a host whose cgroup names the container shows (cgroup v2 with systemd:
`user@UID.service/user.slice/libpod-<id>.scope`; a v1 host like this one leaves a rootless container in its
starter's cgroup), real processes of other uids in user namespaces and cgroups made as libpod makes them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker.test_podman import no_podman
from tests.support.host import REPO
from tests.support.processes import Placed, error_line, on_cards
from tests.support.sandbox import TEST_IMAGE, Agent, exposed_in
from tests.support.scenarios import uuids

PODMAN_SCRIPT = REPO / "tests" / "sandbox" / "podman.sh"
A800, RTX, A800B, A800C = uuids("mixed-4")
ALICE, BOB, MALLORY = 5026, 5027, 5001  # bare uids in no group: two rootless users, one who forges names

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="processes of other uids (setpriv) need root")


class Rootless:
    """A uid's own rootless podman (podman.sh rootless UID): podman(...) is what that user types."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        out = self.script("env", timeout=30).stdout
        self.run_dir = Path(
            dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)["GPUPIN_SANDBOX_ROOTLESS_RUN"]
        )

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(PODMAN_SCRIPT), "rootless", str(self.uid), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def podman(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.script("podman", *args, timeout=timeout)

    def exposed(self, cid: str) -> list[str]:
        """The cards the fake CDI hook gave this container (its log)."""
        return exposed_in(self.run_dir, cid)


@pytest.fixture(scope="module")
def alice() -> Iterator[Rootless]:
    """uid 5026's rootless podman, up for this module; down (her containers removed) after it."""
    if shutil.which("podman") is None:
        no_podman("podman is not installed (`make podman-up` installs it)")
    try:
        r = Rootless(ALICE)
        up = r.script("up", timeout=600)
    except (OSError, subprocess.SubprocessError, KeyError) as err:
        no_podman(f"podman.sh rootless {ALICE}: {err}")
    if up.returncode != 0:
        no_podman(f"podman.sh rootless {ALICE} up: {up.stderr.strip()}")
    yield r
    r.script("down")


def call(agent: Agent, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(agent.argv(*args), env={**agent.env, **env}, capture_output=True, text=True, timeout=120)


def processes(agent: Agent, env: dict[str, str], uuid_: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    r = call(agent, env, "ls", "--json")
    assert r.returncode == 0, r.stderr
    card = next(g for g in json.loads(r.stdout)["gpus"] if g["uuid"] == uuid_)
    return card, card["processes"]


# --- a real rootless podman --------------------------------------------------------------------------------------


def test_a_rootless_podman_container_on_a_card_is_busy_as_its_users(
    alice: Rootless, agent: Agent, tmp_path: Path
) -> None:
    """Alice's `podman run --device nvidia.com/gpu=1` (her own podman, which the root daemon cannot see) holds card
    1; NVML lists its process: `ls` shows the card busy, hers, and `run --gpu 1` on Docker gets 75 naming her uid."""
    name = f"mine-{uuid.uuid4().hex[:8]}"
    started = alice.podman(
        "run", "-d", "--name", name, "--device", "nvidia.com/gpu=1", "localhost/gpupin-base:bookworm", "sleep", "300"
    )
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip().splitlines()[-1]
    assert alice.exposed(cid) == [RTX]  # her CDI device is card 1, and only it
    pid = int(alice.podman("inspect", "--format", "{{.State.Pid}}", name).stdout.split()[-1])
    assert Path(f"/proc/{pid}/status").read_text().count(f"\t{ALICE}\t") >= 1  # runs as her uid on the host
    env = on_cards(tmp_path / "p.json", {RTX: [pid]})
    card, procs = processes(agent, env, RTX)
    hers = f"a user namespace of uid {ALICE} (a rootless container)"  # this cgroup v1 host: no libpod cgroup
    assert (card["state"], card["busy"]) == ("busy", True), card
    assert [(p["pid"], p["owner"], p["rootless"], p["foreign"], p["escape"]) for p in procs] == [
        (pid, "rootless", {"uid": ALICE, "user": str(ALICE), "runtime": None, "whose": hers}, True, False)
    ], procs
    table = call(agent, env, "ls").stdout
    assert re.search(rf"^\s+process\s+{pid}\s.*  {re.escape(hers)}$", table, re.M), table
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"{RTX} is in use by pid {pid} of {ALICE} (sleep) in a user namespace of uid {ALICE}" in line, line
    assert agent.containers() == []  # nothing created on Docker
    assert alice.podman("rm", "-f", "-t", "0", name).returncode == 0


def test_the_entrypoint_proves_the_pin_inside_a_rootless_container(alice: Rootless, agent: Agent) -> None:
    """hostagent cannot pin a rootless user's container (their podman is not its daemon); the image's entrypoint
    still proves what they asked for, and refuses (78) a card they did not get."""
    sandbox = agent.sandbox
    saved = subprocess.run(
        [sandbox.docker_cli, "save", TEST_IMAGE], env=sandbox.env, capture_output=True, timeout=300, check=True
    ).stdout
    loaded = subprocess.run(
        [str(PODMAN_SCRIPT), "rootless", str(ALICE), "podman", "load"], input=saved, capture_output=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr
    ok = alice.podman("run", "--rm", "--device", "nvidia.com/gpu=1", "-e", f"GPUPIN_EXPECT={RTX}", TEST_IMAGE)
    assert ok.returncode == 0 and f"cuda:0 = {RTX}" in ok.stdout and "as expected" in ok.stdout, ok
    wrong = alice.podman("run", "--rm", "--device", "nvidia.com/gpu=1", "-e", f"GPUPIN_EXPECT={A800}", TEST_IMAGE)
    assert wrong.returncode == 78 and "gpupin-entrypoint: ERROR:" in wrong.stderr, wrong


# --- a libpod cgroup, as cgroup v2 with systemd names it ---------------------------------------------------------


@pytest.fixture
def placed(tmp_path: Path) -> Iterator[Callable[..., int]]:
    """placed(uid, scope): a process of `uid` in a user namespace of its own, in the cgroup
    user.slice/user-<uid>.slice/user@<uid>.service/user.slice/<test folder>/<scope> (where the user's podman
    makes `libpod-<id>.scope` on cgroup v2; `slice_uid`: under another uid's slice); its pid. The user chooses
    every name below their own slice."""
    made = Placed()

    def start(uid: int, scope: str, slice_uid: int | None = None) -> int:
        s = uid if slice_uid is None else slice_uid
        base = f"user.slice/user-{s}.slice/user@{s}.service/user.slice/gpupin-{tmp_path.name}-{uid}"
        return made.start(uid, f"{base}/{scope}", userns=True)

    yield start
    made.close()


def test_a_libpod_cgroup_names_the_rootless_container_the_kernel_names_the_user(
    agent: Agent, tmp_path: Path, placed: Callable[..., int]
) -> None:
    cid = uuid.uuid4().hex * 2
    pid = placed(BOB, f"libpod-{cid}.scope/container")  # podman's init sub-cgroup
    env = on_cards(tmp_path / "p.json", {A800C: [pid]})
    card, procs = processes(agent, env, A800C)
    his = f"rootless podman container {cid[:12]} of uid {BOB}"
    assert card["state"] == "busy" and card["busy"], card
    assert [(p["owner"], p["container_id"], p["container"], p["rootless"]) for p in procs] == [
        ("rootless", cid, None, {"uid": BOB, "user": str(BOB), "runtime": "podman", "whose": his})
    ], procs
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "3", TEST_IMAGE), 75)
    assert f"pid {pid} of {BOB} (sleep) in rootless podman container {cid[:12]} of uid {BOB}" in line, line
    assert agent.containers() == []


def test_a_forged_libpod_cgroup_is_never_another_containers_or_users(
    agent: Agent, tmp_path: Path, placed: Callable[..., int]
) -> None:
    """Attack: uid 5001, in a user namespace of its own, runs on card 1 from `libpod-<id>.scope` named for the
    Docker container that holds card 1 (hiding its use), and on card 0 from one under root's slice
    (user-0.slice/user@0.service, framing root) named for another user's container."""
    holder = agent("run", "-d", "--gpu", "1", TEST_IMAGE, "sleep", "300").stdout.strip()
    hiding = placed(MALLORY, f"libpod-{holder}.scope")
    bobs = uuid.uuid4().hex * 2
    framing = placed(MALLORY, f"libpod-{bobs}.scope", slice_uid=0)
    env = on_cards(tmp_path / "p.json", {RTX: [hiding], A800: [framing]})
    card, procs = processes(agent, env, RTX)
    assert card["busy"], card
    assert [(p["owner"], p["container_id"], p["foreign"], p["escape"]) for p in procs] == [
        ("unnamed", None, True, False)
    ], procs  # never the holder's own use
    card, procs = processes(agent, env, A800)
    assert card["state"] == "busy", card
    assert [(p["owner"], p["rootless"]["uid"]) for p in procs] == [("rootless", MALLORY)], procs  # not root's
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "0", TEST_IMAGE), 75)
    assert f"rootless podman container {bobs[:12]} of uid {MALLORY}" in line and "uid 0" not in line, line
