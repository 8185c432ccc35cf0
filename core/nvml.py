"""The NVML adapter: the only module that imports `pynvml` (NVIDIA's nvidia-ml-py binding).

NVML numbers cards by PCI bus id and ignores CUDA_VISIBLE_DEVICES: the physical truth on both sides. It is
imported and initialised lazily, so importing gpupin never needs a driver; a failure that makes cards unusable
is one `GpuUnavailableError` (69) with a hint; an unsupported field is None, and an unreadable card a `Card`
with `error` set, so a listing survives it.
"""

from __future__ import annotations

from gpupin.core.errors import GpuUnavailableError
from gpupin.core.identity import BusId

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    from gpupin.core.health import Health

    T = TypeVar("T")

# NVML return codes (nvml.h), so that errors can be told apart without pynvml's generated classes.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_LIB_RM_VERSION_MISMATCH = 18
_UNKNOWN = 999

# Both sides read these, in containers and on hosts: a hint that depends on where it runs says both.
_HINTS = {
    _LIBRARY_NOT_FOUND: "no NVIDIA driver library (libnvidia-ml.so.1) is visible here: in a container, start it "
    "with a GPU (`hostagent run`, `docker run --gpus device=UUID`) on a host with the NVIDIA Container Toolkit; on "
    "a host, install the NVIDIA driver (`nvidia-smi` must work)",
    _UNKNOWN: "in a container, it lost access to its GPU device nodes, the known effect of `systemctl "
    "daemon-reload` on the host (NVIDIA/nvidia-container-toolkit#48): restart the container, and to stop it "
    "recurring pass the /dev/nvidia* nodes with --device or move the host to cgroup v2; on a host, check "
    "`nvidia-smi` and `dmesg`",
    _DRIVER_NOT_LOADED: "the NVIDIA kernel module is not loaded: check `nvidia-smi` on the host",
    _NO_PERMISSION: "this process may not open /dev/nvidia*: in a container, give it the GPU's device nodes "
    "(`--gpus`); on a host, check the permissions of /dev/nvidia* (the `video` group, or run as root)",
    _LIB_RM_VERSION_MISMATCH: "the driver was upgraded but the old kernel module is still loaded: reboot the "
    "host (or reload the nvidia module)",
    _GPU_IS_LOST: "the card fell off the bus (look for Xid 79 in the host's `dmesg`): reset it with "
    "`nvidia-smi -r` or reboot the host",
}

_NVML_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t: the GPU die
_NO_INSTANCE = 0xFFFFFFFF  # a process's gpu/compute instance id on a card not in MIG mode

_nvml: Any = None  # the pynvml module, once initialised


