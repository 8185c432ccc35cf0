"""Pins the simulated GPU host (tests/fakegpu): the fake NVML, the fake CUDA driver and the fake
nvidia-container-runtime-hook. The fakes are the yardstick for everything else, so each rule they
follow is asserted here through the real nvidia-ml-py and ctypes, in subprocesses (a process loads
a library once, so each topology/environment gets its own)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import pytest

from tests.support.fakegpu import (
    BUILD,
    H200_0,
    H200_1,
    HOOK,
    LIB,
    NVML_INIT,
    RUNTIME,
    SRC,
    make_fakegpu,
    run_py,
    write_json,
)
from tests.support.scenarios import SCENARIOS, gpus, mig_devices, names, uuids

MIXED = SCENARIOS / "mixed-4.json"
MIG = SCENARIOS / "mig.json"
DGX = SCENARIOS / "dgx-8.json"

# mixed-4, in PCI order: nvidia-smi's 0..3.
MIXED_PCI_ORDER = uuids("mixed-4")
A800_1B, RTX_3B, A800_86, A800_AF = MIXED_PCI_ORDER
MIXED_FASTEST_FIRST = [RTX_3B, A800_1B, A800_86, A800_AF]
A800, RTX = names("mixed-4")[:2]

# mig.json: an A100 in MIG mode at 07, a whole A100 at 0F.
MIG_PARENT, A100_0F = uuids("mig")
MIG_GI1, MIG_GI2 = mig_devices("mig")
MIG_NAME = gpus("mig")[0]["mig"]["devices"][0]["name"]


@pytest.fixture(scope="session", autouse=True)
def fakegpu_build() -> Path:
    """Builds build/fakegpu as the top-level `make fakegpu` does; make keeps it incremental."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("make and a C compiler are needed to build tests/fakegpu")
    make_fakegpu()
    return BUILD


# ---------------------------------------------------------------- harness ----


