"""Every path to a card against the sandboxed daemons (both engines), with real containers and real device nodes:
the ways in that the ledger counts (device folders and links, bind mounts of nodes under a device-cgroup rule, the
rules alone, DOCKER_RESOURCE_* in any container, CDI names in NVIDIA_VISIBLE_DEVICES, CDI annotations) block their
cards; `hostagent run` refuses the paths and variables that would reach other cards; labels inherited from an
image (`docker commit` of a pinned container) are not the container's; a start that takes longer than the lease is
never removed, and its card never doubled. Pure rules: tests/test_ledger_paths.py."""

from __future__ import annotations

import datetime
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpupin.hostagent.ledger import lease
from tests.docker.test_ledger_docker import A800, A800B, A800C, RTX, SLEEP, docker_run, held_error, listing
from tests.support.host import idle_topology, saw
from tests.support.sandbox import TEST_IMAGE, Agent


@pytest.fixture
def nodes(tmp_path: Path) -> Path:
    """`c 195:2` (card 2's node) two folders down, right in a folder, and behind a link."""
    tmp_path.chmod(0o755)
    (tmp_path / "gpus" / "deep").mkdir(parents=True)
    os.mknod(tmp_path / "gpus" / "deep" / "card", 0o666 | stat.S_IFCHR, os.makedev(195, 2))
    (tmp_path / "flat").mkdir()
    os.mknod(tmp_path / "flat" / "renamed", 0o666 | stat.S_IFCHR, os.makedev(195, 2))
    (tmp_path / "link").symlink_to(tmp_path / "flat" / "renamed")
    return tmp_path


