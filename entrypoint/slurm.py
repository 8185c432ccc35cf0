"""Slurm's GPU allocation as the expectation: SLURM_STEP_GPUS / SLURM_JOB_GPUS, in CUDA_VISIBLE_DEVICES' order.

Each number is read as slurmd numbers it (its device file in gres.conf, that file's minor number, NVML's card
with it), ordered as this task's CUDA_VISIBLE_DEVICES; a reading that finds no card, two that disagree, or a
CUDA_VISIBLE_DEVICES outside the allocation is refused (78). Imported only when a SLURM_*_GPUS variable is set.
The rules, as measured: docs/slurm.md, "What gpupin-entrypoint does under srun".
"""

from __future__ import annotations

import re

from gpupin.core.contract import SLURM_GPU_VARS
from gpupin.core.errors import ExpectationError, GpuSpecError, MisalignedError
from gpupin.core.expectation import Expectation, ExpectedCard
from gpupin.core.identity import is_uuid_like
from gpupin.core.resolve import Target, by_minor, resolve
from gpupin.entrypoint import gresconf
from gpupin.entrypoint.slurmconf import GresConfError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from gpupin.core.nvml import Card

STEP_VAR, JOB_VAR = SLURM_GPU_VARS
CVD = "CUDA_VISIBLE_DEVICES"
_HINT_CHANGED = (
    f"something in the job (its script, a launcher) changed {CVD} after Slurm set it: leave it to "
    "Slurm and start the workload as `srun ... gpupin-entrypoint CMD`, which gives cuda:k = the k-th "
    "allocated card"
)


def local_rank(env: Mapping[str, str]) -> str:
    """Slurm's name for this task on its node (SLURM_LOCALID), for messages."""
    rank = env.get("SLURM_LOCALID")
    return f"Slurm local rank {rank}" if rank is not None else "the Slurm job"


def _numbers(var: str, value: str) -> list[int]:
    entries = [e.strip() for e in value.split(",")]
    if not all(e.isascii() and e.isdigit() for e in entries):
        raise ExpectationError(
            f"{var}={value!r} is not a comma-separated list of GPU numbers",
            f"Slurm writes {var} itself: check the job for a script that sets it",
        )
    numbers = [int(e) for e in entries]
    if len(set(numbers)) != len(numbers):
        raise ExpectationError(
            f"{var}={value!r} lists a GPU twice", f"Slurm writes {var} itself: check the job for a script that sets it"
        )
    return numbers


def _minors(cards: Sequence[Card]) -> str:
    return ", ".join(f"/dev/nvidia{c.minor_number} = {c.uuid}" for c in cards if c.minor_number is not None) or "none"


_HINT_CONTAINER = (
    "a container started by the job must get the job's cards: by UUID (--gpus device=UUID), or every "
    "card with -e SLURM_STEP_GPUS -e CUDA_VISIBLE_DEVICES (and the node's gres.conf, see "
    "docs/slurm.md); Slurm's numbers are not NVML indices, so --gpus device=$CUDA_VISIBLE_DEVICES gives "
    "other cards (`nvidia-smi -q | grep Minor` lists minor numbers)"
)
_HINT_GRES = (
    "compare the node's gres.conf (and slurmd's log with DebugFlags=Gres, which lists the gpu device "
    "files in Slurm's order) with what this process sees"
)
_HINT_AMBIGUOUS = (
    "list the node's cards in gres.conf with File= in the order NVML gives them (nvidia-smi's order), "
    "or name the cards by UUID in GPUPIN_EXPECT"
)


class Slot:
    """What one of Slurm's GPU numbers is under one reading: the card (or why there is none) and, for messages,
    the device file or index it was found by."""

    __slots__ = ("found_by", "hint", "target", "why")

    def __init__(self, found_by: str, target: Target | None = None, why: str = "", hint: str = _HINT_GRES) -> None:
        self.found_by = found_by
        self.target = target
        self.why = why
        self.hint = hint


class Reading:
    """One way of reading Slurm's GPU numbers as cards (`how`, for messages), slot by slot."""

    __slots__ = ("how", "minor", "slot")

    def __init__(self, how: str, slot: Callable[[int], Slot], minor: bool = False) -> None:
        self.how = how
        self.slot = slot
        self.minor = minor  # the fallback: the number is the minor number


def _by_minor(cards: Sequence[Card]) -> Reading:
    def slot(n: int) -> Slot:
        try:
            return Slot(f"/dev/nvidia{n}", by_minor(n, cards))
        except GpuSpecError:
            return Slot(
                f"/dev/nvidia{n}",
                why=f"no card this process can see has minor number {n} (cards: {_minors(cards)})",
                hint=_HINT_CONTAINER,
            )

    return Reading("minor numbers", slot, minor=True)