class MigDevice:
    """A MIG instance of a card: its UUID, its index on the card (the j of the toolkit's `i:j`, nvidia-smi -L's
    "MIG Device j") and its (GPU instance, compute instance) ids."""

    __slots__ = ("compute_instance_id", "gpu_instance_id", "index", "memory_total", "memory_used", "name", "uuid")

    def __init__(
        self,
        uuid: str,
        gpu_instance_id: int | None,
        compute_instance_id: int | None,
        name: str | None = None,
        memory_total: int | None = None,
        index: int = 0,
        memory_used: int | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.name = name
        self.memory_total = memory_total  # bytes
        self.memory_used = memory_used  # bytes


class Process:
    """A process on a card (nvidia-smi --query-compute-apps, and the graphics clients): its pid in the pid
    namespace of the driver's caller (the host's, for hostagent), its type as nvidia-smi writes it (C compute, G
    graphics, C+G both), the memory it uses (None where NVML cannot tell), and on a card in MIG mode the GPU and
    compute instance it runs on (else None)."""

    __slots__ = ("compute_instance_id", "gpu_instance_id", "pid", "type", "used_memory")

    def __init__(
        self,
        pid: int,
        used_memory: int | None,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
        type: str = "C",
    ) -> None:
        self.pid = pid
        self.used_memory = used_memory  # bytes
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.type = type


class Card:
    """One physical card as NVML reports it. Fields that NVML could not read are None.

    Matching `nvidia-smi --query-gpu` fields: index, uuid, pci.bus_id, name, memory.total, memory.used,
    utilization.gpu, mig.mode.current, compute_cap, temperature.gpu, power.draw, enforced.power.limit.
    """

    __slots__ = (
        "bus_id",
        "compute_capability",
        "energy",
        "error",
        "health",
        "index",
        "lost",
        "memory_total",
        "memory_used",
        "mig_devices",
        "mig_mode",
        "minor_number",
        "name",
        "power_draw",
        "power_limit",
        "process_list",
        "processes",
        "processes_error",
        "temperature",
        "utilization_gpu",
        "uuid",
    )

    def __init__(
        self,
        index: int,
        uuid: str | None = None,
        bus_id: BusId | None = None,
        name: str | None = None,
        error: str | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.bus_id = bus_id
        self.name = name
        self.error = error
        self.memory_total: int | None = None  # bytes
        self.memory_used: int | None = None  # bytes
        self.utilization_gpu: int | None = None  # percent
        self.mig_mode: bool | None = None
        self.mig_devices: list[MigDevice] = []
        self.processes: int | None = None  # how many compute processes run on the card
        self.process_list: list[Process] = []  # its compute and graphics processes (read_processes)
        self.processes_error: str | None = None  # why NVML could not list them: who uses the card is unknown
        self.minor_number: int | None = None
        self.compute_capability: str | None = None
        self.temperature: int | None = None  # degrees C
        self.power_draw: int | None = None  # milliwatts
        self.power_limit: int | None = None  # milliwatts, the enforced limit
        self.energy: int | None = None  # millijoules since the driver was loaded (a counter: only differences count)
        self.lost = False  # NVML answered GPU_IS_LOST (the card fell off the bus)
        self.health: Health | None = None  # gpupin.core.readings.assess fills it in

    @property
    def memory_free(self) -> int | None:
        if self.memory_total is None or self.memory_used is None:
            return None
        return self.memory_total - self.memory_used

    def __repr__(self) -> str:
        return f"Card({self.index}, {self.uuid}, {self.bus_id}, {self.name!r}, error={self.error!r})"


def _code(err: BaseException) -> int:
    return int(getattr(err, "value", -1))


def unavailable(err: BaseException, doing: str) -> GpuUnavailableError:
    """Translate an NVML error into the one-line refusal (exit 69) with a hint."""
    code = _code(err)
    return GpuUnavailableError(f"{doing}: {err}", _HINTS.get(code))


def _module() -> Any:
    global _nvml
    if _nvml is None:
        try:
            import pynvml
        except ImportError:
            raise GpuUnavailableError(
                "the Python package nvidia-ml-py (module pynvml) is not installed where gpupin is (the entrypoint "
                "does not import from PYTHONPATH, the working directory or the user site)",
                "pip install nvidia-ml-py beside gpupin (NVIDIA's binding; not the PyPI package named `pynvml`)",
            ) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise unavailable(err, "Failed to initialize NVML") from None
        _nvml = pynvml
    return _nvml


def shutdown() -> None:
    """Release NVML (a long-lived host process calls this; the entrypoint just execs)."""
    global _nvml
    if _nvml is not None:
        try:
            _nvml.nvmlShutdown()
        finally:
            _nvml = None


def available() -> bool:
    """Whether NVML can be initialised here."""
    try:
        _module()
    except GpuUnavailableError:
        return False
    return True


def driver_version() -> str | None:
    nv = _module()
    return _optional(lambda: str(nv.nvmlSystemGetDriverVersion()))


def cuda_driver_version() -> str | None:
    """The CUDA version the driver supports, as nvidia-smi's header shows it ("13.0" for 13000)."""
    nv = _module()
    version = _optional(lambda: int(nv.nvmlSystemGetCudaDriverVersion()))
    return None if version is None else f"{version // 1000}.{version % 1000 // 10}"


def _optional(call: Callable[[], T]) -> T | None:
    """A field that a card may not support: NotSupported (and friends) become None; a lost card does not."""
    nv = _module()
    try:
        return call()
    except nv.NVMLError as err:
        if _code(err) in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NOT_FOUND, _NO_PERMISSION):
            return None
        raise


def _mig_devices(nv: Any, handle: Any) -> list[MigDevice]:
    devices: list[MigDevice] = []
    count = _optional(lambda: int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))) or 0
    for i in range(count):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nv.NVMLError as err:
            if _code(err) in (_NOT_FOUND, _NOT_SUPPORTED, 2):  # 2: an empty slot is INVALID_ARGUMENT
                continue
            raise
        mem = _optional(lambda m=mig: nv.nvmlDeviceGetMemoryInfo(m))  # type: ignore[misc]
        devices.append(
            MigDevice(
                str(nv.nvmlDeviceGetUUID(mig)),
                _optional(lambda m=mig: int(nv.nvmlDeviceGetGpuInstanceId(m))),  # type: ignore[misc]
                _optional(lambda m=mig: int(nv.nvmlDeviceGetComputeInstanceId(m))),  # type: ignore[misc]
                _optional(lambda m=mig: str(nv.nvmlDeviceGetName(m))),  # type: ignore[misc]
                int(mem.total) if mem is not None else None,
                i,
                int(mem.used) if mem is not None else None,
            )
        )
    return devices


