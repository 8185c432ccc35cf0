"""Ask the CUDA driver (libcuda.so.1, through ctypes) what each `cuda:k` is: UUID, PCI bus id, name.

The entrypoint runs it as a child (`CHILD_ARGS`: `python -I -S`, importing nothing from gpupin) under the
workload's final environment, since cuInit reads CUDA_VISIBLE_DEVICES once and leaves driver state behind;
`gpupin.entrypoint.api` calls `probe()` in-process. The child's output: docs/design.md, "The CUDA probe".
"""

from __future__ import annotations

import ctypes
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CUDA_SUCCESS = 0
# The child's command line after the interpreter: no site, no user or script paths, just this directory.
CHILD_ARGS = [
    "-I",
    "-S",
    "-c",
    f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
    "import cudaprobe; cudaprobe.main()",
]
# cuDeviceGetAttribute codes (cuda.h)
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76


def _error(lib: Any, rc: int) -> tuple[str, str]:
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    try:
        lib.cuGetErrorName(rc, ctypes.byref(name))
        lib.cuGetErrorString(rc, ctypes.byref(text))
    except AttributeError:
        pass
    return (
        (name.value or b"CUDA_ERROR_%d" % rc).decode(errors="replace"),
        (text.value or b"").decode(errors="replace"),
    )


def probe() -> dict[str, Any]:
    """Initialise the CUDA driver in this process and describe every device it enumerates.

    Returns {"rc": int, "error": (name, text), "driver": int | None, "devices": [dict]}; rc -1 means
    libcuda.so.1 could not be loaded at all.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        return {"rc": -1, "error": ("LIBRARY_NOT_FOUND", str(err)), "driver": None, "devices": []}
    rc = int(lib.cuInit(0))
    out: dict[str, Any] = {"rc": rc, "error": _error(lib, rc) if rc else ("", ""), "driver": None, "devices": []}
    if rc != CUDA_SUCCESS:
        return out
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) == CUDA_SUCCESS:
        out["driver"] = version.value
    count = ctypes.c_int()
    rc = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    if rc != CUDA_SUCCESS:
        out["rc"], out["error"] = rc, _error(lib, rc)
        return out
    get_uuid_v2 = getattr(lib, "cuDeviceGetUuid_v2", None)  # drivers before 11.4 lack it
    for k in range(count.value):
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), k) != CUDA_SUCCESS:
            continue
        bus = ctypes.create_string_buffer(64)
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetPCIBusId(bus, 64, dev)
        lib.cuDeviceGetName(name, 256, dev)
        u1 = (ctypes.c_ubyte * 16)()
        u2 = (ctypes.c_ubyte * 16)()
        lib.cuDeviceGetUuid(u1, dev)
        if get_uuid_v2 is None or get_uuid_v2(u2, dev) != CUDA_SUCCESS:
            u2 = u1
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev)
        out["devices"].append(
            {
                "k": k,
                "uuid_hex": bytes(u2).hex(),
                "uuid_v1_hex": bytes(u1).hex(),
                "bus_id": bus.value.decode(errors="replace"),
                "cc": f"{major.value}.{minor.value}",
                "name": name.value.decode(errors="replace"),
            }
        )
    return out


def to_lines(result: dict[str, Any]) -> str:
    name, text = result["error"]
    lines = [f"rc\t{result['rc']}\t{name}\t{text}"]
    if result["driver"] is not None:
        lines.append(f"driver\t{result['driver']}")
    for d in result["devices"]:
        lines.append(
            "\t".join(
                (
                    "dev",
                    str(d["k"]),
                    d["uuid_hex"],
                    d["uuid_v1_hex"],
                    d["bus_id"],
                    d["cc"],
                    d["name"].replace("\t", " "),
                )
            )
        )
    return "\n".join(lines) + "\n"


def from_lines(text: str) -> dict[str, Any]:
    """Parse what `to_lines` printed (in the parent)."""
    out: dict[str, Any] = {"rc": None, "error": ("", ""), "driver": None, "devices": []}
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "rc" and len(f) >= 4:
            out["rc"], out["error"] = int(f[1]), (f[2], f[3])
        elif f[0] == "driver" and len(f) >= 2:
            out["driver"] = int(f[1])
        elif f[0] == "dev" and len(f) >= 7:
            out["devices"].append(
                {"k": int(f[1]), "uuid_hex": f[2], "uuid_v1_hex": f[3], "bus_id": f[4], "cc": f[5], "name": f[6]}
            )
    return out


def main() -> None:
    sys.stdout.write(to_lines(probe()))


if __name__ == "__main__":
    main()
