"""Record the real NVML / CUDA driver behaviour that the fakes copy, edge cases included.

Run on a host with two NVIDIA GPUs (MIG off), nvidia-ml-py installed:
    python3 bench/records/real_edges.py > bench/records/edges-<host>-<date>.jsonl
One JSON object per line, {"case": ..., "value": ...}. CUDA_VISIBLE_DEVICES cases each run in a fresh process
(the driver reads it once, at cuInit); every other call runs in a forked child, since the real libraries crash
on some bad pointers. "{u0}" / "{u1}" in a case stand for the first / second card's UUID.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

CUDA_CHILD = r"""
import ctypes, json
c = ctypes.CDLL("libcuda.so.1")
rc = c.cuInit(0)
out = {"cuInit": rc, "devs": []}
if rc == 0:
    n = ctypes.c_int()
    c.cuDeviceGetCount(ctypes.byref(n))
    for k in range(n.value):
        bus = ctypes.create_string_buffer(64)
        c.cuDeviceGetPCIBusId(bus, 64, k)
        out["devs"].append(bus.value.decode())
else:
    n = ctypes.c_int()
    out["count_after_failure"] = c.cuDeviceGetCount(ctypes.byref(n))
    out["cuInit_again"] = c.cuInit(0)
print(json.dumps(out))
"""

CVD_CASES = [
    "0",
    "1",
    "1,0",
    "0,7,1",
    "bogus",
    "",
    " 1",
    "1 ",
    "1, 0",
    "01",
    "+1",
    "1abc",
    "1.5",
    "1 0",
    "0x1",
    "0,+1",
    "-1",
    "0,-1,1",
    "99999999999999999999",
    "  ",
    "1\t",
    "0,,1",
    "1,0,",
    ",1",
    "0,0",
    "1,0,1",
    "0,1,,0",
    "0,1,0",
    "{u1}",
    "{u1},{u1}",
    "{u1},{u1:10}",
    "{u1},{u1}x",
    "{U1}",
    "{u1/}",
    "GPU--{u1:4:10}",
    "MIG-{u1:4:10}",
    "MIG-{u1:4:}",
    "gpu-{u1:4:}",
    "{u1:4:}",
    " {u1}",
    "GPU-",
    "MIG-",
    "GPU-{u1:4:5}x",
    "GPU-{u1:4:8} ",
    "GPU-{u1:4:12} 6e",
    "MIG-{u1}",
    "{u1} ",
    "{u1}x",
    "{u1}ab",
    "{u1}-",
    "{u1}:0",
    "{u1}{u0:4:}",
    "{u1},{u0}",
    "{u1},0",
    "{u1},1",
    "{u1}, {u0}",
    "{u1},,{u0}",
    "{u1},bogus,{u0}",
    "{u1},MIG-{u0:4:}",
    "0,{u1}",
    "0,{u0}",
    "1,GPU-{u1:4:10}",
]
ORDER_CASES = [None, "FASTEST_FIRST", "PCI_BUS_ID", "", "pci_bus_id", "PCI_BUS_ID ", "fastest_first", "bogus"]
BUS_FORMS = [
    "{bus16}",
    "{bus12}",
    "{bus7}",
    "0:0:{dev}",
    "0:0:{dev}.0",
    "00000:{bus7}",
    "000000000:{bus7}",
    "0x0:0x0:0x{dev}.0",
    "0X0:0:{dev}.0",
    " {bus12}",
    "+0:0:{dev}.0",
    "{bus12} ",
    "{bus12:-2}.1",
    "{bus12:-2}.7",
    "0:0:{dev}.8",
    "0000:3b:00.0",
    "0001:{bus7}",
    "0000:00:1f.0",
    "0000:00:20.0",
    "0000:100:{dev}.0",
    "3b:00.0",
    "3b",
    "zz:00.0",
    "00:{dev}",
    "",
]
UUID_FORMS = [
    "{u0}",
    "{u0:4:}",
    "{U0}",
    "{U0:4:}",
    "gpu-{u0:4:}",
    "MIG-{u0:4:}",
    "{u0} ",
    "{u0}x",
    "{u0:4:}x",
    "{u0/}",
    "{u0:10}",
    "",
]


def emit(case: str, value: object) -> None:
    print(json.dumps({"case": case, "value": value}), flush=True)


def fill(template: str, uuids: list[str], bus: str = "") -> str:
    """Expands {u0}, {U0} (upper-case hex), {u0/} (no dashes), {u0:a:b} / {u0:b} slices, {bus16}, {bus12},
    {bus7}, {bus12:-2} and {dev} of the first card's bus id."""
    out = template
    for i, u in enumerate(uuids):
        out = out.replace(f"{{U{i}}}", "GPU-" + u[4:].upper()).replace(f"{{u{i}/}}", "GPU-" + u[4:].replace("-", ""))
        for a, b in ((4, ""), (4, 5), (4, 8), (4, 10), (4, 12)):
            out = out.replace(f"{{u{i}:{a}:{b}}}", u[a : int(b) if b != "" else None])
            out = out.replace(f"{{U{i}:{a}:{b}}}", u[a : int(b) if b != "" else None].upper())
        out = out.replace(f"{{u{i}:10}}", u[:10]).replace(f"{{u{i}}}", u)
    if bus:
        out = out.replace("{bus16}", bus).replace("{bus12}", bus[4:]).replace("{bus7}", bus[9:])
        out = out.replace("{bus12:-2}", bus[4:-2]).replace("{dev}", bus[12:14])
    return out


