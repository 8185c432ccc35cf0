"""Pins the fake NVML's health surface (tests/fakegpu/README.md, "Health and the fault file"): ECC, retired pages,
row remapping, XID events and lost cards, from the topology and from the fault file ($FAKEGPU_FAULTS) that the
fake re-reads at every call, so that a test can break a card under a running process. Everything goes through
the real nvidia-ml-py, in subprocesses (tests/test_fakegpu.py's harness); no daemon."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.test_fakegpu import (
    A800_1B,
    A800_86,
    A800_AF,
    H200_0,
    H200_1,
    NVML_INIT,
    RTX_3B,
    SRC,
    make_fakegpu,
    run_py,
    scenario,
    write_json,
)


@pytest.fixture(scope="module", autouse=True)
def fakegpu_build() -> None:
    make_fakegpu()


def h200_host(tmp_path: Path, **card: Any) -> Path:
    """The measured 2xH200 host; `card` adds keys to its first card."""
    gpus: list[dict[str, Any]] = [
        {"uuid": u, "name": "NVIDIA H200", "bus_id": b, "compute_capability": "9.0", "memory_total_mib": 143771}
        for u, b in ((H200_0, "0000:18:00.0"), (H200_1, "0000:2A:00.0"))
    ]
    gpus[0].update(card)
    return write_json(tmp_path / "h200.json", {"gpus": gpus})


def mixed(tmp_path: Path, **cards: Any) -> Path:
    """mixed-4 with health keys added to cards named by UUID."""
    data = scenario("mixed-4.json")
    for gpu in data["gpus"]:
        gpu.update(cards.get(gpu["uuid"], {}))
    return write_json(tmp_path / "mixed.json", data)


# Prints every health reading of every card: [ecc mode, [vol corr, vol unc, agg corr, agg unc], retired, remap].
READINGS = """
import pynvml as n
n.nvmlInit()
def reading(f, *a):
    try:
        v = f(*a)
        return list(v) if isinstance(v, tuple) else v
    except n.NVMLError as e:
        return type(e).__name__
def card(h):
    counts = [reading(n.nvmlDeviceGetTotalEccErrors, h, e, c) for c in (0, 1) for e in (0, 1)]
    return [reading(n.nvmlDeviceGetEccMode, h), counts, reading(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
            reading(n.nvmlDeviceGetRemappedRows, h)]
out([card(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())])
"""


def test_h200_defaults_are_measured(tmp_path: Path) -> None:
    """docs/probes: ECC on and clean, retired pages not supported on Hopper, no remapped rows."""
    clean = [[1, 1], [0, 0, 0, 0], "NVMLError_NotSupported", [0, 0, 0, 0]]
    assert run_py(READINGS, h200_host(tmp_path)).value == [clean, clean]


def test_events_as_measured(tmp_path: Path) -> None:
    code = """
    import time, pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    s = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, s)
    t = time.monotonic()
    err = nvml_err(n.nvmlEventSetWait_v2, s, 300)
    waited = time.monotonic() - t
    n.nvmlEventSetFree(s)
    out({"mask": n.nvmlDeviceGetSupportedEventTypes(h), "err": err, "waited": waited,
         "freed_again": nvml_err(n.nvmlEventSetFree, s)})
    """
    res = run_py(code, h200_host(tmp_path)).value
    assert res["mask"] == 65439
    assert res["err"] == ["NVMLError_Timeout", 10, "Timeout"]
    assert 0.3 <= res["waited"] < 2
    assert res["freed_again"][0] == "NVMLError_InvalidArgument"


def test_topology_health_keys(tmp_path: Path) -> None:
    topo = mixed(
        tmp_path,
        **{
            A800_1B: {"ecc": {"volatile_uncorrected": 2, "aggregate_corrected": 7}},
            RTX_3B: {"ecc": None},
            A800_86: {"remap": {"corrected": 1, "uncorrected": 3, "pending": True, "failure": True}},
            A800_AF: {"row_remapping": False, "retired_pages_pending": True, "ecc": {"mode": 0, "pending_mode": 1}},
        },
    )
    no = "NVMLError_NotSupported"
    assert run_py(READINGS, topo).value == [
        # Aggregate counters include the volatile ones.
        [[1, 1], [0, 2, 7, 2], no, [0, 0, 0, 0]],
        [no, [no] * 4, no, [0, 0, 0, 0]],
        [[1, 1], [0, 0, 0, 0], no, [1, 3, 1, 1]],
        # ECC off: its counters are not supported; a card that retires pages has no row remapper.
        [[0, 1], [no] * 4, 1, no],
    ]


XID_EVENTS = """
import pynvml as n
n.nvmlInit()
handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
uuids = {ctypes.cast(h, ctypes.c_void_p).value: n.nvmlDeviceGetUUID(h) for h in handles}
def drain(s):
    got = []
    while True:
        try:
            e = n.nvmlEventSetWait_v2(s, 0)
        except n.NVMLError_Timeout:
            return got
        got.append([uuids[ctypes.cast(e.device, ctypes.c_void_p).value], e.eventType, e.eventData,
                    e.gpuInstanceId, e.computeInstanceId])