def cuda_list(topology: Path, visible: Optional[str] = None, order: Optional[str] = None) -> Any:
    return run_py("out(cuda_devices())", topology, {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": order}).value


def cuda_uuids(result: Mapping[str, Any]) -> list[str]:
    return [d["uuid"] for d in result["devices"]]


def bare(uuids: list[str]) -> list[str]:
    """UUIDs as CUDA's 16 bytes print them: no GPU-/MIG- prefix."""
    return [u[4:] for u in uuids]


def scenario(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCENARIOS / name).read_text())
    return data


@pytest.fixture()
def h200_host(tmp_path: Path) -> Path:
    gpus = [
        {"uuid": u, "name": "NVIDIA H200", "bus_id": b, "compute_capability": "9.0", "memory_total_mib": 143771}
        for u, b in ((H200_0, "0000:18:00.0"), (H200_1, "0000:2A:00.0"))
    ]
    return write_json(tmp_path / "h200.json", {"gpus": gpus})


# ------------------------------------------------------- build, scenarios ----


def test_build_outputs() -> None:
    for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
        assert (LIB / lib).is_file()
    assert os.stat(HOOK).st_mode & 0o777 == 0o755
    first = HOOK.read_text().splitlines()[0]
    assert first.startswith("#!/") and os.access(first[2:], os.X_OK)


def test_build_is_incremental() -> None:
    outputs = [LIB / "libnvidia-ml.so.1", LIB / "libcuda.so.1", HOOK]
    before = [p.stat().st_mtime_ns for p in outputs]
    make_fakegpu()
    assert [p.stat().st_mtime_ns for p in outputs] == before


def test_libraries_need_only_libc() -> None:
    for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
        dyn = subprocess.run(["readelf", "-d", str(LIB / lib)], capture_output=True, text=True, check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
        assert needed == ["libc.so.6"]
        assert f"Library soname: [{lib}]" in dyn


def test_mixed4_scenario() -> None:
    data = scenario("mixed-4.json")
    gpus = data["gpus"]
    assert [g["uuid"] for g in gpus] == MIXED_PCI_ORDER
    assert [g["bus_id"] for g in gpus] == [
        "00000000:1B:00.0",
        "00000000:3B:00.0",
        "00000000:86:00.0",
        "00000000:AF:00.0",
    ]
    assert [g["name"] for g in gpus] == [A800, RTX, A800, A800]
    assert [g["compute_capability"] for g in gpus] == ["8.0", "8.9", "8.0", "8.0"]
    assert gpus[1]["memory_total_mib"] == 24564
    hexes = [u[4:].replace("-", "") for u in MIXED_PCI_ORDER]
    assert len({h[:6] for h in hexes}) == 4
    assert hexes[0][:2] == hexes[2][:2] and len({h[:2] for h in hexes}) == 3
    assert gpus[2]["processes"] and gpus[2]["memory_used_mib"] and gpus[2]["utilization_gpu"]


def test_fault_scenarios_are_mixed4() -> None:
    base = scenario("mixed-4.json")
    unknown = scenario("fault-nvml-unknown.json")
    assert unknown["gpus"] == base["gpus"] and unknown["faults"] == {"nvml_init": "unknown_error"}
    lost = scenario("fault-lost.json")
    assert [g.pop("lost", False) for g in lost["gpus"]] == [False, False, True, False]
    assert lost["gpus"] == base["gpus"]
    misroute = scenario("fault-misroute.json")
    assert misroute["gpus"] == base["gpus"] and misroute["faults"] == {"hook_expose": {RTX_3B: A800_86}}


def test_dgx8_and_mig_scenarios() -> None:
    dgx = scenario("dgx-8.json")["gpus"]
    assert [g["bus_id"][9:11] for g in dgx] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    assert {(g["name"], g["compute_capability"]) for g in dgx} == {("NVIDIA H100 80GB HBM3", "9.0")}
    assert len({g["uuid"] for g in dgx}) == 8
    mig = scenario("mig.json")["gpus"]
    assert [g["uuid"] for g in mig] == [MIG_PARENT, A100_0F]
    assert [(d["uuid"], d["gpu_instance_id"]) for d in mig[0]["mig"]["devices"]] == [(MIG_GI1, 1), (MIG_GI2, 2)]


# ------------------------------------------------------------ topology file ----

CUDA_INIT = "out(ctypes.CDLL('libcuda.so.1').cuInit(0))"


def test_missing_topology(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    assert run_py(NVML_INIT, missing).value == ["NVMLError_DriverNotLoaded", 9, "Driver Not Loaded"]
    assert run_py(CUDA_INIT, missing).value == 100


@pytest.mark.skipif(os.path.exists("/etc/fakegpu/topology.json"), reason="this host has a default topology")
def test_unset_topology_reads_etc_fakegpu() -> None:
    assert run_py(NVML_INIT, None).value[0] == "NVMLError_DriverNotLoaded"


def cards(*gpus: dict[str, Any]) -> str:
    return json.dumps({"gpus": list(gpus)})


def card(**fields: Any) -> str:
    return cards({"uuid": A800_1B, "bus_id": "1b:00.0", **fields})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"gpus": [\n  {"uuid": "GPU-x",}\n]}', "invalid JSON at line 2 column 20"),
        ('{"gpus": []} x', "trailing characters"),
        ('{"gpus": ["\\q"]}', "bad escape"),
        ("[]", "top level: must be an object"),
        ("{}", "gpus: missing"),
        ('{"gpus": [{"bus_id": "1b:00.0"}]}', "gpus[0].uuid: missing"),
        ('{"gpus": [{"uuid": "GPU-1234", "bus_id": "1b:00.0"}]}', "gpus[0]: uuid must look like"),
        (card(bus_id="1b:00"), "gpus[0].bus_id: not a PCI bus id"),
        (card(bus_id="0:100:00.0"), "gpus[0].bus_id: not a PCI bus id"),
        (card(bus_id="0:1b:00.1"), "gpus[0].bus_id: not a PCI bus id of a GPU"),
        (card(bus_id="0:1b:20.0"), "gpus[0].bus_id: not a PCI bus id of a GPU"),
        (card(memory_total_mib=10, memory_used_mib=11), "gpus[0].memory_used_mib: integer out of range"),
        (card(memory_total_mib=1.5), "must be a non-negative integer"),
        (card(compute_capability=8), "gpus[0].compute_capability: must be a string"),
        (card(compute_capability="8"), "gpus[0].compute_capability: must be a string like"),
        (card(lost="yes"), "gpus[0].lost: must be true or false"),
        (card(processes=[{"used_memory_mib": 1}]), "gpus[0].processes[0]: pid missing"),
        (card(temperature_gpu=201), "gpus[0].temperature_gpu: integer out of range"),
        (card(power_draw_mw=-1), "gpus[0].power_draw_mw: must be a non-negative integer"),
        (card(power_limit_mw=250.5), "gpus[0].power_limit_mw: must be a non-negative integer"),
        # The same bus in two spellings: bus ids are compared as numbers.
        (
            cards({"uuid": A800_1B, "bus_id": "3b:00.0"}, {"uuid": RTX_3B, "bus_id": "0000:3B:00.0"}),
            "gpus: two GPUs have the same bus_id",
        ),
        (
            cards({"uuid": A800_1B, "bus_id": "3b:00.0"}, {"uuid": A800_1B, "bus_id": "1b:00.0"}),
            "gpus: two GPUs have the same uuid",
        ),
        (card(mig={"mode": 0, "devices": [{"uuid": MIG_GI1}]}), 'MIG devices need "mode": 1'),
        (card(mig={"mode": 1, "devices": [{"uuid": "GPU-" + MIG_GI1[4:]}]}), "gpus[0].mig.devices[0]: uuid must"),
        ('{"faults": {"nvml_init": "bogus"}, "gpus": []}', "faults.nvml_init: must be"),
        ("[" * 100 + "]" * 100, "nested too deeply"),
    ],
)
def test_malformed_topology(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    run = run_py(NVML_INIT, path)
    assert run.value == ["NVMLError_Unknown", 999, "Unknown Error"]
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fakegpu: {path}: ") and problem in lines[0], lines
    assert run_py(CUDA_INIT, path).value == 999


def test_parser_details(tmp_path: Path) -> None:
    """Escapes decode to UTF-8, unknown keys are ignored, the last duplicate key wins (as in Python)."""
    gpu = (
        f'{{"uuid": "{A800_1B}", "bus_id": "1b:00.0", "name": "Caf\\u00e9 \\ud83d\\ude80 \\"GPU\\"",'
        ' "future_key": {"a": [ ]}, "memory_total_mib": 1, "memory_total_mib": 2048}'
    )
    text = (
        f'{{"comment": {{"nested": [1, -2.5e3, true, false, null, "x"]}}, "driver_version": "1.2.3", "gpus": [{gpu}]}}'
    )
    path = tmp_path / "t.json"
    path.write_text(text)
    code = """
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out([pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20,
         pynvml.nvmlSystemGetDriverVersion()])
    """
    run = run_py(code, path)
    assert run.value == ['Café 🚀 "GPU"', 2048, "1.2.3"]
    assert run.stderr == ""


# ------------------------------------------------------------------- NVML ----


def test_nvml_enumerates_by_bus_id(tmp_path: Path) -> None:
    """JSON order does not matter, bus ids in any form are parsed as numbers; the minor number is the
    card's position in the file."""
    gpus = [
        {"uuid": A800_AF, "bus_id": "af:00.0"},
        {"uuid": A800_1B, "bus_id": "00000000:1b:00.0"},
        {"uuid": "GPU-00000000-0000-4000-8000-000000000001", "bus_id": "0001:05:00.0"},
        {"uuid": A800_86, "bus_id": "0000:86:00"},
        {"uuid": RTX_3B, "bus_id": "0:3B:00.0"},
    ]
    path = write_json(tmp_path / "t.json", {"gpus": gpus})
    code = """
    import pynvml as n
    n.nvmlInit()
    hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    out([[n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetPciInfo(h).busId, n.nvmlDeviceGetIndex(h),
          n.nvmlDeviceGetMinorNumber(h)] for h in hs])
    """
    assert run_py(code, path).value == [
        [A800_1B, "00000000:1B:00.0", 0, 1],
        [RTX_3B, "00000000:3B:00.0", 1, 4],
        [A800_86, "00000000:86:00.0", 2, 3],
        [A800_AF, "00000000:AF:00.0", 3, 0],
        ["GPU-00000000-0000-4000-8000-000000000001", "00000001:05:00.0", 4, 2],
    ]


def test_nvml_mixed4_queries() -> None:
    code = """
    import pynvml as n
    n.nvmlInit()
    res = {"count": n.nvmlDeviceGetCount(), "driver": n.nvmlSystemGetDriverVersion(),
           "nvml": n.nvmlSystemGetNVMLVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
           "cuda2": n.nvmlSystemGetCudaDriverVersion_v2(), "cards": []}
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        p = n.nvmlDeviceGetPciInfo_v3(h)
        m1, m2 = n.nvmlDeviceGetMemoryInfo(h), n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
        u = n.nvmlDeviceGetUtilizationRates(h)
        res["cards"].append({
            "uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h),
            "pci": [p.busId, p.busIdLegacy, p.domain, p.bus, p.device, hex(p.pciDeviceId)],
            "mem": [m1.total >> 20, m1.used >> 20, m1.free >> 20],
            "mem2": [m2.total >> 20, m2.reserved, m2.used >> 20, m2.free >> 20],
            "util": [u.gpu, u.memory], "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
            "mig": n.nvmlDeviceGetMigMode(h), "max_mig": n.nvmlDeviceGetMaxMigDeviceCount(h),
            "is_mig": bool(n.nvmlDeviceIsMigDeviceHandle(h).value),
            "gi": nvml_err(n.nvmlDeviceGetGpuInstanceId, h)[0],
            "procs": [[p.pid, p.usedGpuMemory >> 20, p.gpuInstanceId, p.computeInstanceId]
                      for p in n.nvmlDeviceGetComputeRunningProcesses(h)],
            "procs2": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)],
        })
    out(res)
    """
    res = run_py(code, MIXED).value
    assert (res["count"], res["driver"], res["nvml"], res["cuda"], res["cuda2"]) == (
        4,
        "580.159.04",
        "13.580.159.04",
        13000,
        13000,
    )
    cards = res["cards"]
    assert [c["uuid"] for c in cards] == MIXED_PCI_ORDER
    assert [c["name"] for c in cards] == [A800, RTX, A800, A800]
    assert cards[1]["pci"] == ["00000000:3B:00.0", "0000:3B:00.0", 0, 0x3B, 0, "0x268410de"]
    assert cards[0]["pci"][5] == "0x20f310de"
    assert cards[1]["mem"] == [24564, 0, 24564]
    assert cards[2]["mem"] == [81920, 40962, 40958]
    assert cards[2]["mem2"] == [81920, 0, 40962, 40958]
    assert [c["util"] for c in cards] == [[0, 0], [0, 0], [87, 45], [0, 0]]
    assert [c["cc"] for c in cards] == [[8, 0], [8, 9], [8, 0], [8, 0]]
    assert all(c["mig"] == [0, 0] and c["max_mig"] == 0 and not c["is_mig"] for c in cards)
    assert {c["gi"] for c in cards} == {"NVMLError_InvalidArgument"}  # measured on a whole H200
    assert [c["procs"] for c in cards] == [[], [], [[4242, 40448, 0xFFFFFFFF, 0xFFFFFFFF]], []]
    assert [c["procs2"] for c in cards] == [[], [], [4242], []]


def test_nvml_temperature_and_power(tmp_path: Path) -> None:
    """Temperature (C) and power draw / limit (mW) as the scenario gives them; a reading the topology leaves out
    (or sets to null) is NOT_SUPPORTED, as on a card without that sensor; a MIG handle has none of its own."""
    code = """
    import pynvml as n
    n.nvmlInit()
    res = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        res.append([nvml_err(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
                    or n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                    nvml_err(n.nvmlDeviceGetPowerUsage, h) or n.nvmlDeviceGetPowerUsage(h),
                    nvml_err(n.nvmlDeviceGetEnforcedPowerLimit, h) or n.nvmlDeviceGetEnforcedPowerLimit(h),
                    nvml_err(n.nvmlDeviceGetPowerManagementLimit, h) or n.nvmlDeviceGetPowerManagementLimit(h)])
    h = n.nvmlDeviceGetHandleByIndex(0)
    res.append(nvml_err(n.nvmlDeviceGetTemperature, h, 1)[0])  # a sensor other than the GPU's
    out(res)
    """
    assert run_py(code, MIXED).value == [
        [31, 61250, 400000, 400000],
        [36, 21480, 450000, 450000],
        [71, 312460, 400000, 400000],
        [30, 60800, 400000, 400000],
        "NVMLError_InvalidArgument",
    ]
    unsupported = ["NVMLError_NotSupported", 3, "Not Supported"]
    path = write_json(
        tmp_path / "t.json",
        {"gpus": [{"uuid": A800_1B, "bus_id": "1b:00.0", "temperature_gpu": 40, "power_draw_mw": None}]},
    )
    assert run_py(code, path).value == [[40, unsupported, unsupported, unsupported], "NVMLError_InvalidArgument"]
    mig = """
    import pynvml as n
    n.nvmlInit()
    m = n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
    out([nvml_err(n.nvmlDeviceGetTemperature, m, 0)[0], nvml_err(n.nvmlDeviceGetPowerUsage, m)[0],
         n.nvmlDeviceGetTemperature(n.nvmlDeviceGetHandleByIndex(0), 0)])
    """
    assert run_py(mig, MIG).value == ["NVMLError_NotSupported", "NVMLError_NotSupported", 38]


def test_nvml_process_memory_not_available(tmp_path: Path) -> None:
    """`"used_memory_mib": null` is NVML_VALUE_NOT_AVAILABLE, which nvidia-ml-py turns into None."""
    path = write_json(
        tmp_path / "t.json",
        {
            "gpus": [
                {
                    "uuid": A800_1B,
                    "bus_id": "1b:00.0",
                    "processes": [{"pid": 7, "used_memory_mib": None}, {"pid": 8, "used_memory_mib": 12}],
                }
            ]
        },
    )
    code = """
    import pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    out([[p.pid, p.usedGpuMemory] for p in n.nvmlDeviceGetComputeRunningProcesses(h)])
    """
    assert run_py(code, path).value == [[7, None], [8, 12 << 20]]


def test_nvml_handles_by_uuid_and_bus_id() -> None:
    """Lookups as measured on real NVML (docs/cuda-visible-devices.md): bus ids are read like sscanf's
    %x fields; UUIDs match exactly, or without "GPU-"."""
    code = f"""
    import pynvml as n
    n.nvmlInit()
    idx = lambda h: n.nvmlDeviceGetIndex(h)
    forms = ["3b:00.0", "3B:00.0", "0000:3B:00.0", "00000000:3b:00.0", "0:3b:0", "0:3b:00.0", "000000000:3b:00.0",
             "0000:03b:000.0", "0x0:0x3b:0x0.0", " 0000:3b:00.0", "+0:3b:0.00"]
    err = lambda f, args: [nvml_err(f, a)[0] for a in args]
    out({{"bus": [idx(n.nvmlDeviceGetHandleByPciBusId(f)) for f in forms],
          "uuid": [idx(n.nvmlDeviceGetHandleByUUID(u)) for u in {MIXED_PCI_ORDER!r} + ["{RTX_3B[4:]}"]],
          "bad_uuid": err(n.nvmlDeviceGetHandleByUUID, ["{RTX_3B.upper()}", "{RTX_3B[4:].upper()}", "{RTX_3B[:-1]}",
              "GPU-95c6a38a", "", "{MIG_GI1}", "gpu-{RTX_3B[4:]}", "MIG-{RTX_3B[4:]}", "{RTX_3B} ",
              "{RTX_3B[4:].replace("-", "")}"]),
          "bus_missing": err(n.nvmlDeviceGetHandleByPciBusId, ["0000:3C:00.0", "0001:3B:00.0", "0000:3B:1f.0",
              "0000:3B:20.0", "0000:13B:00.0"]),
          "bus_invalid": err(n.nvmlDeviceGetHandleByPciBusId, ["3b", "zz:00.0", "3b:00", "", "0000:3b:00.0 ",
              "0000:3B:00.1", "0:3b:0.8", "0000:3b:00.0.0"]),
          "index_out_of_range": nvml_err(n.nvmlDeviceGetHandleByIndex, 4)[0]}})
    """
    res = run_py(code, MIXED).value
    assert res["bus"] == [1] * 11
    assert res["uuid"] == [0, 1, 2, 3, 1]
    assert res["bad_uuid"] == ["NVMLError_NotFound"] * 10
    assert res["bus_missing"] == ["NVMLError_NotFound"] * 5
    assert res["bus_invalid"] == ["NVMLError_InvalidArgument"] * 8
    assert res["index_out_of_range"] == "NVMLError_InvalidArgument"


def test_nvml_raw_abi() -> None:
    """What pynvml does not exercise: old struct layouts, buffer sizes, NULLs, bad handles,
    the two-call process protocol step by step."""
    code = """
    c = ctypes.CDLL("libnvidia-ml.so.1")
    res = {"init": c.nvmlInit_v2()}
    h = ctypes.c_void_p()
    assert c.nvmlDeviceGetHandleByIndex_v2(2, ctypes.byref(h)) == 0
    buf = ctypes.create_string_buffer(100)
    res["uuid_short"] = c.nvmlDeviceGetUUID(h, buf, 40)
    res["uuid_exact"] = [c.nvmlDeviceGetUUID(h, buf, 41), buf.value.decode()]
    res["name_short"] = c.nvmlDeviceGetName(h, buf, 5)
    res["driver_short"] = c.nvmlSystemGetDriverVersion(buf, 10)
    res["nulls"] = [c.nvmlDeviceGetUUID(h, None, 80), c.nvmlDeviceGetCount_v2(None),
                    c.nvmlDeviceGetHandleByIndex_v2(0, None), c.nvmlDeviceGetMemoryInfo(h, None),
                    c.nvmlDeviceGetHandleByUUID(None, ctypes.byref(h))]
    res["bad_handle"] = c.nvmlDeviceGetMinorNumber(ctypes.c_void_p(12345), ctypes.byref(ctypes.c_uint()))
    res["null_handle"] = c.nvmlDeviceGetMinorNumber(None, ctypes.byref(ctypes.c_uint()))
    # As measured: v1 writes busId..pciDeviceId (32 bytes), v2 adds pciSubSystemId (36).
    raw = ctypes.create_string_buffer(b"\\xab" * 80, 80)
    res["pci_v2"] = [c.nvmlDeviceGetPciInfo_v2(h, raw), raw.raw[:13].decode(), raw.raw[16:36].hex(),
                     raw.raw[36:].count(b"\\xab")]
    raw = ctypes.create_string_buffer(b"\\xab" * 80, 80)
    res["pci_v1"] = [c.nvmlDeviceGetPciInfo(h, raw), raw.raw[:13].decode(), raw.raw[16:32].hex(),
                     raw.raw[32:].count(b"\\xab")]
    mem2 = (ctypes.c_uint64 * 5)()
    mem2[0] = 1
    res["mem_v2_bad_version"] = c.nvmlDeviceGetMemoryInfo_v2(h, mem2)
    # Two-call protocol, v3 layout (24-byte entries).
    count = ctypes.c_uint(0)
    first = c.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), None)
    needed = count.value
    null_with_room = c.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(ctypes.c_uint(3)), None)
    arr = (ctypes.c_uint8 * (24 * 3))()
    count = ctypes.c_uint(3)
    second = c.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), arr)
    res["procs_v3"] = [first, needed, null_with_room, second, count.value,
                       int.from_bytes(bytes(arr[0:4]), "little"), int.from_bytes(bytes(arr[8:16]), "little") >> 20]
    # v1 layout: 16-byte entries {pid, usedGpuMemory}.
    arr1 = (ctypes.c_uint8 * 32)()
    count = ctypes.c_uint(2)
    res["procs_v1"] = [c.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(count), arr1), count.value,
                       int.from_bytes(bytes(arr1[8:16]), "little") >> 20, bytes(arr1[16:]).count(0)]
    h0 = ctypes.c_void_p()
    c.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h0))
    count = ctypes.c_uint(0)
    res["no_procs"] = [c.nvmlDeviceGetComputeRunningProcesses_v3(h0, ctypes.byref(count), None), count.value]
    out(res)
    """
    res = run_py(code, MIXED).value
    assert res["init"] == 0
    assert res["uuid_short"] == 7 and res["uuid_exact"] == [0, A800_86]
    assert res["name_short"] == 7 and res["driver_short"] == 7
    assert res["nulls"] == [2, 2, 2, 2, 2]
    assert res["bad_handle"] == 2 and res["null_handle"] == 2
    assert res["pci_v2"] == [0, "0000:86:00.0\x00", "000000008600000000000000de10f320de10a116", 44]
    assert res["pci_v1"] == [0, "0000:86:00.0\x00", "000000008600000000000000de10f320", 48]
    assert res["mem_v2_bad_version"] == 13  # measured: FUNCTION_NOT_FOUND, not ARGUMENT_VERSION_MISMATCH
    assert res["procs_v3"] == [7, 1, 2, 0, 1, 4242, 40448]  # NULL with room: INVALID_ARGUMENT
    assert res["procs_v1"] == [0, 1, 40448, 16]
    assert res["no_procs"] == [0, 0]


def test_nvml_init_refcount_and_uninitialized() -> None:
    code = """
    import pynvml as n
    n._LoadNvmlLibrary()
    res = {"before": nvml_err(n.nvmlDeviceGetCount)[0], "shutdown_before": nvml_err(n.nvmlShutdown)[0]}
    n.nvmlInit(); n.nvmlInit()
    n.nvmlShutdown()
    res["after_one_shutdown"] = n.nvmlDeviceGetCount()
    h = n.nvmlDeviceGetHandleByIndex(0)
    n.nvmlShutdown()
    res["after_two"] = [nvml_err(n.nvmlDeviceGetCount)[0], nvml_err(n.nvmlDeviceGetUUID, h)[0],
                        nvml_err(n.nvmlSystemGetDriverVersion)[0], nvml_err(n.nvmlShutdown)[0]]
    n.nvmlInit()
    res["reinit_handle"] = n.nvmlDeviceGetUUID(h)
    codes = (0, 1, 2, 3, 6, 7, 9, 15, 16, 17, 18, 25, 31, 999, 12345)
    res["error_strings"] = {str(k): n.nvmlErrorString(k) for k in codes}
    out(res)
    """
    res = run_py(code, MIXED).value
    assert res["before"] == res["shutdown_before"] == "NVMLError_Uninitialized"
    assert res["after_one_shutdown"] == 4
    assert res["after_two"] == ["NVMLError_Uninitialized"] * 4
    assert res["reinit_handle"] == A800_1B
    assert res["error_strings"] == {
        "0": "Success",
        "1": "Uninitialized",
        "2": "Invalid Argument",
        "3": "Not Supported",
        "6": "Not Found",
        "7": "Insufficient Size",
        "9": "Driver Not Loaded",
        "15": "GPU is lost",
        "16": "GPU requires reset",
        "17": "GPU access blocked by the operating system",
        "18": "Driver/library version mismatch",
        "25": "Argument version mismatch",
        "31": "Unknown Error",
        "999": "Unknown Error",
        "12345": "Unknown Error",
    }


def test_nvml_init_fault_unknown_error() -> None:
    code = """
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_Unknown as e:
        out([e.value, str(e)])
    """
    assert run_py(code, SCENARIOS / "fault-nvml-unknown.json").value == [999, "Unknown Error"]
    # CUDA is unaffected by an NVML fault.
    assert run_py(CUDA_INIT, SCENARIOS / "fault-nvml-unknown.json").value == 0


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("driver_not_loaded", ["NVMLError_DriverNotLoaded", 9, "Driver Not Loaded"]),
        ("no_permission", ["NVMLError_NoPermission", 4, "Insufficient Permissions"]),
        (
            "lib_rm_version_mismatch",
            ["NVMLError_LibRmVersionMismatch", 18, "RM has detected an NVML/RM version mismatch."],
        ),
    ],
)
def test_nvml_init_fault_kinds(tmp_path: Path, fault: str, expected: list[Any]) -> None:
    data = scenario("mixed-4.json") | {"faults": {"nvml_init": fault}}
    assert run_py(NVML_INIT, write_json(tmp_path / "f.json", data)).value == expected


