"""The simulated GPU host's fakes as their own tests drive them (tests/unit/test_fakegpu.py and
test_fakegpu_health.py): where they are built, the build, and Python code run against the fake libraries in a fresh
interpreter (a process loads a library once, so each topology and environment gets its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tests.support.host import REPO

SRC = REPO / "tests" / "fakegpu"
BUILD = REPO / "build" / "fakegpu"
LIB = BUILD / "lib"
HOOK = BUILD / "bin" / "nvidia-container-runtime-hook"
RUNTIME = BUILD / "bin" / "nvidia-container-runtime"

# A copy of the real 2xH200 host on which the CUDA_VISIBLE_DEVICES facts were recorded.
H200_0 = "GPU-1f0a7c3e-8d42-4b6e-9a15-7c2d3e4f5a60"
H200_1 = "GPU-42558917-3c6b-4e2a-8f0d-b1a2c3d4e5f6"


def hook_python() -> str:
    """The interpreter for the hook: the one a previous build chose (the top-level `make fakegpu` picks
    the host's python3, not a venv), else this one; so test runs and `make` do not rebuild it in turn."""
    try:
        current = HOOK.read_text().splitlines()[0][2:].strip()
    except (OSError, IndexError):
        current = ""
    return current if current.startswith("/") and os.access(current, os.X_OK) else sys.executable


def make_fakegpu() -> None:
    # OUT relative to the fakes' folder: make takes a path with spaces (the checkout's may have them) as two targets.
    out = os.path.relpath(BUILD, SRC)
    subprocess.run(["make", "-s", "-C", str(SRC), f"OUT={out}", f"PYTHON={hook_python()}"], check=True, timeout=300)


PRELUDE = """
import ctypes, json, sys

def out(x):
    print(json.dumps(x))

def nvml_err(f, *a):
    import pynvml
    try:
        f(*a)
    except pynvml.NVMLError as e:
        return [type(e).__name__, e.value, str(e)]
    return None

def uuid_text(raw):
    h = raw.hex()
    return "-".join([h[:8], h[8:12], h[12:16], h[16:20], h[20:]])

def cuda_devices(c=None):
    c = c or ctypes.CDLL("libcuda.so.1")
    rc = c.cuInit(0)
    if rc:
        return {"rc": rc, "devices": []}
    n = ctypes.c_int()
    assert c.cuDeviceGetCount(ctypes.byref(n)) == 0
    devs = []
    for i in range(n.value):
        name, bus = ctypes.create_string_buffer(100), ctypes.create_string_buffer(32)
        u1, u2 = ctypes.create_string_buffer(16), ctypes.create_string_buffer(16)
        mem, attr = ctypes.c_size_t(), ctypes.c_int()
        assert c.cuDeviceGetName(name, 100, i) == 0
        assert c.cuDeviceGetPCIBusId(bus, 32, i) == 0
        assert c.cuDeviceGetUuid(u1, i) == 0 and c.cuDeviceGetUuid_v2(u2, i) == 0
        assert c.cuDeviceTotalMem_v2(ctypes.byref(mem), i) == 0
        attrs = {}
        for a in (16, 33, 34, 50, 75, 76):
            assert c.cuDeviceGetAttribute(ctypes.byref(attr), a, i) == 0
            attrs[a] = attr.value
        devs.append({"name": name.value.decode(), "bus": bus.value.decode(), "uuid": uuid_text(u2.raw),
                     "uuid_v1": uuid_text(u1.raw), "mem_mib": mem.value >> 20, "attrs": attrs})
    return {"rc": 0, "devices": devs}
"""


@dataclass
class Run:
    value: Any
    stderr: str


def run_py(
    code: str, topology: Optional[Path], env: Optional[Mapping[str, Optional[str]]] = None, lib: Path = LIB
) -> Run:
    """Runs `code` (after PRELUDE) in a fresh interpreter against the fake libraries; its last
    stdout line is JSON. `env` values of None unset a variable."""
    e = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "FAKEGPU_TOPOLOGY")
    }
    e["LD_LIBRARY_PATH"] = str(lib)
    if topology is not None:
        e["FAKEGPU_TOPOLOGY"] = str(topology)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return Run(json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr)


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


NVML_INIT = """
import pynvml
out(nvml_err(pynvml.nvmlInit))
"""
