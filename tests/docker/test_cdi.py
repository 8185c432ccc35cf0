"""CDI on the sandboxes: what each engine does with it. Engines 26 and 28.5 (CDI on, the fake `nvidia-ctk cdi
generate` spec; 28.5 lists its devices in `docker info`) are pinned through CDI and their CDI holders block their
cards; Docker 20.10 (no CDI) keeps the nvidia driver, and refuses a forced CDI pin as `docker run` would, leaving
nothing behind. How hostagent finds what a daemon serves,
and the pin itself: tests/unit/test_cdi.py."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpupin.hostagent import engine
from gpupin.hostagent.engine import address
from gpupin.hostagent.ledger import lease
from tests.support.host import FAKEGPU, saw
from tests.support.sandbox import PODMAN, TEST_IMAGE, Agent, Sandbox, serves_cdi
from tests.support.scenarios import scenario, uuids

# Every engine runs these (CDI is the engine's own device path): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine

A800, RTX, A800B, A800C = uuids("mixed-4")
NAMES = ["0", A800, "1", RTX, "2", A800B, "3", A800C, "all"]


# --- on the sandboxes --------------------------------------------------------------------------------------------


def test_each_engine_says_whether_it_serves_the_cards_by_cdi(
    mixed4_sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(address, "_ENDPOINT", engine.Endpoint(mixed4_sandbox.host, None, "DOCKER_HOST"))
    api = engine.connect(timeout=30)
    d = engine.daemon_view(api)[1]  # what run, serve and compose ask
    if mixed4_sandbox.engine == PODMAN:  # its API predates CDI, yet it resolves the names itself
        assert d.served and d.names is None and "podman resolves" in d.why
    elif mixed4_sandbox.engine == "28.5":  # CDI on by default, and the daemon lists what it found: no file read
        assert d.served and d.names == frozenset(NAMES) and f"discovered {len(NAMES)} nvidia.com/gpu" in d.why
    elif serves_cdi(mixed4_sandbox):
        spec = mixed4_sandbox.run_dir / "cdi" / "nvidia.yaml"
        assert d.served and d.names is not None and set(NAMES) <= d.names and str(spec) in d.why
    else:  # its API predates CDI: /info is not asked; were it asked, it would say CDI is off
        assert not d.served and "predates CDI" in d.why
        assert "CDI off" in engine.cdi_detection(engine.info(api)).why


def inspect(sandbox: Sandbox, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(sandbox.docker("inspect", cid, check=True).stdout)[0]
    return data


def test_run_pins_through_what_the_daemon_serves_and_the_entrypoint_proves_it(agent: Agent) -> None:
    r = agent(
        "run",
        "--rm",
        "--name",
        f"cdi-{agent.tag}",
        "--uuid",
        RTX,
        TEST_IMAGE,
        "sh",
        "-c",
        'echo "NVD=$NVIDIA_VISIBLE_DEVICES"; python3 -m gpupin.entrypoint',
    )
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    assert f"cuda:0  {RTX}  00000000:3B:00.0  NVIDIA GeForce RTX 4090  (local rank 0)" in r.stderr
    assert "expectation from GPUPIN_EXPECT" in r.stderr
    # CDI's spec sets the variable to void; the nvidia driver's pin sets it to the card
    assert r.stdout.splitlines()[0] == ("NVD=void" if serves_cdi(agent.sandbox) else f"NVD={RTX}")


@pytest.mark.needs("gpus")
def test_via_overrides_what_the_daemon_serves(agent: Agent) -> None:
    r = agent("run", "-d", "--via", "nvidia", "--gpu", "1", TEST_IMAGE, "sleep", "30")
    assert r.returncode == 0, r.stderr
    requests = inspect(agent.sandbox, r.stdout.strip())["HostConfig"]["DeviceRequests"]
    assert [(q["Driver"], q["DeviceIDs"]) for q in requests] == [("nvidia", [RTX])]
    forced = agent("run", "--rm", "--via", "cdi", "--gpu", "3", TEST_IMAGE)
    if serves_cdi(agent.sandbox):
        assert forced.returncode == 0 and saw(forced.stdout) == [A800C], forced.stderr
    else:  # as `docker run --device nvidia.com/gpu=...` would: refused, and the container removed
        errors = [ln for ln in forced.stderr.splitlines() if "ERROR:" in ln]
        assert forced.returncode == 125 and len(errors) == 1 and 'device driver "cdi"' in errors[0], forced.stderr
        assert "HINT: the daemon does not serve nvidia.com/gpu by this name" in errors[0]
        assert len(agent.containers()) == 1  # the first one only


@pytest.mark.needs("cdi-inspect")
def test_a_container_holding_a_card_by_cdi_index_makes_run_answer_75(agent_cdi: Agent) -> None:
    a = agent_cdi
    cid = a.sandbox.docker(
        "run",
        "-d",
        "--name",
        f"cdi-holder-{a.tag}",
        "--label",
        f"gpupin.test={a.tag}",
        "--device",
        "nvidia.com/gpu=1",
        "--entrypoint",
        "sleep",
        TEST_IMAGE,
        "300",
        check=True,
    ).stdout.strip()
    r = a("run", "--rm", "--gpu", RTX, TEST_IMAGE)
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 75 and len(errors) == 1, r.stderr
    assert f"{RTX} is held by cdi-holder-{a.tag} ({cid[:12]}, running, --device nvidia.com/gpu=1)" in errors[0]
    listing = json.loads(a("ls", "--json").stdout)
    (holder,) = next(g for g in listing["gpus"] if g["uuid"] == RTX)["holders"]
    assert (holder["how"], holder["via"], holder["grants"][0]["form"]) == ("--device nvidia.com/gpu=1", "CDI", "cdi")


@pytest.mark.needs("cdi-inspect")
def test_privileged_with_a_cdi_gpu_holds_every_card(agent_cdi: Agent) -> None:
    a = agent_cdi
    mine = {**lease.claim(), "gpupin.test": a.tag}  # held while "being started": no privileged run needed
    a.sandbox.docker(
        "create",
        "--privileged",
        "--device",
        "nvidia.com/gpu=1",
        *(f"--label={k}={v}" for k, v in mine.items()),
        "--entrypoint",
        "sleep",
        TEST_IMAGE,
        "300",
        check=True,
    )
    r = a("run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 75 and "0 of 4 card(s) are free" in r.stderr, r.stderr


@pytest.fixture
def index_only_spec(agent_cdi: Agent) -> Iterator[Agent]:
    """The sandbox's spec regenerated with the `index` name strategy alone (nvidia-ctk's default before 1.14),
    then put back."""
    spec = agent_cdi.sandbox.run_dir / "cdi" / "nvidia.yaml"
    kept = spec.read_bytes()
    env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario("mixed-4")))
    tmp = spec.with_name(f".{uuid.uuid4().hex}.tmp")
    subprocess.run(
        [
            str(FAKEGPU / "bin" / "nvidia-ctk"),
            "cdi",
            "generate",
            "--device-name-strategy",
            "index",
            "--output",
            str(tmp),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    os.replace(tmp, spec)
    try:
        yield agent_cdi
    finally:
        tmp.write_bytes(kept)
        os.replace(tmp, spec)


@pytest.mark.needs("gpus")
def test_a_spec_that_names_no_uuid_is_no_pin_so_the_nvidia_driver_pins(index_only_spec: Agent) -> None:
    a = index_only_spec
    r = a("run", "--dry-run", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and r.stdout.startswith(f"docker run --gpus '\"device={RTX}\"'"), r
    r = a("run", "--rm", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    forced = a("run", "--rm", "--via", "cdi", "--gpu", "1", TEST_IMAGE)  # the daemon cannot resolve the name
    errors = [ln for ln in forced.stderr.splitlines() if "ERROR:" in ln]
    assert forced.returncode == 125 and len(errors) == 1 and "nvidia-ctk cdi list" in errors[0], forced.stderr
    assert a.containers() == []


def test_a_plain_cdi_container_runs_unpinned_and_says_why(agent_cdi: Agent) -> None:
    sb = agent_cdi.sandbox
    r = sb.docker("run", "--rm", "--device", "nvidia.com/gpu=1", TEST_IMAGE)
    assert r.returncode == 0, r
    assert (
        "no expectation (NVIDIA_VISIBLE_DEVICES=void: the cards came through CDI, which names none inside "
        "the container;"
        in r.stderr
        and "running unpinned" in r.stderr
    )
    r = sb.docker(
        "run",
        "--rm",
        "--device",
        "nvidia.com/gpu=1",
        "-e",
        "GPUPIN_REQUIRE=1",
        TEST_IMAGE,
        "sh",
        "-c",
        "echo WORKLOAD-STARTED",
    )
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 78 and "WORKLOAD-STARTED" not in r.stdout and len(errors) == 1, r
    assert "NVIDIA_VISIBLE_DEVICES=void" in errors[0] and "expectation is required" in errors[0]
    r = sb.docker("run", "--rm", "--device", "nvidia.com/gpu=1", "-e", f"GPUPIN_EXPECT={RTX}", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r