def test_nvml_lost_card() -> None:
    code = f"""
    import pynvml as n
    n.nvmlInit()
    def lost(f, *a):
        try:
            f(*a)
        except n.NVMLError_GpuIsLost as e:
            return str(e)
    out({{"count": n.nvmlDeviceGetCount(),
          "lost": [lost(n.nvmlDeviceGetHandleByIndex, 2), lost(n.nvmlDeviceGetHandleByUUID, "{A800_86}"),
                   lost(n.nvmlDeviceGetHandleByPciBusId, "86:00.0")],
          "others": [n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1, 3)]}})
    """
    res = run_py(code, SCENARIOS / "fault-lost.json").value
    assert res == {"count": 4, "lost": ["GPU is lost"] * 3, "others": [A800_1B, RTX_3B, A800_AF]}


def test_nvml_lost_card_handle_queries(tmp_path: Path) -> None:
    """A handle taken before the card fell off answers GPU_IS_LOST to every query."""
    lost, source = tmp_path / "lost.json", SCENARIOS / "fault-lost.json"
    code = f"""
    import os, shutil, pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(2)
    n.nvmlShutdown()
    shutil.copy("{source}", "{lost}")
    os.environ["FAKEGPU_TOPOLOGY"] = "{lost}"
    n.nvmlInit()
    out([nvml_err(f, h)[1] for f in (n.nvmlDeviceGetUUID, n.nvmlDeviceGetName, n.nvmlDeviceGetPciInfo,
         n.nvmlDeviceGetMemoryInfo, n.nvmlDeviceGetUtilizationRates, n.nvmlDeviceGetComputeRunningProcesses,
         n.nvmlDeviceGetMinorNumber, n.nvmlDeviceGetIndex, n.nvmlDeviceGetMigMode,
         n.nvmlDeviceGetCudaComputeCapability)])
    """
    assert run_py(code, MIXED).value == [15] * 10


