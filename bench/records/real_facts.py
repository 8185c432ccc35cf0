"""Record how real NVML and the real CUDA driver behave, so that the simulated GPU host can copy them.

Run on a host with NVIDIA GPUs:  python3 bench/records/real_facts.py > facts.txt
Each CUDA case runs in its own process, because the driver reads CUDA_VISIBLE_DEVICES once, at cuInit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CUDA_CHILD = r"""
import ctypes, json, sys, time
t0 = time.perf_counter()
cuda = ctypes.CDLL("libcuda.so.1")
rc = cuda.cuInit(0)
t1 = time.perf_counter()
out = {"cuInit": rc, "cuInit_s": round(t1 - t0, 4), "devices": []}
if rc == 0:
    n = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(n))
    for k in range(n.value):
        dev = ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), k)
        bus = ctypes.create_string_buffer(64)
        cuda.cuDeviceGetPCIBusId(bus, 64, dev)
        u1 = (ctypes.c_ubyte * 16)()
        u2 = (ctypes.c_ubyte * 16)()
        r1 = cuda.cuDeviceGetUuid(u1, dev)
        r2 = cuda.cuDeviceGetUuid_v2(u2, dev)
        attrs = {}
        for name, code in (("cc_major", 75), ("cc_minor", 76), ("pci_bus", 33), ("pci_device", 34),
                           ("pci_domain", 50)):
            v = ctypes.c_int()
            attrs[name] = (cuda.cuDeviceGetAttribute(ctypes.byref(v), code, dev), v.value)
        out["devices"].append({"k": k, "bus": bus.value.decode(), "uuid_v1": (r1, bytes(u1).hex()),
                               "uuid_v2": (r2, bytes(u2).hex()), "attrs": attrs})
print(json.dumps(out))
"""


def cuda_case(env_extra: dict[str, str | None]) -> dict[str, object]:
    env = dict(os.environ)
    for k, v in env_extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CUDA_CHILD], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    try:
        res: dict[str, object] = json.loads(p.stdout)
    except ValueError:
        res = {"stdout": p.stdout, "stderr": p.stderr[-400:], "rc": p.returncode}
    res["wall_s"] = round(wall, 3)
    return res


def main() -> None:
    print("## nvidia-smi")
    print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout)
    q = "index,uuid,pci.bus_id,name,compute_cap,memory.total,mig.mode.current"
    print(subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True).stdout)
    print("## pynvml")
    t0 = time.perf_counter()
    import pynvml

    t1 = time.perf_counter()
    pynvml.nvmlInit()
    t2 = time.perf_counter()
    print(f"import pynvml {t1 - t0:.4f}s nvmlInit {t2 - t1:.4f}s file {pynvml.__file__}")
    try:
        from importlib.metadata import version

        print("nvidia-ml-py", version("nvidia-ml-py"))
    except Exception as e:
        print("version?", e)
    print("driver", pynvml.nvmlSystemGetDriverVersion(), "cuda", pynvml.nvmlSystemGetCudaDriverVersion())
    uuids = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuids.append(uuid)
        try:
            mig = pynvml.nvmlDeviceGetMigMode(h)
        except pynvml.NVMLError as e:
            mig = f"error {e}"
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        print(
            json.dumps(
                {
                    "index": i,
                    "uuid": uuid,
                    "name": pynvml.nvmlDeviceGetName(h),
                    "busId": pci.busId,
                    "busIdLegacy": pci.busIdLegacy,
                    "domain": pci.domain,
                    "bus": pci.bus,
                    "device": pci.device,
                    "pciDeviceId": hex(pci.pciDeviceId),
                    "minor": pynvml.nvmlDeviceGetMinorNumber(h),
                    "cc": pynvml.nvmlDeviceGetCudaComputeCapability(h),
                    "mig": mig,
                    "mem_total": mem.total,
                    "mem_used": mem.used,
                    "procs": len(procs),
                    "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                }
            )
        )
        bus = pci.busId
        short = bus.split(":", 1)[1]
        for form in (bus, bus.lower(), "0000:" + short, short, short.lower(), bus[4:]):
            t = time.perf_counter()
            try:
                hh = pynvml.nvmlDeviceGetHandleByPciBusId(form)
                got = pynvml.nvmlDeviceGetUUID(hh)
            except pynvml.NVMLError as e:
                got = f"error {e}"
            print(f"  byPciBusId({form!r}) -> {got}  {1e6 * (time.perf_counter() - t):.0f}us")
        for form in (uuid, uuid.lower(), uuid.upper(), uuid[:10], uuid[4:]):
            try:
                got = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByUUID(form))
            except pynvml.NVMLError as e:
                got = f"error {e}"
            print(f"  byUUID({form!r}) -> {got}")
    print("## CUDA_VISIBLE_DEVICES cases (CUDA_DEVICE_ORDER unset unless named)")
    u0, u1 = uuids[0], uuids[-1]
    # the longest shared string prefix of the two UUIDs (an ambiguous CUDA prefix)
    common = u0[: next((i for i, (a, b) in enumerate(zip(u0, u1)) if a != b), min(len(u0), len(u1)))]
    cases: list[tuple[str, dict[str, str | None]]] = [
        ("unset", {"CUDA_VISIBLE_DEVICES": None}),
        ("PCI_BUS_ID order", {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}),
    ]
    for v in [
        "0",
        "1",
        "1,0",
        "0,0",
        "1,1",
        "1,0,1",
        "0,7,1",
        "bogus",
        "",
        " 1",
        "1 ",
        "1, 0",
        "01",
        "-1",
        "0,-1,1",
        "1abc",
        "1,bogus,0",
        u1,
        u1[4:],
        u1.lower(),
        u1.upper(),
        u1[:10],
        u1[:10].lower(),
        "gpu" + u1[3:10],
        common + "x" if len(common) > 4 else "GPU-",
        common,
        f"{u1},{u0}",
        f"{u1},1",
        f"{u1},0",
        "MIG-" + u1[4:],
    ]:
        cases.append((f"CVD={v!r}", {"CUDA_VISIBLE_DEVICES": v}))
    for name, env in cases:
        print(name, json.dumps(cuda_case(env)))
    print("## torch under CUDA_VISIBLE_DEVICES=1,0, CUDA_DEVICE_ORDER=PCI_BUS_ID")
    child = (
        "import time,json;t=time.perf_counter();import torch;t1=time.perf_counter();"
        "n=torch.cuda.device_count();ps=[torch.cuda.get_device_properties(k) for k in range(n)];"
        "t2=time.perf_counter();"
        "print(json.dumps({'import_s':round(t1-t,3),'props_s':round(t2-t1,3),'torch':torch.__version__,"
        "'devs':[{f:str(getattr(p,f,'MISSING')) for f in ('name','uuid','pci_domain_id','pci_bus_id',"
        "'pci_device_id','major','minor','total_memory')} for p in ps]}))"
    )
    torch_env = dict(os.environ, CUDA_VISIBLE_DEVICES="1,0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    p = subprocess.run([sys.executable, "-c", child], env=torch_env, capture_output=True, text=True)
    print(p.stdout, p.stderr[-600:])


if __name__ == "__main__":
    main()