def watch(types=n.nvmlEventTypeXidCriticalError):
    s = n.nvmlEventSetCreate()
    for h in handles:
        n.nvmlDeviceRegisterEvents(h, types, s)
    return s
"""


def test_xid_events_delivered_once_per_set(tmp_path: Path) -> None:
    topo = mixed(tmp_path, **{A800_86: {"xid": [48, 79]}, A800_AF: {"xid": [13]}})
    code = XID_EVENTS + textwrap.dedent("""
    first, second = watch(), watch()
    clock_only = watch(n.nvmlEventTypeClock)
    out({"first": drain(first), "again": drain(first), "second": drain(second), "clock": drain(clock_only)})
    """)
    res = run_py(code, topo).value
    none = 0xFFFFFFFF
    expected = [[A800_86, 8, 48, none, none], [A800_86, 8, 79, none, none], [A800_AF, 8, 13, none, none]]
    assert res == {"first": expected, "again": [], "second": expected, "clock": []}


def test_fault_file_breaks_a_running_process(tmp_path: Path) -> None:
    """The process keeps its NVML session and handles; the file changes under it."""
    faults = tmp_path / "faults.json"
    code = XID_EVENTS + textwrap.dedent(f"""
    import os, threading
    path = {str(faults)!r}
    def put(data):
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)
    h86 = handles[2]
    s = watch()
    res = {{"before": [n.nvmlDeviceGetName(h86), drain(s)]}}
    put({{"cards": {{{A800_86!r}: {{"xid": [79]}}, "3": {{"ecc": {{"volatile_uncorrected": 2}}}}}}}})
    res["xid"] = drain(s)
    res["ecc"] = n.nvmlDeviceGetTotalEccErrors(handles[3], 1, 0)
    # An XID appended while a wait is in progress ends the wait.
    timer = threading.Timer(0.2, put, [{{"cards": {{{A800_86!r}: {{"xid": [79, 94]}}}}}}])
    timer.start()
    e = n.nvmlEventSetWait_v2(s, 10000)
    res["during_wait"] = e.eventData
    put({{"cards": {{"2": {{"lost": True}}}}}})
    res["lost"] = [nvml_err(n.nvmlDeviceGetName, h86), nvml_err(n.nvmlDeviceGetHandleByIndex, 2),
                   nvml_err(n.nvmlDeviceGetHandleByUUID, {A800_86!r}), nvml_err(n.nvmlEventSetWait_v2, s, 0),
                   n.nvmlDeviceGetName(handles[0])]
    os.remove(path)
    res["healed"] = [n.nvmlDeviceGetName(h86), n.nvmlDeviceGetTotalEccErrors(handles[3], 1, 0)]
    out(res)
    """)
    res = run_py(code, mixed(tmp_path), {"FAKEGPU_FAULTS": str(faults)}).value
    lost = ["NVMLError_GpuIsLost", 15, "GPU is lost"]
    assert res["before"] == ["NVIDIA A800-SXM4-80GB", []]
    assert res["xid"] == [[A800_86, 8, 79, 0xFFFFFFFF, 0xFFFFFFFF]]
    assert res["ecc"] == 2
    assert res["during_wait"] == 94
    assert res["lost"] == [lost, lost, lost, lost, "NVIDIA A800-SXM4-80GB"]
    assert res["healed"] == ["NVIDIA A800-SXM4-80GB", 0]


def test_fault_file_nvml_init(tmp_path: Path) -> None:
    faults = write_json(tmp_path / "faults.json", {"nvml_init": "unknown_error"})
    assert run_py(NVML_INIT, mixed(tmp_path), {"FAKEGPU_FAULTS": str(faults)}).value == [
        "NVMLError_Unknown",
        999,
        "Unknown Error",
    ]
    # A session already open is not affected (NVML's init is refcounted); a new one from zero is.
    code = f"""
    import pynvml as n
    n.nvmlInit()
    open({str(faults)!r}, "w").write('{{"nvml_init": "unknown_error"}}')
    n.nvmlInit()  # refcount 2: no error
    n.nvmlShutdown(); n.nvmlShutdown()
    out(nvml_err(n.nvmlInit))
    """
    faults.unlink()
    assert run_py(code, mixed(tmp_path), {"FAKEGPU_FAULTS": str(faults)}).value == [
        "NVMLError_Unknown",
        999,
        "Unknown Error",
    ]


def test_fault_file_absent_or_other_cards(tmp_path: Path) -> None:
    """An absent file is no fault; a card this topology lacks is skipped (one file serves host and containers)."""
    clean = [[1, 1], [0, 0, 0, 0], "NVMLError_NotSupported", [0, 0, 0, 0]]
    assert run_py(READINGS, h200_host(tmp_path), {"FAKEGPU_FAULTS": str(tmp_path / "none.json")}).value == [clean] * 2
    other = write_json(tmp_path / "f.json", {"cards": {A800_86: {"lost": True}, "7": {"lost": True}}})
    assert run_py(READINGS, h200_host(tmp_path), {"FAKEGPU_FAULTS": str(other)}).value == [clean] * 2


@pytest.mark.parametrize(
    ("faults", "problem"),
    [
        ("{", "invalid JSON"),
        ('{"cards": {"0": {"xid": [0]}}}', "cards.0.xid: an XID is 1..65535"),
        ('{"cards": {"0": {"xid": "79"}}}', "cards.0.xid: must be an array"),
        ('{"cards": {"0": {"retired_pages_pending": true}}}', "cards.0: retired_pages_pending needs a card"),
        ('{"cards": {"0": {"ecc": {"mode": 2}}}}', "cards.0.ecc: mode and pending_mode must be 0 or 1"),
        ('{"cards": {"0": {"lost": 1}}}', "cards.0.lost: must be true or false"),
        ('{"cards": []}', "cards: must be an object"),
        ('{"nvml_init": "bogus"}', "nvml_init: must be"),
    ],
)
def test_malformed_fault_file(tmp_path: Path, faults: str, problem: str) -> None:
    """A malformed file fails every call it affects with Unknown Error and says why once on stderr."""
    path = tmp_path / "faults.json"
    path.write_text(faults)
    run = run_py(NVML_INIT, h200_host(tmp_path), {"FAKEGPU_FAULTS": str(path)})
    assert run.value == ["NVMLError_Unknown", 999, "Unknown Error"]
    assert run.stderr.splitlines() == [f"fakegpu: {path}: {run.stderr.split(': ', 2)[2].rstrip()}"]
    assert problem in run.stderr
    # Broken under a running session: the calls it affects fail, one line for all of them.
    path.unlink()
    code = f"""
    import pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    open({str(path)!r}, "w").write({faults!r})
    out([nvml_err(n.nvmlDeviceGetHandleByIndex, 0), nvml_err(n.nvmlDeviceGetName, h)])
    """
    run = run_py(code, h200_host(tmp_path), {"FAKEGPU_FAULTS": str(path)})
    assert run.value == [["NVMLError_Unknown", 999, "Unknown Error"]] * 2
    assert len(run.stderr.splitlines()) == 1 and problem in run.stderr


@pytest.mark.parametrize(
    ("card", "problem"),
    [
        ({"remap": {"failure": True}, "row_remapping": False}, "gpus[0]: remap needs a card that remaps rows"),
        ({"retired_pages_pending": True}, "gpus[0]: retired_pages_pending needs a card that retires pages"),
        ({"xid": [79] * 65}, "gpus[0].xid: too many XIDs"),
        ({"ecc": 1}, "gpus[0].ecc: must be an object or null"),
    ],
)
def test_malformed_health_in_topology(tmp_path: Path, card: dict[str, Any], problem: str) -> None:
    run = run_py(NVML_INIT, h200_host(tmp_path, **card))
    assert run.value == ["NVMLError_Unknown", 999, "Unknown Error"]
    assert problem in run.stderr, run.stderr


def test_hook_passes_health_keys_into_the_container(tmp_path: Path) -> None:
    """The container's topology keeps each exposed card's health keys (a container's NVML sees the same card)."""
    spec = importlib.util.spec_from_file_location("fakegpu_hook_health", SRC / "fakegpu_hook.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = hook  # its dataclasses look their module up
    try:
        spec.loader.exec_module(hook)
    finally:
        sys.modules.pop(spec.name, None)
    topo = json.loads(mixed(tmp_path, **{A800_86: {"xid": [79], "ecc": {"volatile_uncorrected": 1}}}).read_text())
    inner = hook.container_topology(topo, hook.resolve_devices(topo, A800_86))
    assert [(g["uuid"], g["xid"], g["ecc"]) for g in inner["gpus"]] == [(A800_86, [79], {"volatile_uncorrected": 1})]


def test_readme_fault_file_example(tmp_path: Path) -> None:
    """The fault file of README.md's "Health and the fault file" is valid and does what its comments say."""
    readme = (SRC / "README.md").read_text()
    block = readme.split("## Health and the fault file", 1)[1].split("```jsonc", 1)[1].split("```", 1)[0]
    text = "\n".join(line.split("//", 1)[0] for line in block.splitlines())
    data = json.loads(text)
    faults = write_json(tmp_path / "faults.json", data)
    assert run_py(NVML_INIT, mixed(tmp_path), {"FAKEGPU_FAULTS": str(faults)}).value[0] == "NVMLError_Unknown"
    del data["nvml_init"]
    write_json(faults, data)
    run = run_py(
        READINGS.replace("range(n.nvmlDeviceGetCount())", "(0, 1, 2)"), mixed(tmp_path), {"FAKEGPU_FAULTS": str(faults)}
    )
    assert run.stderr == ""
    assert run.value[1][2] == 1  # "1": retires pages, one pending
    assert run.value[2][1][1] == 2 and run.value[2][3] == [0, 0, 0, 1]
    lost = run_py(
        "import pynvml as n\nn.nvmlInit()\nout(nvml_err(n.nvmlDeviceGetHandleByIndex, 3))",
        mixed(tmp_path),
        {"FAKEGPU_FAULTS": str(faults)},
    )
    assert lost.value == ["NVMLError_GpuIsLost", 15, "GPU is lost"]


def test_memory_query_error(tmp_path: Path) -> None:
    """Health NVML cannot tell: the memory-error calls answer the given code, the card's other calls work."""
    faults = write_json(tmp_path / "f.json", {"cards": {"0": {"memory_query_error": 999}}})
    unknown = "NVMLError_Unknown"
    res = run_py(READINGS, h200_host(tmp_path), {"FAKEGPU_FAULTS": str(faults)}).value
    assert res[0] == [unknown, [unknown] * 4, unknown, unknown]
    assert res[1] == [[1, 1], [0, 0, 0, 0], "NVMLError_NotSupported", [0, 0, 0, 0]]