def test_nvml_mig() -> None:
    code = """
    import pynvml as n
    n.nvmlInit()
    p, whole = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    res = {"count": n.nvmlDeviceGetCount(), "modes": [n.nvmlDeviceGetMigMode(p), n.nvmlDeviceGetMigMode(whole)],
           "max": [n.nvmlDeviceGetMaxMigDeviceCount(p), n.nvmlDeviceGetMaxMigDeviceCount(whole)],
           "migs": [], "missing": nvml_err(n.nvmlDeviceGetMigDeviceHandleByIndex, p, 2)[0],
           "none_on_whole": nvml_err(n.nvmlDeviceGetMigDeviceHandleByIndex, whole, 0)[0],
           "parent_procs": [x.pid for x in n.nvmlDeviceGetComputeRunningProcesses(p)],
           # nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
           "util": [nvml_err(n.nvmlDeviceGetUtilizationRates, p)[0], n.nvmlDeviceGetUtilizationRates(whole).gpu]}
    for i in range(2):
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(p, i)
        mem = n.nvmlDeviceGetMemoryInfo(m)
        res["migs"].append({
            "uuid": n.nvmlDeviceGetUUID(m), "name": n.nvmlDeviceGetName(m),
            "is_mig": n.nvmlDeviceIsMigDeviceHandle(m).value,
            "gi": n.nvmlDeviceGetGpuInstanceId(m), "ci": n.nvmlDeviceGetComputeInstanceId(m),
            "mem": [mem.total >> 20, mem.used >> 20], "bus": n.nvmlDeviceGetPciInfo(m).busId,
            "parent": n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)),
            "procs": [[x.pid, x.gpuInstanceId, x.computeInstanceId]
                      for x in n.nvmlDeviceGetComputeRunningProcesses(m)],
            "util": nvml_err(n.nvmlDeviceGetUtilizationRates, m)[0],
            "by_uuid": n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(m))),
        })
    res["parent_of_whole"] = nvml_err(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, whole)[0]
    out(res)
    """
    res = run_py(code, MIG).value
    assert res["count"] == 2
    assert res["modes"] == [[1, 1], [0, 0]]
    assert res["max"] == [7, 0]
    assert res["missing"] == res["none_on_whole"] == "NVMLError_NotFound"
    assert res["parent_procs"] == [5151]
    assert res["util"] == ["NVMLError_NotSupported", 0]
    assert res["parent_of_whole"] == "NVMLError_InvalidArgument"
    m1, m2 = res["migs"]
    assert m1 == {
        "uuid": MIG_GI1,
        "name": MIG_NAME,
        "is_mig": 1,
        "gi": 1,
        "ci": 0,
        "mem": [20096, 0],
        "bus": "00000000:07:00.0",
        "parent": MIG_PARENT,
        "procs": [],
        "util": "NVMLError_NotSupported",
        "by_uuid": MIG_GI1,
    }
    assert (m2["uuid"], m2["gi"], m2["mem"], m2["procs"]) == (MIG_GI2, 2, [20096, 2560], [[5151, 2, 0]])


# ------------------------------------------------------------------- CUDA ----


def test_cuda_fastest_first_vs_pci_bus_id() -> None:
    """The 4090 (8.9) comes first by default, so cuda:1 is the A800 at 1B, nvidia-smi's 0."""
    default = cuda_list(MIXED)
    assert default["rc"] == 0
    assert cuda_uuids(default) == bare(MIXED_FASTEST_FIRST)
    assert cuda_uuids(cuda_list(MIXED, order="FASTEST_FIRST")) == bare(MIXED_FASTEST_FIRST)
    assert cuda_uuids(cuda_list(MIXED, order="PCI_BUS_ID")) == bare(MIXED_PCI_ORDER)
    rtx = default["devices"][0]
    assert rtx == {
        "name": RTX,
        "bus": "0000:3B:00.0",
        "uuid": RTX_3B[4:],
        "uuid_v1": RTX_3B[4:],
        "mem_mib": 24564,
        "attrs": {"16": 128, "33": 0x3B, "34": 0, "50": 0, "75": 8, "76": 9},
    }
    assert default["devices"][1]["attrs"]["16"] == 108


# CUDA_VISIBLE_DEVICES -> (cuInit result, devices), each as measured on the real 2xH200 host
# (docs/cuda-visible-devices.md and the probes of this module's history), on a copy of that host.
H200_FACTS: list[tuple[Optional[str], int, list[str]]] = [
    (None, 0, [H200_0, H200_1]),
    ("1", 0, [H200_1]),
    (H200_1, 0, [H200_1]),
    ("GPU-425589", 0, [H200_1]),  # a unique prefix
    ("1,0", 0, [H200_1, H200_0]),
    ("0,7,1", 0, [H200_0]),  # the first invalid entry ends the list
    ("bogus", 100, []),
    ("", 100, []),
    # Indices are read like strtol: blanks before, a sign, leading digits; the rest is ignored.
    (" 1", 0, [H200_1]),
    ("1 ", 0, [H200_1]),
    ("1, 0", 0, [H200_1, H200_0]),
    ("01", 0, [H200_1]),
    ("+1", 0, [H200_1]),
    ("1abc", 0, [H200_1]),
    ("1.5", 0, [H200_1]),
    ("1 0", 0, [H200_1]),
    ("0x1", 0, [H200_0]),
    ("0,+1", 0, [H200_0, H200_1]),
    ("-1", 100, []),
    ("0,-1,1", 0, [H200_0]),
    ("99999999999999999999", 100, []),
    ("  ", 100, []),
    # Empty entries end the list.
    ("0,,1", 0, [H200_0]),
    ("1,0,", 0, [H200_1, H200_0]),
    (",1", 100, []),
    # A device listed twice fails cuInit as a whole, unless the list ended before it.
    ("0,0", 101, []),
    ("1,0,1", 101, []),
    ("0,1,,0", 0, [H200_0, H200_1]),
    (f"{H200_1},{H200_1}", 101, []),
    (f"{H200_1},GPU-4255", 101, []),
    # UUIDs: the "GPU-"/"MIG-" tag as written, then hex digits in any case, dashes skipped.
    ("GPU-42558917-3C6B-4E2A-8F0D-B1A2C3D4E5F6", 0, [H200_1]),
    ("GPU-425589173c6b4e2a8f0db1a2c3d4e5f6", 0, [H200_1]),
    ("GPU--4255-89", 0, [H200_1]),
    ("MIG-425589", 0, [H200_1]),  # either tag finds either kind of device
    (f"MIG-{H200_1[4:]}", 0, [H200_1]),
    ("gpu-425589", 100, []),
    ("42558917-3c6b-4e2a-8f0d-b1a2c3d4e5f6", 100, []),
    (f" {H200_1}", 100, []),  # no blank before the tag
    ("GPU-", 100, []),
    ("GPU-4x", 100, []),  # the x is compared, and matches nothing
    ("GPU-4255 ", 100, []),
    (f"MIG-{H200_1}", 100, []),  # old MIG-GPU-... names
    # Past the 32 digits of a full UUID, the rest of the entry is ignored.
    (f"{H200_1} ", 0, [H200_1]),
    (f"{H200_1}x", 0, [H200_1]),
    (f"{H200_1}ab", 0, [H200_1]),
    (f"{H200_1}{H200_0[4:]}", 0, [H200_1]),
    # The first entry fixes the kind: an entry of the other kind ends the list.
    (f"{H200_1},{H200_0}", 0, [H200_1, H200_0]),
    (f"{H200_1},0", 0, [H200_1]),
    (f"{H200_1},1", 0, [H200_1]),
    (f"{H200_1}, {H200_0}", 0, [H200_1]),
    (f"{H200_1},,{H200_0}", 0, [H200_1]),
    (f"{H200_1},bogus,{H200_0}", 0, [H200_1]),
    (f"0,{H200_1}", 0, [H200_0]),
    (f"0,{H200_0}", 0, [H200_0]),
    ("1,GPU-4255", 0, [H200_1]),
]


@pytest.mark.parametrize(("visible", "rc", "expected"), H200_FACTS)
def test_cuda_visible_devices_real_facts(h200_host: Path, visible: Optional[str], rc: int, expected: list[str]) -> None:
    res = cuda_list(h200_host, visible)
    assert (res["rc"], cuda_uuids(res)) == (rc, bare(expected))


@pytest.mark.parametrize(
    ("order", "rc"),
    [
        ("FASTEST_FIRST", 0),
        ("PCI_BUS_ID", 0),
        ("", 101),
        ("pci_bus_id", 101),
        ("PCI_BUS_ID ", 101),
        ("fastest_first", 101),
    ],
)
def test_cuda_device_order_values(h200_host: Path, order: str, rc: int) -> None:
    """Only the two documented values are accepted, as measured; anything else fails cuInit."""
    assert cuda_list(h200_host, order=order)["rc"] == rc


