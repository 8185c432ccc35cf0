"""The engines the docker-path tests run on: each sandbox is the engine it claims to be, and Engines 26 and 28.5 really
does CDI with the spec the fake `nvidia-ctk cdi generate` wrote: `docker run --device nvidia.com/gpu=...` gives a
container whose fake NVML and CUDA see exactly the requested card, as on a real host with the toolkit's spec.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.sandbox import PODMAN, TEST_IMAGE, Sandbox, has, serves_cdi
from tests.support.scenarios import topology, uuids

# Every engine runs these (what differs between the engines): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine

A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86, AF
MIG_PARENT, A100_0F = uuids("mig")
MIG_GI1, MIG_GI2 = (d["uuid"] for g in topology("mig")["gpus"] if g["uuid"] == MIG_PARENT for d in g["mig"]["devices"])
_names = itertools.count()

# What the container's driver libraries see: NVML's cards (with their MIG devices), CUDA's devices (own UUIDs),
# the environment the CDI spec set, and the device nodes it created.
PROBE = """
import ctypes, json, os, pynvml
pynvml.nvmlInit()
cards = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    migs = []
    if pynvml.nvmlDeviceGetMigMode(h)[0]:
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                migs.append(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
            except pynvml.NVMLError:
                break
    cards.append([pynvml.nvmlDeviceGetUUID(h), migs])
cu = ctypes.CDLL("libcuda.so.1")
cuda = []
if cu.cuInit(0) == 0:
    n = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(n))
    for k in range(n.value):
        dev, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        cu.cuDeviceGet(ctypes.byref(dev), k)
        cu.cuDeviceGetUuid_v2(raw, dev)
        cuda.append(bytes(raw).hex())
print(json.dumps({"nvml": cards, "cuda": cuda, "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
                  "dev": sorted(f for f in os.listdir("/dev") if f.startswith("nvidia"))}))
"""


def hexid(uuid: str) -> str:
    return uuid.split("-", 1)[1].replace("-", "")


@pytest.fixture
def engine_cdi(sandbox: Sandbox) -> Sandbox:
    """The sandbox of each engine with CDI (26, 28.5), whatever topology it runs (the tests pick theirs); skipped
    on the others."""
    if not serves_cdi(sandbox):
        pytest.skip(f"Engine {sandbox.engine} has no CDI")
    return sandbox


def run_cdi(sb: Sandbox, *devices: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Runs PROBE in a container given `--device nvidia.com/gpu=D` for each device; returns what it saw and the
    container's HostConfig."""
    name = f"gpupintest-cdi-{os.getpid()}-{next(_names)}"
    flags = [arg for d in devices for arg in ("--device", f"nvidia.com/gpu={d}")]
    try:
        r = sb.docker("run", "--name", name, *flags, "--entrypoint", "python3", TEST_IMAGE, "-c", PROBE)
        assert r.returncode == 0, r.stderr
        host_config = json.loads(sb.docker("inspect", name, check=True).stdout)[0]["HostConfig"]
        return json.loads(r.stdout), host_config
    finally:
        sb.docker("rm", "-f", name)


def test_each_sandbox_is_the_engine_it_claims(sandbox: Sandbox) -> None:
    info = json.loads(sandbox.docker("version", "--format", "{{json .}}", check=True).stdout)
    server = info["Server"]
    components = {c["Name"]: c["Version"] for c in server["Components"]}
    if sandbox.engine == PODMAN:  # Debian 12's podman 4.3 (or 13's 5.4: PODMAN=5) behind its compatible API
        want, runc = ("5.4.", "1.1.15") if os.environ.get("GPUPIN_PODMAN") == "5" else ("4.3.", "1.1.5")
        assert server["Version"].startswith(want) and server["ApiVersion"] in ("1.41", "1.43")
        assert components["Podman Engine"].startswith(want)
        assert f"runc version {runc}" in components["OCI Runtime (runc)"]
        return
    compose = sandbox.compose("version", "--short")
    assert compose.returncode == 0, compose.stderr
    if sandbox.engine == "20.10":
        assert server["Version"].startswith("20.10.") and info["Client"]["Version"].startswith("20.10.")
        assert compose.stdout.strip().startswith("1.29.")
    else:
        version, api, containerd, compose_v = {
            "26": ("26.1.", "1.45", "1.7.", "2.26."),
            "28.5": ("28.5.", "1.51", "2.1.", "2.40."),
        }[sandbox.engine]
        assert server["Version"].startswith(version) and server["ApiVersion"] == api
        assert info["Client"]["Version"].startswith(version)
        assert components["containerd"].startswith(containerd)
        assert compose.stdout.strip().startswith(compose_v)
        cdi_dirs = json.loads(sandbox.docker("info", "--format", "{{json .CDISpecDirs}}", check=True).stdout)
        assert cdi_dirs == [str(sandbox.run_dir / "cdi")]  # the sandbox's own, never /etc/cdi or /var/run/cdi
    assert components["runc"].startswith("1.1.5")  # Debian 12's runc on all: the newer ones need glibc 2.38


