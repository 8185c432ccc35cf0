"""Podman as a runtime (docs/podman.md), podman's own tests: hostagent against the Docker-compatible socket of the
sandboxed podman service (tests/sandbox/podman.sh: 4.3, or 5 with `PODMAN=5`), whose CDI spec the fake `nvidia-ctk
cdi generate` writes. The pin goes through CDI and the entrypoint proves it inside; holders podman's inspect does
not show (a plain `podman run --device nvidia.com/gpu=N`) are read from their OCI spec; the nvidia driver's request,
which podman drops, is refused before anything is created; the resident agent does the same against podman. They
run where podman is under test (`make test-podman`, with the docker tier's `per_engine` tests on podman:
docs/testing.md, The engines); what only one podman version has is marked so."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import docker
import pytest

from tests.support.engines import sharing_engines
from tests.support.host import HOSTAGENT, simhost_env
from tests.support.processes import error_line, on_cards
from tests.support.resident import Resident
from tests.support.sandbox import (
    ENGINES,
    PODMAN,
    PODMAN_SCRIPT,
    TEST_IMAGE,
    Agent,
    Sandboxes,
    agent_on,
    engines_under_test,
)
from tests.support.scenarios import bus_ids, uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")
BASE = "gpupin-base:bookworm"

pytestmark = [pytest.mark.docker, pytest.mark.podman]


def no_podman(why: str) -> NoReturn:
    """Where podman is under test (GPUPIN_TEST_REQUIRE_PODMAN=1) a missing podman fails; elsewhere the tests that
    bring up a podman of their own (tests/docker/test_rootless.py) skip without it."""
    if os.environ.get("GPUPIN_TEST_REQUIRE_PODMAN") == "1":
        pytest.fail(f"podman is required here: {why}", pytrace=False)
    pytest.skip(f"no podman: {why}")


def version(pod: Agent) -> str:
    return pod.sandbox.podman("version", "--format", "{{.Server.Version}}", timeout=30).stdout.strip()


@pytest.fixture
def pod(sandboxes: Sandboxes) -> Iterator[Agent]:
    """hostagent on the simulated host against the sandboxed podman service (mixed-4)."""
    yield from agent_on(sandboxes.get(PODMAN))


@pytest.fixture
def resident(pod: Agent) -> Iterator[Resident]:
    r = Resident(pod.env)
    yield r
    r.close()


def tagged(pod: Agent) -> list[str]:
    return [c["ID"] for c in pod.containers()]


def plain_holder(pod: Agent, *form: str) -> str:
    """A container podman's own CLI starts with this form of a card (no hostagent): its name."""
    name = f"plain-{pod.tag}"
    started = pod.sandbox.podman(
        "run", "-d", "--name", name, "--label", f"gpupin.test={pod.tag}", *form, BASE, "sleep", "120"
    )
    assert started.returncode == 0, started.stderr
    return name