@pytest.mark.parametrize(
    ("visible", "order", "expected"),
    [
        ("1", None, [A800_1B]),
        ("1", "PCI_BUS_ID", [RTX_3B]),
        ("GPU-6c", None, []),  # ambiguous: two cards start with 6c
        ("GPU-6C3", None, [A800_1B]),
        (f"{A800_AF},GPU-6c,{RTX_3B}", None, [A800_AF]),  # an ambiguous prefix ends the list
        ("GPU-6cd,GPU-e2", None, [A800_86, A800_AF]),
        ("3,2,1,0", "PCI_BUS_ID", MIXED_PCI_ORDER[::-1]),
        (MIG_GI1, None, []),
    ],
)
def test_cuda_visible_devices_mixed4(visible: str, order: Optional[str], expected: list[str]) -> None:
    assert cuda_uuids(cuda_list(MIXED, visible, order)) == bare(expected)


def test_cuda_lost_card_is_not_enumerated() -> None:
    lost = SCENARIOS / "fault-lost.json"
    assert cuda_uuids(cuda_list(lost, order="PCI_BUS_ID")) == bare([A800_1B, RTX_3B, A800_AF])
    assert cuda_uuids(cuda_list(lost, A800_86)) == []


def test_cuda_mig() -> None:
    everything = cuda_list(MIG)
    assert cuda_uuids(everything) == bare([MIG_GI1, MIG_GI2, A100_0F])
    assert [d["uuid_v1"] for d in everything["devices"]] == bare([MIG_PARENT, MIG_PARENT, A100_0F])
    one = cuda_list(MIG, MIG_GI2)["devices"]
    assert one == [
        {
            "name": MIG_NAME,
            "bus": "0000:07:00.0",
            "uuid": MIG_GI2[4:],
            "uuid_v1": MIG_PARENT[4:],
            "mem_mib": 20096,
            "attrs": {"16": 52, "33": 7, "34": 0, "50": 0, "75": 8, "76": 0},
        }
    ]
    assert cuda_uuids(cuda_list(MIG, "MIG-4337")) == bare([MIG_GI2])
    assert cuda_uuids(cuda_list(MIG, "GPU-4337")) == bare([MIG_GI2])  # either tag, as measured on whole GPUs
    assert cuda_uuids(cuda_list(MIG, f"{MIG_GI2},{A100_0F},{MIG_GI1}")) == bare([MIG_GI2, A100_0F, MIG_GI1])
    # The parent in MIG mode is not a CUDA device.
    assert cuda_list(MIG, MIG_PARENT)["rc"] == 100
    assert cuda_uuids(cuda_list(MIG, "MIG-")) == []


def test_cuda_calls_and_errors(tmp_path: Path) -> None:
    code = """
    c = ctypes.CDLL("libcuda.so.1")
    n, dev, v = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    buf = ctypes.create_string_buffer(64)
    res = {"before": [c.cuDeviceGetCount(ctypes.byref(n)), c.cuDeviceGet(ctypes.byref(dev), 0),
                      c.cuDeviceGetName(buf, 64, 0)],
           "version_before_init": [c.cuDriverGetVersion(ctypes.byref(v)), v.value],
           "flags": c.cuInit(1), "init": c.cuInit(0), "again": c.cuInit(0)}
    res["get"] = [c.cuDeviceGet(ctypes.byref(dev), 3), dev.value, c.cuDeviceGet(ctypes.byref(dev), 4),
                  c.cuDeviceGet(None, 0), c.cuDeviceGetCount(None)]
    res["bad_ordinal"] = [c.cuDeviceGetName(buf, 64, 4), c.cuDeviceGetName(buf, 64, -1),
                          c.cuDeviceTotalMem_v2(ctypes.byref(ctypes.c_size_t()), 9)]
    res["nulls"] = [c.cuDeviceGetName(None, 64, 0), c.cuDeviceGetName(buf, 0, 0),
                    c.cuDeviceGetAttribute(None, 75, 0), c.cuDeviceGetUuid_v2(None, 0), c.cuDriverGetVersion(None)]
    res["attr_unknown"] = c.cuDeviceGetAttribute(ctypes.byref(v), 1, 0)
    short = ctypes.create_string_buffer(b"\\xab" * 8, 8)
    res["short_bus"] = [c.cuDeviceGetPCIBusId(short, 5, 0), short.raw[:5].decode(), short.raw[5:].hex()]
    exact = ctypes.create_string_buffer(13)
    res["exact_bus"] = [c.cuDeviceGetPCIBusId(exact, 13, 0), exact.value.decode()]
    short = ctypes.create_string_buffer(b"\\xab" * 8, 8)
    res["short_name"] = [c.cuDeviceGetName(short, 5, 0), short.raw[:5].decode(), short.raw[5:].hex()]
    padded = ctypes.create_string_buffer(b"\\xab" * 32, 32)
    res["padded_name"] = [c.cuDeviceGetName(padded, 30, 0), padded.raw.hex()]
    raw = (ctypes.c_uint8 * 8)(*([0xAB] * 8))
    res["total_mem_bad_ordinal"] = [c.cuDeviceTotalMem_v2(raw, 9), bytes(raw).hex()]
    # The unversioned cuDeviceTotalMem keeps the 32-bit ABI.
    raw = (ctypes.c_uint8 * 8)(*([0xAB] * 8))
    res["total_mem_v1"] = [c.cuDeviceTotalMem(raw, 0), int.from_bytes(bytes(raw[:4]), "little"), bytes(raw[4:]).hex()]
    s = ctypes.c_char_p()
    res["strings"] = []
    for code in (0, 1, 3, 100, 101, 999, 12345):
        r1 = c.cuGetErrorString(code, ctypes.byref(s)); t = s.value
        r2 = c.cuGetErrorName(code, ctypes.byref(s)); nm = s.value
        res["strings"].append([r1, t and t.decode(), r2, nm and nm.decode()])
    out(res)
    """
    res = run_py(code, MIXED).value
    assert res["before"] == [3, 3, 3]
    assert res["version_before_init"] == [0, 13000]
    assert (res["flags"], res["init"], res["again"]) == (1, 0, 0)
    assert res["get"] == [0, 3, 101, 1, 1]
    assert res["bad_ordinal"] == [101, 101, 101]
    assert res["nulls"] == [1, 1, 1, 1, 1]
    assert res["attr_unknown"] == 1
    # As measured: a short buffer gets the truncated, terminated text; an id that does not fit is an error.
    assert res["short_bus"] == [1, "0000\x00", "ababab"]
    assert res["exact_bus"] == [0, "0000:3B:00.0"]
    assert res["short_name"] == [0, "NVID\x00", "ababab"]
    assert res["padded_name"] == [0, (RTX.encode() + bytes(7)).hex() + "abab"]  # NUL-padded to len
    assert res["total_mem_bad_ordinal"] == [101, "0000000000000000"]
    assert res["total_mem_v1"] == [0, 0xFFFFFFFF, "abababab"]
    assert res["strings"] == [
        [0, "no error", 0, "CUDA_SUCCESS"],
        [0, "invalid argument", 0, "CUDA_ERROR_INVALID_VALUE"],
        [0, "initialization error", 0, "CUDA_ERROR_NOT_INITIALIZED"],
        [0, "no CUDA-capable device is detected", 0, "CUDA_ERROR_NO_DEVICE"],
        [0, "invalid device ordinal", 0, "CUDA_ERROR_INVALID_DEVICE"],
        [0, "unknown error", 0, "CUDA_ERROR_UNKNOWN"],
        [1, None, 1, None],
    ]


def test_cuda_init_failure_is_sticky(tmp_path: Path) -> None:
    data = scenario("mixed-4.json") | {"cuda_driver_version": 12040, "faults": {"cuda_init": 999}}
    code = """
    c = ctypes.CDLL("libcuda.so.1")
    n, v = ctypes.c_int(), ctypes.c_int()
    out([c.cuInit(0), c.cuInit(0), c.cuDeviceGetCount(ctypes.byref(n)), c.cuDriverGetVersion(ctypes.byref(v)),
         v.value])
    """
    assert run_py(code, write_json(tmp_path / "f.json", data)).value == [999, 999, 3, 0, 12040]
    # No device is sticky too, and a later environment change does not matter.
    code = """
    import os
    c = ctypes.CDLL("libcuda.so.1")
    first = c.cuInit(0)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    out([first, c.cuInit(0)])
    """
    assert run_py(code, MIXED, {"CUDA_VISIBLE_DEVICES": ""}).value == [100, 100]


def test_both_libraries_in_one_process(tmp_path: Path) -> None:
    """Each library keeps its own topology copy (hidden symbols): one process may load both."""
    code = """
    import pynvml as n
    n.nvmlInit()
    res = cuda_devices()
    out([n.nvmlDeviceGetCount(), len(res["devices"]), n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0))])
    """
    assert run_py(code, MIXED, {"CUDA_VISIBLE_DEVICES": "2"}).value == [4, 1, A800_1B]


# ------------------------------------------------------------------- hook ----


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fakegpu_hook", SRC / "fakegpu_hook.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hook() -> Iterator[ModuleType]:
    yield load_hook()
    sys.modules.pop("fakegpu_hook", None)