def _by_files(devices: Sequence[gresconf.Device], how: str, where: str, cards: Sequence[Card]) -> Reading:
    def slot(n: int) -> Slot:
        if n >= len(devices):
            return Slot(f"GPU {n}", why=f"{where} gives the node {len(devices)} gpu device file(s), none numbered {n}")
        files = devices[n].files
        if len(files) > 1:
            return Slot(
                ",".join(files),
                why=f"Slurm's GPU {n} is MultipleFiles={','.join(files)} (a MIG device?), "
                "which gpupin does not read as a card",
            )
        minor, found = gresconf.minor_of(files[0])
        named = f"{files[0]} ({found})" if found and minor is not None else files[0]
        if minor is None:
            return Slot(named, why=found)
        try:
            return Slot(named, by_minor(minor, cards))
        except GpuSpecError:
            return Slot(
                named,
                why=f"no card this process can see has minor number {minor} ({files[0]}; cards: {_minors(cards)})",
                hint=_HINT_CONTAINER,
            )

    return Reading(how, slot)


def _by_nvml(cards: Sequence[Card]) -> Reading:
    """The NVML plugin's own list (AutoDetect=nvml, no File= records): every card, by NVML index."""
    ordered = sorted(cards, key=lambda c: c.index)
    mig = next((c for c in ordered if c.mig_mode), None)

    def slot(n: int) -> Slot:
        if mig is not None:
            return Slot(
                f"NVML index {n}",
                why=f"card {mig.index} ({mig.uuid}) is in MIG mode, and Slurm's "
                "AutoDetect then numbers MIG devices, which gpupin does not read",
            )
        if n >= len(ordered):
            return Slot(f"NVML index {n}", why=f"this process sees {len(ordered)} card(s), none at NVML index {n}")
        if ordered[n].uuid is None:
            return Slot(
                f"NVML index {n}", why=f"NVML cannot read the card at index {n} ({ordered[n].error or 'unreadable'})"
            )
        return Slot(f"NVML index {n}", Target(ordered[n]))

    return Reading("NVML's order (AutoDetect=nvml)", slot)


def _natural(path: str) -> list[tuple[str, int]]:
    """strnatcmp's order, as Slurm sorts device files: digit runs compare as numbers (nvidia9 before nvidia10)."""
    return [(text, int(digits) if digits else -1) for text, digits in re.findall(r"([^0-9]*)([0-9]*)", path)]


def _nvml_files(devices: Sequence[gresconf.Device], cards: Sequence[Card]) -> list[gresconf.Device]:
    """The File= records in the order a Slurm built with NVML gives them (gres_gpu.c _merge_system_gres_conf):
    those NVML detects (its device file is /dev/nvidia<minor of a card>) by NVML index, the rest after them by
    file name."""
    detected = {f"/dev/nvidia{c.minor_number}": c.index for c in cards if c.minor_number is not None}
    found = [d for d in devices if len(d.files) == 1 and d.files[0] in detected]
    rest = [d for d in devices if d not in found]
    return sorted(found, key=lambda d: detected[d.files[0]]) + sorted(rest, key=lambda d: _natural(",".join(d.files)))


def readings(env: Mapping[str, str], cards: Sequence[Card]) -> tuple[list[Reading], str]:
    """The ways Slurm's numbers may be read on this node (all must agree) and, for the report, on what basis."""
    try:
        conf, devices = gresconf.read(env)
    except GresConfError as err:
        return [_by_minor(cards)], f"GPU numbers read as minor numbers: {err}"
    where = conf.path
    files = _by_files(devices, where, where, cards)
    if conf.autodetect is None:
        if not devices:
            return [_by_minor(cards)], (
                f"GPU numbers read as minor numbers: {where} lists no gpu File= for node {conf.node}"
            )
        return [files], f"GPU numbers are positions in {where}"
    auto = f"AutoDetect={conf.autodetect} in {where}"
    if conf.autodetect == "nvml":
        if not devices:  # only the NVML plugin can have given device files
            return [_by_nvml(cards)], f"GPU numbers in NVML's order ({auto})"
        other = _by_files(_nvml_files(devices, cards), "NVML's order of them (AutoDetect=nvml)", where, cards)
        return [files, other], f"GPU numbers are positions in {where}, the same in NVML's order ({auto})"
    if not devices:
        return [_by_minor(cards)], f"GPU numbers read as minor numbers: {auto} and no gpu File= for {conf.node}"
    natural = sorted(devices, key=lambda d: _natural(",".join(d.files)))
    other = _by_files(natural, f"file-name order ({auto})", where, cards)
    return [files, other], f"GPU numbers are positions in {where}, the same in file-name order ({auto})"


def _allocated(numbers: list[int], ways: list[Reading], refuse: str) -> list[Target]:
    """The cards allocated, read every way; MisalignedError when a reading finds no card or two disagree."""
    slots = [[way.slot(n) for n in numbers] for way in ways]
    for i, n in enumerate(numbers):
        mine = [row[i] for row in slots]
        failed = next((s for s in mine if s.target is None), None)
        if len(ways) == 1 and failed is not None:
            raise MisalignedError(f"{refuse}, but {failed.why}", failed.hint)
        if failed is not None or len({s.target for s in mine}) > 1:
            named = "; ".join(
                f"{way.how}: {s.found_by} = {s.target.uuid if s.target else s.why}" for way, s in zip(ways, mine)
            )
            raise MisalignedError(
                f"{refuse}, but Slurm's GPU {n} is another card depending on how Slurm was built ({named})",
                _HINT_AMBIGUOUS,
            )
    targets = [row[0].target for row in zip(*slots)]
    chosen = [t for t in targets if t is not None]
    if len(set(chosen)) != len(chosen):
        raise MisalignedError(f"{refuse}, but two of them are the same card", _HINT_GRES)
    return chosen