def _bus_id(pci: Any) -> BusId:
    # The busId text carries the PCI function (virtual functions are not .0); the integers do not.
    text = pci.busId
    try:
        return BusId.parse(text.decode() if isinstance(text, bytes) else str(text))
    except Exception:
        return BusId(int(pci.domain), int(pci.bus), int(pci.device), 0)


def _read_card(nv: Any, index: int, detail: bool, mig: bool) -> Card:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    pci = nv.nvmlDeviceGetPciInfo(handle)
    card = Card(index, str(nv.nvmlDeviceGetUUID(handle)), _bus_id(pci), str(nv.nvmlDeviceGetName(handle)))
    # Always: device files (/dev/nvidiaN) and Slurm name cards by minor number.
    card.minor_number = _optional(lambda: int(nv.nvmlDeviceGetMinorNumber(handle)))
    if mig or detail:
        modes = _optional(lambda: nv.nvmlDeviceGetMigMode(handle))
        card.mig_mode = bool(modes[0]) if modes is not None else None
        if card.mig_mode:
            card.mig_devices = _mig_devices(nv, handle)
    if detail:
        mem = _optional(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        if mem is not None:
            card.memory_total, card.memory_used = int(mem.total), int(mem.used)
        util = _optional(lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        card.utilization_gpu = int(util.gpu) if util is not None else None
        _read_processes(nv, handle, card)
        cc = _optional(lambda: nv.nvmlDeviceGetCudaComputeCapability(handle))
        card.compute_capability = f"{cc[0]}.{cc[1]}" if cc is not None else None
        card.temperature = _optional(lambda: int(nv.nvmlDeviceGetTemperature(handle, _NVML_TEMPERATURE_GPU)))
        card.power_draw = _optional(lambda: int(nv.nvmlDeviceGetPowerUsage(handle)))
        card.power_limit = _optional(lambda: int(nv.nvmlDeviceGetEnforcedPowerLimit(handle)))
        card.energy = _optional(lambda: int(nv.nvmlDeviceGetTotalEnergyConsumption(handle)))
    return card


def _process(p: Any, type: str, instance: MigDevice | None = None) -> Process:
    # nvidia-ml-py gives usedGpuMemory None for NVML_VALUE_NOT_AVAILABLE; v1 entries carry no instance ids.
    used = getattr(p, "usedGpuMemory", None)
    gi = getattr(p, "gpuInstanceId", _NO_INSTANCE) if instance is None else instance.gpu_instance_id
    ci = getattr(p, "computeInstanceId", _NO_INSTANCE) if instance is None else instance.compute_instance_id
    return Process(
        int(p.pid),
        int(used) if used is not None else None,
        None if gi in (None, _NO_INSTANCE) else int(gi),
        None if ci in (None, _NO_INSTANCE) else int(ci),
        type,
    )


def _clients(nv: Any, handle: Any, instance: MigDevice | None = None) -> list[Process]:
    """Compute and graphics clients of one handle, one entry per pid (C+G for a pid that is both)."""
    out = {p.pid: p for p in (_process(q, "C", instance) for q in nv.nvmlDeviceGetComputeRunningProcesses(handle))}
    # A card that has no graphics engine (NotSupported) has no graphics client: not an unknown.
    for q in _optional(lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(handle)) or ():
        g = _process(q, "G", instance)
        if g.pid in out:
            out[g.pid].type = "C+G"
        else:
            out[g.pid] = g
    return list(out.values())


def _read_processes(nv: Any, handle: Any, card: Card) -> None:
    """The card's processes, or why NVML would not list them (process_list then empty, processes_error set).
    A card in MIG mode lists every instance's processes to root only; anyone else asks each MIG device."""
    try:
        try:
            procs = _clients(nv, handle)
        except nv.NVMLError as err:
            if _code(err) != _NO_PERMISSION or not card.mig_devices:
                raise
            procs = [p for m in card.mig_devices for p in _clients(nv, nv.nvmlDeviceGetHandleByUUID(m.uuid), m)]
    except nv.NVMLError as err:
        if _code(err) == _GPU_IS_LOST:
            raise
        card.process_list, card.processes, card.processes_error = [], None, str(err)
        return
    card.process_list, card.processes_error = procs, None
    card.processes = sum(1 for p in procs if "C" in p.type)


def read_processes(cards: Sequence[Card]) -> None:
    """Fill in the processes of these cards (hostagent run reads them under the ledger lock, as late as it can),
    and, for a card that lists none, its memory and load when not read yet (use NVML names no process for is
    still use: gpupin.hostagent.ledger.processes.unseen_use). A card NVML can no longer read gets processes_error."""
    nv = _module()
    for card in cards:
        if card.error is not None or card.uuid is None:
            continue
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(card.uuid)
            _read_processes(nv, handle, card)
            if not card.process_list and card.processes_error is None and card.memory_used is None:
                mem = _optional(lambda h=handle: nv.nvmlDeviceGetMemoryInfo(h))  # type: ignore[misc]
                if mem is not None:
                    card.memory_total, card.memory_used = int(mem.total), int(mem.used)
                util = _optional(lambda h=handle: nv.nvmlDeviceGetUtilizationRates(h))  # type: ignore[misc]
                card.utilization_gpu = int(util.gpu) if util is not None else None
        except nv.NVMLError as err:
            card.process_list, card.processes, card.processes_error = [], None, str(err)


def list_cards(detail: bool = False, mig: bool = False, tolerate_lost: bool = False) -> list[Card]:
    """Every card NVML sees, in NVML's (PCI bus) order.

    `detail` adds memory, utilization, processes, MIG mode, minor number, compute capability, temperature and
    power (hostagent ls);
    `mig` adds MIG mode and MIG devices only. A card NVML cannot read raises GpuUnavailableError, or, with
    `tolerate_lost`, comes back as a placeholder whose `error` says why.
    """
    nv = _module()
    try:
        count = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as err:
        raise unavailable(err, "NVML could not count the cards") from None
    cards: list[Card] = []
    for index in range(count):
        try:
            cards.append(_read_card(nv, index, detail, mig))
        except nv.NVMLError as err:
            if not tolerate_lost:
                raise unavailable(err, f"NVML could not read the card at index {index}") from None
            card = Card(index, error=str(err))
            card.lost = _code(err) == _GPU_IS_LOST
            cards.append(card)
    return cards