@pytest.mark.parametrize(
    ("visible", "gpus", "migs"),
    [
        ("0", [A800_1B], []),
        ("2,1", [A800_86, RTX_3B], []),
        (RTX_3B, [RTX_3B], []),
        (RTX_3B.upper().replace("GPU-", "gpu-"), [RTX_3B], []),  # UUIDs compare without case
        ("00000000:3B:00.0", [RTX_3B], []),
        ("0000:3b:00.0", [RTX_3B], []),
        ("0:3b:0", [RTX_3B], []),  # sscanf-style: a domain, then two-digit fields
        ("0,0,,1", [A800_1B, RTX_3B], []),  # duplicates dropped, empty entries skipped
        ("all", MIXED_PCI_ORDER, []),
        ("1,ALL", [RTX_3B, A800_1B, A800_86, A800_AF], []),
    ],
)
def test_hook_resolve(hook: ModuleType, visible: str, gpus: list[str], migs: list[str]) -> None:
    sel = hook.resolve_devices(scenario("mixed-4.json"), visible)
    assert (sel.gpus, sel.migs) == (gpus, migs)


@pytest.mark.parametrize(
    ("visible", "bad"),
    [
        ("4", "4"),
        ("0,7", "7"),
        ("3b:00.0", "3b:00.0"),
        ("GPU-6c39be0e", "GPU-6c39be0e"),
        ("1 ", "1 "),
        ("bogus", "bogus"),
        (MIG_GI1, MIG_GI1),
        ("void", "void"),
    ],
)
def test_hook_resolve_unknown(hook: ModuleType, visible: str, bad: str) -> None:
    with pytest.raises(hook.DeviceError) as info:
        hook.resolve_devices(scenario("mixed-4.json"), visible)
    assert str(info.value) == f"nvidia-container-cli: device error: {bad}: unknown device"


def test_hook_resolve_mig(hook: ModuleType) -> None:
    topo = scenario("mig.json")
    sel = hook.resolve_devices(topo, MIG_GI2)
    assert (sel.gpus, sel.migs) == ([], [MIG_GI2])
    assert hook.resolve_devices(topo, "0:0").migs == [MIG_GI1]  # <gpu index>:<mig index>
    sel = hook.resolve_devices(topo, "all")
    assert (sel.gpus, sel.migs) == ([MIG_PARENT, A100_0F], [MIG_GI1, MIG_GI2])
    inner = hook.container_topology(topo, hook.resolve_devices(topo, MIG_GI2))
    assert [g["uuid"] for g in inner["gpus"]] == [MIG_PARENT]
    assert [d["uuid"] for d in inner["gpus"][0]["mig"]["devices"]] == [MIG_GI2]
    whole = hook.container_topology(topo, hook.resolve_devices(topo, f"{MIG_PARENT},{MIG_GI2}"))
    assert [d["uuid"] for d in whole["gpus"][0]["mig"]["devices"]] == [MIG_GI1, MIG_GI2]


def test_hook_container_topology(hook: ModuleType) -> None:
    topo = scenario("mixed-4.json") | {"faults": {"nvml_init": "unknown_error", "hook_expose_all": True}, "extra": 1}
    inner = hook.container_topology(topo, hook.resolve_devices(topo, "3,1"))
    assert [(g["uuid"], g["minor_number"]) for g in inner["gpus"]] == [(RTX_3B, 1), (A800_AF, 3)]
    assert inner["faults"] == {"nvml_init": "unknown_error"} and inner["extra"] == 1
    assert "faults" not in hook.container_topology(scenario("fault-misroute.json"), hook.Selection())


def test_hook_faults(hook: ModuleType) -> None:
    misroute = scenario("fault-misroute.json")
    sel = hook.apply_faults(misroute, hook.resolve_devices(misroute, RTX_3B))
    assert sel.gpus == [A800_86]
    sel = hook.apply_faults(misroute, hook.resolve_devices(misroute, "0"))
    assert sel.gpus == [A800_1B]
    expose_all = scenario("mixed-4.json") | {"faults": {"hook_expose_all": True}}
    assert hook.apply_faults(expose_all, hook.resolve_devices(expose_all, "0")).gpus == MIXED_PCI_ORDER