def cuda_case(cvd: str | None, order: str | None) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    if order is not None:
        env["CUDA_DEVICE_ORDER"] = order
    p = subprocess.run([sys.executable, "-c", CUDA_CHILD], env=env, capture_output=True, text=True, timeout=60)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"exit": p.returncode, "stderr": p.stderr[-300:]}


def forked(fn: Callable[[], object]) -> object:
    """fn() in a child; "SIGNAL n" when the child dies of a signal."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            value = fn()
        except Exception as e:  # the record says what failed
            value = f"EXCEPTION {e!r}"
        os.write(w, json.dumps(value).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"SIGNAL {os.WTERMSIG(status)}"
    return json.loads(data) if data else None


def sentinel(n: int) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(b"\xab" * n, n)


def cuda_calls() -> dict[str, Callable[[], object]]:
    def call(f: Callable[[ctypes.CDLL], object], init: bool = True) -> Callable[[], object]:
        def run() -> object:
            c = ctypes.CDLL("libcuda.so.1")
            if init:
                assert c.cuInit(0) == 0
            return f(c)

        return run

    def out_int(c: ctypes.CDLL, name: str, *args: object) -> list[int]:
        v = ctypes.c_int(-7)
        return [getattr(c, name)(ctypes.byref(v), *args), v.value]

    def into(c: ctypes.CDLL, name: str, size: int, *args: object) -> list[object]:
        buf = sentinel(16)
        return [getattr(c, name)(buf, size, *args), buf.raw.hex()]

    def raw(c: ctypes.CDLL, name: str, *args: object) -> list[object]:
        buf = sentinel(16)
        return [getattr(c, name)(buf, *args), buf.raw.hex()]

    def text(c: ctypes.CDLL, name: str, code: int) -> list[object]:
        s = ctypes.c_char_p(b"x")
        rc = getattr(c, name)(code, ctypes.byref(s))
        return [rc, s.value.decode() if s.value else None]

    calls: dict[str, Callable[[], object]] = {
        "before cuInit: cuDeviceGetCount": call(lambda c: out_int(c, "cuDeviceGetCount"), init=False),
        "before cuInit: cuDeviceGet(0)": call(lambda c: out_int(c, "cuDeviceGet", 0), init=False),
        "before cuInit: cuDriverGetVersion": call(lambda c: out_int(c, "cuDriverGetVersion"), init=False),
        "cuInit(1)": call(lambda c: c.cuInit(1), init=False),
        "cuDeviceGet(NULL, 0)": call(lambda c: c.cuDeviceGet(None, 0)),
        "cuDeviceGet(5)": call(lambda c: out_int(c, "cuDeviceGet", 5)),
        "cuDeviceGetCount(NULL)": call(lambda c: c.cuDeviceGetCount(None)),
        "cuDriverGetVersion(NULL)": call(lambda c: c.cuDriverGetVersion(None)),
        "cuDeviceGetName(NULL, 16, 0)": call(lambda c: c.cuDeviceGetName(None, 16, 0)),
        "cuDeviceGetPCIBusId(NULL, 16, 0)": call(lambda c: c.cuDeviceGetPCIBusId(None, 16, 0)),
        "cuDeviceGetAttribute(NULL, 75, 0)": call(lambda c: c.cuDeviceGetAttribute(None, 75, 0)),
        "cuDeviceGetUuid(NULL, 0)": call(lambda c: c.cuDeviceGetUuid(None, 0)),
        "cuDeviceGetUuid_v2(NULL, 0)": call(lambda c: c.cuDeviceGetUuid_v2(None, 0)),
        "cuDeviceGetUuid_v2(buf, 9)": call(lambda c: raw(c, "cuDeviceGetUuid_v2", 9)),
        "cuDeviceTotalMem(buf, 0)": call(lambda c: raw(c, "cuDeviceTotalMem", 0)),
        "cuDeviceTotalMem_v2(buf, 0)": call(lambda c: raw(c, "cuDeviceTotalMem_v2", 0)),
        "cuDeviceTotalMem_v2(buf, 7)": call(lambda c: raw(c, "cuDeviceTotalMem_v2", 7)),
        "cuDeviceTotalMem_v2(NULL, 0)": call(lambda c: c.cuDeviceTotalMem_v2(None, 0)),
        "cuGetErrorString(0, NULL)": call(lambda c: c.cuGetErrorString(0, None), init=False),
    }

    def sized(name: str, n: int) -> Callable[[], object]:
        return call(lambda c: into(c, name, n, 0))

    def attribute(a: int, dev: int) -> Callable[[], object]:
        return call(lambda c: out_int(c, "cuDeviceGetAttribute", a, dev))

    def error_text(name: str, code: int) -> Callable[[], object]:
        return call(lambda c: text(c, name, code), init=False)

    for n in (0, 1, 5, 11, 12, 13):
        calls[f"cuDeviceGetPCIBusId(buf, {n}, 0)"] = sized("cuDeviceGetPCIBusId", n)
        calls[f"cuDeviceGetName(buf, {n}, 0)"] = sized("cuDeviceGetName", n)
    for a, dev in ((1, 0), (16, 0), (33, 0), (34, 0), (50, 0), (75, 0), (76, 0), (9999, 0), (75, 9), (75, -1)):
        calls[f"cuDeviceGetAttribute({a}, {dev})"] = attribute(a, dev)
    for code in (0, 1, 2, 3, 4, 34, 46, 100, 101, 201, 304, 500, 801, 802, 803, 999, 12345):
        calls[f"cuGetErrorString({code})"] = error_text("cuGetErrorString", code)
        calls[f"cuGetErrorName({code})"] = error_text("cuGetErrorName", code)
    return calls


def nvml_calls(uuids: list[str], bus: str) -> dict[str, Callable[[], object]]:
    def call(f: Callable[[ctypes.CDLL, ctypes.c_void_p], object]) -> Callable[[], object]:
        def run() -> object:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            assert lib.nvmlInit_v2() == 0
            h = ctypes.c_void_p()
            assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
            return f(lib, h)

        return run

    def procs(lib: ctypes.CDLL, h: ctypes.c_void_p, name: str, count: int, with_buffer: bool) -> list[object]:
        cnt = ctypes.c_uint(count)
        buf = sentinel(96)
        rc = getattr(lib, name)(h, ctypes.byref(cnt), buf if with_buffer else None)
        return [rc, cnt.value, buf.raw.hex()]

    def mem_v2(lib: ctypes.CDLL, h: ctypes.c_void_p, version: int) -> list[object]:
        buf = sentinel(48)
        ctypes.memmove(buf, (ctypes.c_uint32 * 1)(version), 4)
        return [lib.nvmlDeviceGetMemoryInfo_v2(h, buf), buf.raw.hex()]

    def uint_out(lib: ctypes.CDLL, h: ctypes.c_void_p, name: str) -> list[int]:
        u = ctypes.c_uint(7)
        return [getattr(lib, name)(h, ctypes.byref(u)), u.value]

    def text_out(lib: ctypes.CDLL, h: ctypes.c_void_p, name: str, n: int, with_handle: bool = True) -> list[object]:
        buf = sentinel(100)
        rc = getattr(lib, name)(h, buf, n) if with_handle else getattr(lib, name)(buf, n)
        return [rc, buf.raw[: n + 2].hex()]

    def pci(lib: ctypes.CDLL, h: ctypes.c_void_p, name: str) -> list[object]:
        buf = sentinel(80)
        return [getattr(lib, name)(h, buf), buf.raw.hex()]

    def lookup(lib: ctypes.CDLL, name: str, arg: str) -> int:
        hh = ctypes.c_void_p()
        return int(getattr(lib, name)(arg.encode(), ctypes.byref(hh)))

    def error_strings(lib: ctypes.CDLL) -> dict[int, str]:
        lib.nvmlErrorString.restype = ctypes.c_char_p
        return {k: lib.nvmlErrorString(k).decode() for k in [*range(0, 32), 998, 999, 12345]}

    calls: dict[str, Callable[[], object]] = {
        "processes_v3(count 0, NULL)": call(
            lambda lib, h: procs(lib, h, "nvmlDeviceGetComputeRunningProcesses_v3", 0, False)
        ),
        "processes_v3(count 3, NULL)": call(
            lambda lib, h: procs(lib, h, "nvmlDeviceGetComputeRunningProcesses_v3", 3, False)
        ),
        "processes_v3(count 3, buf)": call(
            lambda lib, h: procs(lib, h, "nvmlDeviceGetComputeRunningProcesses_v3", 3, True)
        ),
        "processes_v2(count 3, buf)": call(
            lambda lib, h: procs(lib, h, "nvmlDeviceGetComputeRunningProcesses_v2", 3, True)
        ),
        "processes(count 3, buf)": call(lambda lib, h: procs(lib, h, "nvmlDeviceGetComputeRunningProcesses", 3, True)),
        "processes_v3(NULL count)": call(lambda lib, h: lib.nvmlDeviceGetComputeRunningProcesses_v3(h, None, None)),
        "graphics_v3(count 3, buf)": call(
            lambda lib, h: procs(lib, h, "nvmlDeviceGetGraphicsRunningProcesses_v3", 3, True)
        ),
        "memory_v1": call(lambda lib, h: pci(lib, h, "nvmlDeviceGetMemoryInfo")),
        "memory_v2(version 0x02000028)": call(lambda lib, h: mem_v2(lib, h, 0x02000028)),
        "memory_v2(version 1)": call(lambda lib, h: mem_v2(lib, h, 1)),
        "memory_v2(version 0x01000028)": call(lambda lib, h: mem_v2(lib, h, 0x01000028)),
        "pci_v1": call(lambda lib, h: pci(lib, h, "nvmlDeviceGetPciInfo")),
        "pci_v2": call(lambda lib, h: pci(lib, h, "nvmlDeviceGetPciInfo_v2")),
        "pci_v3": call(lambda lib, h: pci(lib, h, "nvmlDeviceGetPciInfo_v3")),
        "uuid(40)": call(lambda lib, h: text_out(lib, h, "nvmlDeviceGetUUID", 40)),
        "uuid(41)": call(lambda lib, h: text_out(lib, h, "nvmlDeviceGetUUID", 41)),
        "name(5)": call(lambda lib, h: text_out(lib, h, "nvmlDeviceGetName", 5)),
        "driver_version(10)": call(lambda lib, h: text_out(lib, h, "nvmlSystemGetDriverVersion", 10, False)),
        "driver_version(11)": call(lambda lib, h: text_out(lib, h, "nvmlSystemGetDriverVersion", 11, False)),
        "nvml_version(80)": call(lambda lib, h: text_out(lib, h, "nvmlSystemGetNVMLVersion", 80, False)),
        "uuid(NULL)": call(lambda lib, h: lib.nvmlDeviceGetUUID(h, None, 80)),
        "handle_by_index(5)": call(
            lambda lib, h: lib.nvmlDeviceGetHandleByIndex_v2(5, ctypes.byref(ctypes.c_void_p()))
        ),
        "handle_by_index(0, NULL)": call(lambda lib, h: lib.nvmlDeviceGetHandleByIndex_v2(0, None)),
        "count(NULL)": call(lambda lib, h: lib.nvmlDeviceGetCount_v2(None)),
        "max_mig_count": call(lambda lib, h: uint_out(lib, h, "nvmlDeviceGetMaxMigDeviceCount")),
        "mig_handle_by_index(0)": call(
            lambda lib, h: lib.nvmlDeviceGetMigDeviceHandleByIndex(h, 0, ctypes.byref(ctypes.c_void_p()))
        ),
        "gpu_instance_id": call(lambda lib, h: uint_out(lib, h, "nvmlDeviceGetGpuInstanceId")),
        "compute_instance_id": call(lambda lib, h: uint_out(lib, h, "nvmlDeviceGetComputeInstanceId")),
        "is_mig_handle": call(lambda lib, h: uint_out(lib, h, "nvmlDeviceIsMigDeviceHandle")),
        "parent_of_whole_gpu": call(
            lambda lib, h: lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h, ctypes.byref(ctypes.c_void_p()))
        ),
        "minor(garbage handle)": call(lambda lib, h: uint_out(lib, ctypes.c_void_p(12345), "nvmlDeviceGetMinorNumber")),
        "minor(NULL handle)": call(lambda lib, h: uint_out(lib, ctypes.c_void_p(), "nvmlDeviceGetMinorNumber")),
        "minor(NULL out)": call(lambda lib, h: lib.nvmlDeviceGetMinorNumber(h, None)),
        "cuda_driver_version(NULL)": call(lambda lib, h: lib.nvmlSystemGetCudaDriverVersion(None)),
        "by_bus(NULL)": call(
            lambda lib, h: lib.nvmlDeviceGetHandleByPciBusId_v2(None, ctypes.byref(ctypes.c_void_p()))
        ),
        "by_uuid(NULL)": call(lambda lib, h: lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(ctypes.c_void_p()))),
        "shutdown, shutdown, count": call(
            lambda lib, h: [
                lib.nvmlShutdown(),
                lib.nvmlShutdown(),
                lib.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())),
            ]
        ),
        "init x2 (refcount), shutdown x4": call(
            lambda lib, h: [lib.nvmlInit(), lib.nvmlInitWithFlags(1)] + [lib.nvmlShutdown() for _ in range(4)]
        ),
        "error strings": call(lambda lib, h: error_strings(lib)),
    }

    def find(name: str, arg: str) -> Callable[[], object]:
        return call(lambda lib, h: lookup(lib, name, arg))

    for form in BUS_FORMS:
        arg = fill(form, uuids, bus)
        calls[f"by_bus({arg!r})"] = find("nvmlDeviceGetHandleByPciBusId_v2", arg)
    for form in UUID_FORMS:
        arg = fill(form, uuids)
        calls[f"by_uuid({arg!r})"] = find("nvmlDeviceGetHandleByUUID", arg)
    return calls


def main() -> None:
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    uuids = [str(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    bus = str(pynvml.nvmlDeviceGetPciInfo(handles[0]).busId)
    emit(
        "host",
        {
            "uuids": uuids,
            "bus0": bus,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "nvidia-ml-py": getattr(pynvml, "__version__", None),
        },
    )
    pynvml.nvmlShutdown()
    for case in CVD_CASES:
        emit(f"CUDA_VISIBLE_DEVICES={case!r}", cuda_case(fill(case, uuids), None))
    for order in ORDER_CASES:
        emit(f"CUDA_DEVICE_ORDER={order!r}", cuda_case(None, order))
    for name, fn in cuda_calls().items():
        emit(name, forked(fn))
    # A child holding a CUDA context on card 0 makes NVML list one compute process.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, time\n"
            "c = ctypes.CDLL('libcuda.so.1'); c.cuInit(0); ctx = ctypes.c_void_p()\n"
            "c.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0); c.cuCtxSetCurrent(ctx)\n"
            "p = ctypes.c_void_p(); c.cuMemAlloc_v2(ctypes.byref(p), 1 << 30)\n"
            "print('ready', flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert holder.stdout is not None
    holder.stdout.readline()
    time.sleep(1)
    try:
        for name, fn in nvml_calls(uuids, bus).items():
            emit(name, forked(fn))
    finally:
        holder.kill()


if __name__ == "__main__":
    main()
