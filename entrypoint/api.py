"""`assert_pinned()`: the entrypoint's check, from inside a running Python workload.

It asks the CUDA driver (or torch) of *this* process what each `cuda:k` is, by UUID and bus id, and compares
it with the expectation (GPUPIN_EXPECT by default), so it also catches a launcher that rewrote
CUDA_VISIBLE_DEVICES after the entrypoint. Name-based checks pass on the wrong card of a box of identical cards.
Usage, and `local_rank` under torchrun: docs/entrypoint.md, "From inside a Python workload".
"""

from __future__ import annotations

import os
import sys

from gpupin.core.errors import ExpectationError, GpuSpecError, GpuUnavailableError, MisalignedError
from gpupin.core.expectation import Expectation, ExpectedCard, parse_expect
from gpupin.core.identity import BusId, uuid_from_bytes
from gpupin.entrypoint import align
from gpupin.entrypoint.sources import find

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def _driver_devices() -> list[align.CudaDevice]:
    from gpupin.entrypoint import cudaprobe

    result = cudaprobe.probe()
    if result["rc"] != 0:
        name, text = result["error"]
        raise GpuUnavailableError(
            f"cuInit failed with {name} ({result['rc']}): {text}",
            "run the workload under gpupin-entrypoint, which says why the driver is unusable",
        )
    return [align.CudaDevice.from_probe(d) for d in result["devices"]]


def _torch_devices() -> list[align.CudaDevice]:
    import torch

    from gpupin.entrypoint.torchprobe import identify

    out = []
    for k in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(k)
        uuid, pci = identify(p)
        out.append(align.CudaDevice(k, uuid, BusId(*pci) if pci else None, p.name))
    return out


def _expected_hex(exp: ExpectedCard, k: int, source: str) -> str:
    """The UUID digits CUDA reports for expected card k (a hand-written prefix gives fewer than 32).

    An old-style MIG UUID (`MIG-GPU-<uuid>/<gi>/<ci>`) carries its parent card's digits, which name no MIG device:
    it is resolved through NVML (only then is NVML asked) to the MIG device's own UUID, or refused.
    """
    want = align.uuid_hex(exp.uuid)
    if want is not None:
        return want
    from gpupin.core import nvml
    from gpupin.core.resolve import resolve

    cards = nvml.list_cards(mig=True)
    try:
        target = resolve(exp.uuid, cards)
    except GpuSpecError as err:
        if len(err.matches) > 1:
            raise ExpectationError(f"{source}: {err.message}", err.hint) from None
        raise MisalignedError(
            f"{source} expects {exp} at cuda:{k}, but NVML finds no such MIG device here: {err.message}",
            "`nvidia-smi -L` lists the MIG devices here, with their UUIDs",
        ) from None
    want = align.uuid_hex(target.uuid)
    if want is None:
        raise MisalignedError(
            f"cannot tell whether cuda:{k} is {exp}: NVML names it in the old MIG form too, whose "
            "digits are its parent card's",
            "drivers before R470 write this form: upgrade the driver",
        )
    return want


def devices(via: str | None = None) -> list[align.CudaDevice]:
    """What each cuda:k of this process is, from the CUDA driver (`via="cuda"`) or torch (`via="torch"`).

    Default: torch when this process has already imported it, else the driver through ctypes.
    """
    if via is None:
        via = "torch" if "torch" in sys.modules else "cuda"
    return _torch_devices() if via == "torch" else _driver_devices()


def assert_pinned(
    expect: str | Expectation | None = None,
    local_rank: int | None = None,
    via: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[align.Binding]:
    """Raise MisalignedError unless cuda:k is expected card k (every k, or just `local_rank`).

    `expect`: a GPUPIN_EXPECT-style string or an Expectation; default: from the environment (GPUPIN_EXPECT,
    then NVIDIA_VISIBLE_DEVICES UUIDs, then DOCKER_RESOURCE_*, then Slurm's allocation). `local_rank`: the index
    among this process's expected cards (LOCAL_RANK under torchrun; not SLURM_LOCALID, see the module docstring).
    `via`: "cuda" (the driver, through ctypes) or "torch"; default: torch when this process has already imported
    it, else the driver.
    Returns the verified bindings (cuda:k -> UUID, bus id, name).
    """
    env = os.environ if environ is None else environ
    sources = find(env) if expect is None else None
    if isinstance(expect, str):
        expectation: Expectation | None = parse_expect(expect, "expect")
    else:
        expectation = expect if sources is None else sources.expectation
    if expectation is None:
        why = sources.why_unpinned() if sources is not None else "none given"
        raise MisalignedError(
            f"no expectation to check against ({why})", "run under gpupin-entrypoint, or pass expect='GPU-...[@BUSID]'"
        )
    found = devices(via)
    bindings: list[align.Binding] = []
    ranks = range(len(expectation.cards)) if local_rank is None else [local_rank]
    for k in ranks:
        if not 0 <= k < len(expectation.cards):
            raise MisalignedError(
                f"local rank {k} has no expected card: {expectation.source} lists {len(expectation.cards)}",
                "pass the index among this process's own cards: LOCAL_RANK under torchrun-style launchers, 0 for "
                "a Slurm task with one card (--gpus-per-task); SLURM_LOCALID is that index only when every task "
                "of the node sees all of the node's cards",
            )
        exp = expectation.cards[k]
        if k >= len(found):
            raise MisalignedError(
                f"cuda:{k} does not exist (this process sees {len(found)} device(s)), but "
                f"{expectation.source} expects {exp} there"
            )
        dev = found[k]
        want = _expected_hex(exp, k, expectation.source)
        same_uuid = not dev.uuid_hex or dev.uuid_hex.startswith(want)  # a hand-written prefix matches too
        same_bus = exp.bus_id is None or dev.bus_id is None or dev.bus_id == exp.bus_id
        if not (same_uuid and same_bus):
            tag = exp.uuid.split("-", 1)[0]  # what CUDA reports is 16 bytes, whatever kind of device it is
            seen = uuid_from_bytes(bytes.fromhex(dev.uuid_hex), tag) if dev.uuid_hex else "a card"
            raise MisalignedError(
                f"cuda:{k} is {seen} at {dev.bus_id} ({dev.name}), but {expectation.source} expects {exp} there",
                f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} and CUDA_DEVICE_ORDER="
                f"{env.get('CUDA_DEVICE_ORDER')!r} in this process put another device there: something changed them "
                "after gpupin-entrypoint set them, or the process did not start under it",
            )
        full = uuid_from_bytes(bytes.fromhex(dev.uuid_hex), exp.uuid.split("-", 1)[0]) if dev.uuid_hex else exp.uuid
        bindings.append(align.Binding(k, full, dev.bus_id, dev.name, exp))
    return bindings
