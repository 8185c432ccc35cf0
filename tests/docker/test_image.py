"""The training image (the project's Dockerfile, built by `make image-test` on the sandbox's debootstrap base)."""

from __future__ import annotations

import json

import pytest

from tests.support.sandbox import TEST_IMAGE, Sandbox
from tests.support.scenarios import uuids

# Every engine runs these (each engine builds and runs the image with its own CLI): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine

A800, RTX, A800B, A800C = uuids("mixed-4")


@pytest.mark.needs("gpus")
def test_the_entrypoint_is_gpupin_and_the_example_cmd_proves_the_card(mixed4_sandbox: Sandbox) -> None:
    info = json.loads(mixed4_sandbox.docker("image", "inspect", TEST_IMAGE, check=True).stdout)[0]["Config"]
    assert info["Entrypoint"] == ["gpupin-entrypoint"]
    assert info["Cmd"] == ["python3", "-m", "gpupin.entrypoint"]
    assert "GPUPIN_VERIFY=cuda" in info["Env"]
    r = mixed4_sandbox.docker("run", "--rm", "--gpus", f"device={A800B}", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"cuda:0 = {A800B} at 00000000:86:00.0 (NVIDIA A800-SXM4-80GB), as expected\n"


@pytest.mark.needs("gpus")
def test_the_image_carries_only_the_entrypoint_side(mixed4_sandbox: Sandbox) -> None:
    # Only under the gpupin namespace: a top-level `entrypoint` or `hostagent` would be shadowed by (or shadow)
    # a workload's own module of that name.
    code = (
        "import importlib.util as u; print(*[m for m in ('pynvml', 'gpupin.entrypoint', 'gpupin.hostagent', "
        "'entrypoint', 'hostagent', 'docker', 'requests', 'yaml') if u.find_spec(m)])"
    )
    r = mixed4_sandbox.docker("run", "--rm", "--entrypoint", "python3", TEST_IMAGE, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pynvml", "gpupin.entrypoint", "gpupin.hostagent"]
    # The host side in an image without its SDK: on a unix socket `run` needs no SDK (here no daemon answers);
    # over tcp it says what is missing, in one line, instead of a traceback.
    for host, says in (
        ("unix:///run/no-daemon.sock", "does not answer"),
        ("tcp://127.0.0.1:9", "the docker SDK is not installed"),
    ):
        r = mixed4_sandbox.docker(
            "run", "--rm", "--gpus", "all", "-e", f"DOCKER_HOST={host}", "-e", "GPUPIN_AGENT=0",
            "--entrypoint", "hostagent", TEST_IMAGE, "run", "--gpu", "0", "img",
        )  # fmt: skip
        assert r.returncode == 69 and r.stderr.count("\n") == 1, r.stderr
        assert says in r.stderr, r.stderr
    assert "gpupin[host]" in r.stderr
