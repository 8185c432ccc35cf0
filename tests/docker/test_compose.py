"""`hostagent compose render|check` on the sandboxed daemons: the rendered examples started by each engine's compose
(docker-compose 1.29 beside Engine 20.10, `docker compose` v2 beside Engine 26), each service proving its card,
and check and render seeing what running pinned containers hold. Loading, the rules, placement and the CLI
without a daemon: tests/unit/test_compose.py."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpupin.hostagent.compose import load
from tests.support.compose import CDI_DEPLOY, devices
from tests.support.host import REPO, hostagent, required
from tests.support.sandbox import TEST_IMAGE, Sandbox, serves_cdi
from tests.support.scenarios import uuids

# Every engine runs these (each engine brings its own compose (1.29, v2) and its model): docs/testing.md, The engines.
pytestmark = [pytest.mark.per_engine, pytest.mark.needs("compose")]

A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86 (busy), AF
EXAMPLES = REPO / "compose"


# --- on the sandbox: docker-compose runs the rendered files ---------------------------------------------------

_project_ids = itertools.count()


class ComposeRun:
    """One compose project on the sandbox, under a name of its own; `down` removes what it created.

    Every service runs with `network_mode: none` (an override file beside the one under test, which stays as
    rendered): otherwise compose creates a bridge network, and with it an interface and addresses in the host's
    network namespace, which tests never do."""

    def __init__(self, sandbox: Sandbox, file: Path) -> None:
        if not os.path.exists(sandbox.compose_cli[0]):
            if required():
                pytest.fail(f"{sandbox.compose_cli[0]} is missing (`make sandbox-up` installs it)", pytrace=False)
            pytest.skip(f"{sandbox.compose_cli[0]} is missing")
        self.sandbox = sandbox
        self.file = file
        self.project = f"gpupintest{os.getpid()}x{next(_project_ids)}"
        services = yaml.safe_load(file.read_text()).get("services") or {}
        self.no_network = file.with_name(file.stem + ".no-network.yml")
        self.no_network.write_text(yaml.safe_dump({"services": {name: {"network_mode": "none"} for name in services}}))

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.sandbox.compose(
            "-p", self.project, "-f", str(self.file), "-f", str(self.no_network), *args, timeout=timeout
        )

    def up(self) -> None:
        r = self.compose("up", "--no-color")  # attached: returns when every service has exited
        assert r.returncode == 0, r.stdout + r.stderr

    def logs(self, service: str) -> tuple[int, str, str]:
        """The service's exit code, stdout (the workload) and stderr (the entrypoint's mapping)."""
        # `-a`: compose v2 lists only running containers without it (1.x lists stopped ones too)
        cid = self.compose("ps", "-a", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        logs = self.sandbox.docker("logs", cid)
        code = self.sandbox.docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip()
        return int(code), logs.stdout, logs.stderr

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans")


def rendered_file(src: Path, tmp_path: Path, docker_host: str) -> Path:
    out = tmp_path / src.name.replace(".yml", ".pinned.yml")
    r = hostagent("compose", "render", str(src), "-o", str(out), DOCKER_HOST=docker_host)
    assert r.returncode == 0, r
    return out


def rendered(example: str, tmp_path: Path, docker_host: str) -> Path:
    return rendered_file(EXAMPLES / example, tmp_path, docker_host)


@pytest.mark.parametrize(
    ("example", "want"),
    [
        (
            "two-services.yml",
            {
                "trainer": [(RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090")],
                "evaluator": [(A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB")],
            },
        ),
        (
            "two-cards-one-service.yml",
            {
                "trainer": [
                    (A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB"),
                    (RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090"),
                ]
            },
        ),
    ],
)
def test_rendered_examples_start_and_each_service_proves_its_cards(
    mixed4_sandbox: Sandbox, tmp_path: Path, example: str, want: dict[str, list[tuple[str, str, str]]]
) -> None:
    file = rendered(example, tmp_path, mixed4_sandbox.host)
    way = "cdi" if serves_cdi(mixed4_sandbox) else "nvidia"  # what each engine's daemon serves
    assert all(devices(s)[0]["driver"] == way for s in load.parse(file.read_text())["services"].values())
    run = ComposeRun(mixed4_sandbox, file)
    try:
        run.up()
        for svc, cards in want.items():
            code, out, err = run.logs(svc)
            assert code == 0, (svc, out, err)
            assert out.splitlines() == [
                f"cuda:{k} = {u} at {bus} ({name}), as expected" for k, (u, bus, name) in enumerate(cards)
            ], (svc, out, err)
            for k, (u, bus, name) in enumerate(cards):
                assert f"cuda:{k}  {u}  {bus}  {name}  (local rank {k})" in err, (svc, err)
            assert "expectation from GPUPIN_EXPECT" in err
    finally:
        run.down()


def test_the_wrong_way_puts_both_services_on_one_card_and_check_refuses_it(
    mixed4_sandbox: Sandbox, tmp_path: Path
) -> None:
    run = ComposeRun(mixed4_sandbox, EXAMPLES / "wrong-way-count.yml")
    try:
        run.up()
        seen = {}
        for svc in ("trainer", "evaluator"):
            code, out, err = run.logs(svc)
            assert code == 0, (svc, out, err)
            mapping = [ln for ln in err.splitlines() if "cuda:0  " in ln]
            assert len(mapping) == 1, err
            seen[svc] = mapping[0].split()[2]
    finally:
        run.down()
    assert seen == {"trainer": A800, "evaluator": A800}  # both on GPU 0: the problem is real
    r = hostagent("compose", "check", str(EXAMPLES / "wrong-way-count.yml"), DOCKER_HOST=mixed4_sandbox.host)
    assert r.returncode == 64, r
    errors = [ln for ln in r.stdout.splitlines() if "warning:" not in ln]
    assert len(errors) == 1 and "service evaluator" in errors[0] and "also given to service trainer" in errors[0]


@pytest.mark.parametrize(
    ("text", "v1_accepts"),
    [
        ("services:\n  a:\n    image: i\n    image: j\n", True),  # docker-compose 1.x keeps the last one
        ("x-a: &a {image: i}\nx-b: &b {command: c}\nservices:\n  s:\n    <<: *a\n    <<: *b\n", True),
        ("services:\n  123:\n    image: i\n", False),
        ("services:\n  'a b':\n    image: i\n", False),
    ],
    ids=["duplicate-key", "duplicate-merge-key", "unquoted-number-name", "name-with-a-space"],
)
def test_files_compose_refuses_are_refused_and_duplicate_keys_as_compose_v2_does(
    mixed4_sandbox: Sandbox, tmp_path: Path, text: str, v1_accepts: bool
) -> None:
    """Measured against each engine's own compose: what hostagent refuses, compose v2 refuses too; docker-compose
    1.29 takes duplicate keys silently (the last one wins), which is why hostagent follows v2 there."""
    src = tmp_path / "f.yml"
    src.write_text(text)
    assert hostagent("compose", "check", str(src), DOCKER_HOST=mixed4_sandbox.host).returncode == 64
    r = mixed4_sandbox.compose("-f", str(src), "config")
    accepted = v1_accepts and mixed4_sandbox.engine == "20.10"
    assert (r.returncode == 0) is accepted, r


V2_FORMS = {
    "gpus": "    gpus: [{device_ids: ['3', '1']}]",
    "devices-cdi": f"    devices: ['nvidia.com/gpu=3', 'nvidia.com/gpu={RTX}']",
    "driver-cdi": CDI_DEPLOY % "'nvidia.com/gpu=gpu3', 'nvidia.com/gpu=1'",
}


@pytest.mark.parametrize("form", list(V2_FORMS))
def test_compose_v2_gpu_forms_render_to_files_each_engines_compose_runs(
    mixed4_sandbox: Sandbox, tmp_path: Path, form: str
) -> None:
    src = tmp_path / "v2.yml"
    src.write_text(f"services:\n  trainer:\n    image: {TEST_IMAGE}\n{V2_FORMS[form]}\n")
    r = hostagent("compose", "check", str(src), DOCKER_HOST=mixed4_sandbox.host)
    # Read, never "0 service(s) with GPUs": the index `3` is flagged as the card it names today, which render pins.
    assert r.returncode == 64 and f" 3 is an NVML index: today it is {A800C} (index 3" in r.stdout, r
    run = ComposeRun(mixed4_sandbox, rendered_file(src, tmp_path, mixed4_sandbox.host))
    try:
        run.up()
        code, out, err = run.logs("trainer")
        assert code == 0 and out.splitlines() == [
            f"cuda:0 = {A800C} at 00000000:AF:00.0 (NVIDIA A800-SXM4-80GB), as expected",
            f"cuda:1 = {RTX} at 00000000:3B:00.0 (NVIDIA GeForce RTX 4090), as expected",
        ], (out, err)
        assert "expectation from GPUPIN_EXPECT" in err
    finally:
        run.down()


def test_what_each_compose_does_with_the_compose_v2_forms_as_written(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    """Measured, as the warnings of `check` say: compose v2.26 starts a `gpus:` service with no GPU at all and
    docker-compose 1.29 refuses the file; both pass a CDI name in `devices:` to the daemon as a device file. Compose
    v2.40 (beside Engine 28.5) reads both: `gpus:` is the `--gpus` request, `devices:` CDI names the CDI driver's."""
    sb = mixed4_sandbox
    src = tmp_path / "gpus.yml"
    src.write_text(f"services:\n  trainer:\n    image: {TEST_IMAGE}\n{V2_FORMS['gpus']}\n")
    if sb.engine == "20.10":
        r = sb.compose("-f", str(src), "config")
        assert r.returncode != 0 and "Unsupported config option for services.trainer: 'gpus'" in r.stderr, r
    else:
        run = ComposeRun(sb, src)
        try:
            run.compose("up", "--no-color")
            cid = run.compose("ps", "-a", "-q", "trainer").stdout.strip()
            requests = json.loads(sb.docker("inspect", cid, check=True).stdout)[0]["HostConfig"]["DeviceRequests"]
            if sb.engine == "28.5":
                assert [(r["Driver"], r["DeviceIDs"], r["Capabilities"]) for r in requests] == [
                    ("", ["3", "1"], [["gpu"]])
                ]
            else:
                assert not requests  # the request was dropped: no GPU
        finally:
            run.down()
    src.write_text(f"services:\n  trainer:\n    image: {TEST_IMAGE}\n{V2_FORMS['devices-cdi']}\n")
    run = ComposeRun(sb, src)
    try:
        r = run.compose("up", "--no-color")
        if sb.engine == "28.5":
            cid = run.compose("ps", "-a", "-q", "trainer").stdout.strip()
            host_config = json.loads(sb.docker("inspect", cid, check=True).stdout)[0]["HostConfig"]
            assert r.returncode == 0 and not host_config["Devices"], r
            assert [(q["Driver"], q["DeviceIDs"]) for q in host_config["DeviceRequests"]] == [
                ("cdi", ["nvidia.com/gpu=3", f"nvidia.com/gpu={RTX}"])
            ]
        else:
            assert r.returncode != 0 and "error gathering device information while adding custom device" in (
                r.stdout + r.stderr
            ), r
    finally:
        run.down()