@pytest.mark.parametrize(
    "pick",
    [["--uuid", RTX], ["--gpu", "1"], ["--gpu", bus_ids("mixed-4")[1]], ["--count", "1"]],
    ids=["uuid", "index", "bus-id", "count"],
)
def test_run_pins_through_cdi_and_the_entrypoint_proves_it(pod: Agent, pick: list[str]) -> None:
    r = pod("run", "-d", *pick, TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    assert pod.sandbox.podman("wait", cid).stdout.strip() == "0"
    logs = pod.sandbox.podman("logs", cid)
    out = logs.stdout + logs.stderr
    exposed = pod.sandbox.exposed(cid)  # the CDI spec's edits gave it the one card picked
    assert len(exposed) == 1 and (pick[0] == "--count" or exposed == [RTX]), exposed
    assert f"cuda:0 = {exposed[0]}" in out and "as expected" in out, out
    env = json.loads(pod.sandbox.podman("inspect", cid).stdout)[0]["Config"]["Env"]
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=GPU-") for e in env)  # no --gpus request was sent


def test_the_exit_code_of_a_removed_container_is_the_workloads(pod: Agent) -> None:
    # Podman's compatible wait for "removed" answers 0 whatever the exit: a --rm run must still end with the
    # workload's code, and the container must be gone when it returns.
    r = pod("run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "sh", "-c", "echo out; exit 7")
    assert (r.returncode, r.stdout) == (7, "out\n"), r.stderr
    assert tagged(pod) == []


def test_the_nvidia_drivers_request_is_refused_on_podman_nothing_created(pod: Agent) -> None:
    for args in (["--via", "nvidia"], ["--gpu-capabilities", "compute"]):
        r = pod("run", *args, "--gpu", "3", TEST_IMAGE, "true")
        assert r.returncode == 64, r.stderr
        assert r.stderr.startswith("hostagent: ERROR: ") and "podman" in r.stderr and "Traceback" not in r.stderr
    assert tagged(pod) == []


def test_a_held_card_is_refused_75(pod: Agent) -> None:
    first = pod("run", "-d", "--gpu", "3", TEST_IMAGE, "sleep", "120")
    assert first.returncode == 0, first.stderr
    second = pod("run", "--gpu", "3", TEST_IMAGE, "true")
    assert second.returncode == 75, second.stderr
    assert "held by" in second.stderr
    assert len(tagged(pod)) == 1


def test_a_card_podmans_spec_does_not_name_is_125_with_podmans_hint(pod: Agent) -> None:
    # A spec older than the cards (dgx-8's UUIDs, none in the sandbox's mixed-4 spec): podman cannot resolve the name.
    r = subprocess.run(
        pod.argv("run", "--rm", "--gpu", "0", TEST_IMAGE, "true"),
        env=simhost_env("dgx-8", DOCKER_HOST=pod.sandbox.host),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = error_line(r, 125)
    assert "unresolvable CDI devices" in line and "/etc/cdi" in line and "--via nvidia" not in line, line
    assert tagged(pod) == []


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
def test_a_plain_podman_holder_is_named_by_ls_and_blocks_run(pod: Agent, form: list[str], how: str) -> None:
    # podman's inspect shows none of them: the ledger reads them from the OCI spec podman wrote. Podman 5's CLI
    # maps --gpus onto CDI (nvidia.com/gpu=1: the same nodes), and its compatible API honours a CDI device request
    # (what Docker CLI 28 sends for `docker run --device nvidia.com/gpu=1`); podman 4.3 has no --gpus and drops
    # the request (its container holds no card).
    running = version(pod)
    if form[:1] in (["--gpus"], []) and running.startswith("4."):
        pytest.skip(f"podman {running} has no --gpus and drops a CDI device request")
    if form:
        name = plain_holder(pod, *form)
    else:
        name = f"plain-{pod.tag}"
        api = docker.APIClient(base_url=pod.sandbox.host, version="1.41", timeout=60)
        request = docker.types.DeviceRequest(driver="cdi", device_ids=["nvidia.com/gpu=1"])
        made = api.create_container(
            BASE, ["sleep", "120"], name=name, labels={"gpupin.test": pod.tag},
            host_config=api.create_host_config(device_requests=[request]),
        )  # fmt: skip
        api.start(made["Id"])
    ls = pod("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    card = next(g for g in json.loads(ls.stdout)["gpus"] if g["uuid"] == RTX)
    assert card["held"] and [(h["name"], h["how"]) for h in card["holders"]] == [(name, how)], card["holders"]
    r = pod("run", "--gpu", "1", TEST_IMAGE, "true")
    assert r.returncode == 75 and name in r.stderr, r.stderr
    assert tagged(pod) == [pod.sandbox.podman("inspect", "--format", "{{.Id}}", name).stdout.strip()]


@pytest.mark.skipif(os.geteuid() != 0, reason="nsenter into the service's mount namespace needs root")
def test_doctor_finds_the_cdi_spec_podman_reads_and_says_no_cdi_trap(pod: Agent) -> None:
    # The service's mount namespace is the host it serves: its /etc/cdi holds the spec.
    r = subprocess.run(
        [str(PODMAN_SCRIPT), "exec", HOSTAGENT, "doctor", "--json"],
        env={**os.environ, **pod.env},  # GPUPIN_SANDBOX_NAME for podman.sh, the simulated host for doctor
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = json.loads(r.stdout)["findings"]
    assert not [f for f in findings if "CDI" in f["problem"]], findings


def test_a_podman_holder_refuses_dockers_run_on_its_card_through_nvml(
    pod: Agent, sandboxes: Sandboxes, tmp_path: Path
) -> None:
    # Across runtimes the daemons share nothing but the cards: the podman container's process on card 1 (as NVML
    # reports it) is what makes Docker's run refuse the card (the first Docker engine's sandbox).
    if ENGINES[0] in sharing_engines() and ENGINES[0] not in engines_under_test():
        # That sandbox is another run's, side by side (make test): its tests restart it with other topologies and
        # hold its cards, so using it from here races them. `make test-podman` runs this test alone.
        pytest.skip(f"the {ENGINES[0]} sandbox belongs to the run beside this one")
    name = plain_holder(pod, "--device", "nvidia.com/gpu=1")
    pid = int(pod.sandbox.podman("inspect", "--format", "{{.State.Pid}}", name).stdout)
    env = on_cards(tmp_path / "p.json", {RTX: [pid]})
    for dock in agent_on(sandboxes.get(ENGINES[0])):
        r = subprocess.run(
            dock.argv("run", "--rm", "--gpu", "1", TEST_IMAGE, "true"),
            env={**dock.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        line = error_line(r, 75)
        assert f"{RTX} is in use by pid {pid}" in line, line
        assert dock.containers() == []  # nothing created on Docker


# --- the resident agent (`hostagent serve`) against podman ---------------------------------------------------------


def through(pod: Agent, r: Resident, trace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """hostagent ARGS through the resident agent, its trace in `trace`."""
    env = {**pod.env, "GPUPIN_AGENT_SOCKET": r.socket, "GPUPIN_TRACE": str(trace)}
    return subprocess.run(pod.argv(*args), env=env, capture_output=True, text=True, timeout=120)


def test_a_run_through_the_agent_pins_and_proves_on_podman(pod: Agent, resident: Resident, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    r = through(pod, resident, trace, "run", "-d", "--gpu", "3", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    marks = [line.split()[0] for line in trace.read_text().splitlines()]
    assert "created" in marks and "cards" not in marks  # the agent created it; the client read no NVML
    cid = r.stdout.strip()
    assert pod.sandbox.podman("wait", cid).stdout.strip() == "0"
    logs = pod.sandbox.podman("logs", cid)
    assert f"cuda:0 = {A800C}" in logs.stdout + logs.stderr and pod.sandbox.exposed(cid) == [A800C]
    # In the foreground, through the agent: the streams and the exit code of a removed container.
    fg = through(
        pod, resident, trace, "run", "--rm", "--gpu", "3", TEST_IMAGE, "--quiet", "sh", "-c", "echo out; exit 5"
    )
    assert (fg.returncode, fg.stdout) == (5, "out\n"), fg.stderr


def test_the_agents_view_names_a_plain_podman_holder_and_its_run_refuses_75(
    pod: Agent, resident: Resident, tmp_path: Path
) -> None:
    name = plain_holder(pod, "--device", "nvidia.com/gpu=1")
    # The view follows podman's events, which podman writes to its events file first: a moment later than Docker's.
    wait_for(lambda: resident.card(RTX)["held"], 20, "the agent's view to show the podman holder")
    card = resident.card(RTX)
    assert [(h["name"], h["how"]) for h in card["holders"]] == [(name, "a card node in podman's OCI spec")], card
    r = through(pod, resident, tmp_path / "trace", "run", "--rm", "--gpu", "1", TEST_IMAGE, "true")
    line = error_line(r, 75)
    assert name in line, line
    assert len(tagged(pod)) == 1  # the holder alone: the agent created nothing


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv to another uid needs root")
def test_another_local_user_gets_nothing_from_the_rootful_service(pod: Agent) -> None:
    # The rootful service is root's: its socket (the chrooted podman 5's too, bound into the run folder) refuses
    # another uid, so nobody creates a container that holds a card behind the ledger's back.
    r = subprocess.run(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "env",
            "HOME=/tmp",
            *pod.sandbox.podman_cli,
            "ps",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "permission denied" in r.stderr, (r.returncode, r.stderr)
