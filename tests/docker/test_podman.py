"""Podman as a runtime (docs/podman.md): hostagent against the Docker-compatible socket of the sandboxed podman
service (tests/sandbox/podman.sh, `make podman-up`), whose CDI spec the fake `nvidia-ctk cdi generate` writes. The pin
goes through CDI and the entrypoint proves it inside; holders podman's inspect does not show (a plain `podman run
--device nvidia.com/gpu=N`) are read from their OCI spec; the nvidia driver's request, which podman drops, is refused
before anything is created. The same tests run on podman 4.3 and on podman 5 (`make test-podman PODMAN=5`: the
sandbox's GPUPIN_PODMAN picks which service `podman.sh env` names); what only one of them has is marked so."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import docker
import pytest

from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.processes import error_line, on_cards
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import bus_ids, uuids

PODMAN_SCRIPT = REPO / "tests" / "sandbox" / "podman.sh"
A800, RTX, A800B, A800C = uuids("mixed-4")

pytestmark = pytest.mark.docker


class Podman:
    """The sandboxed podman service: its socket (DOCKER_HOST for hostagent), its podman CLI (--remote), and a tag
    on what the tests create."""

    def __init__(self) -> None:
        out = subprocess.run([str(PODMAN_SCRIPT), "env"], capture_output=True, text=True, check=True, timeout=30).stdout
        info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        self.host = info["DOCKER_HOST"]
        self.run_dir = Path(info["GPUPIN_SANDBOX_RUN"])
        self.cli = info["GPUPIN_SANDBOX_PODMAN"].split()
        self.tag = uuid.uuid4().hex[:12]
        self.env = simhost_env("mixed-4", DOCKER_HOST=self.host)
        self.version = ""  # the service's podman version (the fixture asks it)

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.cli, *args], capture_output=True, text=True, timeout=timeout)

    def hostagent(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [HOSTAGENT, *args]
        if args and args[0] == "run":
            argv = [HOSTAGENT, "run", "--label", f"gpupin.test={self.tag}", *args[1:]]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)

    def tagged(self) -> list[str]:
        out = self.podman("ps", "-aq", "--no-trunc", "--filter", f"label=gpupin.test={self.tag}").stdout
        return out.split()

    def exposed(self, cid: str) -> list[str]:
        """The cards the fake CDI hook exposed to this container (its log in the sandbox's run folder)."""
        found: list[str] = []
        for line in (self.run_dir / "hook.log").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("container_id") == cid and rec.get("command") == "fakegpu-expose":
                found = list(rec.get("exposed") or [])
        return found


def no_podman(why: str) -> NoReturn:
    """`make test-podman` requires the sandboxed podman (GPUPIN_TEST_REQUIRE_PODMAN=1); elsewhere these tests skip
    without it, so that the docker tier does not need podman."""
    if os.environ.get("GPUPIN_TEST_REQUIRE_PODMAN") == "1":
        pytest.fail(f"the sandboxed podman is required here: {why}", pytrace=False)
    pytest.skip(f"no sandboxed podman: {why} (`make podman-up` starts it and builds {TEST_IMAGE} there)")


@pytest.fixture
def pod() -> Iterator[Podman]:
    try:
        p = Podman()
        ping = p.podman("image", "exists", TEST_IMAGE, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        no_podman(str(err))
    if ping.returncode != 0:
        no_podman(f"no {TEST_IMAGE} on the sandboxed podman at {p.host}, or it does not answer")
    p.version = p.podman("version", "--format", "{{.Server.Version}}", timeout=30).stdout.strip()
    yield p
    ids = p.tagged()
    if ids:
        p.podman("rm", "-f", *ids)


@pytest.mark.parametrize(
    "pick",
    [["--uuid", RTX], ["--gpu", "1"], ["--gpu", bus_ids("mixed-4")[1]], ["--count", "1"]],
    ids=["uuid", "index", "bus-id", "count"],
)
def test_run_pins_through_cdi_and_the_entrypoint_proves_it(pod: Podman, pick: list[str]) -> None:
    r = pod.hostagent("run", "-d", *pick, TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    assert pod.podman("wait", cid).stdout.strip() == "0"
    logs = pod.podman("logs", cid)
    out = logs.stdout + logs.stderr
    exposed = pod.exposed(cid)  # the CDI spec's edits gave it the one card picked
    assert len(exposed) == 1 and (pick[0] == "--count" or exposed == [RTX]), exposed
    assert f"cuda:0 = {exposed[0]}" in out and "as expected" in out, out
    env = json.loads(pod.podman("inspect", cid).stdout)[0]["Config"]["Env"]
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for e in env)  # no --gpus request was sent


def test_the_nvidia_drivers_request_is_refused_on_podman_nothing_created(pod: Podman) -> None:
    for args in (["--via", "nvidia"], ["--gpu-capabilities", "compute"]):
        r = pod.hostagent("run", *args, "--gpu", "3", TEST_IMAGE, "true")
        assert r.returncode == 64, r.stderr
        assert r.stderr.startswith("hostagent: ERROR: ") and "podman" in r.stderr and "Traceback" not in r.stderr
    assert pod.tagged() == []


def test_a_held_card_is_refused_75(pod: Podman) -> None:
    first = pod.hostagent("run", "-d", "--gpu", "3", TEST_IMAGE, "sleep", "120")
    assert first.returncode == 0, first.stderr
    second = pod.hostagent("run", "--gpu", "3", TEST_IMAGE, "true")
    assert second.returncode == 75, second.stderr
    assert "held by" in second.stderr
    assert len(pod.tagged()) == 1


@pytest.mark.parametrize(
    ("form", "how"),
    [
        (["--device", "nvidia.com/gpu=1"], "a card node in podman's OCI spec"),
        (["--annotation", "cdi.k8s.io/job=nvidia.com/gpu=1"], "--annotation cdi.k8s.io/job=nvidia.com/gpu=1"),
        (["--gpus", "1"], "a card node in podman's OCI spec"),
        ([], "a card node in podman's OCI spec"),
    ],
    ids=["cdi-device", "cdi-annotation", "gpus", "compat-cdi-request"],
)
def test_a_plain_podman_holder_is_named_by_ls_and_blocks_run(pod: Podman, form: list[str], how: str) -> None:
    # podman's inspect shows none of them: the ledger reads them from the OCI spec podman wrote. Podman 5's CLI
    # maps --gpus onto CDI (nvidia.com/gpu=1: the same nodes), and its compatible API honours a CDI device request
    # (what Docker CLI 28 sends for `docker run --device nvidia.com/gpu=1`); podman 4.3 has no --gpus and drops
    # the request (its container holds no card).
    if form[:1] in (["--gpus"], []) and pod.version.startswith("4."):
        pytest.skip(f"podman {pod.version} has no --gpus and drops a CDI device request")
    name = f"plain-{pod.tag}"
    if form:
        started = pod.podman(
            "run", "-d", "--name", name, "--label", f"gpupin.test={pod.tag}", *form, "gpupin-base:bookworm", "sleep",
            "120",
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
    else:
        api = docker.APIClient(base_url=pod.host, version="1.41", timeout=60)
        request = docker.types.DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=1"])
        made = api.create_container(
            "gpupin-base:bookworm", ["sleep", "120"], name=name, labels={"gpupin.test": pod.tag},
            host_config=api.create_host_config(device_requests=[request]),
        )  # fmt: skip
        api.start(made["Id"])
    ls = pod.hostagent("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    card = next(g for g in json.loads(ls.stdout)["gpus"] if g["uuid"] == RTX)
    assert card["held"] and [(h["name"], h["how"]) for h in card["holders"]] == [(name, how)], card["holders"]
    r = pod.hostagent("run", "--gpu", "1", TEST_IMAGE, "true")
    assert r.returncode == 75 and name in r.stderr, r.stderr
    assert pod.tagged() == [pod.podman("inspect", "--format", "{{.Id}}", name).stdout.strip()]


@pytest.mark.skipif(os.geteuid() != 0, reason="nsenter into the service's mount namespace needs root")
def test_doctor_finds_the_cdi_spec_podman_reads_and_says_no_cdi_trap(pod: Podman) -> None:
    # The service's mount namespace is the host it serves: its /etc/cdi holds the spec.
    r = subprocess.run(
        [str(PODMAN_SCRIPT), "exec", HOSTAGENT, "doctor", "--json"],
        env={**os.environ, **pod.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = json.loads(r.stdout)["findings"]
    assert not [f for f in findings if "CDI" in f["problem"]], findings


def test_a_podman_holder_refuses_dockers_run_on_its_card_through_nvml(
    pod: Podman, agent: Agent, tmp_path: Path
) -> None:
    # Across runtimes the daemons share nothing but the cards: the podman container's process on card 1 (as NVML
    # reports it) is what makes Docker's run refuse the card.
    name = f"across-{pod.tag}"
    started = pod.podman(
        "run", "-d", "--name", name, "--label", f"gpupin.test={pod.tag}", "--device", "nvidia.com/gpu=1",
        "gpupin-base:bookworm", "sleep", "120",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    pid = int(pod.podman("inspect", "--format", "{{.State.Pid}}", name).stdout)
    env = on_cards(tmp_path / "p.json", {RTX: [pid]})
    r = subprocess.run(
        agent.argv("run", "--rm", "--gpu", "1", TEST_IMAGE, "true"),
        env={**agent.env, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = error_line(r, 75)
    assert f"{RTX} is in use by pid {pid}" in line, line
    assert agent.containers() == []  # nothing created on Docker


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another uid needs root")
def test_another_local_user_gets_nothing_from_the_rootful_service(pod: Podman) -> None:
    # The rootful service is root's: its socket (the chrooted podman 5's too, bound into the run folder) refuses
    # another uid, so nobody creates a container that holds a card behind the ledger's back.
    r = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "HOME=/tmp", *pod.cli, "ps"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "permission denied" in r.stderr, (r.returncode, r.stderr)