def test_render_and_check_see_the_cards_running_pinned_containers_hold(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    sb = mixed4_sandbox
    name = f"gpupintest-holder-{os.getpid()}"
    started = sb.docker(
        "run",
        "-d",
        "--name",
        name,
        "--label",
        f"gpupin.devices={RTX}",
        "--gpus",
        f"device={RTX}",
        TEST_IMAGE,
        "sleep",
        "60",
    )
    assert started.returncode == 0, started
    try:
        src = EXAMPLES / "two-services.yml"
        r = hostagent("compose", "render", str(src), "-o", str(tmp_path / "out.yml"), DOCKER_HOST=sb.host)
        assert r.returncode == 75, r
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"hostagent: ERROR: {src}: service trainer: {RTX}") and name in line
        assert not (tmp_path / "out.yml").exists()
        r = hostagent("compose", "check", str(src), DOCKER_HOST=sb.host)
        assert r.returncode == 64 and f"held by running container {name}" in r.stdout, r
        counted = tmp_path / "count.yml"
        # Card 2 runs mixed-4's pid 4242, whose owner /proc does not show: busy, so three cards are not left.
        counted.write_text("services:\n  a:\n    image: i\n    x-gpupin: {count: 3}\n")
        r = hostagent("compose", "render", str(counted), DOCKER_HOST=sb.host)
        assert r.returncode == 75 and f"{A800B} by pid 4242" in r.stderr, r
        counted.write_text("services:\n  a:\n    image: i\n    x-gpupin: {count: 2}\n")
        r = hostagent("compose", "render", str(counted), DOCKER_HOST=sb.host)
        assert r.returncode == 0, r
        entry = devices(load.parse(r.stdout)["services"]["a"])[0]
        # Engine 26 serves the cards by CDI (its spec names them by UUID): render pins through it, as run does.
        way = "cdi" if serves_cdi(sb) else "nvidia"
        prefix = "nvidia.com/gpu=" if way == "cdi" else ""
        assert entry["driver"] == way and entry["device_ids"] == [prefix + u for u in (A800, A800C)]
    finally:
        sb.docker("rm", "-f", name)