def _describe_number(n: int, way: Reading) -> str:
    slot = way.slot(n)
    if slot.target is None:
        return f"{slot.found_by}, which is not here"
    return f"{slot.found_by} ({slot.target.uuid} at {slot.target.bus_id})"


def _order(
    numbers: list[int], cvd: str | None, allocated: list[Target], way: Reading, cards: Sequence[Card], refuse: str
) -> list[int]:
    """Positions in the allocation, in the order CUDA_VISIBLE_DEVICES gives them; MisalignedError when it names
    anything outside the allocation. `refuse` is the refusal's opening words (rank, allocation)."""
    if cvd is None:  # unset after Slurm set it: the allocation's own order
        return list(range(len(numbers)))
    entries = [e.strip() for e in cvd.split(",")]
    if entries == [str(n) for n in numbers]:  # Slurm's own value (ConstrainDevices off)
        return list(range(len(numbers)))
    named = f"{CVD}={cvd}"
    if not cvd.strip():
        raise MisalignedError(f"{refuse}, but {named} hides every card", _HINT_CHANGED)
    # Local numbering (0..n-1 into the allocation) is Slurm's under ConstrainDevices, and a container runtime's:
    # then the task can see no card beyond the allocation. Where it can, the numbers are Slurm's own.
    digits = [int(e) for e in entries if e.isascii() and e.isdigit()]
    local = all(Target(c) in allocated for c in cards) and all(v < len(numbers) for v in digits)
    positions: list[int] = []
    for entry in entries:
        if entry.isascii() and entry.isdigit():
            v = int(entry)
            if local:
                positions.append(v)
            elif v in numbers:
                positions.append(numbers.index(v))
            else:
                raise MisalignedError(
                    f"{refuse}, but {named} names {_describe_number(v, way)}, outside the allocation", _HINT_CHANGED
                )
        elif is_uuid_like(entry):  # a launcher's UUIDs (or Slurm's own with gres.conf Flags=env_uuid)
            try:
                target = resolve(entry, cards)
            except GpuSpecError as err:
                raise MisalignedError(f"{refuse}, but {named}: {err.message}", _HINT_CHANGED) from None
            if target not in allocated:
                raise MisalignedError(
                    f"{refuse}, but {named} names {target.uuid} (/dev/nvidia"
                    f"{target.card.minor_number}), outside the allocation",
                    _HINT_CHANGED,
                )
            positions.append(allocated.index(target))
        else:
            raise MisalignedError(f"{refuse}, but {named}: {entry!r} names no card", _HINT_CHANGED)
    if len(set(positions)) != len(positions):
        raise MisalignedError(f"{refuse}, but {named} names a card twice", _HINT_CHANGED)
    return positions


def read(env: Mapping[str, str], read_cards: Callable[[], Sequence[Card]]) -> Expectation | str:
    """The expectation from Slurm's allocation for this task (see the module's docstring), or why there is none;
    the cards NVML sees are read (`read_cards`) only once Slurm's variables name some."""
    var = STEP_VAR if STEP_VAR in env else JOB_VAR
    value = env[var]
    if value.strip() in ("", "NoDevFiles"):
        return f"{var}={value} names no card (gres.conf without File= device files)"
    numbers = _numbers(var, value)
    rank = local_rank(env)
    cvd = env.get(CVD)
    cards = read_cards()
    ways, basis = readings(env, cards)
    way = ways[0]
    listed = ", ".join(map(str, numbers))
    if way.minor:
        refuse = f"{rank} was allocated minor number{'s' if len(numbers) > 1 else ''} {listed} ({var}={value})"
    else:
        files = ", ".join(way.slot(n).found_by for n in numbers)
        refuse = (
            f"{rank} was allocated GPU{'s' if len(numbers) > 1 else ''} {listed} ({var}={value}: {files} by {way.how})"
        )
    allocated = _allocated(numbers, ways, refuse)
    order = _order(numbers, cvd, allocated, way, cards, refuse)
    named = f"{CVD}={cvd}" if cvd is not None else f"{CVD} unset"
    notes = [
        f"{rank}, minor number {allocated[p].card.minor_number}"
        if way.minor
        else f"{rank}, Slurm's GPU {numbers[p]} = {way.slot(numbers[p]).found_by}"
        for p in order
    ]
    return Expectation(
        [ExpectedCard(allocated[p].uuid, allocated[p].bus_id, note) for p, note in zip(order, notes)],
        var,
        f"{var}={value} and {named} ({rank}); {basis}",
    )