def test_hook_writes_stay_inside_rootfs(hook: ModuleType, tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    outside = tmp_path / "outside"
    (root / "usr/lib").mkdir(parents=True)
    outside.mkdir()
    (root / "etc").symlink_to(outside)  # an absolute link to a host path, as an image might carry
    (root / "lib").symlink_to("usr/lib")
    assert hook.resolve_in_root(root, "etc/fakegpu") == root / str(outside).lstrip("/") / "fakegpu"
    assert hook.resolve_in_root(root, "lib/x") == root / "usr/lib/x"
    assert hook.resolve_in_root(root, "../../x") == root / "x"


@dataclass
class HookRun:
    rc: int
    stderr: str
    rootfs: Path
    log: list[dict[str, Any]]


def run_hook(
    tmp_path: Path,
    env_list: list[str],
    topology: Optional[Path] = MIXED,
    root_path: Optional[str] = None,
    prepare: Optional[Callable[[Path], None]] = None,
    toolkit_config: Optional[str] = None,
) -> HookRun:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    rootfs = Path(root_path) if root_path else bundle / "rootfs"
    rootfs.mkdir(parents=True, exist_ok=True)
    if prepare:
        prepare(rootfs)
    config = {
        "ociVersion": "1.0.2",
        "process": {"env": env_list, "args": ["python3"]},
        "root": {"path": root_path or "rootfs"},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    state = {"ociVersion": "1.0.2", "id": "c0ffee", "status": "creating", "pid": 4321, "bundle": str(bundle)}
    log = tmp_path / "hook.log"
    env = {k: v for k, v in os.environ.items() if k != "FAKEGPU_TOPOLOGY"}
    env["FAKEGPU_HOOK_LOG"] = str(log)
    if topology is not None:
        env["FAKEGPU_TOPOLOGY"] = str(topology)
    # The toolkit's config.toml: absent (its defaults) unless a test writes one; never the host's /etc.
    env["FAKEGPU_TOOLKIT_CONFIG"] = str(tmp_path / "config.toml")
    if toolkit_config is not None:
        (tmp_path / "config.toml").write_text(toolkit_config)
    proc = subprocess.run(
        [str(HOOK), "prestart"],
        input=json.dumps(state),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=bundle,
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return HookRun(proc.returncode, proc.stderr, rootfs, [json.loads(line) for line in lines])


LIBDIR = "usr/lib/x86_64-linux-gnu"


def inner_nvml(rootfs: Path) -> Any:
    """NVML and CUDA as the container sees them: the copied libraries and the written topology."""
    code = """
    import pynvml as n
    n.nvmlInit()
    hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    out({"nvml": [[n.nvmlDeviceGetIndex(h), n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetMinorNumber(h)] for h in hs],
         "cuda": [d["uuid"] for d in cuda_devices()["devices"]]})
    """
    return run_py(code, rootfs / "etc/fakegpu/topology.json", lib=rootfs / LIBDIR).value


@pytest.mark.parametrize(
    "env_list",
    [
        [],
        ["NVIDIA_VISIBLE_DEVICES="],
        ["NVIDIA_VISIBLE_DEVICES=void"],
        ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"],
    ],
)
def test_hook_void(tmp_path: Path, env_list: list[str]) -> None:
    run = run_hook(tmp_path, env_list)
    assert (run.rc, run.stderr) == (0, "")
    assert list(run.rootfs.iterdir()) == []
    assert run.log[0]["status"] == "void" and run.log[0]["container_id"] == "c0ffee"


def test_hook_exposes_chosen_cards(tmp_path: Path) -> None:
    run = run_hook(tmp_path, ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_VISIBLE_DEVICES=3,{RTX_3B}"])
    assert (run.rc, run.stderr) == (0, "")
    for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
        assert (run.rootfs / LIBDIR / lib).read_bytes() == (LIB / lib).read_bytes()
        assert os.stat(run.rootfs / LIBDIR / lib).st_mode & 0o777 == 0o755
    written = json.loads((run.rootfs / "etc/fakegpu/topology.json").read_text())
    assert [g["uuid"] for g in written["gpus"]] == [RTX_3B, A800_AF]
    assert written["driver_version"] == "580.159.04"
    # NVML in the container sees exactly the exposed cards at 0..n-1, keeping host minor numbers.
    assert inner_nvml(run.rootfs) == {"nvml": [[0, RTX_3B, 1], [1, A800_AF, 3]], "cuda": bare([RTX_3B, A800_AF])}
    (entry,) = run.log
    assert entry["status"] == "ok" and entry["container_id"] == "c0ffee"
    assert entry["asked"] == f"3,{RTX_3B}" and entry["exposed"] == [RTX_3B, A800_AF]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [("all", MIXED_PCI_ORDER), ("none", []), ("00000000:86:00.0", [A800_86]), (A800_1B, [A800_1B])],
)
def test_hook_forms(tmp_path: Path, visible: str, expected: list[str]) -> None:
    run = run_hook(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={visible}"])
    assert run.rc == 0
    assert (run.rootfs / LIBDIR / "libcuda.so.1").exists()
    assert [u for _, u, _ in inner_nvml(run.rootfs)["nvml"]] == expected
    assert run.log[0]["exposed"] == expected


def test_hook_unknown_device(tmp_path: Path) -> None:
    run = run_hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0,7"])
    assert run.rc == 1
    assert run.stderr == "nvidia-container-cli: device error: 7: unknown device\n"
    assert list(run.rootfs.iterdir()) == []
    assert run.log[0]["status"] == "error" and run.log[0]["asked"] == "0,7"


def test_hook_misroute_fault(tmp_path: Path) -> None:
    run = run_hook(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={RTX_3B}"], SCENARIOS / "fault-misroute.json")
    assert run.rc == 0
    written = json.loads((run.rootfs / "etc/fakegpu/topology.json").read_text())
    assert [g["uuid"] for g in written["gpus"]] == [A800_86] and "faults" not in written
    assert run.log[0]["asked"] == RTX_3B and run.log[0]["exposed"] == [A800_86]


def test_hook_passes_other_faults(tmp_path: Path) -> None:
    run = run_hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=2"], SCENARIOS / "fault-nvml-unknown.json")
    assert run.rc == 0
    code = "import pynvml\ntry:\n    pynvml.nvmlInit()\nexcept pynvml.NVMLError as e:\n    out(str(e))"
    assert run_py(code, run.rootfs / "etc/fakegpu/topology.json").value == "Unknown Error"


def test_hook_mig_uuid(tmp_path: Path) -> None:
    run = run_hook(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={MIG_GI2}"], MIG)
    assert run.rc == 0
    inner = inner_nvml(run.rootfs)
    assert inner == {"nvml": [[0, MIG_PARENT, 0]], "cuda": bare([MIG_GI2])}


def test_hook_absolute_root_and_ldconfig(tmp_path: Path) -> None:
    def prepare(rootfs: Path) -> None:
        (rootfs / "etc").mkdir()
        (rootfs / "etc/ld.so.conf").write_text(f"/{LIBDIR}\n")
        (rootfs / "etc/ld.so.cache").write_bytes(b"")

    root = tmp_path / "elsewhere" / "merged"
    run = run_hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1"], root_path=str(root), prepare=prepare)
    assert run.rc == 0 and run.rootfs == root
    assert (root / "etc/fakegpu/topology.json").exists()
    if shutil.which("ldconfig") or os.access("/sbin/ldconfig", os.X_OK):
        cache = (root / "etc/ld.so.cache").read_bytes()
        assert b"libnvidia-ml.so.1" in cache and b"libcuda.so.1" in cache


def test_hook_without_topology(tmp_path: Path) -> None:
    run = run_hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], topology=tmp_path / "missing.json")
    assert run.rc == 1
    assert run.stderr == "nvidia-container-cli: initialization error: nvml error: driver not loaded\n"


def test_hook_commands(tmp_path: Path) -> None:
    assert subprocess.run([str(HOOK), "poststop"], capture_output=True, timeout=30).returncode == 0
    usage = subprocess.run([str(HOOK)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage" in usage.stderr


# -------------------------------------------------- CDI: nvidia-ctk, hook ----

CTK = BUILD / "bin" / "nvidia-ctk"
CDI_HOOK = BUILD / "bin" / "nvidia-cdi-hook"


def ctk(*args: str, topology: Optional[Path] = MIXED, log: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FAKEGPU_TOPOLOGY", "FAKEGPU_HOOK_LOG")}
    if topology is not None:
        env["FAKEGPU_TOPOLOGY"] = str(topology)
    if log is not None:
        env["FAKEGPU_HOOK_LOG"] = str(log)
    return subprocess.run([str(CTK), *args], env=env, capture_output=True, text=True, timeout=60)


def cdi_spec(topology: Path = MIXED, *args: str) -> dict[str, Any]:
    r = ctk("cdi", "generate", "--format", "json", *args, topology=topology)
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def device_of(spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    (edits,) = [d["containerEdits"] for d in spec["devices"] if d["name"] == name]
    found: dict[str, Any] = edits
    return found


def exposed(edits: Mapping[str, Any]) -> list[str]:
    """The cards a device's fakegpu-expose hook writes into the container."""
    (hook,) = [h for h in edits["hooks"] if h["args"][1] == "fakegpu-expose"]
    args = hook["args"][2:]
    assert args[::2] == ["--device"] * (len(args) // 2)
    return list(args[1::2])


def test_cdi_spec_names_every_card_and_mig_device_as_the_toolkit_does() -> None:
    spec = cdi_spec()
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [n for i, u in enumerate(MIXED_PCI_ORDER) for n in (str(i), u)] + ["all"]
    for i, uuid in enumerate(MIXED_PCI_ORDER):
        assert device_of(spec, str(i)) == device_of(spec, uuid)
        assert exposed(device_of(spec, uuid)) == [uuid]
        assert device_of(spec, uuid)["deviceNodes"] == [
            {"path": f"/dev/nvidia{i}", "type": "c", "major": 195, "minor": i}
        ]
    assert exposed(device_of(spec, "all")) == MIXED_PCI_ORDER
    mig = cdi_spec(MIG)
    assert [d["name"] for d in mig["devices"]] == ["0", MIG_PARENT, "1", A100_0F, "0:0", MIG_GI1, "0:1", MIG_GI2, "all"]
    assert exposed(device_of(mig, "0:1")) == [MIG_GI2]
    assert [n["path"] for n in device_of(mig, "0:1")["deviceNodes"]] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    assert exposed(device_of(mig, "all")) == [MIG_PARENT, A100_0F, MIG_GI1, MIG_GI2]
    typed = cdi_spec(MIG, "--device-name-strategy", "type-index")
    assert [d["name"] for d in typed["devices"]] == ["gpu0", "gpu1", "mig0:0", "mig0:1", "all"]


def test_cdi_spec_common_edits_are_the_toolkits() -> None:
    spec = cdi_spec()
    edits = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert {n["path"] for n in edits["deviceNodes"]} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (str(LIB / "libnvidia-ml.so.1"), "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.159.04"),
        (str(LIB / "libcuda.so.1"), "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"),
    ]
    assert all("ro" in m["options"] for m in edits["mounts"])
    hooks = edits["hooks"] + [h for d in spec["devices"] for h in d["containerEdits"]["hooks"]]
    assert {(h["hookName"], h["path"], h["args"][0]) for h in hooks} == {
        ("createContainer", str(CDI_HOOK), "nvidia-cdi-hook")
    }
    assert [h["args"][1] for h in edits["hooks"]] == ["create-symlinks", "update-ldcache"]


def test_cdi_spec_yaml_is_the_json_spec(tmp_path: Path) -> None:
    import yaml

    r = ctk("cdi", "generate", topology=MIG)
    assert r.returncode == 0 and r.stdout.startswith("---\n")
    assert yaml.safe_load(r.stdout) == cdi_spec(MIG)
    out = tmp_path / "nvidia.json"
    assert ctk("cdi", "generate", "--output", str(out), topology=MIG).returncode == 0
    assert json.loads(out.read_text()) == cdi_spec(MIG) and out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.json"]  # written through a rename, no leftovers


def test_cdi_spec_carries_the_misroute_fault() -> None:
    """A stale spec: the 4090's device exposes the A800 at 86:00.0, node and all."""
    spec = cdi_spec(SCENARIOS / "fault-misroute.json")
    assert exposed(device_of(spec, RTX_3B)) == [A800_86]
    assert [n["path"] for n in device_of(spec, "1")["deviceNodes"]] == ["/dev/nvidia2"]


@pytest.mark.parametrize(
    ("args", "topology", "says"),
    [
        (["cdi", "generate", "--device-name-strategy", "name"], MIXED, "invalid choice: 'name'"),
        (["cdi", "generate", "--format", "toml"], MIXED, "invalid choice: 'toml'"),
        (["cdi", "generate", "--vendor", "nvidia_com"], MIXED, "invalid CDI kind nvidia_com/gpu"),
        (["cdi", "generate"], Path("/nonexistent/topology.json"), "no topology at /nonexistent/topology.json"),
        (["cdi", "generate", "--output", "/nonexistent/dir/nvidia.yaml"], MIXED, "failed to save CDI spec"),
        (["cdi"], MIXED, "required: generate"),
    ],
    ids=["strategy", "format", "vendor", "topology", "output", "no-command"],
)
def test_ctk_refuses_bad_input_in_one_line(args: list[str], topology: Path, says: str) -> None:
    r = ctk(*args, topology=topology)
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("nvidia-ctk: ERROR: ") and says in line and "HINT: " in line, line


def run_cdi_hook(
    tmp_path: Path, args: list[str], spec_hooks: list[list[str]], prepare: Optional[Callable[[Path], None]] = None
) -> subprocess.CompletedProcess[str]:
    """Runs nvidia-cdi-hook ARGS as runc runs a createContainer hook: the OCI state on stdin, no environment but
    the hook's own; the bundle's config.json lists `spec_hooks` (argument lists) as its createContainer hooks."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    if prepare:
        prepare(bundle / "rootfs")
    hooks = [{"path": str(CDI_HOOK), "args": ["nvidia-cdi-hook", *a]} for a in spec_hooks]
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "hooks": {"createContainer": hooks}}))
    state = {"ociVersion": "1.0.2", "id": "cd1", "status": "creating", "bundle": str(bundle)}
    env = {"FAKEGPU_TOPOLOGY": str(MIXED), "FAKEGPU_HOOK_LOG": str(tmp_path / "hook.log")}
    return subprocess.run(
        [str(CDI_HOOK), *args], input=json.dumps(state), env=env, capture_output=True, text=True, timeout=60
    )


def test_cdi_hook_exposes_the_union_of_the_containers_devices(tmp_path: Path) -> None:
    """Two devices asked: two hooks, each writing both cards; the libraries see exactly those two."""
    spec_hooks = [
        ["fakegpu-expose", "--device", A800_AF],
        ["create-symlinks", "--link", "a::/b"],
        ["fakegpu-expose", "--device", RTX_3B],
    ]
    for hook_args in (spec_hooks[0], spec_hooks[2]):
        r = run_cdi_hook(tmp_path, hook_args, spec_hooks)
        assert r.returncode == 0 and r.stderr == ""
        topo = tmp_path / "bundle/rootfs/etc/fakegpu/topology.json"
        assert [g["uuid"] for g in json.loads(topo.read_text())["gpus"]] == [RTX_3B, A800_AF]
        seen = run_py(
            "import pynvml as n; n.nvmlInit(); out([n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) "
            "for i in range(n.nvmlDeviceGetCount())])",
            topo,
        ).value
        assert seen == [RTX_3B, A800_AF]
    log = [json.loads(line) for line in (tmp_path / "hook.log").read_text().splitlines()]
    assert [(r["command"], r["container_id"], r["status"], r["exposed"]) for r in log] == [
        ("fakegpu-expose", "cd1", "ok", [RTX_3B, A800_AF])
    ] * 2


def test_cdi_hook_links_stay_inside_the_root(tmp_path: Path) -> None:
    def prepare(rootfs: Path) -> None:
        (rootfs / "usr").symlink_to("/nonexistent-host-dir")  # an image's absolute link
        (rootfs / "kept").symlink_to("old")

    link = ["create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so", "--link", "new::/kept"]
    r = run_cdi_hook(tmp_path, link, [link], prepare)
    assert r.returncode == 0, r.stderr
    rootfs = tmp_path / "bundle/rootfs"
    assert os.readlink(rootfs / "nonexistent-host-dir/lib/libcuda.so") == "libcuda.so.1"
    assert os.readlink(rootfs / "kept") == "old" and not os.path.exists("/nonexistent-host-dir")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["create-symlinks", "--link", "libcuda.so"], "want TARGET::/ABSOLUTE/LINK"),
        (["chmod"], "invalid choice: 'chmod'"),
        (["fakegpu-expose", "--device", "GPU-00000000-0000-0000-0000-000000000000"], "unknown device"),
    ],
    ids=["link", "command", "device"],
)
def test_cdi_hook_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    r = run_cdi_hook(tmp_path, args, [args])
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    assert line.startswith("nvidia-") and says in line, line
    assert not (tmp_path / "bundle/rootfs/etc").exists()


# ------------------------------------------------------- hook: Swarm's variables ----
# nvidia-container-toolkit's getDevicesFromEnvvar: the variables `swarm-resource` names, when the container has
# any of them; else NVIDIA_VISIBLE_DEVICES.

SWARM_GPU = 'swarm-resource = "DOCKER_RESOURCE_GPU"\n'


def test_hook_reads_the_swarm_variable_its_config_names(tmp_path: Path) -> None:
    run = run_hook(tmp_path, [f"DOCKER_RESOURCE_GPU={A800_86}", "NVIDIA_VISIBLE_DEVICES=all"], toolkit_config=SWARM_GPU)
    assert (run.rc, run.stderr) == (0, "")
    assert [u for _, u, _ in inner_nvml(run.rootfs)["nvml"]] == [A800_86]
    (entry,) = run.log
    assert (entry["source"], entry["asked"], entry["swarm_resource"]) == (
        "DOCKER_RESOURCE_GPU",
        A800_86,
        ["DOCKER_RESOURCE_GPU"],
    )


@pytest.mark.parametrize(
    ("config", "env_list"),
    [
        (None, [f"DOCKER_RESOURCE_GPU={A800_86}"]),  # no config file: the toolkit's defaults read no Swarm variable
        ('# swarm-resource = "DOCKER_RESOURCE_GPU"\n', [f"DOCKER_RESOURCE_GPU={A800_86}"]),  # as shipped
        (SWARM_GPU, [f"DOCKER_RESOURCE_NVIDIA-GPU={A800_86}"]),  # Docker's example kind: the variable is not read
    ],
)
def test_hook_falls_back_to_nvidia_visible_devices(tmp_path: Path, config: Optional[str], env_list: list[str]) -> None:
    """The trap: the Swarm variable goes unread, and CUDA images' NVIDIA_VISIBLE_DEVICES=all exposes every card."""
    run = run_hook(tmp_path, [*env_list, "NVIDIA_VISIBLE_DEVICES=all"], toolkit_config=config)
    assert run.rc == 0
    assert [u for _, u, _ in inner_nvml(run.rootfs)["nvml"]] == MIXED_PCI_ORDER
    assert run.log[0]["source"] == "NVIDIA_VISIBLE_DEVICES"
    # Without NVIDIA_VISIBLE_DEVICES (an image that leaves it unset) the task is no GPU container at all.
    (tmp_path / "bare").mkdir()
    bare_run = run_hook(tmp_path / "bare", env_list, toolkit_config=config)
    assert bare_run.rc == 0 and bare_run.log[0]["status"] == "void" and list(bare_run.rootfs.iterdir()) == []


def test_hook_swarm_variables_are_trimmed_and_concatenated(tmp_path: Path) -> None:
    config = 'swarm-resource = " DOCKER_RESOURCE_GPU , ,DOCKER_RESOURCE_MIG"\n[nvidia-container-cli]\nldconfig = "x"\n'
    run = run_hook(
        tmp_path,
        [f"DOCKER_RESOURCE_MIG= {MIG_GI2} ", f"DOCKER_RESOURCE_GPU={A100_0F}, ", "NVIDIA_VISIBLE_DEVICES=all"],
        MIG,
        toolkit_config=config,
    )
    assert run.rc == 0, run.stderr
    assert run.log[0]["swarm_resource"] == ["DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_MIG"]
    assert run.log[0]["asked"] == f"{A100_0F},{MIG_GI2}"
    assert inner_nvml(run.rootfs) == {"nvml": [[0, MIG_PARENT, 0], [1, A100_0F, 1]], "cuda": bare([MIG_GI2, A100_0F])}


def test_hook_an_empty_swarm_variable_is_no_gpu(tmp_path: Path) -> None:
    run = run_hook(tmp_path, ["DOCKER_RESOURCE_GPU=", "NVIDIA_VISIBLE_DEVICES=all"], toolkit_config=SWARM_GPU)
    assert run.rc == 0 and run.log[0]["status"] == "void" and list(run.rootfs.iterdir()) == []


@pytest.mark.parametrize("config", ["swarm-resource = DOCKER_RESOURCE_GPU\n", "swarm-resource = 1\n"])
def test_hook_a_malformed_config_fails_the_container(tmp_path: Path, config: str) -> None:
    run = run_hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"], toolkit_config=config)
    assert run.rc == 1 and list(run.rootfs.iterdir()) == []
    assert run.stderr.startswith("nvidia-container-runtime-hook: failed to load config: ")
    assert run.log[0]["status"] == "error"


# ----------------------------------------------------------------- runtime ----


def load_runtime() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fakegpu_runtime", SRC / "fakegpu_runtime.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("args", "create", "bundle"),
    [
        (
            [
                "--root",
                "/r",
                "--log",
                "/l",
                "--log-format",
                "json",
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/p",
                "id",
            ],
            True,
            "/b",
        ),
        (["create", "--bundle=/b", "id"], True, "/b"),
        (["create", "-b", "/b", "id"], True, "/b"),
        (["-bundle", "create", "start", "id"], False, "create"),  # a bundle directory named `create`
        (["start", "id"], False, None),
        (["--root", "/r", "delete", "--force", "id"], False, None),
    ],
)
def test_runtime_args(args: list[str], create: bool, bundle: Optional[str]) -> None:
    rt = load_runtime()
    assert rt.has_create_subcommand(args) is create
    assert rt.bundle_dir(args) == (bundle or os.getcwd())


@dataclass
class RuntimeRun:
    rc: int
    stderr: str
    runc_args: Optional[list[str]]
    spec: dict[str, Any]


def run_runtime(tmp_path: Path, args: list[str], spec: Optional[dict[str, Any]] = None) -> RuntimeRun:
    """The built runtime with a recording `runc` first on PATH, in a bundle holding `spec` as config.json."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    config = bundle / "config.json"
    if spec is not None:
        config.write_text(json.dumps(spec))
        config.chmod(0o600)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "runc.json"
    runc = bin_dir / "runc"
    code = f"import json, sys; json.dump(sys.argv[1:], open({str(record)!r}, 'w'))"
    # sh, then the interpreter: a shebang cannot name an interpreter whose path has a space (the checkout's may)
    runc.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} "$@"\n')
    runc.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin")
    proc = subprocess.run([str(RUNTIME), *args], env=env, cwd=bundle, capture_output=True, text=True, timeout=60)
    return RuntimeRun(
        proc.returncode,
        proc.stderr,
        json.loads(record.read_text()) if record.exists() else None,
        json.loads(config.read_text()) if config.exists() else {},
    )


def test_runtime_adds_the_hook_on_create_and_runs_runc(tmp_path: Path) -> None:
    spec = {
        "ociVersion": "1.0.2",
        "process": {"env": ["A=1"]},
        "root": {"path": "rootfs"},
        "hooks": {"prestart": [{"path": "/usr/bin/other-hook"}]},
    }
    args = ["--root", "/run/x", "create", "--bundle", str(tmp_path / "bundle"), "--pid-file", "/p", "c0ffee"]
    run = run_runtime(tmp_path, args, spec)
    assert (run.rc, run.stderr, run.runc_args) == (0, "", args)
    assert run.spec["hooks"]["prestart"] == [
        {"path": "/usr/bin/other-hook"},
        {"path": str(HOOK.resolve()), "args": ["nvidia-container-runtime-hook", "prestart"]},
    ]
    assert run.spec["process"] == spec["process"]
    assert (tmp_path / "bundle" / "config.json").stat().st_mode & 0o777 == 0o600
    # Docker's `--gpus` put the hook there already: nothing is added twice.
    again = run_runtime(tmp_path, args, run.spec)
    assert again.rc == 0 and again.spec == run.spec


def test_runtime_leaves_other_commands_alone(tmp_path: Path) -> None:
    spec = {"ociVersion": "1.0.2", "process": {"env": []}, "root": {"path": "rootfs"}}
    run = run_runtime(tmp_path, ["start", "c0ffee"], spec)
    assert (run.rc, run.runc_args, run.spec) == (0, ["start", "c0ffee"], spec)


def test_runtime_refuses_a_bundle_it_cannot_read(tmp_path: Path) -> None:
    run = run_runtime(tmp_path, ["create", "--bundle", str(tmp_path / "bundle"), "c0ffee"])
    assert run.rc == 1 and run.runc_args is None
    assert run.stderr.startswith("nvidia-container-runtime: error loading OCI specification for modification: ")
