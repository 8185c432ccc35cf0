"""A CDI spec for a real NVIDIA host's cards, read from NVML, for a GPU host without the NVIDIA container toolkit
(the gpu tier's own engine: `python3 -m tests.support.realcdi DIR` writes DIR/nvidia.json).

It is what `nvidia-ctk cdi generate` writes, less its hooks: kind nvidia.com/gpu, one device per card under its
index and under its UUID, plus "all"; each device's edits its /dev/nvidiaN; the common edits
NVIDIA_VISIBLE_DEVICES=void, the control nodes and the driver's libraries and tools bound read-only. Without
nvidia-cdi-hook there is no ldcache update: each library is bound under its soname into the container's
/usr/lib/x86_64-linux-gnu, where the loader looks without a cache. The device nodes name only their path: the
runtime reads their type and numbers from the host's node, as it does for nvidia-ctk's specs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

# The libraries a CUDA or NVML program in the container opens (by soname), and the tool the tests run there.
LIBRARIES = (
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so",
    "libcudadebugger.so.1",
)
TOOLS = ("nvidia-smi",)
CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def cards() -> list[tuple[int, str, int]]:
    """(index, UUID, minor number) of each card, from NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append((i, str(pynvml.nvmlDeviceGetUUID(h)), int(pynvml.nvmlDeviceGetMinorNumber(h))))
        return out
    finally:
        pynvml.nvmlShutdown()


def _ldconfig() -> dict[str, str]:
    """soname -> path of the 64-bit libraries the loader's cache knows."""
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    found: dict[str, str] = {}
    for m in re.finditer(r"^\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)$", text, re.M):
        found.setdefault(m.group(1), m.group(2))
    return found


def libraries() -> dict[str, str]:
    """soname (or prefix, for the versioned-only ones) -> host path, from the cache or the driver's usual folders."""
    cache = _ldconfig()
    folders = [os.path.dirname(p) for p in cache.values() if "libnvidia-ml" in p] + [
        "/usr/local/nvidia/lib64",
        LIBDIR,
        "/usr/lib64",
    ]
    out: dict[str, str] = {}
    for name in LIBRARIES:
        if name in cache:
            out[name] = os.path.realpath(cache[name])
            continue
        for folder in folders:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            hit = [n for n in names if n == name or n.startswith(name + ".")]
            if hit:
                out[hit[0] if name.endswith(".so") else name] = os.path.realpath(os.path.join(folder, hit[0]))
                break
    return out


def spec() -> dict[str, Any]:
    mounts = [
        {"hostPath": path, "containerPath": f"{LIBDIR}/{name}", "options": ["ro", "nosuid", "nodev", "bind"]}
        for name, path in sorted(libraries().items())
    ]
    for tool in TOOLS:
        for folder in ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"):
            if os.path.exists(f"{folder}/{tool}"):
                real = os.path.realpath(f"{folder}/{tool}")
                mounts.append({"hostPath": real, "containerPath": f"/usr/bin/{tool}", "options": ["ro", "bind"]})
                break
    devices: list[dict[str, Any]] = []
    nodes = []
    for index, uuid, minor in cards():
        node = {"path": f"/dev/nvidia{minor}"}
        nodes.append(node)
        for name in (str(index), uuid):
            devices.append({"name": name, "containerEdits": {"deviceNodes": [node]}})
    devices.append({"name": "all", "containerEdits": {"deviceNodes": nodes}})
    control = [{"path": p} for p in CONTROL if os.path.exists(p)]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "deviceNodes": control, "mounts": mounts},
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m tests.support.realcdi DIR", file=sys.stderr)
        return 64
    folder = Path(argv[0])
    folder.mkdir(parents=True, exist_ok=True)
    # JSON is YAML: the engine's CDI cache reads .yaml and .json alike.
    (folder / "nvidia.json").write_text(json.dumps(spec(), indent=1) + "\n")
    print(f"wrote {folder / 'nvidia.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