FORMS: dict[str, tuple[list[str], str]] = {
    # name: (docker run arguments, what `ls` and the refusal say)
    "device-folder": (["--device", "{tmp}/gpus:/gpus", *SLEEP], "--device {tmp}/gpus"),
    "device-link": (["--device", "{tmp}/link:/dev/gpu", *SLEEP], "--device {tmp}/link"),
    "device-cgroup-rule": (["--device-cgroup-rule", "c 195:2 rwm", *SLEEP], "--device-cgroup-rule 'c 195:2 rwm'"),
    "bind-mount": (
        ["-v", "{tmp}/flat:/flat", "--device-cgroup-rule", "c 195:2 rw", "--cap-drop", "MKNOD", *SLEEP],
        "-v {tmp}/flat:/flat --device-cgroup-rule 'c 195:2 rw'",
    ),
    "docker-resource-runc": (["-e", f"DOCKER_RESOURCE_GPU={A800B}", *SLEEP], f"DOCKER_RESOURCE_GPU={A800B}"),
    "cdi-annotation": (
        ["--annotation", "cdi.k8s.io/job=nvidia.com/gpu=2", *SLEEP],
        "--annotation cdi.k8s.io/job=nvidia.com/gpu=2",
    ),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_way_in_blocks_its_card_and_ls_shows_it(agent: Agent, form: str, nodes: Path) -> None:
    args, says = ([a.replace("{tmp}", str(nodes)) for a in FORMS[form][0]], FORMS[form][1].replace("{tmp}", str(nodes)))
    if form == "cdi-annotation" and agent.sandbox.engine == "20.10":
        r = agent.sandbox.docker("run", "-d", "--label", f"gpupin.test={agent.tag}", *args)
        assert r.returncode != 0, r  # the 20.10 CLI has no --annotation: nothing runs, nothing is held
        agent.env["FAKEGPU_TOPOLOGY"] = idle_topology()  # card 2 free (mixed-4's pid 4242 holds it)
        ok = agent("run", "--rm", "--gpu", "2", TEST_IMAGE)
        assert ok.returncode == 0 and saw(ok.stdout) == [A800B], ok.stderr
        return
    cid = docker_run(agent, *args)
    error = held_error(agent("run", "--rm", "--gpu", A800B, TEST_IMAGE))
    assert f"{A800B} is held by h-" in error and f"({cid[:12]}, " in error and says in error, error
    cards = listing(agent)
    holders = [h for h in cards[A800B]["holders"] if h["id"] == cid]
    assert len(holders) == 1 and holders[0]["holds"] and says in holders[0]["describe"], cards[A800B]
    assert [u for u, g in cards.items() if not g["held"]] == [A800, RTX, A800C]


def test_dev_mounted_with_a_rule_for_major_195_holds_every_card(agent: Agent) -> None:
    cid = docker_run(agent, "-v", "/dev:/dev", "--device-cgroup-rule", "c 195:* rwm", *SLEEP)
    error = held_error(agent("run", "--rm", "--count", "1", TEST_IMAGE))
    assert "0 of 4 card(s) are free" in error
    assert all(g["held"] and g["holders"][0]["id"] == cid for g in listing(agent).values())


def test_cdi_names_in_nvidia_visible_devices_under_the_nvidia_runtime(agent: Agent) -> None:
    # Created with a live lease (this test owns it), so that it holds without a start: the fake hook, like the
    # toolkit's legacy mode, reads no CDI name, and its CDI mode is not faked.
    mine = {**lease.claim(), "gpupin.test": agent.tag}
    cid = agent.sandbox.docker(
        "create",
        "--runtime",
        "nvidia",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=2",
        *(f"--label={k}={v}" for k, v in mine.items()),
        *SLEEP,
        check=True,
    ).stdout.strip()
    error = held_error(agent("run", "--rm", "--gpu", "2", TEST_IMAGE))
    assert f"({cid[:12]}, created, --runtime nvidia NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=2" in error, error
    r = agent("run", "--rm", "--gpu", "3", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [A800C], r.stderr


def test_run_refuses_what_reaches_a_node_on_disk_and_the_variables_that_pick_devices(
    agent: Agent, nodes: Path, tmp_path: Path
) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text(f"LR=0.1\nDOCKER_RESOURCE_GPU={A800B}\n")
    for args, says in (
        (["--device", f"{nodes}/gpus:/gpus"], f"--device {nodes}/gpus:/gpus: the host path {nodes}/gpus reaches"),
        (["--device", f"{nodes}/link"], f"the host path {nodes}/link (a link to {nodes}/flat/renamed) reaches"),
        (["-v", f"{nodes}/flat:/data"], f"-v {nodes}/flat:/data: the host path {nodes}/flat reaches"),
        (["--mount", f"type=bind,source={nodes}/link,target=/x"], f"--mount type=bind,source={nodes}/link"),
        (["--env-file", str(env_file)], f"--env-file {env_file}: DOCKER_RESOURCE_GPU: the NVIDIA runtime reads"),
        (["-e", f"DOCKER_RESOURCE_GPU={A800B}"], "-e DOCKER_RESOURCE_GPU: the NVIDIA runtime reads"),
    ):
        r = agent("run", "--rm", "--gpu", "1", *args, TEST_IMAGE)
        errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
        assert r.returncode == 64 and len(errors) == 1 and says in errors[0], r.stderr
    assert agent.containers() == []
    # the folder's tree is the --device's business; a bind mount of a folder that holds no node right in it runs
    r = agent("run", "--rm", "--gpu", "1", "-v", f"{nodes}/gpus:/data", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr


# --- labels belong to the container that set them ----------------------------------------------------------------


def test_labels_inherited_from_a_committed_pinned_container_are_not_the_containers(agent: Agent) -> None:
    pinned = agent("run", "-d", "--share", "--gpu", "1", TEST_IMAGE, "sleep", "300")
    assert pinned.returncode == 0, pinned.stderr
    image = f"committed-{agent.tag}:1"
    agent.sandbox.docker("commit", pinned.stdout.strip(), image, check=True)
    try:
        inherited = json.loads(
            agent.sandbox.docker("image", "inspect", "-f", "{{json .Config.Labels}}", image, check=True).stdout
        )
        assert inherited["gpupin.devices"] == RTX and inherited["gpupin.shared"] == "true"
        assert lease.OWNER_LABEL in inherited  # a hostagent that has since exited: a dead owner, to this host
        agent.sandbox.docker("rm", "-f", pinned.stdout.strip(), check=True)
        # A user's own containers from that image: one created and never started, one running with no GPU.
        created = agent.sandbox.docker("create", "--entrypoint", "sleep", image, "300", check=True).stdout.strip()
        running = agent.sandbox.docker("run", "-d", "--entrypoint", "sleep", image, "300", check=True).stdout.strip()
        r = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
        assert r.returncode == 0 and saw(r.stdout) == [RTX] and "removed" not in r.stderr, r.stderr
        assert {c["ID"] for c in agent.containers()} == {created, running}  # neither an orphan nor a holder
        card = listing(agent)[RTX]
        assert not card["held"] and not [h for h in card["holders"] if h["id"] in (created, running)], card
        # A pinned run from that image without --share does not share, whatever the image says.
        mine = agent("run", "-d", "--gpu", "1", image, "sleep", "300")
        assert mine.returncode == 0, mine.stderr
        assert (
            agent.sandbox.docker(
                "inspect", "-f", '{{index .Config.Labels "gpupin.shared"}}', mine.stdout.strip(), check=True
            ).stdout.strip()
            == "false"
        )
        error = held_error(agent("run", "--rm", "--share", "--gpu", "1", TEST_IMAGE))
        assert f"({mine.stdout.strip()[:12]}, running, gpupin via " in error, error
    finally:
        for cid in agent.sandbox.docker("ps", "-aq", "--filter", f"ancestor={image}").stdout.split():
            agent.sandbox.docker("rm", "-f", cid)
        agent.sandbox.docker("rmi", "-f", image)


# --- leases tell the truth ---------------------------------------------------------------------------------------

HOOK_DELAY_S = 50  # longer than the lease (30 s): the start outlives it by a margin a loaded machine needs


def created_container(agent: Agent, timeout: float = 60) -> tuple[str, float]:
    """The tagged container a run is starting, and its creation time (the daemon's clock: this host's), from the
    list (an inspect waits until the start ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = agent.containers()
        if found:
            when = datetime.datetime.strptime(found[0]["CreatedAt"][:25], "%Y-%m-%d %H:%M:%S %z")
            return found[0]["ID"], when.timestamp()
        time.sleep(0.1)
    raise AssertionError("no container was created")


def test_a_start_longer_than_the_lease_is_never_removed_nor_its_card_doubled(agent: Agent) -> None:
    first = agent.popen(
        "run", "--rm", "--via", "nvidia", "--gpu", "1", "-e", f"FAKEGPU_HOOK_DELAY_S={HOOK_DELAY_S}", TEST_IMAGE
    )
    try:
        cid, created = created_container(agent)
        # Until the lease's own time, counted from the creation, is up (the case the old rule removed) ...
        while time.time() < created + lease.LEASE_S + 2:
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        # ... a second client on this host sees the owner alive: it refuses, and removes nothing.
        second = agent("run", "--rm", "--gpu", "1", TEST_IMAGE)
        in_start = time.time() < created + HOOK_DELAY_S
        assert in_start, "the second run ended after the first's start: nothing was proven (a machine too loaded)"
        assert "being started by hostagent" in held_error(second) and "removed" not in second.stderr
        # One that cannot see the owner (another pid namespace, as a client on another machine) reads its renewal.
        ns = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", *agent.argv("run", "--rm", "--gpu", "1", TEST_IMAGE)],
            env=agent.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert time.time() < created + HOOK_DELAY_S, "the checks ran past the start: nothing was proven"
        assert "being started by hostagent" in held_error(ns) and "removed" not in ns.stderr
        assert [c["ID"] for c in agent.containers()] == [cid]
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0 and saw(out) == [RTX], err
    left = agent.sandbox.docker("volume", "ls", "-q", "--filter", f"label={lease.OF_LABEL}={cid}", check=True)
    assert left.stdout.split() == []  # the renewals went with the start