@pytest.mark.parametrize(
    ("devices", "cards"),
    [
        ((RTX,), [RTX]),
        (("2",), [A800B]),
        (("3", "0"), [A800, A800C]),  # NVML lists them in bus order, whatever the order asked
        (("all",), [A800, RTX, A800B, A800C]),
    ],
    ids=["uuid", "index", "two-indices", "all"],
)
def test_a_cdi_device_gives_exactly_that_card(engine_cdi: Sandbox, devices: tuple[str, ...], cards: list[str]) -> None:
    seen, host_config = run_cdi(engine_cdi.use("mixed-4"), *devices)
    assert seen["nvml"] == [[u, []] for u in cards]
    # CUDA's default order is FASTEST_FIRST: the 4090 (8.9) before the A800s (8.0), then bus order.
    assert seen["cuda"] == [hexid(u) for u in sorted(cards, key=lambda u: u != RTX)]
    assert seen["visible"] == "void"  # the spec's common edits: the runtime hook must not act as well
    in_file = [g["uuid"] for g in topology("mixed-4")["gpus"]]  # minor numbers: the cards' places in the file
    minors = [in_file.index(u) for u in cards]
    assert [d for d in seen["dev"] if d[len("nvidia") :].isdigit()] == sorted(f"nvidia{m}" for m in minors)
    if has(engine_cdi, "cdi-inspect"):
        assert [(r["Driver"], r["DeviceIDs"]) for r in host_config["DeviceRequests"]] == [
            ("cdi", [f"nvidia.com/gpu={d}" for d in devices])
        ]
        assert not host_config.get("Devices")


@pytest.mark.parametrize(("device", "mig"), [("0:1", MIG_GI2), (MIG_GI1, MIG_GI1)], ids=["index", "uuid"])
def test_a_cdi_mig_device_gives_exactly_that_mig_device(engine_cdi: Sandbox, device: str, mig: str) -> None:
    seen, host_config = run_cdi(engine_cdi.use("mig"), device)
    assert seen["nvml"] == [[MIG_PARENT, [mig]]]
    assert seen["cuda"] == [hexid(mig)]
    assert seen["visible"] == "void"
    assert "nvidia-caps" in seen["dev"] and "nvidia0" in seen["dev"] and "nvidia1" not in seen["dev"]
    if has(engine_cdi, "cdi-inspect"):
        assert [(r["Driver"], r["DeviceIDs"]) for r in host_config["DeviceRequests"]] == [
            ("cdi", [f"nvidia.com/gpu={device}"])
        ]


def test_an_unknown_cdi_device_is_refused_and_nothing_runs(engine_cdi: Sandbox) -> None:
    sb = engine_cdi.use("mixed-4")
    name = f"gpupintest-cdi-{os.getpid()}-{next(_names)}"
    try:
        r = sb.docker("run", "--name", name, "--device", "nvidia.com/gpu=4", TEST_IMAGE, "true")
        # the docker CLI's 125; podman's CLI answers 126 (4.3, measured: it fails in the start's attach)
        assert r.returncode == (126 if sb.engine == PODMAN else 125) and "nvidia.com/gpu=4" in r.stderr, r
        state = json.loads(sb.docker("inspect", name, check=True).stdout)[0]["State"]
        assert state["Status"] == "created" and state["StartedAt"].startswith("0001-")
    finally:
        sb.docker("rm", "-f", name)


@pytest.mark.needs("compose")
def test_compose_v2_runs_a_compose_file_with_a_cdi_device_request(engine_cdi: Sandbox, tmp_path: Path) -> None:
    """compose v2 passes a `driver: cdi` reservation through as the daemon's DeviceRequest."""
    sb = engine_cdi.use("mixed-4")
    file = tmp_path / "compose.yml"
    file.write_text(f"""services:
  hello:
    image: {TEST_IMAGE}
    network_mode: none
    entrypoint: ["python3", "-c", {json.dumps(PROBE)}]
    deploy:
      resources:
        reservations:
          devices:
            - driver: cdi
              device_ids: ["nvidia.com/gpu={A800C}"]
              capabilities: [gpu]
""")
    project = f"gpupintest{os.getpid()}x{next(_names)}"
    try:
        r = sb.compose("-p", project, "-f", str(file), "up", "--no-color")
        assert r.returncode == 0, r.stdout + r.stderr
        cid = sb.compose("-p", project, "-f", str(file), "ps", "-a", "-q", "hello").stdout.strip()
        seen = json.loads(sb.docker("logs", cid, check=True).stdout)
        assert seen["nvml"] == [[A800C, []]] and seen["visible"] == "void"
        requests = json.loads(sb.docker("inspect", cid, check=True).stdout)[0]["HostConfig"]["DeviceRequests"]
        assert [(q["Driver"], q["DeviceIDs"]) for q in requests] == [("cdi", [f"nvidia.com/gpu={A800C}"])]
    finally:
        sb.compose("-p", project, "-f", str(file), "down", "-v")
